"""End to end: a fabricated campaign directory → 05_stats.py → 06_report.py, run as subprocesses.

The campaign is written in code (lib.artifacts + manifests, no committed fixtures): π_pre/π_post/student-init eval
units on a 40-problem toy benchmark (π_pre with a smaller cap, for the cap-sensitivity view), a synthetic training run
(metrics.jsonl with a termination collapse, summary.json, two checkpoints) with checkpoint eval units on the full and
the 8-seed curve protocol, a RAFT stats file with RAFT eval units, and a gates manifest for the time ledger.
Checks: the stats agree with numbers recomputed here; every number in every README table traces to a file in
MANIFEST.json; a rebuild is byte-identical; figures are real PNGs; broken units are refused, naming them.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import run_script
from lib.artifacts import atomic_write_json, atomic_write_jsonl, now_iso, read_json, sha256_file, write_manifest
from lib.registry import TOY_COLLAPSE_LOW_LR

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parent.parent
N_PROBLEMS, LEVELS = 40, (1, 2, 3, 4)
P_CORRECT = {"toy-pre": (0.95, 0.9, 0.1, 0.02), "toy-post": (0.97, 0.95, 0.8, 0.2),   # per level 1..4
             "toy-student": (0.9, 0.8, 0.2, 0.05), "raft": (0.97, 0.93, 0.2, 0.03)}
SEEDS = {"sample4": list(range(4)), "greedy": [0], "sample32": list(range(32)), "curve8": list(range(8))}


def model_block(alias, run=None, step=None, init=None):
    return {"alias": alias, "path": f"/models/{alias}", "hub_id": None, "revision": None, "resolved_revision": "toy:x",
            "train_run": run, "train_step": step, "student_init": init}


def write_unit(run_dir: Path, alias: str, protocol: str, probs, cap: int, tokens_mean: float, seed: int,
               model=None, deviations=(), problems=None, mutate=None, bench_sha=None) -> Path:
    """One eval unit as 04_eval writes it: samples.jsonl, scores.json, manifest.json."""
    rng = np.random.default_rng(seed)
    d = run_dir / "evals" / alias / "toy" / protocol
    rows = []
    for i in (problems if problems is not None else range(N_PROBLEMS)):
        level = LEVELS[i % 4]
        for s in SEEDS[protocol]:
            n_tok = int(min(cap, max(5, rng.normal(tokens_mean * level / 2, 10))))
            trunc = n_tok >= cap
            ext = "none" if (trunc and rng.random() < 0.5) else ("boxed" if rng.random() < 0.3 else "answer_line")
            ok = bool(ext != "none" and rng.random() < probs[level - 1])
            rows.append({"problem_id": f"toy-{i:03d}", "seed": s, "pass": s, "completion": "1+2=3.\nAnswer: 3",
                         "n_tokens": n_tok, "truncated": trunc, "extractor": ext, "extracted": None if ext == "none" else "3",
                         "correct": ok, "verify_method": "math_verify", "grade_reason": None, "level": level,
                         "answer": ("3", "6", "7")[i % 3], "first_answer": "3"})
    if mutate:
        rows = mutate(rows)
    acc = 100.0 * np.mean([r["correct"] for r in rows])
    scores = {"alias": alias, "benchmark": "toy", "protocol": protocol, "n_problems": len({r["problem_id"] for r in rows}),
              "n_samples_per_problem": len(SEEDS[protocol]), "seeds": SEEDS[protocol], "accuracy": acc,
              "accuracy_ci95": [acc - 5, acc + 5], "truncation_rate": np.mean([r["truncated"] for r in rows]),
              "mean_tokens": np.mean([r["n_tokens"] for r in rows]), "extractor_split": {}, "accuracy_truncated": None,
              "max_new_tokens": cap, "deviations": list(deviations),
              "provenance": {"model": model or model_block(alias), "generation": {}}}
    if bench_sha:                # 04_eval records the benchmark file's sha256 in the unit's config
        scores["config"] = {"benchmark_sha256": bench_sha}
    if mutate:   # a broken unit keeps the scores.json of the intact one (that is the point of the refusal)
        scores["n_problems"] = N_PROBLEMS if problems is None else len(problems)
    atomic_write_jsonl(d / "samples.jsonl", rows)
    atomic_write_json(d / "scores.json", json.loads(json.dumps(scores, default=float)))
    write_manifest(d, stage="04_eval", script=__file__, args={"pair": "toy", "model": alias}, inputs={},
                   outputs=["samples.jsonl", "scores.json"], started=now_iso(), wall_s=12.5 + seed, gpu_s=3.25 * seed)
    return d


def metric_rows(n_steps=40, onset=25, peak=1.0):
    """Per-step DESIGN.md §7.4 metrics of a run that collapses: clip ratio jumps after `onset`, length runs away.
    With `peak` ≤ 0.5 the clip ratio stops there: a run that runs away without crossing the onset."""
    rows = []
    for s in range(1, n_steps + 1):
        c = 0.0 if s < onset else min(peak, 0.3 + 0.1 * (s - onset))
        rows.append({"step": s, "response_length/mean": 20 + (s >= onset) * 25 + 0.1 * s,
                     "response_length/clip_ratio": c, "response_length/max": 48, "response_length/min": 5,
                     "delta_opd/weighted_reward_mean": -0.01 + 0.0002 * s, "delta_opd/log_ratio_mean": 0.1,
                     "actor/kl_coef": round(2.5 * 0.99 ** s, 6), "actor/entropy": 0.5 - 0.01 * s,
                     "actor/grad_norm": 1.0 + (s == 21) * 9.0, "timing_s/step": 1.5, "rollout/logprob_gap": 0.001})
    return rows


# training runs: (folder name, reward, seed recorded in summary.json, seed in the manifest's args, per-level skill at
# step 20 and 40). opd's three seeds: seed 42 in summary.json, seed 1 only in the manifest args, seed 2 only in the name
RUNS = [("opd", "opd", 42, 42, (0.92, 0.85, 0.3, 0.05), (0.95, 0.9, 0.45, 0.1)),
        ("opd-seed1", "opd", None, 1, (0.9, 0.8, 0.3, 0.05), (0.93, 0.88, 0.4, 0.08)),
        ("opd-seed2", "opd", None, None, (0.9, 0.82, 0.25, 0.05), (0.94, 0.9, 0.5, 0.1)),
        ("delta-topk", "delta-topk", 42, 42, (0.9, 0.8, 0.25, 0.05), (0.85, 0.7, 0.1, 0.0))]
NO_ONSET_RUN = "opd-seed2"   # its clip ratio climbs to 0.4 and stays: no onset, and not a run a fix held either
EVALS = {"opd": {20: ("curve8",), 40: ("sample4", "curve8")}, "delta-topk": {20: ("curve8",), 40: ("sample4", "greedy", "curve8")}}
GATE_NAMES = ("tokenizer", "prompt_length", "context", "template", "anatomy")
RAFT_FIRST_WALL = 200.0      # 07_raft's first run; a rerun overwrites raft/manifest.json with RAFT_RERUN_WALL
RAFT_RERUN_WALL = 17.1


def write_run(run_dir: Path, name, reward, seed_summary, seed_args, skill, cap, k):
    t = run_dir / "train" / name
    quiet = name == NO_ONSET_RUN
    atomic_write_jsonl(t / "metrics.jsonl", metric_rows(onset=25 + k, peak=0.4 if quiet else 1.0))
    summ = {"pair": "toy", "reward": reward, "student": "toy", "steps": 40,
            "collapse_onset_step": None if quiet else 28 + k,
            "length_runaway_step": 25 + k, "longest_clip90_run": 0 if quiet else 10 - k}
    atomic_write_json(t / "summary.json", summ | ({"seed": seed_summary} if seed_summary is not None else {}))
    for step in (20, 40):
        atomic_write_json(t / f"step_{step:06d}" / "checkpoint.json",
                          {"run": name, "step": step, "pair": "toy", "reward": reward, "student_init": "toy-student"})
    args = {"pair": "toy", "reward": reward} | ({"seed": seed_args} if seed_args is not None else {})
    write_manifest(t, stage="03_opd_train", script=__file__, args=args, inputs={},
                   outputs=["metrics.jsonl", "summary.json", "step_000020", "step_000040"], started=now_iso(),
                   wall_s=300.0 + k, gpu_s=0.0)
    for step, protos in EVALS["opd" if reward == "opd" else name].items():
        if name != "opd" and reward == "opd" and step == 20:
            continue                 # the extra seeds: only their last checkpoint is evaluated
        for j, proto in enumerate(protos):
            write_unit(run_dir, f"{name}-step{step}", proto, skill[step], cap, 25 + step, 20 + step + j + 10 * k,
                       model=model_block(f"{name}-step{step}", name, step, "toy-student"))


def write_gates(run_dir: Path):
    """gates/ as 01_gates writes it: one <gate>.json per gate and a manifest naming each gate's status."""
    g = run_dir / "gates"
    status = {"tokenizer": "PASS", "prompt_length": "PASS", "context": "PASS", "template": "FAIL", "anatomy": "PASS"}
    for name in GATE_NAMES:
        rep = {"gate": name, "allowed": name == "template", "status": status[name], "summary": f"{name} summary" + (", ends '<|im_start|>assistant'" if name == "template" else ""),
               "reasons": ["injected system prompt differs"] if status[name] == "FAIL" else [],
               "warnings": ["embedding padding"] if name == "tokenizer" else []}
        if name == "anatomy":
            rep |= {"n_sequences": 64, "n_tokens": 2345, "token_mean_delta": 0.0123, "student_weighted_mean": -0.0456,
                    "pos_frac": 0.5432, "pos_frac_decided": 0.6543, "abs_mean_delta": 0.3456, "interior_mean_delta": 0.0111,
                    "stop": {"n": 60, "mean_delta": 1.2345, "pos_frac": 0.9}, "accuracy": 0.4219, "stop_rate": 0.9375,
                    "logp_stop_at_answer_end": {"n": 50, "student": -0.1, "pi_pre": -2.3456, "pi_post": -0.0789},
                    "mean_tokens": 36.6, "auroc": {"length_controlled": 0.6789, "ci95": [0.6, 0.75]},
                    "models": {"student": "toy-student", "pi_pre": "toy-pre", "pi_post": "toy-post"}}
        atomic_write_json(g / f"{name}.json", rep)
    write_manifest(g, stage="01_gates", script=__file__, args={"pair": "toy"}, inputs={},
                   outputs=[f"{n}.json" for n in GATE_NAMES], started=now_iso(), wall_s=42.25, gpu_s=7.5,
                   extra={"gates": status, "allowed": ["template"], "failed": [], "carried": ["context"], "passed": True})


def make_campaign(run_dir: Path) -> Path:
    cap_pre, cap = 64, 96
    write_unit(run_dir, "toy-pre", "sample4", P_CORRECT["toy-pre"], cap_pre, 30, 1)
    write_unit(run_dir, "toy-pre", "greedy", P_CORRECT["toy-pre"], cap_pre, 30, 2)
    write_unit(run_dir, "toy-post", "sample4", P_CORRECT["toy-post"], cap, 40, 3)
    write_unit(run_dir, "toy-post", "greedy", P_CORRECT["toy-post"], cap, 40, 4)
    for k, proto in enumerate(("sample4", "greedy", "sample32")):
        write_unit(run_dir, "toy-student", proto, P_CORRECT["toy-student"], cap, 25, 5 + k)
    for k, (name, reward, s_sum, s_args, skill20, skill40) in enumerate(RUNS):
        write_run(run_dir, name, reward, s_sum, s_args, {20: skill20, 40: skill40}, cap, k)
    # still in progress: a run without manifest.json, and a unit folder 04_eval is still writing
    atomic_write_jsonl(run_dir / "train" / "delta-sampled" / "metrics.jsonl", metric_rows(n_steps=7))
    atomic_write_jsonl(run_dir / "evals" / "toy-post" / "toy" / "sample32" / "samples.jsonl", [{"problem_id": "toy-000"}])
    # RAFT: stats file (07_raft's documented keys) and its eval units
    r = run_dir / "raft"
    atomic_write_json(r / "stats.json", {
        "base": "toy-pre", "k": 4, "n_prompts": 400, "kept": 310, "keep_rate_pct": 77.5,
        "keep_rate_by_level_pct": {"1": 99.0, "2": 95.0, "3": 40.0}, "n_correct_of_k": {"0": 90, "1": 20, "4": 290},
        "rejection_reasons": {"no_correct_sample": 90}, "gate_g1": {"pass": True, "threshold": 200, "kept": 310},
        "sft": {"val_loss": [[10, 0.9], [20, 0.7], [30, 0.65]], "train_loss": [[10, 1.0], [20, 0.75], [30, 0.6]]},
        "shift_abs_dlogp_per_token": 0.0991, "eos_probe": {"pi_pre": -0.074, "raft": -0.015}})
    write_manifest(r, stage="07_raft", script=__file__, args={"pair": "toy-raft"}, inputs={}, outputs=["stats.json"],
                   started="2026-01-01T00:00:00Z", wall_s=RAFT_FIRST_WALL, gpu_s=0.0)
    write_unit(run_dir, "raft", "sample4", P_CORRECT["raft"], cap_pre, 30, 77)
    write_gates(run_dir)
    return run_dir


