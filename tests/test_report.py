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
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import run_script
from lib.artifacts import atomic_write_json, atomic_write_jsonl, now_iso, read_json, sha256_file, write_manifest

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
               model=None, deviations=(), problems=None, mutate=None) -> Path:
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
            rows.append({"problem_id": f"toy-{i:03d}", "seed": s, "pass": s, "completion": "1+2=3. Answer: 3",
                         "n_tokens": n_tok, "truncated": trunc, "extractor": ext, "extracted": None if ext == "none" else "3",
                         "correct": ok, "verify_method": "math_verify", "grade_reason": None, "level": level})
    if mutate:
        rows = mutate(rows)
    acc = 100.0 * np.mean([r["correct"] for r in rows])
    scores = {"alias": alias, "benchmark": "toy", "protocol": protocol, "n_problems": len({r["problem_id"] for r in rows}),
              "n_samples_per_problem": len(SEEDS[protocol]), "seeds": SEEDS[protocol], "accuracy": acc,
              "accuracy_ci95": [acc - 5, acc + 5], "truncation_rate": np.mean([r["truncated"] for r in rows]),
              "mean_tokens": np.mean([r["n_tokens"] for r in rows]), "extractor_split": {}, "accuracy_truncated": None,
              "max_new_tokens": cap, "deviations": list(deviations),
              "provenance": {"model": model or model_block(alias), "generation": {}}}
    if mutate:   # a broken unit keeps the scores.json of the intact one (that is the point of the refusal)
        scores["n_problems"] = N_PROBLEMS if problems is None else len(problems)
    atomic_write_jsonl(d / "samples.jsonl", rows)
    atomic_write_json(d / "scores.json", json.loads(json.dumps(scores, default=float)))
    write_manifest(d, stage="04_eval", script=__file__, args={"pair": "toy", "model": alias}, inputs={},
                   outputs=["samples.jsonl", "scores.json"], started=now_iso(), wall_s=12.5 + seed, gpu_s=3.25 * seed)
    return d


def metric_rows(n_steps=40, onset=25):
    """Per-step SPEC §7.4 metrics of a run that collapses: clip ratio jumps after `onset`, length runs away."""
    rows = []
    for s in range(1, n_steps + 1):
        c = 0.0 if s < onset else min(1.0, 0.3 + 0.1 * (s - onset))
        rows.append({"step": s, "response_length/mean": 20 + (s >= onset) * 25 + 0.1 * s,
                     "response_length/clip_ratio": c, "response_length/max": 48, "response_length/min": 5,
                     "delta_opd/weighted_reward_mean": -0.01 + 0.0002 * s, "delta_opd/log_ratio_mean": 0.1,
                     "actor/kl_coef": round(2.5 * 0.99 ** s, 6), "actor/entropy": 0.5 - 0.01 * s,
                     "actor/grad_norm": 1.0 + (s == 21) * 9.0, "timing_s/step": 1.5, "rollout/logprob_gap": 0.001})
    return rows


