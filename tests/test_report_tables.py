"""The report's sample-level tables (issue 32 item 6), each checked against the artifacts by a computation of its own.

The campaign is tests/test_report.py's fabricated one, with the truncated samples of every checkpoint unit rewritten
as a collapsed student writes them (its answer, then the same answer line again and again until the cap, or more
digits glued onto its answer and then other answer lines) or as a destroyed one does (a clause repeated, no answer).
05_stats and 06_report run on it as subprocesses; then:

    extraction on truncated samples (source §8.3)   counted here from each unit's samples.jsonl, and summed per
                                                    condition over the units its verdict rests on; with the samples
                                                    whose first answer reached the gold one (a regex of its own)
    rollout excerpts                                the first sample of each kind picked here from samples.jsonl; the
                                                    excerpt is the completion or its head and tail, the loop visible
    student − π_post, paired                        per-problem means on the common seeds, bootstrapped here
    the unpaired comparison                         each side's problems resampled on their own, here
    the README                                      tests/test_report.py's check_tables (every cell = its source)

Each check is shown to bite: a mutated 05 (or 06) reruns on a copy and the check must fail (MUTANTS below).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lib.artifacts import atomic_write_jsonl, now_iso, read_json, write_manifest
from lib.eval.extract import first_answer
from test_report import boot_summary, check_tables, make_campaign, per_problem, run_mutant, run_stage, unit_seeds

pytestmark = pytest.mark.e2e

LOOP_ANSWER = "3+5=8. 8-2=6.\n" + "Answer: 6\n" * 40           # reached its answer, then could not stop
LOOP_NO_ANSWER = "3+5=8. 8-2=6. " * 30                            # never got to an answer
# reached its answer, then wrote digits where it should have stopped (the toy's collapse): the grader reads "1"
GLUED_ANSWER = "3+5=8. 8-2=6.\nAnswer: 60000+1=1.\n" + "Answer: 1\n" * 30


def collapse_checkpoint_units(run_dir: Path) -> None:
    """Rewrite every checkpoint unit's truncated samples as looping text (the manifest rewritten with them)."""
    for scores in sorted(run_dir.glob("evals/*/toy/*/scores.json")):
        d = scores.parent
        if read_json(scores)["provenance"]["model"].get("train_run") is None:
            continue
        rows = [json.loads(ln) for ln in (d / "samples.jsonl").read_text().splitlines()]
        for k, r in enumerate(rows):
            if r["truncated"]:
                r["completion"] = (LOOP_ANSWER if k % 2 else GLUED_ANSWER) if r["extractor"] != "none" \
                    else LOOP_NO_ANSWER
                r["first_answer"] = first_answer(r["completion"])             # as 04_eval writes it
        atomic_write_jsonl(d / "samples.jsonl", rows)
        write_manifest(d, stage="04_eval", script=__file__, args={"pair": "toy", "model": d.parts[-3]}, inputs={},
                       outputs=["samples.jsonl", "scores.json"], started=now_iso(), wall_s=1.0, gpu_s=0.0)


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    run_dir = make_campaign(tmp_path_factory.mktemp("tables") / "toy")
    collapse_checkpoint_units(run_dir)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    return run_dir


def samples(run_dir: Path, unit: str) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / unit / "samples.jsonl").read_text().splitlines()]


def finished_units(run_dir: Path) -> list[str]:
    return sorted(p.parent.relative_to(run_dir).as_posix() for p in run_dir.glob("evals/*/*/*/manifest.json"))


# --- the checks: each recomputes its table from the artifacts ---

FIRST_ANSWER = re.compile(r"^Answer:[ \t]*(\S+)|\\boxed\{([^{}]*)\}", re.M)   # enough for these completions


def reached_here(r: dict) -> bool:
    """The first `Answer: x` or `\\boxed{x}` of the completion starts with the gold answer (the report's `reached`)."""
    m = FIRST_ANSWER.search(r["completion"])
    return m is not None and (m.group(1) or m.group(2)).startswith(r["answer"])


