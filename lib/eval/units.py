"""Eval units (DESIGN.md §5): one (model alias, benchmark, protocol) → one folder of per-sample rows and scores.

    evals/<alias>/<benchmark>/<protocol>/
        samples.jsonl   one row per sample: problem_id, seed, pass, completion, n_tokens, truncated, extractor,
                        extracted, correct, verify_method, grade_reason, decided_by, level, answer (the gold
                        answer graded against, so a reader of the rows can re-grade them without the benchmark),
                        first_answer (the answer written first, where `extracted` is the last: the report's
                        "reached its answer", lib/report/rollouts.py)
        scores.json     accuracy (+95 % CI), truncation, tokens, extractor split, grading (what decided, every
                        timeout), deviations, provenance, config
        manifest.json   lib.artifacts manifest: the sha256 of both files above

The machinery of 04_eval.py, in the order it runs: `plan_unit` (everything that decides the unit's identity, the
evaluated model folder checked against the manifest that sealed it), `existing_state` (skip, or refuse to overwrite,
with the reason), and `write_unit` (rows, scores, manifest). Reading and checking a finished unit (duplicates, seed
grid, missing problems) is lib/report/campaign.py's.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lib import benchmarks, models, registry, runs
from lib.artifacts import (ArtifactError, atomic_write_json, atomic_write_jsonl, dumps_json, read_json, sha256_bytes,
                           sha256_file, verify_dir, write_manifest)
from lib.cli import name_error
from lib.data import evenly_spaced
from lib.errors import UserError
from lib.eval.extract import first_answer
from lib.eval.grading import TIMEOUT_S
from lib.report.campaign import EXTRACTORS, check_unit
from lib.report.stats import resample_index

SAMPLES, SCORES, MANIFEST = "samples.jsonl", "scores.json", "manifest.json"
GRADE_TIMEOUT_S = TIMEOUT_S          # the grader's default bound (CPU-s per sample); another enters the unit's config


def unit_dir(run_dir: str | Path, alias: str, benchmark: str, protocol: str) -> Path:
    return Path(run_dir) / "evals" / alias / benchmark / protocol


def config_sha256(config: dict) -> str:
    """The identity of a unit's configuration: a unit is never overwritten by a different one."""
    return sha256_bytes(dumps_json(config).encode())


# --- the evaluated model: a checkpoint is evaluated only as its training run sealed it ---

def verify_model_folder(path: Path) -> str | None:
    """Check every file of a model folder made by a stage (a training checkpoint, the RAFT model) against the
    manifest.json of the stage folder above it; return that manifest's path, None for a folder no stage made."""
    listed, seal = {}, path.parent / MANIFEST
    if seal.exists():
        m = read_json(seal)
        prefix = path.name + "/"
        listed = {k[len(prefix):]: v for k, v in m.get("outputs", {}).items() if k.startswith(prefix)}
    if not listed:
        if (path / runs.INTEGRITY).exists():       # a checkpoint of a run still in progress: its own sha256 record
            runs.verify_files(path, "the checkpoint", "re-run the training stage that wrote it")
            return str(path / runs.INTEGRITY)
        if (path / "checkpoint.json").exists():
            raise ArtifactError(f"checkpoint {path} is not sealed: {seal} is missing or does not list it (the training "
                                f"run did not finish). Finish the run (03_opd_train.py --resume), then evaluate it.")
        return None
    for rel in sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()):
        if rel not in listed:
            raise ArtifactError(f"model folder {path}: {rel} is not listed in {seal}: it was added after "
                                f"{m['stage']} wrote the folder. Remove it, or re-run {m['stage']}.")
    for rel, want in sorted(listed.items()):
        f = path / rel
        got = sha256_file(f) if f.exists() else "missing"
        if got != want:
            raise ArtifactError(f"model folder {path}: {rel} has sha256 {got[:12]}… but {seal} recorded {want[:12]}…: "
                                f"the checkpoint changed after {m['stage']} wrote it. It is not evaluated as is; "
                                f"re-create it by re-running {m['stage']}.")
    return str(seal)


# --- planning: everything that decides the unit's identity, before any model is loaded ---