def make_campaign(run_dir: Path) -> Path:
    cap_pre, cap = 64, 96
    write_unit(run_dir, "toy-pre", "sample4", P_CORRECT["toy-pre"], cap_pre, 30, 1)
    write_unit(run_dir, "toy-pre", "greedy", P_CORRECT["toy-pre"], cap_pre, 30, 2)
    write_unit(run_dir, "toy-post", "sample4", P_CORRECT["toy-post"], cap, 40, 3)
    write_unit(run_dir, "toy-post", "greedy", P_CORRECT["toy-post"], cap, 40, 4)
    for k, proto in enumerate(("sample4", "greedy", "sample32")):
        write_unit(run_dir, "toy-student", proto, P_CORRECT["toy-student"], cap, 25, 5 + k)
    # training run with two checkpoints
    t = run_dir / "train" / "opd-toy"
    atomic_write_jsonl(t / "metrics.jsonl", metric_rows())
    atomic_write_json(t / "summary.json", {"pair": "toy", "reward": "delta-topk", "student": "toy", "steps": 40,
                                           "collapse_onset_step": 28, "length_runaway_step": 25,
                                           "longest_clip90_run": 10})
    for step in (20, 40):
        atomic_write_json(t / f"step_{step:06d}" / "checkpoint.json",
                          {"run": "opd-toy", "step": step, "pair": "toy", "reward": "delta-topk", "student_init": "toy-student"})
    write_manifest(t, stage="03_opd_train", script=__file__, args={"pair": "toy"}, inputs={},
                   outputs=["metrics.jsonl", "summary.json", "step_000020", "step_000040"], started=now_iso(),
                   wall_s=300.0, gpu_s=0.0)
    ckpt = {20: (0.9, 0.8, 0.25, 0.05), 40: (0.85, 0.7, 0.1, 0.0)}
    for step, protos in ((20, ("curve8",)), (40, ("sample4", "greedy", "curve8"))):
        for k, proto in enumerate(protos):
            write_unit(run_dir, f"opd-toy-step{step}", proto, ckpt[step], cap, 25 + step, 20 + step + k,
                       model=model_block(f"opd-toy-step{step}", "opd-toy", step, "toy-student"))
    # RAFT: stats file (07_raft's documented keys) and its eval units
    r = run_dir / "raft"
    atomic_write_json(r / "stats.json", {
        "base": "toy-pre", "k": 4, "n_prompts": 400, "kept": 310, "keep_rate_pct": 77.5,
        "keep_rate_by_level_pct": {"1": 99.0, "2": 95.0, "3": 40.0}, "n_correct_of_k": {"0": 90, "1": 20, "4": 290},
        "rejection_reasons": {"no_correct_sample": 90}, "gate_g1": {"pass": True, "threshold": 200, "kept": 310},
        "sft": {"val_loss": [[10, 0.9], [20, 0.7], [30, 0.65]], "train_loss": [[10, 1.0], [20, 0.75], [30, 0.6]]},
        "shift_abs_dlogp_per_token": 0.0991, "eos_probe": {"pi_pre": -0.074, "raft": -0.015}})
    write_manifest(r, stage="07_raft", script=__file__, args={"pair": "toy-raft"}, inputs={}, outputs=["stats.json"],
                   started=now_iso(), wall_s=200.0, gpu_s=0.0)
    write_unit(run_dir, "raft", "sample4", P_CORRECT["raft"], cap_pre, 30, 77)
    g = run_dir / "gates"
    atomic_write_json(g / "gates.json", {"ok": True})
    write_manifest(g, stage="01_gates", script=__file__, args={"pair": "toy"}, inputs={}, outputs=["gates.json"],
                   started=now_iso(), wall_s=42.25, gpu_s=7.5)
    return run_dir


def run_stage(script, run_dir, *extra, ok=True):
    return run_script(script, "--run-dir", run_dir, *extra, check=ok, timeout=300)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    run_dir = make_campaign(tmp_path_factory.mktemp("campaign") / "toy")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    return run_dir


# --- the numbers agree with an independent recomputation ---

