"""Statistics of DESIGN.md §6: the paired per-problem bootstrap and the rules built on it. Pure numerics, no disk.

A model's scores on a benchmark are `{problem_id: per-sample correctness}`, where the samples are either a list
(sample index = seed) or a mapping `seed -> 0/1`. Two models are compared *paired by problem*:

    acc_a[p] = mean over the common seeds S of correct_a[p, s]          (P problems, S seeds)
    d[p]     = acc_b[p] - acc_a[p]                                        gain = 100 · mean_p d[p]   (pp)
    resample the P problems with replacement B = 10,000 times (numpy.random.default_rng(42)):
    d*_b     = mean of d over the b-th resample                          (B,)
    CI95     = numpy's linear-interpolated 2.5 / 97.5 percentiles of 100 · d*
    p        = min(1, 2 · min(P*(d* ≤ 0), P*(d* ≥ 0)))                   printed `p<0.0001` when it is 0

Alignment (the audit): both sides must hold the same problem ids; within a side every problem must carry the same seed
grid; the two grids must be nested (e.g. an 8-sample curve unit against a 32-sample baseline), and the larger side
is then restricted to the common seeds. Anything else is refused with the ids and the unit names.

On a common seed grid every d[p] is an integer count difference / S, so the bootstrap runs on integer sums and
"d* ≤ 0" is decided exactly (identical models give gain 0 and p = 1, never p = 0.98 from rounding). Views with
ragged per-problem sample counts (cap sensitivity, kept-only) go through float means with a 1e-12 tie tolerance.

Several training seeds of one reward (DESIGN.md §6), each seed k's checkpoint against the same initial student:

    d_k[p]   = acc_ckpt_k[p] - acc_init[p]       per seed, on the seeds both units share (the per-seed gain above)
    d̄[p]     = (1/K) · sum_k d_k[p]              the pooled paired difference of problem p
    pooled   = 100 · mean_p d̄[p], CI and p from resampling the P problems as above (one index draw shared by all
               seeds, so a problem's seed-to-seed spread stays inside d̄[p]; training-seed variance is *not* resampled,
               so the pooled CI is about these K trained students on this benchmark, not about all training seeds)

Multiple comparisons: a verdict drawn from m tested gains uses Holm's step-down adjusted p (`holm`): sort the p
ascending, p_adj(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)); a gain is called only when p_adj < 0.05 and its CI
excludes 0.
"""
from __future__ import annotations

import numpy as np

N_BOOT, SEED = 10_000, 42
TIE_TOL = 1e-12                       # float sums of per-problem means closer to 0 than this count as 0
MIN_TEACHER_GAIN_PP = 1.0             # transfer-ratio guard: |teacher gain| ≥ 1.0 pp
ALPHA = 0.05                          # a verdict needs its Holm-adjusted p below this


class AlignmentError(ValueError):
    """Two sets of scores cannot be paired: different problems, or seed grids that are not nested."""


# --- scores: {problem_id: list | {seed: 0/1}} → {problem_id: {seed: 0/1}} ---

def normalize(scores: dict, name: str = "scores") -> dict[str, dict[int, int]]:
    out = {}
    for pid, samples in scores.items():
        items = samples.items() if isinstance(samples, dict) else enumerate(samples)
        row = {}
        for seed, v in items:
            if v not in (0, 1, True, False):
                raise ValueError(f"{name}: problem {pid} seed {seed} has correctness {v!r}; expected 0/1")
            row[int(seed)] = int(v)
        if not row:
            raise AlignmentError(f"{name}: problem {pid} has no samples; drop it or re-run the unit")
        out[str(pid)] = row
    return out


def _first(xs, k: int = 5) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs[:k])) + (f" … (+{len(xs) - k} more)" if len(xs) > k else "")


def seed_grid(scores: dict[str, dict[int, int]], name: str) -> tuple[int, ...]:
    """The one seed grid every problem of a side shares; refuse a side whose problems disagree."""
    grids = {pid: tuple(sorted(row)) for pid, row in scores.items()}
    values = sorted(set(grids.values()), key=lambda g: (-sum(1 for x in grids.values() if x == g), g))
    if len(values) > 1:
        main = values[0]
        odd = [pid for pid, g in grids.items() if g != main]
        raise AlignmentError(f"{name}: mismatched seeds — problems {_first(odd)} have seed grids other than the "
                             f"unit's {list(main)}; every problem of a unit must carry the same seeds "
                             "(re-run the unit)")
    return values[0]