@dataclass
class Plan:
    alias: str
    benchmark: str
    protocol: str
    out: Path
    model: models.Resolved
    spec: registry.Model
    rows: list
    bench_src: str
    max_new_tokens: int
    deviations: list
    config: dict
    chat_kwargs: dict = field(default_factory=dict)
    sealed_by: str | None = None                 # the manifest.json the model folder was checked against


def plan_unit(run_dir, model_name, benchmark, protocol, *, alias=None, limit_problems=None, max_new_tokens=None,
              backend="hf", dtype="auto", grade_timeout=GRADE_TIMEOUT_S) -> Plan:
    model = models.resolve_model(model_name, run_dir)
    sealed_by = verify_model_folder(model.path)
    ckpt_file = model.path / "checkpoint.json"
    ckpt = read_json(ckpt_file) if ckpt_file.exists() else {}
    # a checkpoint is evaluated under its initial student's registry entry (cap, template kwargs)
    spec = models.model_spec(ckpt.get("student_init") or model_name, run_dir)
    if ckpt and (why := name_error(ckpt.get("run")) or (None if type(ckpt.get("step")) is int else
                                                           f"step {ckpt.get('step')!r} is not an integer")):
        raise UserError(f"{ckpt_file}: {why}; a received checkpoint names its run and step, which become the unit's "
                        "folder name: fix checkpoint.json or pass --alias")
    if alias is not None and (why := name_error(alias)):
        raise UserError(f"alias {why}")
    if alias is None and not ckpt and (why := name_error(model.alias)):      # a folder's name: `--model a/..`
        raise UserError(f"model {model_name}: its name becomes the unit's folder, but {why}; pass --alias NAME")
    if alias is None:
        alias = f"{ckpt['run']}-step{ckpt['step']}" if ckpt else model.alias
    model.extra.update({k: ckpt.get(k) for k in ("run", "step", "student_init")})

    rows, src = benchmarks.load_benchmark(benchmark)
    bench_name = benchmark if benchmarks.is_known(benchmark) else Path(benchmark).stem
    if why := name_error(bench_name):                       # a file's stem: `...jsonl` is '..'
        raise UserError(f"benchmark file {benchmark}: its stem becomes the unit's folder, but {why}; rename the file")
    deviations = []
    if limit_problems is not None and limit_problems < len(rows):
        deviations.append(f"limit-problems: {limit_problems} of {len(rows)} problems, evenly spaced")
        alias += f"_sub{limit_problems}"
        rows = evenly_spaced(rows, limit_problems)
    cap = spec.eval_max_new_tokens
    if max_new_tokens is not None and max_new_tokens != cap:
        deviations.append(f"max-new-tokens: {max_new_tokens} instead of the model's {cap}")
        alias += f"_cap{max_new_tokens}"
        cap = max_new_tokens
    proto = registry.PROTOCOLS[protocol]
    bench_sha = sha256_file(src) if Path(src).exists() else src
    identity = {k: v for k, v in model.provenance().items() if k != "path"}  # a path is not an identity
    config = {"model": identity | {"train_run": ckpt.get("run"), "train_step": ckpt.get("step"),
                                   "student_init": ckpt.get("student_init")},
              "benchmark": bench_name, "benchmark_sha256": bench_sha, "problem_ids": [r["id"] for r in rows],
              "protocol": protocol, "n": proto.n, "temperature": proto.temperature, "top_p": proto.top_p,
              "max_new_tokens": cap, "backend": backend, "dtype": dtype}
    if grade_timeout != GRADE_TIMEOUT_S:       # the bound changes verdicts; the default is left out, so the units
        config["grade_timeout_s"] = grade_timeout  # sealed before it counted keep their identity
    chat_kwargs = {"enable_thinking": True} if spec.thinking else {}
    return Plan(alias, bench_name, protocol, unit_dir(run_dir, alias, bench_name, protocol), model, spec, rows, src,
                cap, deviations, config, chat_kwargs, sealed_by)