def per_problem(unit_dir, seeds=None):
    acc = {}
    for line in (unit_dir / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        if seeds is None or r["seed"] in seeds:
            acc.setdefault(r["problem_id"], []).append(r["correct"])
    return {p: np.mean(v) for p, v in acc.items()}


def test_stats_match_recomputation(campaign):
    T = read_json(campaign / "stats" / "teacher_gains.json")
    ev = campaign / "evals"
    for t in T["gains"]:
        a, b = per_problem(ev / "toy-pre" / "toy" / t["protocol"]), per_problem(ev / "toy-post" / "toy" / t["protocol"])
        assert t["gain_pp"] == pytest.approx(100 * np.mean([b[p] - a[p] for p in a]), abs=1e-9)
    assert {t["protocol"] for t in T["gains"]} == {"sample4", "greedy"}
    assert T["gate"]["protocol"] == "sample4" and T["gate"]["pass"] == (T["gains"][1]["ci95_pp"][0] > 0)
    SG = read_json(campaign / "stats" / "student_gains.json")
    curve = [g for g in SG["gains"] if g["protocol"] == "curve8"]
    assert [g["step"] for g in curve] == [20, 40]
    for g in curve:   # 8-seed curve unit paired with the 32-seed init restricted to seeds 0-7
        assert g["unit_a"] == "evals/toy-student/toy/sample32" and g["audit"]["grids"] == "nested"
        assert g["audit"]["restricted"] == g["unit_a"] and g["n_seeds"] == 8
        a = per_problem(ev / "toy-student" / "toy" / "sample32", seeds=set(range(8)))
        b = per_problem(ev / g["alias_b"] / "toy" / "curve8")
        assert g["gain_pp"] == pytest.approx(100 * np.mean([b[p] - a[p] for p in a]), abs=1e-9)
    assert SG["scan"]["n"] == len(SG["gains"]) == 4
    TR = read_json(campaign / "stats" / "transfer.json")
    for r in TR["ratios"]:
        assert (r["ratio"] is None) == bool(r["failed"])
        assert ("student_positive" in r["failed"]) == (r["student_gain_pp"] <= 0)
    # cap view: π_post's samples over π_pre's 64-token cap, counted wrong
    C = read_json(campaign / "stats" / "cap_sensitivity.json")["views"]
    assert {v["protocol"] for v in C} == {"sample4", "greedy"}
    rows = [json.loads(x) for x in (ev / "toy-post" / "toy" / "sample4" / "samples.jsonl").read_text().splitlines()]
    v = next(v for v in C if v["protocol"] == "sample4")
    assert v["over_cap_as_wrong"]["acc_b"] == pytest.approx(
        100 * np.mean([r["correct"] and r["n_tokens"] <= 64 for r in rows]), abs=1e-9)
    assert v["kept_sample_pct"] == pytest.approx(100 * np.mean([r["n_tokens"] <= 64 for r in rows]))
    TRN = read_json(campaign / "stats" / "training.json")["runs"][0]
    assert TRN["watch"]["collapse_onset_step"] == 28 and TRN["watch"]["collapse_band"] == [28, 40]
    assert TRN["watch"]["longest_clip90_run"] == [31, 40] and TRN["checkpoints"] == [20, 40]
    assert TRN["grad_norm_peak"] == {"value": 10.0, "step": 21} and TRN["watch_agrees"]
    R = read_json(campaign / "stats" / "raft.json")
    assert R["present"] and R["gate_g2"]["benchmark"] == "toy" and len(R["g2_gains"]) == 1


# --- every table number traces to a file in MANIFEST.json ---

NUM = re.compile(r"(?<![A-Za-z_\d.])[+-]?\d+(?:\.\d+)?")   # a number, not the digit inside `sample4`
NUMERIC_CELL = re.compile(r"^[\s\[\]+\-\d.,–@/]*$")


def leaves(obj):
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield float(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from leaves(v)


def traces(token: str, values: np.ndarray) -> bool:
    nd = len(token.split(".")[1]) if "." in token else 0
    return bool(np.any(np.abs(values - float(token)) <= 0.5 * 10.0 ** -nd + 1e-9))


def tables(readme: str):
    """(header, rows, source line) for each markdown table."""
    lines, out, i = readme.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[i:j]]
            assert lines[j] == "", "a table must end with a blank line (else markdown swallows the next line)"
            out.append((cells[0], cells[2:], lines[j + 1]))
            i = j
        else:
            i += 1
    return out


def test_every_table_number_traces_to_manifest(campaign):
    rep = campaign / "report"
    manifest = read_json(rep / "MANIFEST.json")["files"]
    for rel, sha in manifest.items():                            # the MANIFEST is true
        assert sha256_file(campaign / rel) == sha, rel
    readme = (rep / "README.md").read_text()
    checked = 0
    for head, rows, source in tables(readme):
        assert source.startswith("Source: "), f"table {head} names no source"
        srcs = re.findall(r"`(stats/[a-z_]+\.json)`", source)
        if srcs:
            assert all(s in manifest for s in srcs)
            values = np.array([v for s in srcs for v in leaves(read_json(campaign / s))])
        else:   # the time ledger: per-run rows from each manifest; stage/total rows are sums of them
            values = None
        for row in rows:
            if values is None:
                continue
            for cell in row:
                cell = cell.replace("p<0.0001", "").replace("p=", "")
                if cell and NUMERIC_CELL.match(cell):
                    for tok in NUM.findall(cell):
                        assert traces(tok, values), f"{tok!r} in table {head} row {row} not found in {srcs}"
                        checked += 1
    assert checked > 200
    # the TL;DR's numbers, too (its last line sums the time ledger, checked below)
    every = np.array([v for rel in manifest if rel.startswith("stats/") and rel.endswith(".json")
                      for v in leaves(read_json(campaign / rel))])
    tldr = readme.split("## 0. TL;DR")[1].split("## 1.")[0].strip().splitlines()
    assert len(tldr) >= 6 and tldr[-1].startswith(f"{len(tldr)}. Time:")
    for line in tldr[:-1]:
        body = line.split(". ", 1)[1].replace("p<0.0001", "").replace("95 %", "")
        for tok in NUM.findall(body):
            assert traces(tok, every), f"{tok!r} in TL;DR line {line!r} is in no stats file"
    # the ledger tables: each directory row equals its manifest; stage rows and the total are their sums
    t = tables(readme)
    per_dir = next(rows for head, rows, _ in t if head[0] == "directory")
    stage_rows = next(rows for head, rows, _ in t if head[0] == "stage")
    ms = {}
    for d, stage, wall, gpu in per_dir:
        m = read_json(campaign / d.strip("`") / "manifest.json")
        assert f"{d.strip('`')}/manifest.json" in manifest
        assert (stage, wall, gpu) == (m["stage"], f"{m['wall_s']:.1f}", f"{m['gpu_s']:.1f}")
        ms.setdefault(stage, []).append(m)
    assert len(ms["04_eval"]) == 12 and "05_stats" in ms
    for stage, n, wall, gpu in stage_rows:
        group = [m for v in ms.values() for m in v] if stage == "**total**" else ms[stage]
        assert int(n) == len(group) and wall == f"{sum(m['wall_s'] for m in group):.1f}"
        assert gpu == f"{sum(m['gpu_s'] for m in group):.1f}"


def test_readme_content_and_figures(campaign):
    rep = campaign / "report"
    readme = (rep / "README.md").read_text()
    T = read_json(campaign / "stats" / "teacher_gains.json")
    gate = next(t for t in T["gains"] if t["protocol"] == "sample4")
    assert f"π_post − π_pre = {gate['gain_pp']:+.3f} [{gate['ci95_pp'][0]:+.3f}, {gate['ci95_pp'][1]:+.3f}]" in readme
    assert "onset step 28 (band 28–40)" in readme
    assert "## 6. RAFT teacher" in readme and "Gate G2" in readme and "no_correct_sample" in readme
    pngs = sorted(p.name for p in (rep / "figures").glob("*.png"))
    assert pngs == sorted(["teacher_gains.png", "training_opd-toy.png", "student_gain_toy_sample4.png",
                           "student_gain_toy_greedy.png", "student_gain_toy_curve8.png", "teacher_vs_student.png",
                           "answer_format.png", "raft_loss.png"])
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
    assert r.returncode != 0 and "toy-post/toy/greedy/samples.jsonl" in r.stderr and "changed" in r.stderr


def test_report_refuses_changed_stats(tmp_path):
    run_dir = make_campaign(tmp_path / "c")
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    p = run_dir / "stats" / "teacher_gains.json"
    p.write_text(p.read_text().replace('"pass": true', '"pass": false'))
    r = run_stage("06_report.py", run_dir, ok=False)
    assert r.returncode != 0 and "stats/teacher_gains.json" in r.stderr and "05_stats" in r.stderr
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
