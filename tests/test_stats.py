"""lib.report.stats against independent computations, and the pure helpers of lib.report.campaign.

- exact enumeration: a 3-problem case has 3^3 = 27 equally likely resamples; the bootstrap's p, CI and mean must match
  the exact distribution within Monte-Carlo error;
- brute force: a plain Python loop over the same default_rng draws (scalar draws, one problem at a time) must give
  the same gain, CI and p to 1e-9, including the restriction of a 32-seed side to an 8-seed side's seeds;
- known answers: identical models → gain 0, p = 1; all-positive differences → p < 0.0001;
- refusals: mismatched ids, non-nested seed grids, a side whose problems disagree on seeds, non-0/1 scores;
- the five transfer-ratio guards one at a time, the gate, the gain scan, the cap-sensitivity views, the collapse watch.
"""
from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from lib.report import stats
from lib.report.campaign import check_unit, collapse_watch, diagnostics, UnitError
from lib.report.stats import AlignmentError, paired_bootstrap


# --- exact enumeration on 3 problems ---

def exact_distribution(d):
    """All len(d)^len(d) resamples, each equally likely: the exact bootstrap distribution of the mean (in pp)."""
    P = len(d)
    return np.array([100.0 * sum(d[i] for i in idx) / P for idx in itertools.product(range(P), repeat=P)])


def exact_quantile(dist, q):
    """Left-continuous inverse CDF of an equally weighted discrete distribution."""
    xs = np.sort(dist)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


@pytest.mark.parametrize("a, b", [
    # per-problem samples on seeds 0-3: d = [+1/4, +2/4, -1/4]
    ([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], [[1, 1, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1]]),
    # d = [-2/4, +1/4, 0]: a mixed case with an atom at 0
    ([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 1]], [[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 1, 1]]),
])
def test_bootstrap_matches_exact_enumeration(a, b):
    B = 10_000
    res = paired_bootstrap({f"p{i}": x for i, x in enumerate(a)}, {f"p{i}": x for i, x in enumerate(b)}, n_boot=B)
    d = [(sum(y) - sum(x)) / 4 for x, y in zip(a, b)]
    dist = exact_distribution(d)
    assert res["gain_pp"] == pytest.approx(100 * np.mean(d), abs=1e-12)
    q_le, q_ge = np.mean(dist <= 1e-12), np.mean(dist >= -1e-12)
    p_exact = min(1.0, 2 * min(q_le, q_ge))
    q = min(q_le, q_ge)
    assert abs(res["p"] - p_exact) <= 5 * 2 * math.sqrt(q * (1 - q) / B) + 1e-12
    delta = 5 * math.sqrt(0.025 * 0.975 / B)     # 5 SE of an empirical 2.5 % quantile level
    lo, hi = res["ci95_pp"]
    assert exact_quantile(dist, 0.025 - delta) <= lo <= exact_quantile(dist, 0.025 + delta)
    assert exact_quantile(dist, 0.975 - delta) <= hi <= exact_quantile(dist, 0.975 + delta)


def test_exact_case_all_positive_gives_p_zero():
    res = paired_bootstrap({"x": [0, 0], "y": [0, 1], "z": [1, 0]}, {"x": [1, 0], "y": [1, 1], "z": [1, 1]})
    assert exact_distribution([0.5, 0.5, 0.5]).min() > 0
    assert res["p"] == 0.0 and res["p_str"] == "p<0.0001" and res["ci95_pp"] == [50.0, 50.0]


# --- brute force: a Python loop over the same draws ---

def brute_force(a: dict, b: dict, n_boot: int, seed: int):
    ids = sorted(a)
    seeds = sorted(set(a[ids[0]]) & set(b[ids[0]]))
    d = [sum(b[p][s] for s in seeds) / len(seeds) - sum(a[p][s] for s in seeds) / len(seeds) for p in ids]
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(n_boot):
        total = 0.0
        for _ in range(len(ids)):
            total += d[int(rng.integers(0, len(ids)))]
        boot.append(100 * total / len(ids))
    boot.sort()

    def pctl(q):   # numpy's default "linear" method, written out
        h = (len(boot) - 1) * q
        return boot[math.floor(h)] + (h - math.floor(h)) * (boot[math.ceil(h)] - boot[math.floor(h)])

    le = sum(x <= 1e-9 for x in boot) / n_boot
    ge = sum(x >= -1e-9 for x in boot) / n_boot
    return 100 * sum(d) / len(d), [pctl(0.025), pctl(0.975)], min(1.0, 2 * min(le, ge))


