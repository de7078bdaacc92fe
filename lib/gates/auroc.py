"""Length-controlled AUROC (DESIGN.md §8.5): does a per-sequence score rank correct above wrong samples beyond what
their lengths already say?

Length control by stratification: sequences fall into length-quantile bins (edges from the sample's own quantiles;
ties stay together) and the AUROC counts only (correct, wrong) pairs within one bin,

    AUROC_lc = Σ_b Σ_{i∈C_b, j∈W_b} ([s_i > s_j] + ½[s_i = s_j]) / Σ_b |C_b|·|W_b|

(the Mann–Whitney statistic pooled over strata). A score that only tracked length cannot earn credit across bins, and
unlike residualising the score on log length it assumes no functional form. CI: resample sequences with replacement
(numpy default_rng(42), 10,000 resamples; bins kept from the full sample), 95 % percentile interval; resamples with
no within-bin (correct, wrong) pair are dropped and counted. Pure numpy; lib/gates/anatomy.py applies it to Δ̄_s.
"""
from __future__ import annotations

import numpy as np


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