def align(scores_a: dict, scores_b: dict, names=("a", "b"),
          ids=None) -> tuple[list, tuple, np.ndarray, np.ndarray, dict]:
    """Pair two score sets by problem id and common seeds. Returns (ids, seeds, A_PS, B_PS, audit).

    `ids`: pair on exactly these problems (a reduced unit against a full baseline); each side must hold all of them.
    """
    na, nb = names
    a, b = normalize(scores_a, na), normalize(scores_b, nb)
    if ids is None:
        only_a, only_b = set(a) - set(b), set(b) - set(a)
        if only_a or only_b:
            raise AlignmentError(f"mismatched problem ids between {na} ({len(a)} problems) and {nb} ({len(b)}): "
                                 f"only in {na}: [{_first(only_a)}]; only in {nb}: [{_first(only_b)}]. "
                                 f"Pair units of the same benchmark, or name the subset explicitly")
        ids = sorted(a)
    else:
        ids = sorted(map(str, ids))
        for side, s in ((na, a), (nb, b)):
            missing = set(ids) - set(s)
            if missing:
                raise AlignmentError(f"{side} lacks problems [{_first(missing)}] that the pairing asks for")
        a, b = {p: a[p] for p in ids}, {p: b[p] for p in ids}
    if not ids:
        raise AlignmentError(f"{na} and {nb} share no problems")
    ga, gb = seed_grid(a, na), seed_grid(b, nb)
    sa, sb = set(ga), set(gb)
    if not (sa <= sb or sb <= sa):
        raise AlignmentError(f"seed grids of {na} {list(ga)} and {nb} {list(gb)} are not nested; a paired "
                             f"comparison needs one grid inside the other (re-run one unit on the other's seeds)")
    seeds = tuple(sorted(sa & sb))
    A_PS = np.array([[a[p][s] for s in seeds] for p in ids], dtype=np.int64)   # (P, S)
    B_PS = np.array([[b[p][s] for s in seeds] for p in ids], dtype=np.int64)   # (P, S)
    audit = {"ok": True, "n_problems": len(ids), "seeds_a": len(ga), "seeds_b": len(gb), "seeds_common": len(seeds),
             "grids": "identical" if sa == sb else "nested",
             "restricted": None if sa == sb else (na if len(sa) > len(sb) else nb)}
    return ids, seeds, A_PS, B_PS, audit


# --- the bootstrap ---