@pytest.mark.parametrize("P, seeds_a, seeds_b, seed", [(60, 4, 4, 42), (37, 32, 8, 7), (25, 1, 1, 3)])
def test_bootstrap_matches_brute_force_loop(P, seeds_a, seeds_b, seed):
    rng = np.random.default_rng(1000 + P)
    skill = rng.random(P)
    a = {f"q{i:03d}": {s: int(rng.random() < skill[i]) for s in range(seeds_a)} for i in range(P)}
    b = {f"q{i:03d}": {s: int(rng.random() < min(1, skill[i] + 0.1)) for s in range(seeds_b)} for i in range(P)}
    res = paired_bootstrap(a, b, n_boot=3000, seed=seed)
    gain, (lo, hi), p = brute_force(a, b, 3000, seed)
    assert res["gain_pp"] == pytest.approx(gain, abs=1e-9)
    assert res["ci95_pp"] == pytest.approx([lo, hi], abs=1e-9)
    assert res["p"] == pytest.approx(p, abs=1e-12)
    assert res["n_seeds"] == min(seeds_a, seeds_b)
    assert res["audit"]["grids"] == ("nested" if seeds_a != seeds_b else "identical")


def test_defaults_are_spec_and_fast():
    rng = np.random.default_rng(0)
    a = {f"p{i}": list(rng.integers(0, 2, 4)) for i in range(500)}
    b = {f"p{i}": list(rng.integers(0, 2, 4)) for i in range(500)}
    elapsed = []
    for _ in range(3):   # best of 3: the machine may be busy with other tests
        t = time.perf_counter()
        res = paired_bootstrap(a, b)
        elapsed.append(time.perf_counter() - t)
    elapsed = min(elapsed)
    assert res == paired_bootstrap(a, b, n_boot=10_000, seed=42) and res["n_boot"] == 10_000
    assert res != paired_bootstrap(a, b, seed=43)
    assert elapsed < 1.0, f"10,000 × 500 bootstrap took {elapsed:.2f} s"


# --- known answers and input forms ---

def test_identical_models_gain_zero_p_one():
    rng = np.random.default_rng(5)
    a = {f"p{i}": list(rng.integers(0, 2, 8)) for i in range(30)}
    res = paired_bootstrap(a, a)
    assert res["gain_pp"] == 0 and res["p"] == 1.0 and res["ci95_pp"] == [0.0, 0.0] and not res["ci_excludes_0"]
    assert stats.verdict(res) == "not significant"


def test_all_negative_differences():
    res = paired_bootstrap({f"p{i}": [1, 1] for i in range(10)}, {f"p{i}": [i % 2, 0] for i in range(10)})
    assert res["p"] == 0.0 and res["ci95_pp"][1] < 0 and stats.verdict(res) == "loss"
    assert res["ci_excludes_0"]               # a loss's CI excludes 0 as a gain's does (05's JSON carries the flag)
    assert stats.format_gain(res).endswith("p<0.0001")


def test_list_and_mapping_forms_agree():
    rng = np.random.default_rng(9)
    a = {f"p{i}": list(map(int, rng.integers(0, 2, 4))) for i in range(20)}
    b = {f"p{i}": list(map(int, rng.integers(0, 2, 4))) for i in range(20)}
    as_map = lambda s: {p: {str(k): v for k, v in enumerate(x)} for p, x in s.items()}   # JSON-style str seeds
    assert paired_bootstrap(a, b) == paired_bootstrap(as_map(a), as_map(b))


def test_float_path_agrees_with_integer_path():
    rng = np.random.default_rng(11)
    A, B = rng.integers(0, 2, (40, 4)), rng.integers(0, 2, (40, 4))
    exact = stats.bootstrap_counts(B.sum(1) - A.sum(1), 4)
    flt = stats.bootstrap_means(A.mean(1), B.mean(1))
    assert flt["gain_pp"] == pytest.approx(exact["gain_pp"]) and flt["p"] == exact["p"]
    assert flt["ci95_pp"] == pytest.approx(exact["ci95_pp"])


# --- refusals ---

def test_refuses_mismatched_ids_naming_them():
    a = {f"p{i}": [1, 0] for i in range(5)}
    b = {f"p{i}": [1, 0] for i in range(1, 6)}
    with pytest.raises(AlignmentError, match=r"only in unitA: \[p0\]; only in unitB: \[p5\]"):
        paired_bootstrap(a, b, names=("unitA", "unitB"))
    # an explicit subset is allowed when both sides hold it
    assert paired_bootstrap(a, b, ids=["p1", "p2", "p3"])["n_problems"] == 3
    with pytest.raises(AlignmentError, match="unitA lacks problems"):
        paired_bootstrap(a, b, names=("unitA", "unitB"), ids=["p5"])


def test_refuses_non_nested_grids_and_ragged_sides():
    a = {"p0": {0: 1, 1: 0}, "p1": {0: 1, 1: 1}}
    b = {"p0": {1: 1, 2: 0}, "p1": {1: 0, 2: 1}}
    with pytest.raises(AlignmentError, match="not nested"):
        paired_bootstrap(a, b)
    ragged = {"p0": {0: 1, 1: 0}, "p1": {0: 1}, "p2": {0: 0, 1: 1}}
    with pytest.raises(AlignmentError, match=r"U: mismatched seeds — problems p1 "):
        paired_bootstrap(ragged, ragged, names=("U", "V"))
    with pytest.raises(ValueError, match="correctness 0.5"):
        paired_bootstrap({"p0": [0.5]}, {"p0": [1]})