def rerun_raft(run_dir: Path) -> None:
    """A rerun of 07_raft that found its work done: a new manifest, a short wall-clock, the first run's time gone."""
    write_manifest(run_dir / "raft", stage="07_raft", script=__file__, args={"pair": "toy-raft"}, inputs={},
                   outputs=["stats.json"], started="2026-01-02T00:00:00Z", wall_s=RAFT_RERUN_WALL, gpu_s=0.0)


def run_stage(script, run_dir, *extra, ok=True):
    return run_script(script, "--run-dir", run_dir, *extra, check=ok, timeout=300)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    run_dir = make_campaign(tmp_path_factory.mktemp("campaign") / "toy")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    rerun_raft(run_dir)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    return run_dir


# --- 05's JSON against an independent recomputation from the samples ---

def per_problem(unit_dir, seeds=None):
    acc = {}
    for line in (unit_dir / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        if seeds is None or r["seed"] in seeds:
            acc.setdefault(r["problem_id"], []).append(r["correct"])
    return {p: np.mean(v) for p, v in acc.items()}


def unit_seeds(unit_dir):
    return set(read_json(unit_dir / "scores.json")["seeds"])


def boot_summary(d_P, n_boot=10_000, seed=42):
    """Gain, percentile CI and two-sided p of per-problem differences d_P, resampled over problems."""
    d_P = np.asarray(d_P, float)
    means = 100 * d_P[np.random.default_rng(seed).integers(0, len(d_P), (n_boot, len(d_P)))].mean(1)
    p = min(1.0, 2 * min(np.mean(means <= 1e-9), np.mean(means >= -1e-9)))
    return 100 * d_P.mean(), list(np.percentile(means, [2.5, 97.5])), p


def holm_step_down(ps):
    order = np.argsort(ps, kind="stable")
    adj, run = np.empty(len(ps)), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj


# --- conditions, the cross-condition summary, snapshots, the naive comparison, hypotheses, the roster: recomputed ---

# what 03 records that does not make a condition (the seed; where it writes, how it is launched, logged, stopped for
# time), written out here rather than imported
NOT_IDENTITY = {"seed", "resume", "nproc", "time_limit", "logger", "wandb_project", "keep_last", "peak_tflops",
                "save_every", "run_dir", "run_name", "logprob_gap_every", "vllm_sleep"}


def run_metrics(campaign, run):
    """train/<run>/metrics.jsonl as rows, a torn last line dropped."""
    rows = []
    for ln in (campaign / "train" / run / "metrics.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError:
            pass
    return rows


def watch_of(rows):
    """(onset, runaway, peak clip) straight from the per-step rows (DESIGN.md §7.5)."""
    onset = next((r["step"] for r in rows if r["response_length/clip_ratio"] > 0.5), None)
    runaway = next((r["step"] for r in rows if r["response_length/mean"] > 2 * rows[0]["response_length/mean"]), None)
    return onset, runaway, max(r["response_length/clip_ratio"] for r in rows)


def run_args(campaign, run):
    """The settings a run recorded: its manifest's args, else its resume state's, else None."""
    t = campaign / "train" / run
    if (t / "manifest.json").exists():
        return read_json(t / "manifest.json")["args"]
    if (t / "resume" / "loop_state.json").exists():
        return read_json(t / "resume" / "loop_state.json")["args"]
    return None


def identity(campaign, run):
    args = run_args(campaign, run)
    return None if args is None else json.dumps({k: v for k, v in args.items() if k not in NOT_IDENTITY},
                                                sort_keys=True)


def check_conditions(campaign):
    """Seeds are pooled only within identical settings: every by_condition entry's runs share one identity (read from
    their manifests / resume states), and runs of different identities never share a condition."""
    SG = read_json(campaign / "stats" / "student_gains.json")
    C = read_json(campaign / "stats" / "conditions.json")
    for e in SG["by_condition"]:
        ids = {identity(campaign, g["run"]) for g in e["per_seed"]}
        assert len(ids) == 1 and None not in ids or len(e["per_seed"]) == 1, \
            f"{e['condition']} pools runs of different settings: {[g['run'] for g in e['per_seed']]}"
        if e["pooled"]:
            assert e["pooled"]["n_training_seeds"] == len(e["per_seed"])
    runs = sorted(p.name for p in (campaign / "train").iterdir() if p.is_dir())
    groups = {}
    for r in runs:
        groups.setdefault(identity(campaign, r) or f"none:{r}", []).append(r)
    assert sorted(sorted(c["runs"]) for c in C["conditions"]) == sorted(sorted(g) for g in groups.values())
    names = [c["name"] for c in C["conditions"]]
    assert len(set(names)) == len(names)
    return C


def check_summary(campaign):
    """One row per condition × benchmark at the primary protocol: gain from its decision, the watch from metrics.jsonl,
    truncation from the checkpoint units' samples."""
    SG = read_json(campaign / "stats" / "student_gains.json")
    C = read_json(campaign / "stats" / "conditions.json")
    for x in C["summary"]:
        cond = next(c for c in C["conditions"] if c["id"] == x["condition_id"])
        watches = [watch_of(run_metrics(campaign, r)) for r in cond["runs"] if run_metrics(campaign, r)]
        assert x["onset_steps"] == [w[0] for w in watches] and x["runaway_steps"] == [w[1] for w in watches]
        assert x["peak_clip_ratio"] == max(w[2] for w in watches)
        assert x["n_collapsed"] == sum(w[0] is not None for w in watches)
        e = [e for e in SG["by_condition"] if e["condition_id"] == x["condition_id"] and e["protocol"] == "sample4"]
        if not e:
            assert x["benchmark"] is None and x["decision"] is None
            continue
        e = e[0]
        assert x["decision"] == e["decision"] and (x["benchmark"], x["protocol"]) == ("toy", "sample4")
        trunc = []
        for g in e["per_seed"]:
            rows = [json.loads(ln) for ln in (campaign / g["unit_b"] / "samples.jsonl").read_text().splitlines()]
            trunc.append(100 * np.mean([r["truncated"] for r in rows]))
        assert x["truncation_pct"] == pytest.approx(trunc, abs=1e-9)
        assert x["mean_truncation_pct"] == pytest.approx(np.mean(trunc), abs=1e-9)


def check_snapshots(campaign):
    """Each run's snapshot rows: its checkpoint steps and the steps either side of its onset, values from metrics."""
    TRN = read_json(campaign / "stats" / "training.json")["runs"]
    for r in TRN:
        rows = {m["step"]: m for m in run_metrics(campaign, r["run"])}
        ckpts = sorted(read_json(c)["step"] for c in (campaign / "train" / r["run"]).glob("step_*/checkpoint.json"))
        onset = watch_of(list(rows.values()))[0]
        want = set(ckpts) | ({onset - 1, onset, onset + 1} if onset else set())
        assert [x["step"] for x in r["snapshots"]] == sorted(want & set(rows))
        for x in r["snapshots"]:
            for k in ("response_length/mean", "response_length/clip_ratio", "delta_opd/weighted_reward_mean",
                      "actor/kl_coef", "actor/entropy", "actor/grad_norm"):
                assert x[k] == rows[x["step"]][k]
            assert ("checkpoint" in x["why"]) == (x["step"] in ckpts)
            assert ("onset" in x["why"]) == (x["step"] == onset)


def check_naive(campaign):
    """Beside every seed-restricted pairing: each side's per-problem accuracy over all its own seeds, bootstrapped."""
    SG = read_json(campaign / "stats" / "student_gains.json")
    restricted = [g for g in SG["gains"] if g["audit"]["restricted"]]
    assert [g for g in SG["gains"] if "naive" in g] == restricted
    for g in restricted:
        a, b = per_problem(campaign / g["unit_a"]), per_problem(campaign / g["unit_b"])
        gain, ci95, p = boot_summary([b[q] - a[q] for q in sorted(a)])
        n = g["naive"]
        assert n["gain_pp"] == pytest.approx(gain, abs=1e-9) and n["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
        assert n["seeds_a"] == len(unit_seeds(campaign / g["unit_a"])) > g["n_seeds"]


def expected_hypotheses(campaign, pair="toy"):
    """lib/registry.py's hypotheses of the campaign's pair and of every other pair a run here trained on (the collapse
    arm's), each clause decided here from the artifacts: {name: (verdict, [clause results])}. A run belongs to the
    pair its args name (else the campaign's); a clause selects the runs whose args carry every (setting, value) of its
    `where`."""
    from lib.registry import HYPOTHESES
    SG = read_json(campaign / "stats" / "student_gains.json")
    runs = sorted(p.name for p in (campaign / "train").iterdir() if p.is_dir())
    args = {r: run_args(campaign, r) or {"reward": r.split("-seed")[0]} for r in runs}
    ev = campaign / "evals"
    a, b = per_problem(ev / "toy-pre" / "toy" / "sample4"), per_problem(ev / "toy-post" / "toy" / "sample4")
    gate_lo = boot_summary([b[q] - a[q] for q in sorted(a)])[1][0]
    trained = {pair} | {args[r].get("pair", pair) for r in runs}
    out = {}
    for h in (h for h in HYPOTHESES if h.pair in trained):
        res = []
        for c in h.clauses:
            sel = [r for r in runs if args[r].get("pair", pair) == h.pair and all(args[r].get(k) == v
                                                                                  for k, v in c.where)]
            met = {r: run_metrics(campaign, r) for r in sel}
            planned = {r: (read_json(campaign / "train" / r / "summary.json").get("steps")
                           if (campaign / "train" / r / "summary.json").exists() else None) for r in sel}
            if c.kind == "teacher_gate":     # measured for the campaign's own pair only
                res.append(("holds" if gate_lo > 0 else "fails") if h.pair == pair else "undecided")
            elif c.kind == "gain":
                rows = [e for e in SG["by_condition"] if e["protocol"] == "sample4"
                        and {g["run"] for g in e["per_seed"]} == set(sel)]
                res.append("undecided" if not rows else
                           "holds" if sum(e["decision"]["verdict"] == "gain" for e in rows) >= c.min_benchmarks
                           else "fails")
            elif not sel:
                res.append("undecided")
            elif c.kind == "no_collapse":
                if any(watch_of(met[r])[0] is not None and watch_of(met[r])[0] <= (c.through_step or planned[r] or 0)
                       for r in sel):
                    res.append("fails")
                elif any(planned[r] is None or met[r][-1]["step"] < (c.through_step or planned[r]) for r in sel):
                    res.append("undecided")
                else:
                    res.append("holds")
            elif c.kind == "held":           # every run under 0.1 at every logged step, and every run finished
                if any(watch_of(met[r])[2] >= 0.1 for r in sel):
                    res.append("fails")
                elif any(planned[r] is None or met[r][-1]["step"] < planned[r] for r in sel):
                    res.append("undecided")
                else:
                    res.append("holds")
            elif c.kind == "collapse":       # a run without onset fails it only once it ran all its planned steps
                quiet = [r for r in sel if watch_of(met[r])[0] is None]
                res.append("holds" if not quiet else "fails" if any(planned[r] and met[r][-1]["step"] >= planned[r]
                                                                     for r in quiet) else "undecided")
            elif c.kind == "reward_negative":
                res.append("holds" if all(met[r][0]["delta_opd/weighted_reward_mean"] < 0 for r in sel) else "fails")
        out[h.name] = ("fails" if "fails" in res else "undecided" if "undecided" in res else "holds", res)
    return out


def check_hypotheses(campaign):
    C = read_json(campaign / "stats" / "conditions.json")
    want = expected_hypotheses(campaign)
    got = {h["name"]: (h["verdict"], [c["result"] for c in h["clauses"]]) for h in C["hypotheses"]}
    assert got == want
    for h in C["hypotheses"]:
        assert h["failing"] == [i for i, r in enumerate(want[h["name"]][1], 1) if r == "fails"]


def check_roster(campaign):
    """Every training run and eval unit folder is on the roster once, with pending ones as pending.json lists them."""
    R = read_json(campaign / "stats" / "roster.json")["items"]
    P = read_json(campaign / "stats" / "pending.json")
    by = {r["item"]: r for r in R}
    assert len(by) == len(R)
    folders = {p.relative_to(campaign).as_posix() for p in (campaign / "evals").glob("*/*/*") if p.is_dir()}
    folders |= {p.relative_to(campaign).as_posix() for p in (campaign / "train").iterdir() if p.is_dir()}
    pend = {u["unit"] for u in P["units"]} | {r["dir"] for r in P["runs"]}
    assert folders | pend <= set(by)
    for item in pend:
        assert by[item]["status"] == "pending"
    for item in folders - pend:
        assert by[item]["status"] in ("found", "skipped") and by[item]["reason"]
    assert set(read_json(campaign / "stats" / "roster.json")["counts"].values()) and \
        sum(read_json(campaign / "stats" / "roster.json")["counts"].values()) == len(R)


def check_stats(campaign):
    """Every number of 05's JSON that the report leans on, recomputed here from samples.jsonl and the manifests."""
    S = campaign / "stats"
    T = read_json(S / "teacher_gains.json")
    ev = campaign / "evals"
    for t in T["gains"]:
        a, b = per_problem(ev / "toy-pre" / "toy" / t["protocol"]), per_problem(ev / "toy-post" / "toy" / t["protocol"])
        assert t["gain_pp"] == pytest.approx(100 * np.mean([b[p] - a[p] for p in a]), abs=1e-9)
    assert {t["protocol"] for t in T["gains"]} == {"sample4", "greedy"}
    SG = read_json(S / "student_gains.json")
    for g in SG["gains"]:      # every checkpoint against the init, the init restricted to the checkpoint's seeds
        seeds = unit_seeds(campaign / g["unit_b"])
        a, b = per_problem(campaign / g["unit_a"], seeds), per_problem(campaign / g["unit_b"])
        gain, ci95, p = boot_summary([b[q] - a[q] for q in sorted(a)])
        assert g["gain_pp"] == pytest.approx(gain, abs=1e-9) and g["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
        assert g["p"] == pytest.approx(p, abs=1e-12)
        assert g["training_seed"] == {"opd": 42, "opd-seed1": 1, "opd-seed2": 2, "delta-topk": 42}[g["run"]]
        assert g["latest"] == (g["step"] == 40)
    curve = [g for g in SG["gains"] if g["protocol"] == "curve8" and g["run"] == "delta-topk"]
    assert [g["step"] for g in curve] == [20, 40]
    for g in curve:
        assert g["unit_a"] == "evals/toy-student/toy/sample32" and g["audit"]["grids"] == "nested"
        assert g["audit"]["restricted"] == g["unit_a"] and g["n_seeds"] == 8
    # per condition (one per reward here: the runs of a reward share their settings): the latest checkpoint of every
    # seed, and the pooled gain
    assert all(e["condition"] == e["reward"] for e in SG["by_condition"])
    R = {(e["reward"], e["benchmark"], e["protocol"]): e for e in SG["by_condition"]}
    assert set(R) == {("opd", "toy", "sample4"), ("opd", "toy", "curve8"), ("delta-topk", "toy", "sample4"),
                      ("delta-topk", "toy", "greedy"), ("delta-topk", "toy", "curve8")}
    for (reward, _, proto), e in R.items():
        names = [n for n, rw, *_ in RUNS if rw == reward]
        assert sorted(g["run"] for g in e["per_seed"]) == sorted(names) and set(e["steps"]) == {40}
        assert e["training_seeds"] == sorted(e["training_seeds"])
        if len(names) > 1:
            dbar = np.zeros(N_PROBLEMS)
            for n in names:
                u = ev / f"{n}-step40" / "toy" / proto
                a, b = per_problem(campaign / e["per_seed"][0]["unit_a"], unit_seeds(u)), per_problem(u)
                dbar += np.array([b[q] - a[q] for q in sorted(a)]) / len(names)
            gain, ci95, p = boot_summary(dbar)
            pooled = e["pooled"]
            assert pooled["gain_pp"] == pytest.approx(gain, abs=1e-9) and pooled["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
            assert pooled["p"] == pytest.approx(p, abs=1e-12) and pooled["n_training_seeds"] == 3
            assert e["decision"]["on"] == "pooled" and e["decision"]["gain_pp"] == pooled["gain_pp"]
        else:
            assert e["pooled"] is None and e["decision"]["gain_pp"] == e["per_seed"][0]["gain_pp"]
    fam = list(R.values())
    adj = holm_step_down([e["decision"]["p"] for e in fam])
    for e, a in zip(fam, adj):
        d = e["decision"]
        assert d["p_holm"] == pytest.approx(a, abs=1e-12)
        lo, hi = d["ci95_pp"]
        assert d["verdict"] == ("gain" if a < 0.05 and lo > 0 else "loss" if a < 0.05 and hi < 0 else "not significant")
    assert SG["family"]["n_verdicts"] == 5 and SG["family"]["n_gains_tested"] == len(SG["gains"]) == 11
    TR = read_json(S / "transfer.json")
    assert TR["ratios"] and {r["reward"] for r in TR["ratios"]} == {"delta-topk"}    # classic OPD: no such ratio
    for r in TR["ratios"]:
        assert (r["ratio"] is None) == bool(r["failed"])
        assert ("student_positive" in r["failed"]) == (r["student_gain_pp"] <= 0)
    # cap view: π_post's samples over π_pre's 64-token cap, counted wrong
    C = read_json(S / "cap_sensitivity.json")["views"]
    rows = [json.loads(x) for x in (ev / "toy-post" / "toy" / "sample4" / "samples.jsonl").read_text().splitlines()]
    v = next(v for v in C if v["protocol"] == "sample4")
    assert v["over_cap_as_wrong"]["acc_b"] == pytest.approx(
        100 * np.mean([r["correct"] and r["n_tokens"] <= 64 for r in rows]), abs=1e-9)
    TRN = {r["run"]: r for r in read_json(S / "training.json")["runs"]}
    assert sorted(TRN) == sorted([n for n, *_ in RUNS] + ["delta-sampled"])      # the unfinished run: its 7 steps
    assert TRN["delta-sampled"]["status"] == "unfinished" and TRN["delta-sampled"]["steps_logged"] == 7
    for k, (name, reward, *_) in enumerate(RUNS):
        w = TRN[name]["watch"]
        assert TRN[name]["reward"] == reward and TRN[name]["seed"] == {"opd-seed1": 1, "opd-seed2": 2}.get(name, 42)
        if name == NO_ONSET_RUN:
            assert w["collapse_onset_step"] is None and w["collapse_band"] is None and w["longest_clip90_run"] == 0
            assert w["peak_clip_ratio"] == pytest.approx(0.4)
        else:
            assert w["collapse_onset_step"] == 28 + k and w["collapse_band"] == [28 + k, 40]
            assert w["longest_clip90_span"] == [31 + k, 40] and w["longest_clip90_run"] == 10 - k
        assert TRN[name]["watch_agrees"] and TRN[name]["checkpoints"] == [20, 40]
    P = read_json(S / "pending.json")
    assert [r["run"] for r in P["runs"]] == ["delta-sampled"] and P["runs"][0]["steps_logged"] == 7
    assert sorted(u["unit"] for u in P["units"]) == sorted(
        ["evals/toy-post/toy/sample32"] + [f"evals/{n}-step40/toy/greedy" for n in ("opd", "opd-seed1", "opd-seed2")])
    G = read_json(S / "gates.json")
    gm = read_json(campaign / "gates" / "manifest.json")
    assert G["present"] and {g["gate"]: g["status"] for g in G["gates"]} == gm["gates"]
    # the ledger keeps the run whose manifest the rerun overwrote
    led = read_json(S / "ledger.json")["runs"]
    raft = [r for r in led if r["dir"] == "raft"]
    assert sorted(r["wall_s"] for r in raft) == [RAFT_RERUN_WALL, RAFT_FIRST_WALL]
    check_conditions(campaign)
    check_summary(campaign)
    check_snapshots(campaign)
    check_naive(campaign)
    check_hypotheses(campaign)
    check_roster(campaign)


def test_stats_match_recomputation(campaign):
    check_stats(campaign)


# --- every number the report prints equals the cell it comes from ---

NUM = re.compile(r"(?<![A-Za-z_\d.])[+-]?\d+(?:\.\d+)?")   # a number, not the digit inside `sample4`


def tables(readme: str):
    """(header, rows, source line) for each markdown table."""
    lines, out, i = readme.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln.strip()[1:-1])]
                     for ln in lines[i:j]]
            assert lines[j] == "", "a table must end with a blank line (else markdown swallows the next line)"
            out.append((cells[0], cells[2:], lines[j + 1]))
            i = j
        else:
            i += 1
    return out


def close(tok: str, want) -> bool:
    """A printed number is the value it was printed from, formatted to the digits printed (exactly: 8.75 → "8.8",
    never "8.7"), sign as printed."""
    if want is None:
        return False
    nd = len(tok.split(".")[1]) if "." in tok else 0
    if isinstance(want, int) == bool(nd):   # a count printed as 40.0, or a measurement printed as a bare 0
        return False
    return f"{float(want):{'+' if tok[0] in '+-' else ''}.{nd}f}" == tok


def devices_counted(rows: list[dict]) -> str:
    """The report's devices cell for ledger rows, counted here: "<device> × <runs>", devices in sorted order."""
    names = sorted({r.get("devices") or "not recorded" for r in rows})
    return "; ".join(f"{d} × {sum((r.get('devices') or 'not recorded') == d for r in rows)}" for d in names)


def check_cell(cell: str, kind: str, want, where: str) -> int:
    cell = cell.replace("**", "").strip("`")
    if kind == "str":
        assert cell == str(want), f"{where}: {cell!r} != {want!r}"
        return 0
    if kind == "p":
        ok = cell == ("p<0.0001" if want == 0 else f"p={want:.4f}")
        assert ok, f"{where}: {cell!r} is not p = {want}"
        return 1
    if kind == "sum":                   # a sum of floats: 06 may add in another order, which moves only the last bit
        nd = len(cell.split(".")[1]) if "." in cell else 0
        sums = {f"{x:.{nd}f}" for x in (sum(want), math.fsum(want), sum(reversed(want)))}
        assert cell in sums, f"{where}: {cell!r} is not the sum {sorted(sums)}"
        return 1
    wants = [want] if kind == "num" else list(want)
    if wants == [None]:
        assert cell == "—", f"{where}: {cell!r} printed for a missing value"
        return 0
    toks = NUM.findall(cell)
    assert len(toks) == len(wants) and all(close(t, w) for t, w in zip(toks, wants)), f"{where}: {cell!r} != {wants}"
    return len(toks)


def first_last(run, key):
    pts = [v for _, v in run["curves"].get(key, []) if v is not None]
    return (pts[0], pts[-1]) if pts else (None, None)


def sig(r):
    lo, hi = r["ci95_pp"]
    return "gain" if lo > 0 else "loss" if hi < 0 else "not significant"


def gain_cols(acc_a, acc_b, gain="gain (pp)", ci_="95 % CI", p="p"):
    return {acc_a: ("num", lambda r: r["acc_a"]), acc_b: ("num", lambda r: r["acc_b"]), gain: ("num", lambda r: r["gain_pp"]),
            ci_: ("nums", lambda r: r["ci95_pp"]), p: ("p", lambda r: r["p"])}


def table_specs(campaign):
    """For each report table: the records its rows come from (read from the source files, not from 06), the columns
    that identify a record, and for every other column the cell it must equal."""
    J = lambda rel: read_json(campaign / rel)
    T, SG, TR = J("stats/teacher_gains.json"), J("stats/student_gains.json"), J("stats/transfer.json")
    DG, CAP, TRN, RAFT = J("stats/diagnostics.json")["units"], J("stats/cap_sensitivity.json"), J("stats/training.json"), J("stats/raft.json")
    PEND, LED = J("stats/pending.json"), J("stats/ledger.json")["runs"]
    rs, gm = J("raft/stats.json"), J("gates/manifest.json")
    gates = {n: J(f"gates/{n}.json") for n in gm["gates"]}
    diag = {d["unit"]: d for d in DG}
    lvl = lambda entries: [dict(r, _e=e, _lv=lv) for e in entries for lv, r in e["by_level"].items()]
    lvl_cols = {**gain_cols("a acc", "b acc"), "verdict": ("str", sig), "problems": ("num", lambda r: r["n_problems"])}
    an = gates.get("anatomy")
    measures = {} if an is None else {"sequences": an["n_sequences"], "tokens": an["n_tokens"], "token-mean Δ": an["token_mean_delta"],
                "student-weighted mean Δ": an["student_weighted_mean"], "fraction of tokens with Δ > 0": an["pos_frac"],
                "… of those with |Δ| ≥ the tie tolerance": an["pos_frac_decided"],
                "mean abs Δ": an["abs_mean_delta"], "interior-token mean Δ": an["interior_mean_delta"],
                "Δ at the final stop token (mean)": an["stop"]["mean_delta"], "stopped sequences": an["stop"]["n"],
                "log p(stop) at answer ends, π_pre": an["logp_stop_at_answer_end"]["pi_pre"],
                "log p(stop) at answer ends, π_post": an["logp_stop_at_answer_end"]["pi_post"],
                "student accuracy on these samples": an["accuracy"], "stop rate": an["stop_rate"],
                "AUROC of sequence-mean Δ, length-controlled": an["auroc"]["length_controlled"]}
    by_cond = [dict(g, _e=e, _row=f"seed {g['training_seed']}") for e in SG["by_condition"] for g in e["per_seed"]]
    by_cond += [dict(e["decision"], _e=e, _row=f"{e['decision']['on']} (decides)",
                       acc_a=(e["pooled"] or e["per_seed"][0])["acc_a"], acc_b=(e["pooled"] or e["per_seed"][0])["acc_b"])
                for e in SG["by_condition"]]
    on_disk = [p for p in campaign.rglob("manifest.json") if p.parent.relative_to(campaign).parts[0] != "report"]
    manifests = [(p.parent.relative_to(campaign).as_posix(), read_json(p)) for p in on_disk]
    now = {(d, m["stage"], m["started"], m["ended"], m["wall_s"]) for d, m in manifests}
    dirs = {d for d, _ in manifests}
    earlier = [dict(r, kind="earlier run (overwritten manifest)" if r["dir"] in dirs else "earlier run (folder removed)")
               for r in LED if (r["dir"], r["stage"], r["started"], r["ended"], r["wall_s"]) not in now]
    ledger_rows = [{"dir": d, "stage": m["stage"], "started": m["started"], "wall_s": m["wall_s"], "gpu_s": m["gpu_s"],
                    "kind": "latest", "devices": ", ".join(m["devices"])} for d, m in manifests] + earlier
    stage_rows = [{"stage": s, "rows": [r for r in ledger_rows if r["stage"] == s]} for s in {r["stage"] for r in ledger_rows}]
    stage_rows.append({"stage": "**total**".strip("*"), "rows": ledger_rows})
    primary = {"toy": "sample4"}
    COND, ROS = J("stats/conditions.json"), J("stats/roster.json")["items"]
    dec = lambda k, nd=None: (lambda r: r["decision"][k] if r["decision"] else None)
    steps_text = lambda xs: ", ".join("—" if x is None else str(x) for x in xs) or "—"
    snaps = [dict(x, _run=r["run"], _cond=r["condition"]) for r in TRN["runs"] for x in r["snapshots"]]
    ROLL = J("stats/rollouts.json")
    trunc_cols = {"samples": ("num", lambda r: r["n_samples"]), "trunc %": ("num", lambda r: r["truncation_pct"]),
                  "truncated samples": ("num", lambda r: r["n_truncated"]), "extracted": ("num", lambda r: r["n_extracted"]),
                  "extracted %": ("num", lambda r: r["extracted_pct"]), "correct": ("num", lambda r: r["n_extracted_correct"]),
                  "correct of extracted %": ("num", lambda r: r["correct_of_extracted_pct"]),
                  "reached %": ("num", lambda r: r["reached_pct"]),
                  "truncated that reached %": ("num", lambda r: r["truncated_reached_pct"])}
    clauses = [dict(c, _h=h["name"]) for h in COND["hypotheses"] for c in h["clauses"]]
    XA = [r for r in (J("stats/gates.json").get("anatomy_cross") or {}).get("pairs", []) if r["status"] == "scored"]
    lps = lambda role: ("num", lambda r: r["logp_stop_at_answer_end"][role])
    share = lambda k: ("num", lambda r: None if r[k] is None else 100 * r[k])
    return [
        (["pair", "π_pre", "π_post", "tokens"], XA, {"pair": lambda r: r["pair"]},
         {"π_pre": ("str", lambda r: r["pi_pre"]), "π_post": ("str", lambda r: r["pi_post"]),
          "tokens": ("num", lambda r: r["n_tokens"]), "mean Δ": ("num", lambda r: r["token_mean_delta"]),
          "% Δ > 0": share("pos_frac"), "% Δ > 0 where decided": share("pos_frac_decided"),
          "mean abs Δ": ("num", lambda r: r["abs_mean_delta"]), "Δ at stop": ("num", lambda r: r["stop"]["mean_delta"]),
          "stops": ("num", lambda r: r["stop"]["n"]), "log p(stop) student": lps("student"),
          "log p(stop) π_pre": lps("pi_pre"), "log p(stop) π_post": lps("pi_post"),
          "AUROC": ("num", lambda r: r["auroc"].get("length_controlled")),
          "AUROC CI": ("nums", lambda r: r["auroc"].get("ci95") or [None])}),
        (["condition", "id", "reward", "runs"], COND["conditions"], {"condition": lambda r: r["name"]},
         {"id": ("str", lambda r: r["id"]), "reward": ("str", lambda r: r["reward"]),
          "runs": ("str", lambda r: ", ".join(r["runs"])), "training seeds": ("nums", lambda r: r["seeds"]),
          "status": ("str", lambda r: "; ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items())))}),
        (["condition", "benchmark", "protocol", "runs"], COND["summary"],
         {"condition": lambda r: r["condition"], "benchmark": lambda r: r["benchmark"] or "(training only)"},
         {"protocol": ("str", lambda r: r["protocol"] or "—"), "runs": ("num", lambda r: len(r["runs"])),
          "gain (pp)": ("num", dec("gain_pp")),
          "95 % CI": ("nums", lambda r: r["decision"]["ci95_pp"] if r["decision"] else [None]),
          "Holm p": ("num", dec("p_holm")), "verdict": ("str", lambda r: r["decision"]["verdict"] if r["decision"] else "—"),
          "onset steps": ("str", lambda r: steps_text(r["onset_steps"])),
          "runaway steps": ("str", lambda r: steps_text(r["runaway_steps"])),
          "collapsed": ("nums", lambda r: [r["n_collapsed"], len(r["runs"])]),
          "peak clip": ("num", lambda r: r["peak_clip_ratio"]),
          "eval truncation %": ("num", lambda r: r["mean_truncation_pct"])}),
        (["condition", "run", "step", "shown at"], snaps, {"run": lambda r: r["_run"], "step": lambda r: str(r["step"])},
         {"condition": ("str", lambda r: r["_cond"]), "shown at": ("str", lambda r: ", ".join(r["why"])), "mean length": ("num", lambda r: r["response_length/mean"]),
          "clip ratio": ("num", lambda r: r["response_length/clip_ratio"]),
          "reward mean": ("num", lambda r: r["delta_opd/weighted_reward_mean"]),
          "KL coef": ("num", lambda r: r["actor/kl_coef"]), "entropy": ("num", lambda r: r["actor/entropy"]),
          "grad norm": ("num", lambda r: r["actor/grad_norm"])}),
        (["run", "step", "benchmark", "protocol", "paired gain"], SG["gains"],
         {"run": lambda r: r["run"], "step": lambda r: str(r["step"]), "benchmark": lambda r: r["benchmark"],
          "protocol": lambda r: r["protocol"]},
         {"paired gain": ("num", lambda r: r["gain_pp"]), "paired CI": ("nums", lambda r: r["ci95_pp"]),
          "paired CI width": ("num", lambda r: r["ci95_pp"][1] - r["ci95_pp"][0]),
          "seeds paired": ("num", lambda r: r["n_seeds"]),
          "naive gain": ("num", lambda r: r["naive"]["gain_pp"] if "naive" in r else None),
          "naive CI": ("nums", lambda r: r["naive"]["ci95_pp"] if "naive" in r else [None]),
          "init seeds naive": ("num", lambda r: r["naive"]["seeds_a"] if "naive" in r else None),
          "unpaired CI": ("nums", lambda r: r["unpaired"]["ci95_pp"]),
          "unpaired CI width": ("num", lambda r: r["unpaired"]["ci95_pp"][1] - r["unpaired"]["ci95_pp"][0])}),
        (["condition", "run", "step", "benchmark", "protocol", "pair"], SG["vs_post"],
         {"condition": lambda r: r["condition"], "run": lambda r: r["run"], "step": lambda r: str(r["step"]),
          "benchmark": lambda r: r["benchmark"], "protocol": lambda r: r["protocol"]},
         {"pair": ("str", lambda r: r["pair"]), **gain_cols("π_post acc", "ckpt acc"), "verdict": ("str", sig),
          "seeds": ("num", lambda r: r["n_seeds"])}),
        (["condition", "benchmark", "protocol", "seeds"], ROLL["truncated_extraction"]["conditions"],
         {"condition": lambda r: r["condition"], "benchmark": lambda r: r["benchmark"],
          "protocol": lambda r: r["protocol"]}, {"seeds": ("nums", lambda r: r["training_seeds"]), **trunc_cols}),
        (["unit", "role", "step", "kind"], [dict(e, _x=x) for x in ROLL["excerpts"] for e in x["excerpts"]],
         {"unit": lambda r: r["_x"]["unit"], "kind": lambda r: r["kind"]},
         {"role": ("str", lambda r: r["_x"]["role"]), "step": ("num", lambda r: r["_x"]["step"]),
          "problem": ("str", lambda r: r["problem_id"]), "seed": ("num", lambda r: r["seed"]),
          "tokens": ("num", lambda r: r["n_tokens"]), "cap hit": ("str", lambda r: "truncated" if r["truncated"] else "stopped"),
          "extractor": ("str", lambda r: r["extractor"]), "extracted": ("str", lambda r: r["extracted"] or "—"),
          "correct": ("str", lambda r: "yes" if r["correct"] else "no"), "repeats": ("num", lambda r: r["max_line_repeats"]),
          "chars left out": ("num", lambda r: r["chars_left_out"]),
          "excerpt": ("str", lambda r: r["excerpt"].replace("`", "'").replace("\n", " ⏎ "))}),
        (["hypothesis", "clause", "result"], clauses, {"hypothesis": lambda r: r["_h"], "clause": lambda r: str(r["clause"])},
         {"result": ("str", lambda r: r["result"]), "what it says": ("str", lambda r: r["text"]),
          "measured": ("str", lambda r: r["detail"] or "—")}),
        (["item", "kind", "status", "reason"], ROS, {"item": lambda r: r["item"]},
         {"kind": ("str", lambda r: r["kind"]), "status": ("str", lambda r: r["status"]),
          "reason": ("str", lambda r: r["reason"])}),
        (["benchmark", "protocol", "π_pre acc", "π_post acc", "gain (pp)", "95 % CI", "p", "problems", "seeds"],
         T["gains"], {"benchmark": lambda r: r["benchmark"], "protocol": lambda r: r["protocol"]},
         {**gain_cols("π_pre acc", "π_post acc"), "problems": ("num", lambda r: r["n_problems"]),
          "seeds": ("num", lambda r: r["n_seeds"])}),
        (["benchmark", "protocol", "comparison", "level"], lvl(T["gains"]),
         {"benchmark": lambda r: r["_e"]["benchmark"], "protocol": lambda r: r["_e"]["protocol"],
          "comparison": lambda r: "π_post − π_pre", "level": lambda r: r["_lv"]}, lvl_cols),
        (["gate", "verdict"], list(gates.values()), {"gate": lambda r: r["gate"]},
         {"verdict": ("str", lambda r: gm["gates"][r["gate"]]),
          "allowed": ("str", lambda r: "yes" if r["gate"] in gm["allowed"] else "no"),
          "kept from an earlier run": ("str", lambda r: "yes" if r["gate"] in gm["carried"] else "no"),
          "summary": ("str", lambda r: r["summary"]), "failures": ("str", lambda r: "; ".join(r["reasons"]) or "—"),
          "warnings": ("str", lambda r: "; ".join(r["warnings"]) or "—")}),
        (["measure", "value"], list(measures), {"measure": lambda r: r}, {"value": ("num", measures.get)}),
        (["run", "reward", "training seed"], TRN["runs"], {"run": lambda r: r["run"]},
         {"reward": ("str", lambda r: r["reward"]), "training seed": ("num", lambda r: r["seed"]),
          "status": ("str", lambda r: r["status"]),
          "steps": ("num", lambda r: r["steps_logged"]), "onset": ("num", lambda r: r["watch"]["collapse_onset_step"]),
          "runaway": ("num", lambda r: r["watch"]["length_runaway_step"]),
          "band": ("nums", lambda r: r["watch"]["collapse_band"] or [None]),
          "clip>0.9 span": ("nums", lambda r: r["watch"]["longest_clip90_span"] or [None]),
          "peak clip": ("num", lambda r: r["watch"]["peak_clip_ratio"]),
          "reward mean first": ("num", lambda r: r["weighted_reward"]["first"]),
          "reward mean last": ("num", lambda r: r["weighted_reward"]["last"]),
          "reward mean < 0": ("nums", lambda r: [r["weighted_reward"]["n_negative"], r["weighted_reward"]["n"]]),
          "KL coef first": ("num", lambda r: first_last(r, "actor/kl_coef")[0]),
          "KL coef last": ("num", lambda r: first_last(r, "actor/kl_coef")[1]),
          "entropy first": ("num", lambda r: first_last(r, "actor/entropy")[0]),
          "entropy last": ("num", lambda r: first_last(r, "actor/entropy")[1]),
          "grad-norm peak": ("nums", lambda r: [r["grad_norm_peak"]["value"], r["grad_norm_peak"]["step"]]),
          "summary.json agrees": ("str", lambda r: "yes" if r["watch_agrees"] else "NO")}),
        (["run", "step", "unit"], SG["gains"],
         {"run": lambda r: r["run"], "step": lambda r: str(r["step"]), "unit": lambda r: r["alias_b"],
          "benchmark": lambda r: r["benchmark"], "protocol": lambda r: r["protocol"]},
         {**gain_cols("init acc", "ckpt acc"), "verdict": ("str", sig), "problems": ("num", lambda r: r["n_problems"]),
          "seeds": ("num", lambda r: r["n_seeds"]),
          "ckpt truncation %": ("num", lambda r: diag[r["unit_b"]]["truncation_pct"])}),
        (["run", "step", "benchmark", "protocol", "level"], lvl(SG["gains"]),
         {"run": lambda r: r["_e"]["run"], "step": lambda r: str(r["_e"]["step"]),
          "benchmark": lambda r: r["_e"]["benchmark"], "protocol": lambda r: r["_e"]["protocol"],
          "level": lambda r: r["_lv"]}, lvl_cols),
        (["condition", "benchmark", "protocol", "row"], by_cond,
         {"condition": lambda r: r["_e"]["condition"], "benchmark": lambda r: r["_e"]["benchmark"],
          "protocol": lambda r: r["_e"]["protocol"], "row": lambda r: r["_row"]},
         {**gain_cols("init acc", "ckpt acc"), "step": ("num", lambda r: r.get("step")),
          "Holm p": ("num", lambda r: r.get("p_holm")), "verdict": ("str", lambda r: r.get("verdict") or sig(r))}),
        (["run", "step", "benchmark", "protocol", "teacher protocol"], [r for r in TR["ratios"] if r["latest"]],
         {"run": lambda r: r["run"], "step": lambda r: str(r["step"]), "benchmark": lambda r: r["benchmark"],
          "protocol": lambda r: r["protocol"]},
         {"teacher protocol": ("str", lambda r: r["teacher_protocol"]), "teacher gain": ("num", lambda r: r["teacher_gain_pp"]),
          "teacher CI": ("nums", lambda r: r["teacher_ci95_pp"]), "student gain": ("num", lambda r: r["student_gain_pp"]),
          "student CI": ("nums", lambda r: r["student_ci95_pp"]),
          "ratio": ("str", lambda r: f"{r['ratio']:.3f}" if r["ratio"] is not None else "withheld: " + ", ".join(r["failed"]))}),
        (["unit", "role", "cap"], DG, {"unit": lambda r: r["unit"]},
         {"role": ("str", lambda r: r["role"]), "cap": ("num", lambda r: r["max_new_tokens"]),
          "samples": ("num", lambda r: r["n_samples"]), "acc %": ("num", lambda r: r["accuracy_pct"]),
          "trunc %": ("num", lambda r: r["truncation_pct"]), "mean tokens": ("num", lambda r: r["mean_tokens"]),
          **{f"{e} %": ("num", lambda r, e=e: r["extractor_pct"][e]) for e in ("answer_line", "boxed", "none")},
          "deviations": ("str", lambda r: "; ".join(r["deviations"]) or "—")}),
        (["benchmark", "model", "role"], [d for d in DG if primary.get(d["benchmark"]) == d["protocol"]],
         {"benchmark": lambda r: r["benchmark"], "model": lambda r: r["alias"]},
         {"role": ("str", lambda r: r["role"]), "step": ("num", lambda r: r["train_step"]),
          **{f"{e} %": ("num", lambda r, e=e: r["extractor_pct"][e]) for e in ("answer_line", "boxed", "none")}}),
        (["unit", "role", "condition", "step"], ROLL["truncated_extraction"]["units"], {"unit": lambda r: r["unit"]},
         {"role": ("str", lambda r: r["role"]), "condition": ("str", lambda r: r["condition"] or "—"),
          "step": ("num", lambda r: r["step"]), **trunc_cols,
          "acc on truncated %": ("num", lambda r: diag[r["unit"]]["truncated_accuracy_pct"])}),
        (["benchmark", "protocol", "π_pre cap", "view"],
         [dict(r, _v=v, _name=n) for v in CAP["views"] for n, r in (("native", v["native"]),
          ("over-cap-as-wrong", v["over_cap_as_wrong"]), ("kept-only", v["kept_only"])) if r is not None],
         {"benchmark": lambda r: r["_v"]["benchmark"], "protocol": lambda r: r["_v"]["protocol"], "view": lambda r: r["_name"]},
         {"π_pre cap": ("num", lambda r: r["_v"]["cap"]), "π_post acc": ("num", lambda r: r["acc_b"]),
          "gain (pp)": ("num", lambda r: r["gain_pp"]), "95 % CI": ("nums", lambda r: r["ci95_pp"]), "p": ("p", lambda r: r["p"]),
          "problems": ("num", lambda r: r["n_problems"]), "samples within cap %": ("num", lambda r: r["_v"]["kept_sample_pct"])}),
        (["prompts", "k", "kept"], [rs], {"prompts": lambda r: str(r["n_prompts"])},
         {"k": ("num", lambda r: r["k"]), "kept": ("num", lambda r: r["kept"]), "keep rate %": ("num", lambda r: r["keep_rate_pct"]),
          "gate G1": ("nums", lambda r: [r["gate_g1"]["threshold"]]),
          "mean abs Δ log p per token": ("num", lambda r: r["shift_abs_dlogp_per_token"]),
          "EOS probe π_pre": ("num", lambda r: r["eos_probe"]["pi_pre"]), "EOS probe RAFT": ("num", lambda r: r["eos_probe"]["raft"])}),
        (["level", "keep rate %"], list(rs["keep_rate_by_level_pct"]), {"level": lambda r: r},
         {"keep rate %": ("num", rs["keep_rate_by_level_pct"].get)}),
        (["n correct of k", "prompts"], list(rs["n_correct_of_k"]), {"n correct of k": lambda r: r},
         {"prompts": ("num", rs["n_correct_of_k"].get)}),
        (["rejection reason", "samples"], list(rs["rejection_reasons"]), {"rejection reason": lambda r: r},
         {"samples": ("num", rs["rejection_reasons"].get)}),
        (["SFT step", "val loss"], rs["sft"]["val_loss"], {"SFT step": lambda r: str(r[0])}, {"val loss": ("num", lambda r: r[1])}),
        (["benchmark", "protocol", "base acc", "RAFT acc"], RAFT["g2_gains"],
         {"benchmark": lambda r: r["benchmark"], "protocol": lambda r: r["protocol"]},
         {**gain_cols("base acc", "RAFT acc"), "problems": ("num", lambda r: r["n_problems"])}),
        (["unit a", "unit b"], T["gains"] + SG["gains"] + RAFT["g2_gains"],
         {"unit a": lambda r: r["unit_a"], "unit b": lambda r: r["unit_b"]},
         {"problems": ("num", lambda r: r["audit"]["n_problems"]), "seeds a": ("num", lambda r: r["audit"]["seeds_a"]),
          "seeds b": ("num", lambda r: r["audit"]["seeds_b"]), "grids": ("str", lambda r: r["audit"]["grids"]),
          "restricted side": ("str", lambda r: r["audit"]["restricted"] or "—"),
          "problem subset": ("str", lambda r: r["audit"]["subset"] or "—")}),
        (["stage", "runs"], stage_rows, {"stage": lambda r: r["stage"]},
         {"runs": ("num", lambda r: len(r["rows"])), "wall-clock s": ("sum", lambda r: [x["wall_s"] for x in r["rows"]]),
          "GPU-seconds": ("sum", lambda r: [x["gpu_s"] for x in r["rows"]]),
          "devices (runs)": ("str", lambda r: devices_counted(r["rows"]))}),
        (["directory", "stage", "run", "started"], ledger_rows,
         {"directory": lambda r: r["dir"], "stage": lambda r: r["stage"], "run": lambda r: r["kind"],
          "started": lambda r: r["started"], "wall-clock s": lambda r: f"{r['wall_s']:.1f}"},
         {
          "GPU-seconds": ("num", lambda r: r["gpu_s"]), "devices": ("str", lambda r: r["devices"])}),
        (["item", "what"], PEND["runs"] + PEND["units"], {"item": lambda r: r.get("dir") or r["unit"]},
         {"what": ("str", lambda r: "training run" if "dir" in r else "eval unit"),
          "detail": ("str", lambda r: f"reward {r['reward']}, seed {r['seed']}, {r['steps_logged']} steps logged"
                     if "dir" in r else r["why"])}),
    ]


def check_tables(campaign) -> int:
    readme = (campaign / "report" / "README.md").read_text()
    specs, checked = table_specs(campaign), 0
    found = tables(readme)
    for head, rows, source in found:
        assert source.startswith("Source: "), f"table {head} names no source"
        match = [s for s in specs if head[:len(s[0])] == s[0]]
        assert match, f"table {head} has no checker: every number the report prints must be checked"
        _, records, key, cols = match[0]
        assert set(head) == set(key) | set(cols), f"table {head}: unchecked columns {set(head) - set(key) - set(cols)}"
        want = {tuple(str(f(r)) for f in key.values()): r for r in records}
        assert len(want) == len(records), f"table {head}: key columns do not identify its records"
        idx = {c: head.index(c) for c in head}
        got = [tuple(row[idx[c]].replace("**", "").strip("`") for c in key) for row in rows]
        assert sorted(got) == sorted(want), f"table {head}: rows {sorted(set(got) ^ set(want))} differ from the source"
        for k, row in zip(got, rows):
            for c, (kind, f) in cols.items():
                checked += check_cell(row[idx[c]], kind, f(want[k]), f"table {head[:3]} row {k} column {c!r}")
        for c in (c for c, (kind, _) in cols.items() if kind != "str"):   # one spelling per numeric column
            digits = {len(tok.split(".")[1]) for row in rows for tok in NUM.findall(row[idx[c]]) if "." in tok}
            assert len(digits) <= 1, f"table {head[:3]} column {c!r} prints numbers with {sorted(digits)} decimals"
    return checked


def check_tldr(campaign) -> None:
    """The TL;DR's decisions: per reward on its latest evaluated checkpoint (pooled over seeds), Holm-adjusted."""
    readme = (campaign / "report" / "README.md").read_text()
    tldr = readme.split("## 0. TL;DR")[1].split("## 1.")[0].strip().splitlines()
    SG = read_json(campaign / "stats" / "student_gains.json")
    T = read_json(campaign / "stats" / "teacher_gains.json")
    gate = next(t for t in T["gains"] if t["protocol"] == T["gate"]["protocol"])
    g = re.search(r"π_post − π_pre = (\S+) \[(\S+), (\S+)\] (p\S+) ", tldr[0])
    assert close(g[1], gate["gain_pp"]) and close(g[2], gate["ci95_pp"][0]) and close(g[3], gate["ci95_pp"][1])
    check_cell(g[4], "p", gate["p"], "TL;DR gate")
    assert tldr[0].endswith(f"{g[4]} ({T['gate']['reason']}).")
    verdicts = [m for m in (re.search(
        r"`(\S+)` \((.*?)\) on (\w+)/(\w+), latest evaluated checkpoint \(step ([\d, ]+)\), (pooled over training seeds "
        r"([\d, ]+)|training seed (\d+)): gain (\S+) \[(\S+), (\S+)\] (p\S+), Holm-adjusted p = (\S+) → \*\*(.+)\*\*\.$", ln)
        for ln in tldr) if m]
    want = {(e["condition"], e["benchmark"], e["protocol"]): e for e in SG["by_condition"] if e["protocol"] == "sample4"}
    assert sorted((m[1], m[3], m[4]) for m in verdicts) == sorted(want)
    for m in verdicts:
        e = want[(m[1], m[3], m[4])]
        d = e["decision"]
        assert ("shift" in m[2]) == (e["reward"] != "opd"), f"{m[1]} described as {m[2]!r}"
        assert [int(x) for x in (m[7] or m[8]).split(", ")] == e["training_seeds"] and bool(m[7]) == bool(e["pooled"])
        assert {int(x) for x in m[5].split(", ")} == set(e["steps"])
        assert close(m[9], d["gain_pp"]) and close(m[10], d["ci95_pp"][0]) and close(m[11], d["ci95_pp"][1])
        check_cell(m[12], "p", d["p"], "TL;DR verdict")
        assert close(m[13], d["p_holm"]) and m[14] == d["verdict"]
    mc = next(ln for ln in tldr if "Multiple comparisons" in ln)
    fam, scan = SG["family"], SG["scan"]
    assert re.search(rf": {fam['n_verdicts']} verdicts .* adjusted p < {fam['alpha']} and a CI excluding 0\. In all {scan['n']} paired student gains .* "
                     rf"{scan['positive_significant']} have a CI above 0 and {scan['negative_significant']} below 0", mc)
    seen = {0, *(tldr.index(m.string) for m in verdicts), tldr.index(mc)}
    P = read_json(campaign / "stats" / "pending.json")
    k = next(i for i, ln in enumerate(tldr) if "Pending:" in ln)
    assert tldr[k].endswith(f"Pending: {len(P['runs'])} training run(s) and {len(P['units'])} eval unit(s) are not "
                            f"finished and are not counted (§9).")
    gm = read_json(campaign / "gates" / "manifest.json")
    k2 = next(i for i, ln in enumerate(tldr) if "Gates of pair" in ln)
    assert re.findall(r"(\w+) \*\*(PASS|FAIL)\*\*", tldr[k2]) == sorted(gm["gates"].items())
    assert tldr[k2].endswith(" (§1.1).") and "### 1.1 Gates of the main pair" in readme
    seen |= {k, k2}
    TRN = {r["run"]: r for r in read_json(campaign / "stats" / "training.json")["runs"]}
    for i, ln in enumerate(tldr):
        m = re.search(r"Run `(\S+)` \((\d+) steps\): termination collapse, onset step (\d+) \(band (\d+)–(\d+)\); "
                      r"(.+) mean negative on (\d+) of (\d+) steps\.$", ln)
        if m:
            r, seen = TRN[m[1]], seen | {i}
            w, wr = r["watch"], r["weighted_reward"]
            assert [int(x) for x in (m[2], m[3], m[4], m[5], m[7], m[8])] == [
                r["steps_logged"], w["collapse_onset_step"], *w["collapse_band"], wr["n_negative"], wr["n"]]
            assert m[6] == ("OPD reward" if r["reward"] == "opd" else "weighted shift reward")
        m = re.search(r"Run `(\S+)` \((\d+) steps\): no collapse onset \(peak clip ratio (\S+?)(, not below the 0\.1 a "
                      r"held run stays under)?\); (.+) mean negative on (\d+) of (\d+) steps\.$", ln)
        if m:
            r, seen = TRN[m[1]], seen | {i}
            w, wr = r["watch"], r["weighted_reward"]
            assert w["collapse_onset_step"] is None and int(m[2]) == r["steps_logged"]
            assert close(m[3], w["peak_clip_ratio"]) and bool(m[4]) == (w["peak_clip_ratio"] >= 0.1), ln
            assert [int(m[6]), int(m[7])] == [wr["n_negative"], wr["n"]]
    assert any("no collapse onset" in ln and "not below" in ln for ln in tldr)      # the fixture's NO_ONSET_RUN
    hyp = expected_hypotheses(campaign)
    k7 = next(i for i, ln in enumerate(tldr) if "Hypotheses of pair" in ln)
    got = re.findall(r"`(\S+)` \*\*(\w+)\*\*(?: \(clause ([\d, ]+) (fails|undecided)\))?", tldr[k7])
    assert sorted(got) == sorted((n, v, ", ".join(str(i) for i, r in enumerate(res, 1) if r == v) if v != "holds"
                                  else "", v if v != "holds" else "") for n, (v, res) in hyp.items())
    seen |= {k7}
    TR = read_json(campaign / "stats" / "transfer.json")["ratios"]
    k3 = next(i for i, ln in enumerate(tldr) if "Direct-OPD transfer ratio" in ln)
    got = re.findall(r"(\S+)@(\d+) (\w+)/(\w+): (ratio \S+|withheld \(([^)]*)\))", tldr[k3])
    assert sorted((a, int(b), c, d, f) for a, b, c, d, _, f in got) == sorted(
        (r["run"], r["step"], r["benchmark"], r["protocol"], ", ".join(r["failed"])) for r in TR if r["latest"])
    CAP = read_json(campaign / "stats" / "cap_sensitivity.json")["views"]
    v = next(v for v in CAP if v["protocol"] == "sample4")
    k4 = next(i for i, ln in enumerate(tldr) if "Cap sensitivity" in ln)
    m = re.search(r"π_pre's (\d+) tokens, over-cap-as-wrong gain (\S+) \[(\S+), (\S+)\] (\S+) \(native (\S+) \[(\S+), "
                  r"(\S+)\] (\S+)\)\.$", tldr[k4])
    assert int(m[1]) == v["cap"]
    for (g, lo, hi, p), r in (((m[2], m[3], m[4], m[5]), v["over_cap_as_wrong"]), ((m[6], m[7], m[8], m[9]), v["native"])):
        assert close(g, r["gain_pp"]) and close(lo, r["ci95_pp"][0]) and close(hi, r["ci95_pp"][1])
        check_cell(p, "p", r["p"], "TL;DR cap")
    DG = {(d["train_run"], d["train_step"], d["protocol"], d["role"]): d for d in read_json(campaign / "stats" / "diagnostics.json")["units"]}
    init = next(d for d in DG.values() if d["role"] == "student_init" and d["protocol"] == "sample4")
    k5 = next(i for i, ln in enumerate(tldr) if "Style and termination" in ln)
    parts = re.findall(r"`(\S+)`@(\d+) answer_line (\S+) % → (\S+) %, boxed (\S+) % → (\S+) %, truncation (\S+) % → "
                       r"(\S+) %", tldr[k5])
    assert sorted(p[0] for p in parts) == sorted(n for n, *_ in RUNS)
    for run, step, *nums in parts:
        d = DG[(run, int(step), "sample4", "checkpoint")]
        want = [init["extractor_pct"]["answer_line"], d["extractor_pct"]["answer_line"], init["extractor_pct"]["boxed"],
                d["extractor_pct"]["boxed"], init["truncation_pct"], d["truncation_pct"]]
        assert all(close(a, b) for a, b in zip(nums, want)), (run, nums, want)
    k6 = len(tldr) - 1
    ledger_rows = next(s for s in table_specs(campaign) if s[0][0] == "directory")[1]
    m = re.search(r"Time: (\d+) stage runs, (\S+) s wall-clock, (\S+) GPU-seconds; runs by the devices they saw: "
                  r"(.+) \(time ledger below\)", tldr[k6])
    assert int(m[1]) == len(ledger_rows)
    check_cell(m[2], "sum", [r["wall_s"] for r in ledger_rows], "TL;DR time")
    check_cell(m[3], "sum", [r["gpu_s"] for r in ledger_rows], "TL;DR time")
    check_cell(m[4], "str", devices_counted(ledger_rows), "TL;DR devices")
    seen |= {k3, k4, k5, k6}
    assert seen == set(range(len(tldr))), f"TL;DR lines without a check: {[tldr[i] for i in set(range(len(tldr))) - seen]}"
    assert not re.search(r"\bnull\b|terminal checkpoint|capability transfer detected", readme)


def check_report(campaign) -> None:
    """AssertionError when any printed number is not its source cell (a lookup that fails counts as a mismatch)."""
    try:
        assert check_tables(campaign) > 400
        check_tldr(campaign)
    except (KeyError, StopIteration, TypeError, ValueError, IndexError) as e:
        raise AssertionError(f"the report does not match its sources: {type(e).__name__}: {e}") from e


def test_every_report_number_equals_its_source_cell(campaign):
    rep = campaign / "report"
    manifest = read_json(rep / "MANIFEST.json")["files"]
    for rel, sha in manifest.items():                            # the MANIFEST is true
        assert sha256_file(campaign / rel) == sha, rel
    check_report(campaign)
    readme = (rep / "README.md").read_text()
    tldr = readme.split("## 0. TL;DR")[1].split("## 1.")[0].strip().splitlines()
    tot = next(ln for ln in tldr if ". Time: " in ln)
    ms = [read_json(p) for p in campaign.rglob("manifest.json") if "report" not in p.parts]
    n, wall = len(ms) + 2, sum(m["wall_s"] for m in ms) + RAFT_FIRST_WALL   # + the overwritten RAFT and 05 runs
    now05 = read_json(campaign / "stats" / "manifest.json")         # the earlier 05 run: another (start, end, wall)
    first05 = next(r for r in read_json(campaign / "stats" / "ledger.json")["runs"] if r["stage"] == "05_stats"
                   and (r["started"], r["ended"], r["wall_s"]) != (now05["started"], now05["ended"], now05["wall_s"]))
    assert f"Time: {n} stage runs, {wall + first05['wall_s']:.1f} s wall-clock" in tot


# --- the checks bite: a mutated 05 / 06 is caught ---

REPORT_MUTANTS = {   # name: (old, new) in 06_report.py
    "swap init/ckpt accuracy columns": ('pct(g["acc_a"], 2), pct(g["acc_b"], 2), pp(g["gain_pp"]),\n        ci(g["ci95_pp"])',
                                        'pct(g["acc_b"], 2), pct(g["acc_a"], 2), pp(g["gain_pp"]),\n        ci(g["ci95_pp"])'),
    "teacher gain shifted by one row": ('pp(t["gain_pp"]), ci(t["ci95_pp"]),\n        t["p_str"], t["n_problems"]',
                                        'pp(teacher[(teacher.index(t) + 1) % len(teacher)]["gain_pp"]), ci(t["ci95_pp"]),'
                                        '\n        t["p_str"], t["n_problems"]'),
    "wrong CI bound": ('return f"[{c[0]:+.3f}, {c[1]:+.3f}]"', 'return f"[{c[0]:+.3f}, {c[0]:+.3f}]"'),
    "raw p printed as Holm p": ("Holm-adjusted p = {d['p_holm']:.4f}", "Holm-adjusted p = {d['p']:.4f}"),
    "reruns dropped from the ledger": ('earlier=earlier_runs(S["ledger"]["runs"], manifest_runs(run_dir))', "earlier=[]"),
    "per-seed rows shifted": ('    for g in e["per_seed"]:\n        rows.append([f"`{e[\'condition\']}`", e["benchmark"], e["protocol"], f"seed {g[\'training_seed\']}"',
                              '    for i, h in enumerate(e["per_seed"]):\n        g = e["per_seed"][(i + 1) % len(e["per_seed"])]\n'
                              '        rows.append([f"`{e[\'condition\']}`", e["benchmark"], e["protocol"], f"seed {h[\'training_seed\']}"'),
    "snapshot columns swapped": ('num(x["response_length/clip_ratio"]), num(x["delta_opd/weighted_reward_mean"], 4), num(x["actor/kl_coef"])',
                                 'num(x["response_length/clip_ratio"]), num(x["delta_opd/weighted_reward_mean"], 4), num(x["actor/entropy"])'),
    "naive CI printed as the paired one": ('ci(g["naive"]["ci95_pp"]) if "naive" in g', 'ci(g["ci95_pp"]) if "naive" in g'),
    "a hypothesis verdict left out of the TL;DR": ('for h in COND["hypotheses"]) + ".")', 'for h in COND["hypotheses"][1:]) + ".")'),
    "summary onset and runaway swapped": ('steps_list(x["onset_steps"]), steps_list(x["runaway_steps"])',
                                          'steps_list(x["runaway_steps"]), steps_list(x["onset_steps"])'),
    "roster status dropped": ('r["kind"], r["status"], cell(r["reason"])', 'r["kind"], "found", cell(r["reason"])'),
}
STATS_MUTANTS = {    # name: (old, new) in 05_stats.py
    "pooled on the first seed only": ('paired = [(by_key_unit(g["unit_a"]).correct(), by_key_unit(g["unit_b"]).correct()) for g in seeds]',
                                      'paired = [(by_key_unit(g["unit_a"]).correct(), by_key_unit(g["unit_b"]).correct()) for g in seeds[:1]] * len(seeds)'),
    "no multiple-comparison adjustment": ('stats.holm_verdicts([e["decision"] for e in by_condition])',
                                          '[(d["p"], stats.verdict(d) if d["p"] < stats.ALPHA else stats.NOT_SIGNIFICANT)'
                                          ' for d in (e["decision"] for e in by_condition)]'),
    "reruns dropped from the ledger": ("current + earlier_runs(previous, current)", "current"),
    "snapshots at the onset only": ('"snapshots": snapshots(met, r["checkpoints"], watch["collapse_onset_step"])',
                                    '"snapshots": snapshots(met, [], watch["collapse_onset_step"])'),
    "naive on the restricted seeds": ("g[\"naive\"] = stats.naive_gain(base.correct(), u.correct()",
                                      "g[\"naive\"] = stats.naive_gain(u.correct(), u.correct()"),
}


def run_mutant(script: str, old: str, new: str, run_dir: Path, tmp: Path):
    src = (REPO / script).read_text()
    assert src.count(old) == 1, f"mutation target not found once in {script}: {old!r}"
    mutant = tmp / script
    mutant.write_text(src.replace(old, new))
    env = os.environ | {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(mutant), "--run-dir", str(run_dir)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


MUTANTS = {"06_report.py": (REPORT_MUTANTS, check_report), "05_stats.py": (STATS_MUTANTS, check_stats)}


@pytest.mark.parametrize("script, name", [(s, n) for s, (m, _) in MUTANTS.items() for n in sorted(m)])
def test_checks_catch_a_mutated_stage(campaign, tmp_path, script, name):
    """Each mutant of 06 (or 05) reruns on a copy of the campaign (its stats/ledger.json holds the overwritten RAFT
    run); the report (or stats) check must then fail."""
    mutants, check = MUTANTS[script]
    run_dir = tmp_path / "toy"
    shutil.copytree(campaign, run_dir)
    run_mutant(script, *mutants[name], run_dir, tmp_path)
    with pytest.raises(AssertionError):
        check(run_dir)


def test_readme_content_and_figures(campaign):
    rep = campaign / "report"
    readme = (rep / "README.md").read_text()
    assert "onset step 28 (band 28–40)" in readme and "### 1.1 Gates of the main pair" in readme
    assert "## 6. RAFT teacher" in readme and "Gate G2" in readme and "no_correct_sample" in readme
    assert "## 9. Pending" in readme and "`train/delta-sampled`" in readme
    pngs = sorted(p.name for p in (rep / "figures").glob("*.png"))
    assert pngs == sorted(["teacher_gains.png", "student_gain_toy_sample4.png", "student_gain_toy_greedy.png",
                           "student_gain_toy_curve8.png", "teacher_vs_student.png", "answer_format.png", "raft_loss.png",
                           "dynamics_by_condition.png"]
                          + [f"training_{n}.png" for n, *_ in RUNS] + ["training_delta-sampled.png"])   # unfinished too
    for name in pngs:
        assert f"(figures/{name})" in readme
        data = (rep / "figures" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert b"Software" not in data and b"matplotlib" not in data.lower()
    lines = (rep / "CHECKSUMS.sha256").read_text().splitlines()
    assert len(lines) == len(pngs) + 2
    for ln in lines:
        sha, rel = ln.split("  ")
        assert sha256_file(rep / rel) == sha


def test_rebuild_is_byte_identical(campaign):
    rep = campaign / "report"
    files = ["README.md", "MANIFEST.json", "CHECKSUMS.sha256"] + [f"figures/{p.name}" for p in (rep / "figures").glob("*.png")]
    before = {f: (rep / f).read_bytes() for f in files}
    run_stage("06_report.py", campaign)
    after = {f: (rep / f).read_bytes() for f in files}
    assert sorted(p.name for p in (rep / "figures").glob("*.png")) == sorted(f[8:] for f in files if f.startswith("fig"))
    assert before == after


def test_baselines_only_campaign_renders(tmp_path):
    """The state after 02_baselines: teacher and student-init units, no training run, no RAFT."""
    run_dir = tmp_path / "toy"
    for k, (alias, proto) in enumerate([(a, p) for a in ("toy-pre", "toy-post", "toy-student") for p in ("sample4", "greedy")]):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, k)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    readme = (run_dir / "report" / "README.md").read_text()
    assert "No trained checkpoint has been evaluated yet" in readme and "No `raft/stats.json`" in readme
    assert "no cap-sensitivity view applies" in readme
    assert sorted(p.name for p in (run_dir / "report" / "figures").glob("*.png")) == ["answer_format.png", "teacher_gains.png"]


# --- refusals ---

def test_stats_refuses_changed_input(tmp_path):
    run_dir = make_campaign(tmp_path / "c")
    p = run_dir / "evals" / "toy-post" / "toy" / "greedy" / "samples.jsonl"
    p.write_text(p.read_text().replace('"correct": false', '"correct": true', 1))
    r = run_stage("05_stats.py", run_dir, ok=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr                  # a refusal, not a crash: one line
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("05_stats: ") and "toy-post/toy/greedy/samples.jsonl" in line and "changed" in line


def test_report_refuses_changed_stats(tmp_path):
    run_dir = make_campaign(tmp_path / "c")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    p = run_dir / "stats" / "teacher_gains.json"
    p.write_text(p.read_text().replace('"pass": true', '"pass": false'))
    r = run_stage("06_report.py", run_dir, ok=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "stats/teacher_gains.json" in r.stderr and "05_stats" in r.stderr
    assert not (run_dir / "report" / "README.md").exists()
    run_stage("05_stats.py", run_dir, "--pair", "toy")                       # fresh stats, then a unit appears
    write_unit(run_dir, "toy-post", "sample32", P_CORRECT["toy-post"], 96, 40, 99)
    r = run_stage("06_report.py", run_dir, ok=False)
    assert r.returncode != 0 and "evals/toy-post/toy/sample32 appeared after 05_stats ran" in r.stderr


@pytest.mark.parametrize("kind, needle", [
    ("missing", "missing problems"), ("duplicated", "duplicated samples toy-007@seed2"),
    ("seeds", "mismatched seeds — problems toy-003")])
def test_broken_units_are_refused(tmp_path, kind, needle):
    run_dir = tmp_path / "c"
    for alias, proto in (("toy-pre", "sample4"), ("toy-pre", "greedy"), ("toy-post", "greedy")):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, 1)
    mutate = {"missing": lambda rows: [r for r in rows if r["problem_id"] != "toy-005"],
              "duplicated": lambda rows: rows + [r for r in rows if r["problem_id"] == "toy-007" and r["seed"] == 2],
              "seeds": lambda rows: [dict(r, seed=9) if r["problem_id"] == "toy-003" and r["seed"] == 3 else r
                                     for r in rows]}[kind]
    write_unit(run_dir, "toy-post", "sample4", P_CORRECT["toy-post"], 96, 30, 2, mutate=mutate)
    r = run_stage("05_stats.py", run_dir, "--pair", "toy", ok=False)
    assert r.returncode != 0
    assert needle in r.stderr and "evals/toy-post/toy/sample4" in r.stderr


def test_mismatched_problem_sets_are_refused(tmp_path):
    run_dir = tmp_path / "c"
    write_unit(run_dir, "toy-pre", "sample4", P_CORRECT["toy-pre"], 96, 30, 1)
    write_unit(run_dir, "toy-post", "sample4", P_CORRECT["toy-post"], 96, 30, 2, problems=range(1, N_PROBLEMS + 1))
    r = run_stage("05_stats.py", run_dir, "--pair", "toy", ok=False)
    assert r.returncode != 0 and "mismatched problem ids" in r.stderr
    assert "only in evals/toy-pre/toy/sample4: [toy-000]" in r.stderr and "toy-040" in r.stderr


def test_unfinished_runs_are_pending_not_refused(tmp_path):
    """A run killed before its first checkpoint (empty folder, or a half-written metrics line) and a unit folder
    without manifest: 05 and 06 report the finished part and list the rest as pending."""
    run_dir = tmp_path / "toy"
    for k, (alias, proto) in enumerate([(a, p) for a in ("toy-pre", "toy-post", "toy-student") for p in ("sample4", "greedy")]):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, k)
    (run_dir / "train" / "opd" / "resume.tmp").mkdir(parents=True)
    t = run_dir / "train" / "opd-seed1"
    atomic_write_jsonl(t / "metrics.jsonl", metric_rows(n_steps=3))
    with open(t / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "response_len')                      # the trainer was killed mid-line
    (run_dir / "evals" / "opd-step15" / "toy" / "sample4").mkdir(parents=True)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    P = read_json(run_dir / "stats" / "pending.json")
    assert [(r["run"], r["reward"], r["seed"], r["steps_logged"]) for r in P["runs"]] == [
        ("opd", "opd", 42, 0), ("opd-seed1", "opd", 1, None)]
    assert [u["unit"] for u in P["units"]] == ["evals/opd-step15/toy/sample4"]
    run_stage("06_report.py", run_dir)
    readme = (run_dir / "report" / "README.md").read_text()
    assert "Pending: 2 training run(s) and 1 eval unit(s)" in readme
    assert "| `train/opd-seed1` | training run | reward opd, seed 1, ? steps logged |" in readme


def test_removed_units_stay_in_the_ledger_and_the_verdict_falls_back(campaign, tmp_path):
    """The opd seeds' sample4 units removed (to be redone): their time stays in the ledger, labelled; the opd verdict
    falls back to the protocol its checkpoints still have (curve8) and the missing units are pending."""
    run_dir = tmp_path / "toy"
    shutil.copytree(campaign, run_dir)
    gone = [f"evals/{n}-step40/toy/sample4" for n in ("opd", "opd-seed1", "opd-seed2")]
    for rel in gone:
        shutil.rmtree(run_dir / rel)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    assert check_tables(run_dir) > 400
    readme = (run_dir / "report" / "README.md").read_text()
    assert re.search(r"`opd` \(classic OPD, one teacher\) on toy/curve8, latest evaluated checkpoint \(step 40\), "
                     r"pooled over training seeds 1, 2, 42", readme)
    for rel in gone:
        assert f"| `{rel}` | 04_eval | earlier run (folder removed) |" in readme
    assert {u["unit"] for u in read_json(run_dir / "stats" / "pending.json")["units"]} >= set(gone)


# --- issue 34: units of two benchmark revisions are not paired; what is missing is said, not substituted ---

def test_units_of_two_benchmark_revisions_are_not_paired(tmp_path):
    run_dir = tmp_path / "toy"
    for k, alias in enumerate(("toy-pre", "toy-post")):
        write_unit(run_dir, alias, "sample4", P_CORRECT[alias], 96, 30, k, bench_sha=("a" if k else "b") * 64)
    r = run_stage("05_stats.py", run_dir, "--pair", "toy", ok=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for needle in ("evals/toy-pre/toy/sample4", "evals/toy-post/toy/sample4", "b" * 16, "a" * 16, "re-evaluate one"):
        assert needle in r.stderr, (needle, r.stderr)
    assert not (run_dir / "stats").exists()
    write_unit(run_dir, "toy-pre", "sample4", P_CORRECT["toy-pre"], 96, 30, 0, bench_sha="a" * 64)   # re-evaluated
    run_stage("05_stats.py", run_dir, "--pair", "toy")


def test_a_missing_gate_unit_is_pending_not_replaced_by_greedy(tmp_path):
    run_dir = tmp_path / "toy"
    for k, (alias, proto) in enumerate([("toy-pre", "sample4"), ("toy-pre", "greedy"), ("toy-post", "greedy")]):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, k)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    gate = read_json(run_dir / "stats" / "teacher_gains.json")["gate"]
    assert (gate["protocol"], gate["pass"], gate["pending"]) == ("sample4", False, True)
    assert gate["missing"] == ["evals/toy-post/toy/sample4"] and gate["reason"].startswith("pending: ")
    assert "evals/toy-post/toy/sample4" in [u["unit"] for u in read_json(run_dir / "stats" / "pending.json")["units"]]
    run_stage("06_report.py", run_dir)
    readme = (run_dir / "report" / "README.md").read_text()
    assert "**Teacher-gain gate (toy/sample4): pending** — `evals/toy-post/toy/sample4` not evaluated yet" in readme


def test_a_missing_student_init_is_named_not_no_checkpoint(tmp_path):
    run_dir = tmp_path / "toy"
    for k, (alias, proto) in enumerate([(a, p) for a in ("toy-pre", "toy-post") for p in ("sample4", "greedy")]):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, k)
    for k, step in enumerate((20, 40)):
        write_unit(run_dir, f"opd-step{step}", "sample4", P_CORRECT["toy-student"], 96, 25, 10 + k,
                   model=model_block(f"opd-step{step}", "opd", step, "toy-student"))
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    pend = read_json(run_dir / "stats" / "pending.json")["units"]
    assert [u["unit"] for u in pend] == ["evals/toy-student/toy/sample4"] and "init unit" in pend[0]["why"]
    run_stage("06_report.py", run_dir)
    readme = (run_dir / "report" / "README.md").read_text()
    assert "No trained checkpoint has been evaluated yet" not in readme
    assert ("2 trained checkpoint(s) were evaluated (`opd`@20, `opd`@40), but there is no student gain to report: "
            "the student's init unit `evals/toy-student/toy/sample4` is missing (pending, §9).") in readme


# --- conditions: runs of one reward with other settings are never pooled; a budget-stopped run's checkpoints count ---

def write_train(run_dir: Path, name: str, args: dict, n_steps: int, onset: int, ckpts, *, finished=True, summary=(),
                peak=1.0):
    """A training run folder as 03 leaves it: metrics (metric_rows' onset and peak), summary, checkpoints; finished: a
    manifest with its args; else (a --time-limit stop) no manifest, and the resume state of the last checkpoint
    holding the args."""
    t = run_dir / "train" / name
    atomic_write_jsonl(t / "metrics.jsonl", metric_rows(n_steps=n_steps, onset=onset, peak=peak))
    atomic_write_json(t / "summary.json", {"pair": args.get("pair", "toy"), "reward": args["reward"], "student": "toy", "seed": args["seed"],
                                           "steps": args["steps"], "last_step": n_steps, "stopped": None, **dict(summary)})
    for step in ckpts:
        atomic_write_json(t / f"step_{step:06d}" / "checkpoint.json",
                          {"run": name, "step": step, "pair": "toy", "reward": args["reward"], "student_init": "toy-student"})
    if finished:
        write_manifest(t, stage="03_opd_train", script=__file__, args=args, inputs={},
                       outputs=["metrics.jsonl", "summary.json"] + [f"step_{s:06d}" for s in ckpts], started=now_iso(),
                       wall_s=100.0, gpu_s=0.0)
    else:
        atomic_write_json(t / "resume" / "loop_state.json", {"step": n_steps, "kl_coef": 2.0, "args": args})


# run name → (seed, settings that differ from the raw condition, steps logged, checkpoints, evaluated step,
# how it ended); raw-twin repeats raw's condition and seed (only its run name and folder differ): a duplicate, never pooled
COND_RUNS = {"raw": (42, {}, 40, (20, 40), 40, "finished"), "raw-seed1": (1, {}, 40, (20, 40), 40, "finished"),
             "raw-seed2": (2, {"time_limit": 900.0}, 20, (20,), 20, "time_limit"),
             "raw-twin": (42, {}, 40, (20, 40), 40, "finished"),
             "neutral": (42, {"eos_policy": "neutral"}, 40, (20, 40), 40, "finished"),
             "stop": (42, {"stop_on_collapse": True}, 28, (20, 28), 28, "collapse")}


def make_conditions_campaign(run_dir: Path) -> Path:
    for k, alias in enumerate(("toy-pre", "toy-post", "toy-student")):
        write_unit(run_dir, alias, "sample4", P_CORRECT[alias], 96, 30, k)
    for k, (name, (seed, diff, n, ckpts, evaluated, ended)) in enumerate(COND_RUNS.items()):
        args = {"pair": "toy", "reward": "delta-topk", "eos_policy": "raw", "lr": 2e-4, "steps": 40, "seed": seed,
                "stop_on_collapse": False, "time_limit": None, "run_name": name, "run_dir": f"/elsewhere/{k}"} | diff
        write_train(run_dir, name, args, n, 25, ckpts, finished=ended != "time_limit",
                    summary={"stopped": ended} if ended != "finished" else {})
        write_unit(run_dir, f"{name}-step{evaluated}", "sample4", (0.9, 0.85, 0.3 + 0.05 * k, 0.05), 96, 30, 50 + k,
                   model=model_block(f"{name}-step{evaluated}", name, evaluated, "toy-student"))
    return run_dir


def check_condition_campaign(run_dir: Path):
    """The three conditions of COND_RUNS, each pooled over its own seeds only, with the budget-stopped seed counted and
    the duplicate seed (raw-twin) left out and named."""
    check_conditions(run_dir)
    check_summary(run_dir)
    check_snapshots(run_dir)
    check_roster(run_dir)
    SG = read_json(run_dir / "stats" / "student_gains.json")
    C = read_json(run_dir / "stats" / "conditions.json")
    assert sorted(sorted(c["runs"]) for c in C["conditions"]) == [
        ["neutral"], ["raw", "raw-seed1", "raw-seed2", "raw-twin"], ["stop"]]
    E = {tuple(sorted(g["run"] for g in e["per_seed"])): e for e in SG["by_condition"]}
    assert sorted(E) == [("neutral",), ("raw", "raw-seed1", "raw-seed2"), ("stop",)]
    assert E[("neutral",)]["condition"] == "delta-topk+eos-policy=neutral+no-stop-on-collapse"
    assert E[("stop",)]["condition"] == "delta-topk+eos-policy=raw+stop-on-collapse"
    raw = E[("raw", "raw-seed1", "raw-seed2")]
    assert raw["training_seeds"] == [1, 2, 42] and raw["steps"] == [40, 20, 40]      # the budget-stopped seed at 20
    a = per_problem(run_dir / "evals" / "toy-student" / "toy" / "sample4")
    dbar = np.zeros(N_PROBLEMS)
    for name in ("raw", "raw-seed1", "raw-seed2"):
        b = per_problem(run_dir / "evals" / f"{name}-step{COND_RUNS[name][4]}" / "toy" / "sample4")
        dbar += np.array([b[q] - a[q] for q in sorted(a)]) / 3
    gain, ci95, _ = boot_summary(dbar)
    assert raw["pooled"]["gain_pp"] == pytest.approx(gain, abs=1e-9)
    assert raw["pooled"]["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
    P = read_json(run_dir / "stats" / "pending.json")
    assert P["runs"] == [] and P["units"] == []
    TRN = {r["run"]: r for r in read_json(run_dir / "stats" / "training.json")["runs"]}
    assert TRN["raw-seed2"]["status"] == "stopped by --time-limit" and TRN["raw-seed2"]["steps_logged"] == 20
    assert TRN["stop"]["status"] == "stopped by --stop-on-collapse" and TRN["stop"]["watch"]["collapse_onset_step"] == 28
    R = {r["item"]: r for r in read_json(run_dir / "stats" / "roster.json")["items"]}
    assert R["train/raw-seed2"]["status"] == "found" and R["train/raw-seed2 steps 21–40"]["status"] == "pending"
    assert R["train/stop steps 29–40"]["status"] == "canceled" and "--stop-on-collapse" in R["train/stop steps 29–40"]["reason"]
    assert R["evals/raw-seed2-step20/toy/sample4"]["status"] == "found"
    twin = R["train/raw-twin"]
    assert twin["status"] == "skipped" and "same condition and seed as train/raw," in twin["reason"]
    assert R["evals/raw-twin-step40/toy/sample4"]["status"] == "skipped"
    rows = {x["condition"]: x for x in C["summary"]}
    # the summary's collapse watch lists every run of the condition, the duplicate too (it trained; only the gain
    # leaves it out)
    assert rows[raw["condition"]]["runs"] == ["raw", "raw-seed1", "raw-seed2", "raw-twin"]
    assert rows[raw["condition"]]["onset_steps"] == [28, 28, None, 28]
    assert rows[raw["condition"]]["runaway_steps"] == [25, 25, None, 25]


@pytest.fixture(scope="module")
def condition_campaign(tmp_path_factory):
    run_dir = make_conditions_campaign(tmp_path_factory.mktemp("conditions") / "toy")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    return run_dir


def test_runs_of_one_reward_with_other_settings_are_never_pooled(condition_campaign):
    check_condition_campaign(condition_campaign)
    run_stage("06_report.py", condition_campaign)
    readme = (condition_campaign / "report" / "README.md").read_text()
    assert "### 2.2 Cross-condition summary" in readme and "| `train/stop steps 29–40` | training steps | canceled |" in readme
    assert "`delta-topk+eos-policy=neutral+no-stop-on-collapse` (Direct-OPD, weighted top-K shift reward) on toy/sample4" in readme


CONDITION_MUTANTS = {    # name: (old, new) in 05_stats.py; check_condition_campaign must fail on each
    "seeds pooled across settings": ('"settings": run_settings(r["settings"])}', '"settings": {"reward": r["reward"]}}'),
    "budget-stopped runs left pending": ("+ [load_stopped_run(run_dir, d)\n", "+ [] and [load_stopped_run(run_dir, d)\n"),
    "a duplicate seed pooled": ('g["latest"] and g["run"] not in duplicate_of\n', 'g["latest"]\n'),
    "a duplicate seed reported found": ('("training run", "skipped", f"condition {cond}',
                                        '("training run", "found", f"condition {cond}'),
}


@pytest.mark.parametrize("name", sorted(CONDITION_MUTANTS))
def test_condition_checks_catch_a_mutated_stage(condition_campaign, tmp_path, name):
    run_dir = tmp_path / "toy"
    shutil.copytree(condition_campaign, run_dir)
    run_mutant("05_stats.py", *CONDITION_MUTANTS[name], run_dir, tmp_path)
    with pytest.raises(AssertionError):
        check_condition_campaign(run_dir)


# --- the collapse arm's hypotheses (pair toy-collapse, trained inside the toy campaign): recomputed ---

def arm_args(name: str, diff: dict) -> dict:
    """03's args of a collapse-arm run as campaign.sh launches it (lib/registry.py's _RAW), with `diff` changed."""
    from lib.registry import TOY_COLLAPSE_LR
    return {"pair": "toy-collapse", "reward": "delta-topk", "eos_policy": "raw", "reward_center": False,
            "kl_mode": "adaptive", "kl_coef": 2.5, "lr": TOY_COLLAPSE_LR, "steps": 20, "seed": 42,
            "stop_on_collapse": False, "time_limit": None, "run_name": name, "run_dir": "/elsewhere"} | diff


# run name → (args diff, steps logged, clip onset, clip peak): a verdict of every kind for the `held` clause (holds,
# fails at 0.45 without an onset, fails by a collapse, undecided for a run stopped short, undecided with no run), and
# a toy-pair run with the neutral fix's very settings but pair toy, which the arm's hypotheses must not select
ARM_RUNS = {"arm-raw": ({}, 20, 8, 1.0), "arm-raw-seed1": ({"seed": 1}, 20, 9, 1.0),
            "arm-neutral": ({"eos_policy": "neutral"}, 20, 8, 0.05),
            "arm-clamp": ({"eos_policy": "clamp"}, 20, 8, 0.45),
            "arm-center": ({"reward_center": True, "time_limit": 600.0}, 12, 8, 0.05),
            "arm-kl-max": ({"kl_mode": "constant"}, 20, 10, 1.0),
            "arm-low-lr": ({"lr": TOY_COLLAPSE_LOW_LR, "steps": 40}, 40, 30, 0.05),
            "toy-twin-of-neutral": ({"pair": "toy", "eos_policy": "neutral"}, 20, 8, 1.0)}
ARM_VERDICTS = {"toy-collapse-sink": "holds", "toy-collapse-neutral": "holds", "toy-collapse-neutral-all": "undecided",
                "toy-collapse-clamp": "fails", "toy-collapse-center": "undecided", "toy-collapse-kl-max": "fails",
                "toy-collapse-low-lr": "holds"}


def make_arm_campaign(run_dir: Path) -> Path:
    """The conditions campaign with the collapse arm's runs beside it (training only, as campaign.sh's arm)."""
    make_conditions_campaign(run_dir)
    for name, (diff, n, onset, peak) in ARM_RUNS.items():
        args = arm_args(name, diff)
        write_train(run_dir, name, args, n, onset, (), finished=n == args["steps"], peak=peak,
                    summary={"stopped": "time_limit"} if n < args["steps"] else {})
    return run_dir


@pytest.fixture(scope="module")
def arm_campaign(tmp_path_factory):
    run_dir = make_arm_campaign(tmp_path_factory.mktemp("arm") / "toy")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    return run_dir


def test_the_collapse_arms_hypotheses_equal_a_recomputation(arm_campaign):
    """05's verdicts for the arm's hypotheses, clause by clause, against expected_hypotheses' own reading of the
    runs; the fabricated runs give the `held` clause each of its outcomes, and a toy-pair run with a fix's settings
    is not counted as the arm's."""
    check_conditions(arm_campaign)
    check_hypotheses(arm_campaign)
    got = {h["name"]: h["verdict"] for h in read_json(arm_campaign / "stats" / "conditions.json")["hypotheses"]}
    assert {k: got.get(k) for k in ARM_VERDICTS} == ARM_VERDICTS
    assert got["toy-topk"] == "fails"                  # the toy pair's own runs (and the twin) collapse
