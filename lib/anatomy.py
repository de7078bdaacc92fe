"""Shift anatomy (SPEC §8.5): what a teacher pair's reward looks like on the student's OWN samples, before training.

The student samples one completion per prompt at the rollout settings; π_pre, π_post and the student score the
sampled ids (lib.scoring, the training loop's code). Per response token t of sequence s, with y_t the sampled id and
x_1..x_K the student's top-K candidates (K = 16, the delta-topk reward of SPEC §7.2):

    Δ_t      = log π_post(y_t) − log π_pre(y_t)                             (delta-sampled reward)
    W_t      = Σ_k w_k (log π_post(x_k) − log π_pre(x_k)),  w = softmax_k log π_student(x_k)
                                                                             (delta-topk's weighted_reward_mean)
Reported, pooled over all tokens: token-mean Δ, student-weighted mean W, % tokens with Δ > 0, mean |Δ| (the shift
magnitude); mean Δ at the terminal stop token of samples that stopped; each model's mean log p(stop) at genuine
answer ends (the stop token of samples that stopped after an extractable answer: where the student chose to end);
and the length-controlled AUROC of the sequence-mean Δ̄_s = mean_t Δ_t for correctness.

Length control by stratification: sequences fall into length-quantile bins (edges from the sample's own quantiles;
ties stay together) and the AUROC counts only (correct, wrong) pairs within one bin,

    AUROC_lc = Σ_b Σ_{i∈C_b, j∈W_b} ([Δ̄_i > Δ̄_j] + ½[Δ̄_i = Δ̄_j]) / Σ_b |C_b|·|W_b|

(the Mann–Whitney statistic pooled over strata). A score that only tracked length cannot earn credit across bins, and
unlike residualising Δ̄ on log length it assumes no functional form. CI: resample sequences with replacement
(numpy default_rng(42), 10,000 resamples; bins kept from the full sample), 95 % percentile interval; resamples with
no within-bin (correct, wrong) pair are dropped and counted.

Source-report orientation (per token, on 2,960 frozen student rollouts): OpenThinker3 pair 34 % of tokens > 0 and
terminal EOS Δ −90; RAFT pair 84.7 % and −0.006; RL pair 58 % and −6.3; |Δ| ≈ 2.7 (corpus pairs) vs 0.099 (RAFT).
"""
from __future__ import annotations

import math

import numpy as np

MODELS = ("student", "pi_pre", "pi_post")


# --- AUROC with length control ---

def length_strata(lengths, n_bins: int = 4) -> np.ndarray:
    """Bin index per sequence from the lengths' own quantiles; equal lengths always share a bin."""
    lengths = np.asarray(lengths, dtype=float)
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, n_bins + 1)))
    return np.searchsorted(edges[1:-1], lengths, side="right")


def _pair_matrices(scores, labels, strata):
    """Per stratum b: indices of positives P_b, negatives N_b and the (|P_b|, |N_b|) win matrix (1, ½ on ties)."""
    out = []
    for b in np.unique(strata):
        pos = np.flatnonzero((strata == b) & labels)
        neg = np.flatnonzero((strata == b) & ~labels)
        if len(pos) and len(neg):
            d = scores[pos][:, None] - scores[neg][None, :]
            out.append((pos, neg, (d > 0) + 0.5 * (d == 0)))
    return out