def test_check_unit_refusals_name_the_ids():
    scores = {"seeds": [0, 1], "n_problems": 2}
    row = lambda p, s: {"problem_id": p, "seed": s}
    check_unit("u", scores, [row("a", 0), row("a", 1), row("b", 0), row("b", 1)])
    with pytest.raises(UnitError, match=r"unit u: duplicated samples b@seed1"):
        check_unit("u", scores, [row("a", 0), row("a", 1), row("b", 0), row("b", 1), row("b", 1)])
    with pytest.raises(UnitError, match=r"mismatched seeds — problems b .*b has \[0\]"):
        check_unit("u", scores, [row("a", 0), row("a", 1), row("b", 0)])
    with pytest.raises(UnitError, match="missing problems"):
        check_unit("u", scores, [row("a", 0), row("a", 1)])


# --- gate, guards, scan ---

def res(gain, lo, hi):
    return {"gain_pp": gain, "ci95_pp": [lo, hi], "ci_excludes_0": lo > 0 or hi < 0}


def test_teacher_gate():
    assert stats.teacher_gate(res(5, 1, 9))["pass"]
    assert not stats.teacher_gate(res(5, -1, 9))["pass"]
    assert not stats.teacher_gate(res(-5, -9, -1))["pass"]
    assert not stats.teacher_gate(None)["pass"]


@pytest.mark.parametrize("teacher, student, failed", [
    (res(20, 10, 30), res(5, 1, 9), []),
    (res(0.8, 0.2, 1.4), res(5, 1, 9), ["teacher_abs_ge_1pp"]),
    (res(-20, -30, -10), res(5, 1, 9), ["teacher_positive"]),
    (res(20, -1, 41), res(5, 1, 9), ["teacher_ci_excludes_0"]),
    (res(20, 10, 30), res(-5, -9, -1), ["student_positive"]),
    (res(20, 10, 30), res(2, -1, 5), ["student_ci_excludes_0"]),
])
def test_transfer_ratio_guards(teacher, student, failed):
    r = stats.transfer_ratio(teacher, student)
    assert r["failed"] == failed
    assert r["ratio"] == (None if failed else pytest.approx(student["gain_pp"] / teacher["gain_pp"]))
    assert r["unguarded_ratio"] == pytest.approx(student["gain_pp"] / teacher["gain_pp"])


def test_gain_scan():
    s = stats.gain_scan([res(2, 1, 3), res(-2, -3, -1), res(-2, -4, -0.5), res(1, -1, 3), res(0, 0, 0)])
    assert s == {"n": 5, "positive_significant": 1, "negative_significant": 2, "not_significant": 2}


def test_cap_sensitivity_against_manual_views():
    rng = np.random.default_rng(4)
    P, S, cap = 30, 4, 50
    pre = {f"p{i}": list(map(int, rng.integers(0, 2, S))) for i in range(P)}
    post = {f"p{i}": list(map(int, rng.integers(0, 2, S))) for i in range(P)}
    tok = {f"p{i}": list(map(int, rng.integers(10, 50 + 40 * (i % 3 == 0) + 1, S))) for i in range(P)}
    tok["p0"] = [99] * S                                           # p0: nothing within the cap
    v = stats.cap_sensitivity(pre, post, tok, cap)
    wrong = {p: [c * (t <= cap) for c, t in zip(post[p], tok[p])] for p in post}
    assert v["over_cap_as_wrong"] == paired_bootstrap(pre, wrong, names=("pi_pre", "pi_post"))
    kept = [p for p in post if any(t <= cap for t in tok[p])]
    acc = [np.mean([c for c, t in zip(post[p], tok[p]) if t <= cap]) for p in kept]
    assert "p0" not in kept and v["problems_covered"] == len(kept) == v["kept_only"]["n_problems"]
    assert v["kept_only"]["acc_b"] == pytest.approx(100 * np.mean(acc))
    assert v["kept_only"]["gain_pp"] == pytest.approx(100 * np.mean([a - np.mean(pre[p]) for a, p in zip(acc, kept)]))
    assert v["kept_sample_pct"] == pytest.approx(100 * np.mean([t <= cap for p in tok for t in tok[p]]))
    with pytest.raises(AlignmentError, match="n_tokens missing for problems \\[p3\\]"):
        stats.cap_sensitivity(pre, post, {**tok, "p3": [1, 2]}, cap)


# --- collapse watch and diagnostics ---

def test_collapse_watch_by_hand():
    clip = [0, 0, 0.2, 0.6, 0.95, 0.95, 0.7, 0.3, 0.92, 0.95, 0.99, 0.6]
    length = [100, 120, 150, 210, 300, 300, 280, 190, 300, 300, 300, 250]
    m = [{"step": i + 1, "response_length/clip_ratio": c, "response_length/mean": x} for i, (c, x) in enumerate(zip(clip, length))]
    w = collapse_watch(m)
    assert w["collapse_onset_step"] == 4 and w["length_runaway_step"] == 4 and w["collapse_band"] == [4, 7]
    assert w["longest_clip90_span"] == [9, 11] and w["longest_clip90_run"] == 3 and w["peak_clip_ratio"] == 0.99
    calm = collapse_watch([{"step": s, "response_length/clip_ratio": 0.1, "response_length/mean": 50} for s in (1, 2)])
    assert calm["collapse_onset_step"] is None and calm["collapse_band"] is None and calm["longest_clip90_span"] is None
    assert calm["longest_clip90_run"] == 0