def check_truncated_extraction(run_dir: Path) -> None:
    """Per unit: truncated samples, those whose answer still extracts, those of them correct, and the samples (all,
    truncated) whose first answer reached the gold one; per condition the sums over the units its by_condition
    verdict rests on."""
    R = read_json(run_dir / "stats" / "rollouts.json")["truncated_extraction"]
    got = {t["unit"]: t for t in R["units"]}
    assert sorted(got) == finished_units(run_dir)
    counts = {}
    for unit in got:
        rows = samples(run_dir, unit)
        trunc = [r for r in rows if r["truncated"]]
        ext = [r for r in trunc if r["extractor"] != "none"]
        ok = [r for r in ext if r["correct"]]
        counts[unit] = (len(rows), len(trunc), len(ext), len(ok), sum(map(reached_here, rows)),
                        sum(map(reached_here, trunc)))
        t = got[unit]
        assert (t["n_samples"], t["n_truncated"], t["n_extracted"], t["n_extracted_correct"], t["n_reached"],
                t["n_truncated_reached"]) == counts[unit], unit
        assert t["reached_pct"] == pytest.approx(100 * counts[unit][4] / len(rows))
        assert t["truncated_reached_pct"] == (pytest.approx(100 * counts[unit][5] / len(trunc)) if trunc else None)
        assert t["extracted_pct"] == (pytest.approx(100 * len(ext) / len(trunc)) if trunc else None)
        assert t["correct_of_extracted_pct"] == (pytest.approx(100 * len(ok) / len(ext)) if ext else None)
    SG = read_json(run_dir / "stats" / "student_gains.json")
    want = {(e["condition"], e["benchmark"], e["protocol"]): [g["unit_b"] for g in e["per_seed"]]
            for e in SG["by_condition"]}
    assert sorted((c["condition"], c["benchmark"], c["protocol"]) for c in R["conditions"]) == sorted(want)
    for c in R["conditions"]:
        n, tr, ex, ok, re_all, re_tr = np.sum([counts[u] for u in want[(c["condition"], c["benchmark"],
                                                                          c["protocol"])]], axis=0)
        assert (c["n_samples"], c["n_truncated"], c["n_extracted"], c["n_extracted_correct"], c["n_reached"],
                c["n_truncated_reached"]) == (n, tr, ex, ok, re_all, re_tr)
        assert c["reached_pct"] == pytest.approx(100 * re_all / n)
        assert c["extracted_pct"] == pytest.approx(100 * ex / tr) and c["truncation_pct"] == pytest.approx(100 * tr / n)


KIND_TESTS = [("truncated, answer extracted", lambda r: r["truncated"] and r["extractor"] != "none"),
              ("truncated, no answer", lambda r: r["truncated"] and r["extractor"] == "none"),
              ("stopped, correct", lambda r: not r["truncated"] and r["correct"]),
              ("stopped, wrong", lambda r: not r["truncated"] and not r["correct"])]