def existing_state(plan: Plan, skip_if_exists: bool) -> str:
    """'done' (finished, same config, hashes verified), 'fresh' (nothing there), or refuse, saying why."""
    if not (plan.out / MANIFEST).exists():
        return "fresh"
    try:
        old = read_json(plan.out / SCORES)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{plan.out / SCORES} is unreadable ({e}); delete {plan.out} and re-run") from e
    if old.get("config_sha256") != config_sha256(plan.config):
        old_cfg = old.get("config", {})
        if (old_cfg.get("benchmark_sha256") != plan.config["benchmark_sha256"]
                and old.get("provenance", {}).get("benchmark_source") not in (None, plan.bench_src)):
            raise ArtifactError(f"{plan.out} holds the unit of another benchmark file with the stem "
                                f"{plan.benchmark!r} ({old['provenance']['benchmark_source']}, not {plan.bench_src}); "
                                f"refusing to overwrite it. Rename one of the two files, or use another --run-dir.")
        diff = sorted(k for k in set(old_cfg) | set(plan.config) if old_cfg.get(k) != plan.config.get(k))
        raise ArtifactError(f"{plan.out} holds a unit with a different configuration ({', '.join(diff) or 'config'} "
                            f"differ; config sha256 {old.get('config_sha256', '?')[:12]}… vs "
                            f"{config_sha256(plan.config)[:12]}…); refusing to overwrite it. Use another --alias or "
                            f"--run-dir, or delete that folder on purpose.")
    if skip_if_exists:
        verify_dir(plan.out, [SAMPLES, SCORES])  # a corrupted unit is refused, never silently reused
    return "done" if skip_if_exists else "fresh"


# --- the numbers of scores.json ---

def mean_ci(per_problem: np.ndarray) -> tuple[float, float]:
    """95 % percentile CI of the mean per-problem accuracy, resampling problems exactly as DESIGN.md §6's bootstrap."""
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


def grading_summary(rows: list[dict], grades: list, timeout_s: float) -> dict:
    """Which extraction path decided each verdict (counts), and every timeout with the seconds it used."""
    timeouts = [{"problem_id": r["problem_id"], "seed": r["seed"], "cpu_s": g.cpu_s, "wall_s": g.wall_s}
                for r, g in zip(rows, grades) if g.reason == "timeout"]
    return {"timeout_s_cpu": timeout_s, "decided_by": dict(sorted(Counter(r["decided_by"] for r in rows).items())),
            "n_timeouts": len(timeouts), "timeouts": timeouts}


# --- writing the unit ---

def sample_rows(plan: Plan, gens: list[dict], grades: list) -> list[dict]:
    level = {r["id"]: r.get("level") for r in plan.rows}
    gold = {r["id"]: r["answer"] for r in plan.rows}
    return [{"problem_id": g["problem_id"], "seed": g["seed"], "pass": g["seed"], "completion": g["completion"],
             "n_tokens": g["n_tokens"], "truncated": g["truncated"], "extractor": gr.extractor,
             "extracted": gr.extracted, "correct": bool(gr.correct), "verify_method": gr.verify_method,
             "grade_reason": gr.reason, "decided_by": gr.decided_by, "level": level[g["problem_id"]],
             "answer": gold[g["problem_id"]], "first_answer": first_answer(g["completion"])}
            for g, gr in zip(gens, grades)]


def write_unit(plan: Plan, samples: list[dict], scores: dict, *, script, args: dict, started: str, wall_s: float,
               gpu_s: float, driver: str) -> None:
    """samples.jsonl and scores.json (atomically, after checking the seed grid), then the manifest sealing both."""
    check_unit(str(plan.out), scores, samples)          # one row per (problem, seed), every problem present
    atomic_write_jsonl(plan.out / SAMPLES, samples)
    atomic_write_json(plan.out / SCORES, scores)
    inputs = {"benchmark": plan.bench_src} if Path(plan.bench_src).exists() else {}
    if plan.sealed_by:
        inputs["model_manifest"] = plan.sealed_by
    write_manifest(plan.out, stage="04_eval", script=script, args=args, inputs=inputs, outputs=[SAMPLES, SCORES],
                   started=started, wall_s=wall_s, gpu_s=gpu_s,
                   extra={"unit": [plan.alias, plan.benchmark, plan.protocol], "driver": driver})