def test_diagnostics_by_hand():
    r = lambda ok, trunc, ext, n, lvl: {"problem_id": f"p{lvl}", "correct": ok, "truncated": trunc, "extractor": ext,
                                        "n_tokens": n, "verify_method": "math_verify", "level": lvl}
    rows = [r(True, False, "answer_line", 10, 1), r(False, True, "none", 96, 1), r(True, True, "boxed", 96, 2),
            r(False, False, "answer_line", 30, 2)]
    d = diagnostics(rows)
    assert d["accuracy_pct"] == 50 and d["truncation_pct"] == 50 and d["mean_tokens"] == 58
    assert d["extractor_pct"] == {"answer_line": 50, "boxed": 25, "none": 25}
    assert d["n_truncated"] == 2 and d["truncated_extracted_pct"] == 50 and d["truncated_accuracy_pct"] == 50
    assert d["accuracy_by_level_pct"] == {"1": 50, "2": 50} and d["n_problems"] == 2


def test_nested_grid_that_is_not_a_prefix():
    rng = np.random.default_rng(21)
    a = {f"p{i}": {s: int(rng.integers(0, 2)) for s in range(8)} for i in range(12)}
    b = {f"p{i}": {s: int(rng.integers(0, 2)) for s in (3, 6)} for i in range(12)}
    r = paired_bootstrap(a, b)
    assert r["seeds"] == [3, 6] and r["audit"]["restricted"] == "a"
    assert r["gain_pp"] == pytest.approx(100 * np.mean([(b[p][3] + b[p][6] - a[p][3] - a[p][6]) / 2 for p in a]))


# --- several training seeds: the pooled gain, and Holm's adjustment ---

def test_pooled_gain_matches_independent_numpy():
    """K = 3 seeds, each checkpoint on its own seed grid (8, 4, 8 samples) against one 32-sample init; the pooled
    estimator recomputed with numpy loops: d̄[p] = mean_k (acc_ckpt_k[p] − acc_init[p] on ckpt k's seeds)."""
    rng = np.random.default_rng(17)
    P = 45
    skill = rng.random(P)
    init = {f"q{i:02d}": {s: int(rng.random() < skill[i]) for s in range(32)} for i in range(P)}
    grids = [range(8), range(4), range(8, 16)]
    ckpts = [{f"q{i:02d}": {s: int(rng.random() < min(1, skill[i] + 0.05 * k)) for s in g} for i in range(P)}
             for k, g in enumerate(grids)]
    res = stats.pooled_gain([(init, c) for c in ckpts], n_boot=2000, seed=5)
    ids = sorted(init)
    dbar = np.zeros(P)
    for c, g in zip(ckpts, grids):
        for j, p in enumerate(ids):
            dbar[j] += (np.mean([c[p][s] for s in g]) - np.mean([init[p][s] for s in g])) / len(ckpts)
    rng2 = np.random.default_rng(5)
    boot = np.array([100 * np.mean(dbar[rng2.integers(0, P, P)]) for _ in range(2000)])
    assert res["gain_pp"] == pytest.approx(100 * dbar.mean(), abs=1e-9)
    assert res["ci95_pp"] == pytest.approx(list(np.percentile(boot, [2.5, 97.5])), abs=1e-9)
    p = min(1.0, 2 * min(np.mean(boot <= 1e-9), np.mean(boot >= -1e-9)))
    assert res["p"] == pytest.approx(p, abs=1e-12) and res["n_training_seeds"] == 3 and res["n_problems"] == P
    # one seed pooled is that seed's own paired gain
    one = stats.pooled_gain([(init, ckpts[0])], n_boot=2000, seed=5)
    single = paired_bootstrap(init, ckpts[0], n_boot=2000, seed=5)
    assert one["gain_pp"] == pytest.approx(single["gain_pp"]) and one["ci95_pp"] == pytest.approx(single["ci95_pp"])
    # seeds on different problem sets cannot be pooled
    with pytest.raises(AlignmentError, match="other problems"):
        stats.pooled_gain([(init, ckpts[0]), ({p: init[p] for p in ids[:-1]}, {p: ckpts[1][p] for p in ids[:-1]})])


def test_holm_known_values_and_step_down_definition():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.0, 0.5]) == [0.0, 0.5] and stats.holm([]) == []
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = list(rng.random(int(rng.integers(1, 8))) ** 3)
        adj = stats.holm(p)
        for alpha in (0.01, 0.05, 0.1, 0.3):
            # Holm's sequential procedure: reject the k smallest while p_(k) ≤ alpha / (m − k + 1)
            rejected, m = set(), len(p)
            for k, i in enumerate(sorted(range(m), key=lambda i: p[i])):
                if p[i] > alpha / (m - k):
                    break
                rejected.add(i)
            assert {i for i in range(m) if adj[i] <= alpha} == rejected