def check_excerpts(run_dir: Path) -> None:
    """One excerpt set per evaluated checkpoint and per student init, from the unit of the first (benchmark,
    protocol) of the pair's eval order; in it the longest sample of each kind (the first such), at most three; the text the completion
    itself or its head and tail around a marker that counts what was left out."""
    X = read_json(run_dir / "stats" / "rollouts.json")["excerpts"]
    order = {("toy", "sample4"): 0, ("toy", "greedy"): 1}
    best = {}
    for unit in finished_units(run_dir):
        sc = read_json(run_dir / unit / "scores.json")
        m = sc["provenance"]["model"]
        if m.get("train_run") is not None:
            key = (m["train_run"], m["train_step"])
        elif sc["alias"] == "toy-student":
            key = ("init", sc["alias"])
        else:
            continue
        rank = (order.get((sc["benchmark"], sc["protocol"]), 9), sc["benchmark"], sc["protocol"])
        best[key] = min(best.get(key, (rank, unit)), (rank, unit))
    assert sorted(x["unit"] for x in X) == sorted(u for _, u in best.values())
    for x in X:
        rows = sorted(samples(run_dir, x["unit"]), key=lambda r: (r["problem_id"], r["seed"]))
        want = []
        for kind, test in KIND_TESTS:
            longest = max((r["n_tokens"] for r in rows if test(r)), default=None)
            if longest is not None:
                want.append((kind, next(r for r in rows if test(r) and r["n_tokens"] == longest)))
        want = want[:3]
        assert [(e["kind"], e["problem_id"], e["seed"]) for e in x["excerpts"]] == \
            [(k, r["problem_id"], r["seed"]) for k, r in want]
        for e, (_, r) in zip(x["excerpts"], want):
            text, shown = r["completion"], e["excerpt"]
            assert (e["truncated"], e["extractor"], e["correct"], e["n_chars"]) == \
                (r["truncated"], r["extractor"], r["correct"], len(text))
            top = max(text.splitlines().count(ln) for ln in text.splitlines()) if text.strip() else 0
            assert e["max_line_repeats"] == top
            if e["chars_left_out"] == 0:
                assert shown == text
            else:
                head, rest = shown.split(" [… ", 1)
                count, tail = rest.split(" characters left out …] ", 1)
                assert text.startswith(head) and text.endswith(tail) and int(count) == e["chars_left_out"]
                assert len(head) + int(count) + len(tail) == len(text)
                if text == LOOP_ANSWER:
                    assert tail.count("Answer: 6") >= 10      # the loop stays visible at the end


def post_unit(run_dir: Path, ckpt_unit: str) -> str:
    """toy-post's unit at the checkpoint's protocol, else the one of the same sampling with nested seeds."""
    proto = ckpt_unit.split("/")[-1]
    if (run_dir / "evals/toy-post/toy" / proto / "manifest.json").exists():
        return f"evals/toy-post/toy/{proto}"
    sampled = {"sample4", "sample32", "curve8"}           # T 0.7, top-p 0.95 (greedy is T 0)
    seeds = unit_seeds(run_dir / ckpt_unit)
    for p in sorted(sampled):
        d = run_dir / "evals/toy-post/toy" / p
        if proto in sampled and (d / "manifest.json").exists() and (seeds <= unit_seeds(d) or unit_seeds(d) <= seeds):
            return f"evals/toy-post/toy/{p}"
    raise AssertionError(f"no π_post unit for {ckpt_unit}")