def stratified_auroc(scores, labels, strata=None) -> tuple[float | None, int]:
    """(AUROC pooled over within-stratum (positive, negative) pairs, number of such pairs); None if no pair."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    strata = np.zeros(len(scores), int) if strata is None else np.asarray(strata)
    mats = _pair_matrices(scores, labels, strata)
    n_pairs = sum(m.size for _, _, m in mats)
    return (sum(m.sum() for _, _, m in mats) / n_pairs if n_pairs else None), n_pairs


def bootstrap_aurocs(scores, labels, strata=None, n_resamples: int = 10_000, seed: int = 42,
                     chunk: int = 1_000) -> np.ndarray:
    """The stratified AUROC of each of n_resamples resamples of the sequences (NaN where it is undefined).

    A resample is a count vector c ~ Multinomial(n, 1/n) over the n sequences (= n draws with replacement); its
    AUROC is Σ_b c_P_bᵀ M_b c_N_b / Σ_b (Σ c_P_b)(Σ c_N_b) — the statistic on the resampled multiset, computed
    without materialising it (strata and win matrices M_b from the full sample)."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    strata = np.zeros(len(scores), int) if strata is None else np.asarray(strata)
    mats = _pair_matrices(scores, labels, strata)
    rng = np.random.default_rng(seed)
    n, out = len(scores), []
    for start in range(0, n_resamples, chunk):
        c_BN = rng.multinomial(n, np.full(n, 1.0 / n), size=min(chunk, n_resamples - start)).astype(float)
        num, den = np.zeros(len(c_BN)), np.zeros(len(c_BN))
        for pos, neg, m in mats:
            num += ((c_BN[:, pos] @ m) * c_BN[:, neg]).sum(1)          # (B,P)@(P,Q) → (B,Q), dot with (B,Q)
            den += c_BN[:, pos].sum(1) * c_BN[:, neg].sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(num / den)
    return np.concatenate(out) if out else np.zeros(0)


def bootstrap_auroc_ci(scores, labels, strata=None, n_resamples: int = 10_000, seed: int = 42,
                       level: float = 0.95) -> dict:
    """Percentile CI of the stratified AUROC; resamples where it is undefined are dropped and counted."""
    auc_B = bootstrap_aurocs(scores, labels, strata, n_resamples, seed)
    ok = auc_B[np.isfinite(auc_B)]
    alpha = (1 - level) / 2
    ci = [float(np.quantile(ok, alpha)), float(np.quantile(ok, 1 - alpha))] if len(ok) else None
    return {"ci": ci, "level": level, "n_resamples": n_resamples, "n_dropped": int(n_resamples - len(ok)), "seed": seed}


# --- the summary ---

def _mean(xs) -> float | None:
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()) if xs.size else None


def summarise(seqs: list[dict], n_bins: int = 4, n_resamples: int = 10_000) -> dict:
    """seqs: one dict per sampled sequence with
        delta      (T,) Δ_t on the sampled ids          weighted   (T,) W_t
        stopped    bool: the last token is the stop     answer_end bool: stopped right after an extractable answer
        lp_stop    {model: log p(stop)} at the last token when stopped, else None
        correct    bool | None (None: no gold answer)   n_tokens   int (stop token included)"""
    delta = np.concatenate([np.asarray(s["delta"], float) for s in seqs]) if seqs else np.zeros(0)
    weighted = np.concatenate([np.asarray(s["weighted"], float) for s in seqs]) if seqs else np.zeros(0)
    stop_delta = [s["delta"][-1] for s in seqs if s["stopped"]]
    interior = np.concatenate([np.asarray(s["delta"][:-1] if s["stopped"] else s["delta"], float) for s in seqs]) \
        if seqs else np.zeros(0)
    ends = [s for s in seqs if s["stopped"] and s["answer_end"]]
    out = {
        "n_sequences": len(seqs), "n_tokens": int(delta.size),
        "token_mean_delta": _mean(delta), "student_weighted_mean": _mean(weighted),
        "pos_frac": _mean(delta > 0), "abs_mean_delta": _mean(np.abs(delta)),
        "interior_mean_delta": _mean(interior), "non_finite_tokens": int((~np.isfinite(delta)).sum()),
        "stop": {"n": len(stop_delta), "mean_delta": _mean(stop_delta), "pos_frac": _mean(np.asarray(stop_delta) > 0)},
        "logp_stop_at_answer_end": {"n": len(ends), **{m: _mean([s["lp_stop"][m] for s in ends]) for m in MODELS}},
        "stop_rate": _mean([s["stopped"] for s in seqs]), "mean_tokens": _mean([s["n_tokens"] for s in seqs]),
    }
    graded = [s for s in seqs if s["correct"] is not None]
    out["accuracy"] = _mean([s["correct"] for s in graded])
    out["auroc"] = auroc_report(graded, n_bins, n_resamples)
    return out