def test_a_verdict_needs_its_holm_p_and_its_ci():
    """05's verdict per condition × benchmark (stats.holm_verdicts), by hand: Holm's p of [0.01, 0.03, 0.04] is
    [0.03, 0.06, 0.06], so the third result is 'not significant' although its CI excludes 0, and the second is too
    although its raw p is below 0.05; a CI that holds 0 is never called, whatever its p."""
    res = [{"p": 0.01, "ci95_pp": [1.0, 3.0]}, {"p": 0.03, "ci95_pp": [0.5, 2.0]}, {"p": 0.04, "ci95_pp": [-3.0, -1.0]}]
    got = stats.holm_verdicts(res)
    assert [p for p, _ in got] == pytest.approx([0.03, 0.06, 0.06])
    assert [v for _, v in got] == ["gain", "not significant", "not significant"]
    assert stats.holm_verdicts([{"p": 0.001, "ci95_pp": [-3.0, -1.0]}, {"p": 0.001, "ci95_pp": [-1.0, 2.0]}]) == [
        (0.002, "loss"), (0.002, "not significant")]


def test_collapse_watch_agrees_with_the_trainers_live_watch():
    """lib.report.campaign recomputes the watch from metrics.jsonl; lib.train.opd.CollapseWatch runs live in the trainer.
    Same thresholds (declared once, in lib.train.opd), same onset, runaway and longest clip>run_clip length."""
    from lib.train.opd import CollapseWatch
    rng = np.random.default_rng(8)
    for _ in range(30):
        n = int(rng.integers(5, 40))
        clip = list(np.round(rng.choice([0.0, 0.3, 0.5, 0.55, 0.9, 0.95, 1.0], n), 2))
        length = list(rng.integers(20, 120, n).astype(float))
        live = CollapseWatch()
        for s, (c, x) in enumerate(zip(clip, length), 1):
            live.update(s, c, x)
        w = collapse_watch([{"step": s, "response_length/clip_ratio": c, "response_length/mean": x}
                            for s, (c, x) in enumerate(zip(clip, length), 1)])
        assert {k: w[k] for k in live.summary()} == live.summary()
        span = w["longest_clip90_span"]
        assert (span[1] - span[0] + 1 if span else 0) == w["longest_clip90_run"]


def test_collapse_thresholds_are_strict_in_both_watches():
    """DESIGN.md §7.5's detectors fire strictly above their thresholds: a clip ratio of exactly 0.5 is no onset and a
    mean length of exactly twice step 1's is no runaway, in the live watch and in the report's recomputation."""
    from lib.train.opd import CollapseWatch
    clip, length = [0.0, 0.5, 0.51], [50.0, 100.0, 101.0]
    live = CollapseWatch()
    for s, (c, x) in enumerate(zip(clip[:2], length[:2]), 1):
        live.update(s, c, x)
    assert live.summary() == {"collapse_onset_step": None, "length_runaway_step": None, "longest_clip90_run": 0}
    live.update(3, clip[2], length[2])
    assert (live.collapse_onset_step, live.length_runaway_step) == (3, 3)
    w = collapse_watch([{"step": s, "response_length/clip_ratio": c, "response_length/mean": x}
                        for s, (c, x) in enumerate(zip(clip, length), 1)])
    assert (w["collapse_onset_step"], w["length_runaway_step"]) == (3, 3)


def test_time_ledger_adds_reruns(tmp_path):
    """Every stage run counts once: the manifests on disk, the earlier runs a manifest lists under previous_runs,
    and the rows of an older ledger whose manifest a rerun has overwritten (not those still on disk)."""
    import json
    from lib.report.campaign import earlier_runs, manifest_runs, time_ledger

    def manifest(d, stage, started, wall, gpu=0.0, **extra):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "manifest.json").write_text(json.dumps(
            {"stage": stage, "started": started, "ended": started, "wall_s": wall, "gpu_s": gpu, **extra}))

    manifest("raft", "07_raft", "t0", 596.3, devices=["cpu (2 cores)"])
    manifest("report", "06_report", "t0", 5.0)                  # the report's own manifest is left out
    old = manifest_runs(tmp_path)
    manifest("raft", "07_raft", "t1", 17.1)                     # the rerun overwrites raft/manifest.json
    manifest("train/opd", "03_opd_train", "t2", 30.0, 4.0, devices=["NVIDIA H200"],
             previous_runs=[{"started": "t1", "wall_s": 70.0, "gpu_s": 8.0}])
    now = manifest_runs(tmp_path)
    back = earlier_runs(old, now)
    assert [(r["dir"], r["wall_s"]) for r in back] == [("raft", 596.3)]
    assert earlier_runs(now, now) == []
    led = time_ledger(tmp_path, earlier=back)
    assert led["stages"]["07_raft"] == {"n_runs": 2, "wall_s": pytest.approx(613.4), "gpu_s": 0.0,
                                        "devices": {"cpu (2 cores)": 1, "not recorded": 1}}
    assert led["stages"]["03_opd_train"] == {"n_runs": 2, "wall_s": 100.0, "gpu_s": 12.0,
                                             "devices": {"NVIDIA H200": 1, "not recorded": 1}}
    assert "06_report" not in led["stages"] and led["total"]["n_runs"] == 4
    # where each run was computed: its manifest's devices; an earlier run a manifest lists names none
    assert led["total"]["devices"] == {"NVIDIA H200": 1, "cpu (2 cores)": 1, "not recorded": 2}