def check_vs_post(run_dir: Path) -> None:
    """Every checkpoint − π_post, paired by problem on the common seeds, bootstrapped here."""
    SG = read_json(run_dir / "stats" / "student_gains.json")
    assert sorted(v["unit_b"] for v in SG["vs_post"]) == sorted(g["unit_b"] for g in SG["gains"])
    for v in SG["vs_post"]:
        post = post_unit(run_dir, v["unit_b"])
        assert v["unit_a"] == post
        common = unit_seeds(run_dir / post) & unit_seeds(run_dir / v["unit_b"])
        a, b = per_problem(run_dir / post, common), per_problem(run_dir / v["unit_b"], common)
        gain, ci95, p = boot_summary([b[q] - a[q] for q in sorted(a)])
        assert v["gain_pp"] == pytest.approx(gain, abs=1e-9) and v["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
        assert v["p"] == pytest.approx(p, abs=1e-12) and v["n_seeds"] == len(common) and v["pair"] == "toy"


def check_unpaired(run_dir: Path) -> None:
    """Each side's per-problem accuracy on all its own seeds; two independent problem resamples per bootstrap draw
    (side a first, one default_rng(42))."""
    SG = read_json(run_dir / "stats" / "student_gains.json")
    for g in SG["gains"]:
        a, b = per_problem(run_dir / g["unit_a"]), per_problem(run_dir / g["unit_b"])
        ids = sorted(a)
        A, B = np.array([a[q] for q in ids]), np.array([b[q] for q in ids])
        rng = np.random.default_rng(42)
        ia, ib = (rng.integers(0, len(ids), (10_000, len(ids))) for _ in range(2))
        boot = 100 * (B[ib].mean(1) - A[ia].mean(1))
        u = g["unpaired"]
        assert u["gain_pp"] == pytest.approx(100 * (B.mean() - A.mean()), abs=1e-9)
        assert u["ci95_pp"] == pytest.approx(list(np.percentile(boot, [2.5, 97.5])), abs=1e-9)
        paired_width = g["ci95_pp"][1] - g["ci95_pp"][0]
        assert u["ci95_pp"][1] - u["ci95_pp"][0] > 0 and paired_width > 0


def check_all(run_dir: Path) -> None:
    check_truncated_extraction(run_dir)
    check_excerpts(run_dir)
    check_vs_post(run_dir)
    check_unpaired(run_dir)


def test_sample_tables_match_the_artifacts(looped):
    check_all(looped)


def test_report_prints_the_tables_cell_for_cell(looped):
    assert check_tables(looped) > 400
    readme = (looped / "report" / "README.md").read_text()
    for title in ("### 3.2 Naive and unpaired comparisons", "### 3.2.1 Student against π_post, paired",
                  "### 5.3 Truncation", "### 5.5 Rollout excerpts"):
        assert title in readme
    assert "Answer: 6 ⏎ Answer: 6 ⏎ Answer: 6" in readme and "characters left out" in readme


def mutated_repo(tmp: Path, path: str, old: str, new: str) -> Path:
    """A copy of the stages and lib/ with one file mutated."""
    src = Path(__file__).resolve().parent.parent
    repo = tmp / "repo"
    shutil.copytree(src / "lib", repo / "lib", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("05_stats.py", "06_report.py"):
        shutil.copy(src / f, repo / f)
    text = (repo / path).read_text()
    assert text.count(old) == 1, f"mutation target not found once in {path}: {old!r}"
    (repo / path).write_text(text.replace(old, new))
    return repo


def run_stage_in(repo: Path, script: str, run_dir: Path) -> None:
    env = os.environ | {"PYTHONPATH": str(repo), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(repo / script), "--run-dir", str(run_dir), "--pair", "toy"], cwd=repo,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]


MUTANTS = {   # name: (script, old, new); the check named must fail on the mutated stage's output
    "extraction counted on all samples, not the truncated": (
        "lib/report/campaign.py",
        '"n_truncated_extracted": sum(r["extractor"] != "none" for r in trunc),',
        '"n_truncated_extracted": sum(r["extractor"] != "none" for r in rows),'),
    "truncated samples that reached counted over all samples": (
        "lib/report/rollouts.py", '"n_truncated_reached": sum(reached(r) for r in rows if r["truncated"])}',
        '"n_truncated_reached": sum(reached(r) for r in rows)}'),
    "reached read from the last answer, not the first": (
        "lib/report/rollouts.py", "first = row[\"first_answer\"]", "first = row[\"extracted\"]"),
    "a condition pooled on its first seed only": (
        "05_stats.py", '**pool_truncated([trunc_by_unit[g["unit_b"]] for g in e["per_seed"]])}',
        '**pool_truncated([trunc_by_unit[g["unit_b"]] for g in e["per_seed"][:1]])}'),
    "excerpts from the last of the longest of a kind": (
        "lib/report/rollouts.py", "r = max(of_kind, key=lambda r: r[\"n_tokens\"])",
        "r = max(reversed(of_kind), key=lambda r: r[\"n_tokens\"])"),
    "excerpts from the shortest of a kind": (
        "lib/report/rollouts.py", "r = max(of_kind, key=lambda r: r[\"n_tokens\"])",
        "r = min(of_kind, key=lambda r: r[\"n_tokens\"])"),
    "excerpt tail cut off": ("lib/report/rollouts.py", "{text[-tail:]}", "{text[-tail:-20]}"),
    "student vs π_pre instead of π_post": ("05_stats.py", "post = matching_unit(aliases[1], ckpt)",
                                           "post = matching_unit(aliases[0], ckpt)"),
    "unpaired resampling shares one index draw": (
        "lib/report/stats.py", "idx_b = rng.integers(0, len(ids), size=(n_boot, len(ids)))", "idx_b = idx_a"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_checks_catch_a_mutated_stage(looped, tmp_path, name):
    """The mutated file (a stage, or a lib/report module a stage imports) is run from a copy of the repository's
    stage folder, so the module version is the one the stage imports."""
    path, old, new = MUTANTS[name]
    run_dir = tmp_path / "toy"
    shutil.copytree(looped, run_dir)
    if path.endswith("05_stats.py"):
        run_mutant("05_stats.py", old, new, run_dir, tmp_path)
    else:
        repo = mutated_repo(tmp_path, path, old, new)
        run_stage_in(repo, "05_stats.py", run_dir)
    with pytest.raises(AssertionError):
        check_all(run_dir)


REPORT_MUTANTS = {   # name: (old, new) in 06_report.py; check_tables must fail on the README it writes
    "reached % of all printed as of the truncated": ('["truncated_accuracy_pct"], 2), pct(t["reached_pct"]),',
                                                     '["truncated_accuracy_pct"], 2), pct(t["truncated_reached_pct"]),'),
    "extracted % printed as correct of extracted %": ('t["n_extracted_correct"], pct(t["correct_of_extracted_pct"])',
                                                      't["n_extracted_correct"], pct(t["extracted_pct"])'),
    "π_post and checkpoint accuracy swapped": ('v["pair"], pct(v["acc_a"], 2),\n        pct(v["acc_b"], 2)',
                                               'v["pair"], pct(v["acc_b"], 2),\n        pct(v["acc_a"], 2)'),
    "unpaired CI printed as the paired one": ('ci(g["unpaired"]["ci95_pp"]),', 'ci(g["ci95_pp"]),'),
    "excerpt of another sample": ('excerpt_text(e["excerpt"])]\n       for x in ROLL["excerpts"] for e in x["excerpts"]]',
                                  'excerpt_text(x["excerpts"][0]["excerpt"])]\n       for x in ROLL["excerpts"] '
                                  'for e in x["excerpts"]]'),
}


@pytest.mark.parametrize("name", sorted(REPORT_MUTANTS))
def test_report_checks_catch_a_mutated_report(looped, tmp_path, name):
    run_dir = tmp_path / "toy"
    shutil.copytree(looped, run_dir)
    run_mutant("06_report.py", *REPORT_MUTANTS[name], run_dir, tmp_path)
    with pytest.raises(AssertionError):
        check_tables(run_dir)


# --- figures (issue 32 item 7) ---

def test_figures_per_condition(looped):
    figs = sorted(p.name for p in (looped / "report" / "figures").glob("*.png"))
    for name in ("dynamics_by_condition.png", "teacher_vs_student.png", "student_gain_toy_sample4.png"):
        assert name in figs
    readme = (looped / "report" / "README.md").read_text()
    assert "(figures/dynamics_by_condition.png)" in readme and "teacher gain vs student gain per condition" in readme


def test_a_chart_of_only_full_bars_is_left_out(tmp_path):
    """Every unit answers through the Answer: line on every sample: the answer-format chart would be all 100 % bars;
    it is not drawn, and the report says why."""
    from lib.report.figures import all_one_extractor
    assert all_one_extractor([{"answer_line": 100.0, "boxed": 0.0, "none": 0.0}] * 3)
    assert not all_one_extractor([{"answer_line": 100.0, "boxed": 0.0, "none": 0.0},
                                  {"answer_line": 0.0, "boxed": 100.0, "none": 0.0}])
    assert not all_one_extractor([{"answer_line": 90.0, "boxed": 10.0, "none": 0.0}])
    from test_report import P_CORRECT, write_unit
    run_dir = tmp_path / "toy"
    one_style = lambda rows: [dict(r, extractor="answer_line", extracted="3") for r in rows]   # noqa: E731
    for k, (alias, proto) in enumerate([(a, p) for a in ("toy-pre", "toy-post", "toy-student")
                                        for p in ("sample4", "greedy")]):
        write_unit(run_dir, alias, proto, P_CORRECT[alias], 96, 30, k, mutate=one_style)
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    run_stage("06_report.py", run_dir)
    assert not (run_dir / "report" / "figures" / "answer_format.png").exists()
    assert "answers through one extractor on all its samples: no chart is drawn" in \
        (run_dir / "report" / "README.md").read_text()


# --- a condition trained on another pair (a collapse arm, the RAFT student) is read against that pair ---

def test_a_condition_of_another_pair_is_read_against_its_own_pi_post(tmp_path):
    from test_report import P_CORRECT, model_block, write_train, write_unit
    run_dir = tmp_path / "toy"
    for k, alias in enumerate(("toy-pre", "toy-post", "toy-student")):
        write_unit(run_dir, alias, "sample4", P_CORRECT[alias], 96, 30, k)
    write_unit(run_dir, "toy-post-offsupport", "sample4", (0.6, 0.5, 0.4, 0.1), 96, 30, 9)
    for k, (name, pair) in enumerate((("main", "toy"), ("off", "toy-offsupport"))):
        write_train(run_dir, name, {"pair": pair, "reward": "delta-topk", "steps": 40, "seed": 42, "lr": 2e-4}, 40, 25,
                    (40,))
        write_unit(run_dir, f"{name}-step40", "sample4", (0.9, 0.8, 0.3, 0.05), 96, 30, 20 + k,
                   model=model_block(f"{name}-step40", name, 40, "toy-student"))
    run_stage("05_stats.py", run_dir, "--pair", "toy")
    SG = read_json(run_dir / "stats" / "student_gains.json")
    T = read_json(run_dir / "stats" / "teacher_gains.json")
    vp = {v["run"]: v for v in SG["vs_post"]}
    assert (vp["main"]["unit_a"], vp["main"]["pair"]) == ("evals/toy-post/toy/sample4", "toy")
    assert (vp["off"]["unit_a"], vp["off"]["pair"]) == ("evals/toy-post-offsupport/toy/sample4", "toy-offsupport")
    ev = run_dir / "evals"
    for v in vp.values():
        a, b = per_problem(run_dir / v["unit_a"]), per_problem(run_dir / v["unit_b"])
        assert v["gain_pp"] == pytest.approx(boot_summary([b[q] - a[q] for q in sorted(a)])[0], abs=1e-9)
    assert sorted(T["by_pair"]) == ["toy", "toy-offsupport"]
    [t] = T["by_pair"]["toy-offsupport"]
    a, b = per_problem(ev / "toy-pre/toy/sample4"), per_problem(ev / "toy-post-offsupport/toy/sample4")
    gain, ci95, _ = boot_summary([b[q] - a[q] for q in sorted(a)])
    assert t["gain_pp"] == pytest.approx(gain, abs=1e-9) and t["ci95_pp"] == pytest.approx(ci95, abs=1e-9)
    C = read_json(run_dir / "stats" / "conditions.json")
    assert {c["settings"]["pair"] for c in C["conditions"]} == {"toy", "toy-offsupport"}
    run_stage("06_report.py", run_dir)
    assert "Hypotheses of pair `toy`" in (run_dir / "report" / "README.md").read_text()