def auroc_report(graded: list[dict], n_bins: int, n_resamples: int) -> dict:
    """Length-controlled AUROC of sequence-mean Δ for correctness, with its bootstrap CI (and the raw AUROC)."""
    method = f"within {n_bins} length-quantile bins, pooled (Mann-Whitney over within-bin pairs)"
    n_c = sum(bool(s["correct"]) for s in graded)
    base = {"method": method, "n_correct": n_c, "n_wrong": len(graded) - n_c, "n_bins": n_bins}
    if not n_c or n_c == len(graded):
        return {**base, "length_controlled": None, "raw": None, "ci95": None,
                "why": f"needs both correct and wrong samples; got {n_c} correct of {len(graded)} graded"}
    score = np.array([np.mean(s["delta"]) for s in graded])
    label = np.array([bool(s["correct"]) for s in graded])
    strata = length_strata([s["n_tokens"] for s in graded], n_bins)
    auc, n_pairs = stratified_auroc(score, label, strata)
    raw, _ = stratified_auroc(score, label)
    if auc is None:
        return {**base, "length_controlled": None, "raw": raw, "ci95": None, "n_pairs": 0,
                "why": "no length bin holds both a correct and a wrong sample"}
    boot = bootstrap_auroc_ci(score, label, strata, n_resamples)
    return {**base, "length_controlled": float(auc), "raw": raw, "ci95": boot["ci"], "n_pairs": n_pairs,
            "bootstrap": boot, "n_bins_used": int(len(np.unique(strata)))}


# --- the gate ---

def anatomy_gate(stats: dict, min_stop_delta: float, min_abs_delta: float, min_pos_frac: float) -> list[str]:
    """Reasons to fail (empty = PASS): an anti-EOS shift, a shift too small to carry anything, a shift that
    penalises most of the student's own tokens, or non-finite rewards."""
    reasons = []
    lp = stats["logp_stop_at_answer_end"]
    fmt = lambda x: "n/a" if x is None else f"{x:+.3f}"   # noqa: E731
    if stats["non_finite_tokens"]:
        reasons.append(f"{stats['non_finite_tokens']} tokens have a non-finite Δ: a teacher assigns −inf to the "
                       "student's tokens (a vocabulary or masking problem) — the reward is unusable")
    if stats["stop"]["n"] == 0:
        reasons.append(f"none of the {stats['n_sequences']} samples stopped within the response cap, so Δ at the stop "
                       "token cannot be measured: check the student's stop ids or raise --anatomy-max-new-tokens")
    elif stats["stop"]["mean_delta"] < min_stop_delta:
        reasons.append(f"mean Δ at the terminal stop token is {stats['stop']['mean_delta']:+.3f} nats over "
                       f"{stats['stop']['n']} stops (< {min_stop_delta}): at genuine answer ends π_post puts log p(stop) "
                       f"{fmt(lp['pi_post'])} vs π_pre {fmt(lp['pi_pre'])} (student {fmt(lp['student'])}) — π_post is off "
                       "support at the stop token, so Direct-OPD would teach the student not to stop (termination "
                       "collapse, SPEC §1). Use another pair, --eos-policy neutral|clamp, or --allow anatomy")
    if stats["abs_mean_delta"] is not None and stats["abs_mean_delta"] < min_abs_delta:
        reasons.append(f"shift magnitude mean |Δ| = {stats['abs_mean_delta']:.4f} nats/token (< {min_abs_delta}): "
                       "π_pre and π_post barely differ on the student's samples; there is nothing to transfer")
    if stats["pos_frac"] is not None and stats["pos_frac"] < min_pos_frac:
        reasons.append(f"only {100 * stats['pos_frac']:.1f} % of the student's tokens have Δ > 0 (< "
                       f"{100 * min_pos_frac:.0f} %): the pair mostly says 'stop being yourself' (the source report's "
                       "corpus-SFT pairs: 23–34 %, vs RL 58 %, RAFT 84.7 %)")
    if not all(math.isfinite(v) for v in (stats["token_mean_delta"] or 0.0, stats["abs_mean_delta"] or 0.0)):
        reasons.append("token-mean Δ is not finite")
    return reasons