# --- conditions, snapshots, the naive comparison, rollout tables, hypotheses (lib/report/conditions.py, rollouts.py,
# hypotheses.py) ---

def test_conditions_group_only_identical_settings():
    from lib.report.conditions import build_conditions, run_settings
    base = {"pair": "toy", "reward": "delta-topk", "eos_policy": "raw", "lr": 2e-4, "run_dir": "a", "run_name": "x",
            "time_limit": None, "logger": "none"}
    runs = [("raw", 42, base), ("raw-seed1", 1, base | {"run_dir": "b", "run_name": "y", "time_limit": 60.0}),
            ("neutral", 42, base | {"eos_policy": "neutral"}), ("lowlr", 42, base | {"lr": 1e-4}),
            ("opd", 42, base | {"reward": "opd"}), ("again", 42, base | {"logger": "tensorboard"}), ("old", 3, None)]
    conds, of = build_conditions([{"name": n, "reward": a["reward"] if a else "delta-topk", "seed": s,
                                   "status": "finished", "settings": run_settings(a | {"seed": s} if a else None)}
                                  for n, s, a in runs])
    by_runs = {tuple(c["runs"]): c for c in conds}
    # bookkeeping (paths, run name, time budget, logger) and the seed never split a condition; anything else does
    assert sorted(by_runs) == [("again", "raw", "raw-seed1"), ("lowlr",), ("neutral",), ("old",), ("opd",)]
    raw = by_runs[("again", "raw", "raw-seed1")]
    assert raw["seeds"] == [42, 1] and raw["duplicate_seeds"] == [{"run": "raw", "seed": 42}]
    assert raw["name"] == "delta-topk+eos-policy=raw+lr=0.0002"
    assert by_runs[("neutral",)]["name"] == "delta-topk+eos-policy=neutral+lr=0.0002"
    assert by_runs[("lowlr",)]["name"] == "delta-topk+eos-policy=raw+lr=0.0001"
    assert by_runs[("opd",)]["name"] == "opd" and by_runs[("old",)]["id"] == "unrecorded:old"
    assert len({c["id"] for c in conds}) == len(conds) == len({c["name"] for c in conds})
    assert of["raw"] == of["raw-seed1"] != of["neutral"]
    # a run recorded before --truncated-policy existed ran with its default (raw): one condition with a new raw run
    assert run_settings(base) == run_settings(base | {"truncated_policy": "raw"}) != \
        run_settings(base | {"truncated_policy": "mask"})



def test_condition_names_say_the_pair_once():
    """Two pairs' conditions of one reward are named by the pair alone (its recorded name and file hash follow from
    it), unless one pair name holds two files: then the hash tells them apart, by its first 8 hex digits."""
    from lib.report.conditions import name_conditions
    h1, h2 = "1f" * 32, "e0" * 32

    def cond(pair, name, sha):
        return {"reward": "delta-topk", "runs": [pair], "settings": {"pair": pair, "pair_name": name,
                                                                      "pair_sha256": sha, "lr": 2e-4}}
    names = name_conditions({"a": cond("toy", "toy", h1), "b": cond("toy-raft", "toy-raft", h2)})
    assert names == {"a": "delta-topk+pair=toy", "b": "delta-topk+pair=toy-raft"}
    names = name_conditions({"a": cond("toy", "toy", h1), "b": cond("p.toml", "smol", h1),
                             "c": cond("p.toml", "smol", h2)})
    assert names == {"a": "delta-topk+pair=toy+pair-sha256=1f1f1f1f",
                     "b": "delta-topk+pair=p.toml+pair-sha256=1f1f1f1f",
                     "c": "delta-topk+pair=p.toml+pair-sha256=e0e0e0e0"}
    assert len(set(names.values())) == 3


def test_snapshots_at_checkpoints_and_either_side_of_the_onset():
    from lib.report.conditions import snapshots
    metrics = [{"step": s, "response_length/mean": 10.0 + s, "response_length/clip_ratio": 0.1 * s} for s in range(1, 9)]
    got = snapshots(metrics, [4, 8], 6)
    assert [(x["step"], x["why"]) for x in got] == [(4, ["checkpoint"]), (5, ["before onset"]), (6, ["onset"]),
                                                     (7, ["after onset"]), (8, ["checkpoint"])]
    assert [x["response_length/mean"] for x in got] == [14.0, 15.0, 16.0, 17.0, 18.0]
    assert [x["step"] for x in snapshots(metrics, [8], 8)] == [7, 8]        # step 9 was never logged
    assert snapshots(metrics, [], None) == []