def resample_index(n_problems: int, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """(B, P) problem indices, drawn row by row from default_rng(seed) (identical to B successive draws of P)."""
    return np.random.default_rng(seed).integers(0, n_problems, size=(n_boot, n_problems))


def _summary(boot_B: np.ndarray, gain: float, zero_le: np.ndarray, zero_ge: np.ndarray, n_boot: int) -> dict:
    lo, hi = np.percentile(boot_B, [2.5, 97.5])
    p = min(1.0, 2.0 * min(zero_le.mean(), zero_ge.mean()))
    return {"gain_pp": float(gain), "ci95_pp": [float(lo), float(hi)], "p": float(p), "p_str": format_p(p),
            "ci_excludes_0": bool(lo > 0 or hi < 0), "n_boot": n_boot}


def bootstrap_counts(diff_P: np.ndarray, n_seeds: int, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Exact-integer bootstrap: diff_P[p] = (#correct_b − #correct_a) on problem p over the n_seeds common seeds."""
    P = len(diff_P)
    sums_B = diff_P.astype(np.int64)[resample_index(P, n_boot, seed)].sum(axis=1)     # (B,)  integers
    scale = 100.0 / (P * n_seeds)
    return _summary(sums_B * scale, diff_P.sum() * scale, sums_B <= 0, sums_B >= 0, n_boot)


def bootstrap_means(acc_a_P: np.ndarray, acc_b_P: np.ndarray, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Float bootstrap on per-problem mean accuracies (0..1) — for views with ragged sample counts."""
    d_P = np.asarray(acc_b_P, float) - np.asarray(acc_a_P, float)
    P = len(d_P)
    mean_B = d_P[resample_index(P, n_boot, seed)].mean(axis=1)                      # (B,)
    res = _summary(100.0 * mean_B, 100.0 * d_P.mean(), mean_B <= TIE_TOL, mean_B >= -TIE_TOL, n_boot)
    res.update(n_problems=P, acc_a=100.0 * float(np.mean(acc_a_P)), acc_b=100.0 * float(np.mean(acc_b_P)))
    return res


def pooled_gain(pairs: list[tuple[dict, dict]], n_boot: int = N_BOOT, seed: int = SEED, names=None, ids=None) -> dict:
    """Pooled gain over K training seeds: `pairs` = [(scores_init, scores_ckpt_k)], all on the same problems.
    Per problem the mean over seeds of the paired difference, bootstrapped over problems (module docstring)."""
    if not pairs:
        raise ValueError("pooled_gain needs at least one (init, checkpoint) pair")
    names = names or [(f"init#{k}", f"ckpt#{k}") for k in range(len(pairs))]
    d_KP, acc_a, acc_b, ref = [], [], [], None
    for (a, b), nm in zip(pairs, names):
        pids, seeds, A_PS, B_PS, _ = align(a, b, nm, ids)
        if ref is not None and pids != ref:
            raise AlignmentError(f"{nm[1]} covers other problems than {names[0][1]}; pool seeds on one problem set")
        ref = pids
        d_KP.append(B_PS.mean(1) - A_PS.mean(1))
        acc_a.append(A_PS.mean(1))
        acc_b.append(B_PS.mean(1))
    res = bootstrap_means(np.mean(acc_a, 0), np.mean(acc_b, 0), n_boot, seed)   # mean_p d̄[p] = mean(acc_b − acc_a)
    res.update(n_training_seeds=len(pairs), estimator="mean over training seeds of the per-problem paired difference, "
               "bootstrapped over problems")
    return res


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (module docstring)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        out[i] = running
    return out


def paired_bootstrap(scores_a: dict, scores_b: dict, n_boot: int = N_BOOT, seed: int = SEED,
                     names=("a", "b"), ids=None) -> dict:
    """Gain of b over a in percentage points, with the 95 % percentile CI, the two-sided p and the alignment audit."""
    ids, seeds, A_PS, B_PS, audit = align(scores_a, scores_b, names, ids)
    res = bootstrap_counts(B_PS.sum(1) - A_PS.sum(1), len(seeds), n_boot, seed)
    res.update(n_problems=len(ids), n_seeds=len(seeds), seeds=list(seeds),
               acc_a=100.0 * float(A_PS.mean()), acc_b=100.0 * float(B_PS.mean()), audit=audit)
    return res


def naive_gain(scores_a: dict, scores_b: dict, n_boot: int = N_BOOT, seed: int = SEED, names=("a", "b"),
               ids=None) -> dict:
    """The naive comparison beside a restricted paired one: each side's per-problem accuracy over ALL its own seeds
    (e.g. 8 checkpoint samples against the init's full 32), the difference bootstrapped over problems. Paired in
    problems, unpaired in samples: not the estimand, shown so a reader can see the seed restriction did not make the
    result."""
    a, b = normalize(scores_a, names[0]), normalize(scores_b, names[1])
    ids = sorted(a) if ids is None else sorted(map(str, ids))
    acc_a = np.array([np.mean(list(a[p].values())) for p in ids])
    acc_b = np.array([np.mean(list(b[p].values())) for p in ids])
    res = bootstrap_means(acc_a, acc_b, n_boot, seed)
    res.update(seeds_a=len(seed_grid({p: a[p] for p in ids}, names[0])),
               seeds_b=len(seed_grid({p: b[p] for p in ids}, names[1])))
    return res


def unpaired_gain(scores_a: dict, scores_b: dict, n_boot: int = N_BOOT, seed: int = SEED, names=("a", "b"),
                  ids=None) -> dict:
    """The comparison with no pairing at all: each side's per-problem accuracy over all its own seeds, each side's
    problems resampled independently (two index draws per resample from one default_rng(seed), side a first). The
    gain equals the naive one; its CI is what the report would print had it ignored that both sides answered the
    same problems — set beside the paired CI it shows what pairing buys."""
    a, b = normalize(scores_a, names[0]), normalize(scores_b, names[1])
    ids = sorted(a) if ids is None else sorted(map(str, ids))
    acc_a = np.array([np.mean(list(a[p].values())) for p in ids])
    acc_b = np.array([np.mean(list(b[p].values())) for p in ids])
    rng = np.random.default_rng(seed)
    idx_a = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    idx_b = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    mean_B = acc_b[idx_b].mean(axis=1) - acc_a[idx_a].mean(axis=1)
    res = _summary(100.0 * mean_B, 100.0 * (acc_b.mean() - acc_a.mean()), mean_B <= TIE_TOL, mean_B >= -TIE_TOL,
                   n_boot)
    res.update(n_problems=len(ids), acc_a=100.0 * float(acc_a.mean()), acc_b=100.0 * float(acc_b.mean()))
    return res


def format_p(p: float) -> str:
    return "p<0.0001" if p == 0 else f"p={p:.4f}"


def format_gain(res: dict) -> str:
    lo, hi = res["ci95_pp"]
    return f"{res['gain_pp']:+.3f} [{lo:+.3f}, {hi:+.3f}] {res['p_str']}"


NOT_SIGNIFICANT = "not significant"


def verdict(res: dict) -> str:
    """'gain' / 'loss' only when the CI excludes 0 (DESIGN.md §6's rule), else 'not significant'."""
    lo, hi = res["ci95_pp"]
    return "gain" if lo > 0 else "loss" if hi < 0 else NOT_SIGNIFICANT


def holm_verdicts(results: list[dict]) -> list[tuple[float, str]]:
    """(Holm-adjusted p, verdict) of each result of one family of tested gains, in the input order: 'gain' / 'loss'
    only when the adjusted p is below ALPHA and the CI excludes 0, else 'not significant' (the module docstring)."""
    adjusted = holm([r["p"] for r in results])
    return [(p, verdict(r) if p < ALPHA else NOT_SIGNIFICANT) for r, p in zip(results, adjusted)]


# --- rules built on the bootstrap ---

def teacher_gate(res: dict | None) -> dict:
    """DESIGN.md §6 teacher-gain gate: paired π_post − π_pre on the gate benchmark > 0 with a CI excluding 0."""
    if res is None:
        return {"pass": False, "reason": "no paired teacher gain on the gate benchmark (evaluate both teachers on it)"}
    ok = res["gain_pp"] > 0 and res["ci95_pp"][0] > 0
    return {"pass": ok, "reason": "gain > 0 and CI excludes 0" if ok else
            ("gain ≤ 0" if res["gain_pp"] <= 0 else "CI includes 0")}


def transfer_ratio(teacher: dict, student: dict) -> dict:
    """student gain / teacher gain, printed only when the five guards of DESIGN.md §6 hold; else the failed guards."""
    t, s = teacher["gain_pp"], student["gain_pp"]
    guards = {
        "teacher_abs_ge_1pp": abs(t) >= MIN_TEACHER_GAIN_PP,
        "teacher_positive": t > 0,
        "teacher_ci_excludes_0": teacher["ci_excludes_0"],
        "student_positive": s > 0,
        "student_ci_excludes_0": student["ci_excludes_0"],
    }
    failed = [k for k, ok in guards.items() if not ok]
    return {"ratio": None if failed else s / t, "guards": guards, "failed": failed,
            "unguarded_ratio": s / t if t != 0 else None}


def gain_scan(results: list[dict]) -> dict:
    """Campaign gain scan: how many paired student gains are positive / negative with a CI excluding 0."""
    v = [verdict(r) for r in results]
    return {"n": len(v), "positive_significant": v.count("gain"), "negative_significant": v.count("loss"),
            "not_significant": v.count(NOT_SIGNIFICANT)}


def cap_sensitivity(pre: dict, post: dict, post_tokens: dict, cap: int, n_boot: int = N_BOOT,
                    seed: int = SEED, names=("pi_pre", "pi_post")) -> dict:
    """π_post held to π_pre's token cap, using π_post's stored samples (per-sample n_tokens), two readings:

    over-cap-as-wrong — every π_post sample with n_tokens > cap counted incorrect (a lower bound);
    kept-only         — π_post's accuracy on its samples ≤ cap, on the problems with at least one such sample,
                        paired with π_pre on those problems (conditional, biased towards easy problems).
    """
    ids, seeds, A_PS, B_PS, audit = align(pre, post, names)
    tokens = {str(p): {int(s): n for s, n in (row.items() if isinstance(row, dict) else enumerate(row))}
              for p, row in post_tokens.items()}
    missing = [p for p in ids if any(s not in tokens.get(p, {}) for s in seeds)]
    if missing:
        raise AlignmentError(f"{names[1]}: n_tokens missing for problems [{_first(missing)}] on seeds {list(seeds)}")
    T_PS = np.array([[tokens[p][s] for s in seeds] for p in ids])                    # (P, S) n_tokens
    keep_PS = T_PS <= cap
    wrong = paired_bootstrap({p: dict(zip(seeds, A_PS[i])) for i, p in enumerate(ids)},
                             {p: dict(zip(seeds, B_PS[i] * keep_PS[i])) for i, p in enumerate(ids)},
                             n_boot, seed, names)
    covered = keep_PS.any(1)                                                         # (P,)
    kept = None
    if covered.any():
        acc_post = (B_PS * keep_PS).sum(1)[covered] / keep_PS.sum(1)[covered]
        kept = bootstrap_means(A_PS.mean(1)[covered], acc_post, n_boot, seed)
    return {"cap": cap, "n_problems": len(ids), "n_seeds": len(seeds), "kept_sample_pct": 100.0 * float(keep_PS.mean()),
            "problems_covered": int(covered.sum()), "over_cap_as_wrong": wrong, "kept_only": kept, "audit": audit}

