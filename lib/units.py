"""Eval units (SPEC §5): one (model alias, benchmark, protocol) → one folder of per-sample rows and scores.

    evals/<alias>/<benchmark>/<protocol>/
        samples.jsonl   one row per sample: problem_id, seed, pass, completion, n_tokens, truncated, extractor,
                        extracted, correct, verify_method, grade_reason, level
        scores.json     accuracy (+95 % CI), truncation, tokens, extractor split, deviations, provenance, config
        manifest.json   lib.artifacts manifest: the sha256 of both files above

Writing a unit is 04_eval.py's job; reading and checking one (duplicates, seed grid, missing problems) is
lib/campaign.py's.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from lib.artifacts import dumps_json, sha256_bytes
from lib.campaign import EXTRACTORS
from lib.stats import resample_index

SAMPLES, SCORES = "samples.jsonl", "scores.json"


def unit_dir(run_dir: str | Path, alias: str, benchmark: str, protocol: str) -> Path:
    return Path(run_dir) / "evals" / alias / benchmark / protocol


def config_sha256(config: dict) -> str:
    """The identity of a unit's configuration: a unit is never overwritten by a different one."""
    return sha256_bytes(dumps_json(config).encode())


def mean_ci(per_problem: np.ndarray) -> tuple[float, float]:
    """95 % percentile CI of the mean per-problem accuracy, resampling problems exactly as SPEC §6's bootstrap."""
    if len(per_problem) == 0:
        return (float("nan"), float("nan"))
    means = per_problem[resample_index(len(per_problem))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarize(rows: list[dict]) -> dict:
    """The numbers of scores.json from the per-sample rows (accuracy is the mean of per-problem means, in %)."""
    by_problem = defaultdict(list)
    for r in rows:
        by_problem[r["problem_id"]].append(r["correct"])
    per_problem = np.array([np.mean(v) for v in by_problem.values()], dtype=float)
    lo, hi = mean_ci(per_problem)
    n = len(rows)
    trunc = [r for r in rows if r["truncated"]]
    return {
        "n_problems": len(by_problem),
        "n_samples": n,
        "accuracy": 100 * float(per_problem.mean()) if n else float("nan"),
        "accuracy_ci95": [100 * lo, 100 * hi],
        "truncation_rate": sum(r["truncated"] for r in rows) / n if n else float("nan"),
        "mean_tokens": float(np.mean([r["n_tokens"] for r in rows])) if n else float("nan"),
        "extractor_split": {e: sum(r["extractor"] == e for r in rows) / n if n else 0.0 for e in EXTRACTORS},
        "accuracy_truncated": 100 * float(np.mean([r["correct"] for r in trunc])) if trunc else None,
        "extracted_truncated": (sum(r["extractor"] != "none" for r in trunc) / len(trunc)) if trunc else None,
    }