def test_naive_gain_uses_each_sides_own_seeds():
    rng = np.random.default_rng(21)
    a = {f"q{i}": {s: int(rng.random() < 0.5) for s in range(32)} for i in range(30)}
    b = {f"q{i}": {s: int(rng.random() < 0.6) for s in range(8)} for i in range(30)}
    res = stats.naive_gain(a, b, n_boot=2000, seed=5)
    d = [np.mean(list(b[p].values())) - np.mean(list(a[p].values())) for p in sorted(a)]
    means = 100 * np.asarray(d)[np.random.default_rng(5).integers(0, 30, (2000, 30))].mean(1)
    assert res["gain_pp"] == pytest.approx(100 * np.mean(d), abs=1e-9)
    assert res["ci95_pp"] == pytest.approx(list(np.percentile(means, [2.5, 97.5])), abs=1e-9)
    assert (res["seeds_a"], res["seeds_b"]) == (32, 8)
    assert res["gain_pp"] != pytest.approx(paired_bootstrap(a, b)["gain_pp"])   # the paired one cuts a to 8 seeds


def test_rollout_tables_pure_rules():
    """lib/report/rollouts.py's small rules, by hand: reached counts only on a toy benchmark; a pooled reached count
    only when every unit has one; a completion is cut only when the cut saves more than the marker costs; the excerpt
    of a kind is the longest sample, ties broken by (problem id, seed) whatever the input order; empty text repeats
    no line."""
    from lib.report.rollouts import HEAD_CHARS, TAIL_CHARS, cut, excerpts, max_line_repeats, pool_truncated, \
        reached_counts
    rows = [{"first_answer": "6", "answer": "6", "truncated": True}, {"first_answer": "60+1", "answer": "6",
                                                                      "truncated": False}]
    assert reached_counts(rows, "toy") == {"n_reached": 2, "n_truncated_reached": 1}
    assert reached_counts(rows, "math500") == {"n_reached": None, "n_truncated_reached": None}
    unit = {"n_samples": 4, "n_truncated": 2, "n_extracted": 1, "n_extracted_correct": 1, "n_reached": 2,
            "n_truncated_reached": 1}
    assert pool_truncated([unit, unit])["n_reached"] == 4
    assert pool_truncated([unit, dict(unit, n_reached=None)])["n_reached"] is None
    short = "x" * (HEAD_CHARS + TAIL_CHARS + 40)
    assert cut(short) == (short, 0) and cut(short + "y")[1] == 41
    sample = lambda pid, seed, n: {"problem_id": pid, "seed": seed, "n_tokens": n, "truncated": False, "correct": 1,
                                   "extractor": "answer_line", "completion": f"{pid}/{seed}"}
    picked = excerpts([sample("p2", 0, 9), sample("p1", 1, 9), sample("p1", 0, 9), sample("p0", 0, 3)])
    assert [(e["problem_id"], e["seed"]) for e in picked] == [("p1", 0)]
    assert max_line_repeats("") == 0 and max_line_repeats("a\nb\na") == 2


def test_hypothesis_clauses_hold_fail_and_say_what_is_missing():
    from lib.registry import Clause, Hypothesis
    from lib.report.hypotheses import evaluate
    conds = [{"id": "c1", "name": "opd", "reward": "opd", "settings": {"pair": "toy", "reward": "opd"}},
             {"id": "c2", "name": "delta-topk", "reward": "delta-topk",
              "settings": {"pair": "toy", "reward": "delta-topk"}}]
    watch = lambda onset, peak: {"collapse_onset_step": onset, "peak_clip_ratio": peak}
    runs = [{"run": "opd", "condition_id": "c1", "watch": watch(None, 0.01), "status": "finished", "last_step": 45,
             "steps_planned": 45, "step1_weighted_reward": 0.3},
            {"run": "topk", "condition_id": "c2", "watch": watch(12, 1.0), "status": "finished", "last_step": 45,
             "steps_planned": 45, "step1_weighted_reward": -0.02},
            {"run": "topk-seed1", "condition_id": "c2", "watch": watch(None, 0.2), "status": "unfinished",
             "last_step": 10, "steps_planned": 45, "step1_weighted_reward": -0.01}]
    decision = {"gain_pp": 7.5, "ci95_pp": [5.0, 9.5], "verdict": "gain"}
    rows = [{"condition_id": "c1", "benchmark": "toy", "protocol": "sample4", "decision": decision}]
    gate = {"pass": True, "reason": "gain > 0 and CI excludes 0"}
    opd, topk = (("reward", "opd"),), (("reward", "delta-topk"),)
    h = lambda *clauses: evaluate(Hypothesis("h", "toy", "claim", clauses), conds, runs, rows, gate)
    ok = h(Clause("teacher_gate"), Clause("no_collapse", opd), Clause("gain", opd), Clause("no_collapse", opd, 30))
    assert ok["verdict"] == "holds" and ok["failing"] == ok["missing"] == []
    bad = h(Clause("no_collapse", topk), Clause("gain", topk), Clause("reward_negative", opd))
    assert bad["verdict"] == "fails" and bad["failing"] == [1, 3] and bad["missing"] == [2]
    assert "topk: clip ratio first exceeded 0.5 at step 12" in bad["clauses"][0]["detail"]
    assert "no evaluated checkpoint of condition delta-topk" in bad["clauses"][1]["detail"]
    assert bad["clauses"][2]["detail"] == "opd: +0.3000 at step 1"
    # an onset after the clause's step does not fail it; an unfinished seed without onset leaves `collapse` open
    late = h(Clause("no_collapse", topk, 11), Clause("collapse", topk), Clause("reward_negative", topk))
    assert [c["result"] for c in late["clauses"]] == ["undecided", "undecided", "holds"]
    assert "topk-seed1 logged 10 of 11 steps (unfinished)" == late["clauses"][0]["detail"]
    quiet = h(Clause("collapse", opd))                      # opd ran all its 45 planned steps without an onset
    assert quiet["verdict"] == "fails" and "opd: no onset in 45 steps (peak clip ratio 0.010)" == quiet["clauses"][0][
        "detail"]
    none = h(Clause("gain", ()), Clause("collapse", (("reward", "delta-sampled"),)))
    assert none["verdict"] == "undecided" and "selects 2 conditions" in none["clauses"][0]["detail"]
    assert evaluate(Hypothesis("g", "toy", "c", (Clause("teacher_gate"),)), conds, runs, rows,
                    {"pending": True, "pass": False, "reason": "pending: units"})["verdict"] == "undecided"
    # the boundaries: an onset AT the clause's last step fails it; a step-1 reward of exactly 0 is not negative; a
    # "not significant" benchmark is no gain
    assert h(Clause("no_collapse", topk, 12))["clauses"][0]["result"] == "fails"
    zero = [dict(r, step1_weighted_reward=0.0) if r["run"] == "opd" else r for r in runs]
    assert evaluate(Hypothesis("z", "toy", "c", (Clause("reward_negative", opd),)), conds, zero, rows,
                    gate)["verdict"] == "fails"
    flat = [dict(rows[0], decision={"gain_pp": 1.5, "ci95_pp": [-0.5, 3.5], "verdict": "not significant"})]
    assert evaluate(Hypothesis("n", "toy", "c", (Clause("gain", opd),)), conds, runs, flat, gate)["clauses"][0][
        "detail"] == "0 of 1 benchmark(s) show a gain: toy/sample4 +1.500 [-0.500, +3.500] not significant"


def test_held_clause_needs_every_run_below_the_held_bar():
    """`held` (what "a fix prevents the collapse" means for the collapse arm): every run's peak clip ratio below 0.1.
    A run that never crossed the onset (0.5) but ran away to 0.45 passes `no_collapse` and fails `held`; an unfinished
    run below the bar leaves it open; one already past the bar fails it at once."""
    from lib.registry import Clause, Hypothesis
    from lib.report.hypotheses import evaluate
    cond = [{"id": "c", "name": "fix", "reward": "delta-topk", "settings": {"pair": "toy", "reward": "delta-topk"}}]
    topk = (("reward", "delta-topk"),)

    def verdicts(*runs):
        rs = [{"run": f"r{i}", "condition_id": "c", "watch": {"collapse_onset_step": None, "peak_clip_ratio": peak},
               "status": "finished" if last == 20 else "unfinished", "last_step": last, "steps_planned": 20,
               "step1_weighted_reward": -0.05} for i, (peak, last) in enumerate(runs)]
        h = evaluate(Hypothesis("h", "toy", "c", (Clause("no_collapse", topk), Clause("held", topk))), cond, rs, [],
                     {"pass": True, "reason": ""})
        return [c["result"] for c in h["clauses"]], h["clauses"][1]["detail"]

    assert verdicts((0.02, 20), (0.05, 20)) == (["holds", "holds"], "2 run(s), peak clip ratio 0.050")
    assert verdicts((0.02, 20), (0.45, 20)) == (["holds", "fails"], "r1: peak clip ratio 0.450")
    assert verdicts((0.1, 20),)[0] == ["holds", "fails"]                   # the bar itself is not below it
    assert verdicts((0.02, 20), (0.05, 12)) == (["undecided", "undecided"], "r1 logged 12 of 20 steps (unfinished)")
    assert verdicts((0.3, 12),)[0] == ["undecided", "fails"]
    with pytest.raises(ValueError, match="held clause reads the whole run"):
        evaluate(Hypothesis("h", "toy", "c", (Clause("held", topk, 10),)), cond,
                 [{"run": "r", "condition_id": "c", "watch": {"peak_clip_ratio": 0.0}}], [], {})


def test_registry_hypotheses_are_well_formed():
    from lib.registry import HYPOTHESES, PAIRS
    from lib.report.hypotheses import clause_text
    assert len({h.name for h in HYPOTHESES}) == len(HYPOTHESES)
    for h in HYPOTHESES:
        assert h.pair in PAIRS and h.clauses and h.claim
        for c in h.clauses:
            assert not clause_text(c).startswith("unknown"), (h.name, c.kind)
