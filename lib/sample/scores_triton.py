"""lib/sample/draw.student_scores as four small Triton kernels over a decode step's logits (03's `--student-scores
sampler` on CUDA).

For row b of the (B, V) logits x and z = x / T (fp32), cut into n blocks of BLOCK columns:

    stats    one program per (b, block): the block's max m_c and its mass s_c = Σ exp(z − m_c)
    row      one program per row: lse = M + log Σ_c s_c · exp(m_c − M) with M = max_c m_c, and the threshold
             τ = the K-th largest of the n block maxima
    select   one program per (b, block): the block's share of the entropy, Σ exp(z − lse) · (lse − z) (each term
             ≥ 0: no cancellation between two large sums), and the block's candidates, its entries z ≥ τ
    merge    one program per row: the K largest among the blocks' candidates, sorted, the entropy summed over the
             blocks, and the drawn token's log-prob z[tok] − lse

Why τ is safe: the K block maxima at or above τ are K distinct entries of the row, so the row's K-th largest entry
is ≥ τ, and every one of the row's K largest is a candidate. A block keeps all its candidates when it has at most
K of them (compacted by a prefix sum); a block with more (ties, or fewer than K blocks: τ = −inf) keeps its own K
largest by K rounds of one max-with-index reduction, each winner masked out. Either way a row's K largest are
among what the blocks keep. On a decode step's logits a block has at most a few candidates, so the K rounds, which
the first version ran in every block (465 µs a step at 256 rows on an H200), run almost nowhere; `threshold=False`
forces them everywhere, for the bench and the tests. On one H100 at 256 rows (bench/RESULTS.md §8): 166 µs, against
489 µs with `threshold=False` and 950 µs for the compiled torch ops; one read of the logits takes 26 µs there.

The logits are read twice. The results equal student_scores' up to float rounding (the sums run in another
order); among tied logits the lower id comes first, as the scorer's sort puts it. Graph-safe: static grids, no
host sync. On CPU the kernels run under TRITON_INTERPRET=1 (tests/test_sampling.py), set before this module is
imported.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _stats(X, TEMP, M, S, V, stride_b, n_blocks, BLOCK: tl.constexpr):
    b, c = tl.program_id(0), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    z = tl.load(X + b * stride_b + cols, mask=cols < V, other=float("-inf")).to(tl.float32) / tl.load(TEMP)
    m = tl.max(z, axis=0)
    tl.store(M + b * n_blocks + c, m)
    tl.store(S + b * n_blocks + c, tl.sum(tl.exp(z - m), axis=0))


@triton.jit
def _row(M, S, LSE, TAU, n_blocks, K: tl.constexpr, THRESHOLD: tl.constexpr, NP: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, NP)
    ok = j < n_blocks
    m = tl.load(M + b * n_blocks + j, mask=ok, other=float("-inf"))
    s = tl.load(S + b * n_blocks + j, mask=ok, other=0.0)
    mx = tl.max(m, axis=0)
    tl.store(LSE + b, mx + tl.log(tl.sum(s * tl.exp(m - mx), axis=0)))
    tau = float("-inf")
    if THRESHOLD:                               # the K-th largest block maximum (K ≤ n_blocks, checked by the caller)
        for _ in tl.static_range(K):
            tau, i = tl.max(m, axis=0, return_indices=True)
            m = tl.where(j == i, float("-inf"), m)
    tl.store(TAU + b, tau)


@triton.jit
def _select(X, TEMP, LSE, TAU, E, VALS, IDS, V, stride_b, n_blocks, K: tl.constexpr, KP: tl.constexpr,
            BLOCK: tl.constexpr):
    b, c = tl.program_id(0), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    z = tl.load(X + b * stride_b + cols, mask=ok, other=float("-inf")).to(tl.float32) / tl.load(TEMP)
    lse = tl.load(LSE + b)
    ze = tl.where(ok, z, lse)                                       # a padding column adds exp(0) · 0 = 0
    tl.store(E + b * n_blocks + c, tl.sum(tl.exp(ze - lse) * (lse - ze), axis=0))
    if K > 0:
        out = (b * n_blocks + c) * K
        kk = tl.arange(0, KP)
        hit = ok & (z >= tl.load(TAU + b))
        n_hit = tl.sum(hit.to(tl.int32), axis=0)
        if n_hit <= K:                          # the common case: all the block's candidates, in column order
            pos = tl.cumsum(hit.to(tl.int32), axis=0) - 1
            tl.store(VALS + out + pos, z, mask=hit)
            tl.store(IDS + out + pos, cols.to(tl.int64), mask=hit)
            rest = (kk >= n_hit) & (kk < K)
            tl.store(VALS + out + kk, tl.full([KP], float("-inf"), tl.float32), mask=rest)
            tl.store(IDS + out + kk, tl.zeros([KP], dtype=tl.int64), mask=rest)
        else:                                   # more than K: the block's own K largest, by K rounds
            vals = tl.full([KP], float("-inf"), tl.float32)
            ids = tl.zeros([KP], dtype=tl.int64)
            for i in tl.static_range(K):
                v, j = tl.max(z, axis=0, return_indices=True)
                vals = tl.where(kk == i, v, vals)
                ids = tl.where(kk == i, (c * BLOCK + j).to(tl.int64), ids)
                z = tl.where(cols == c * BLOCK + j, float("-inf"), z)
            tl.store(VALS + out + kk, vals, mask=kk < K)
            tl.store(IDS + out + kk, ids, mask=kk < K)


@triton.jit
def _merge(X, TEMP, TOK, LSE, E, VALS, IDS, LP, TOP_IDS, TOP_LP, ENT, stride_b, n_blocks, K: tl.constexpr,
           KP: tl.constexpr, NP: tl.constexpr, CP: tl.constexpr):
    b = tl.program_id(0)
    lse = tl.load(LSE + b)
    j = tl.arange(0, NP)
    tl.store(ENT + b, tl.sum(tl.load(E + b * n_blocks + j, mask=j < n_blocks, other=0.0), axis=0))
    tok = tl.load(TOK + b)
    tl.store(LP + b, tl.load(X + b * stride_b + tok).to(tl.float32) / tl.load(TEMP) - lse)
    if K > 0:
        i = tl.arange(0, CP)
        ok = i < n_blocks * K
        v = tl.load(VALS + b * n_blocks * K + i, mask=ok, other=float("-inf"))
        ids = tl.load(IDS + b * n_blocks * K + i, mask=ok, other=0)
        kk = tl.arange(0, KP)
        top = tl.full([KP], float("-inf"), tl.float32)
        top_ids = tl.zeros([KP], dtype=tl.int64)
        for r in tl.static_range(K):
            # the largest left; among equal values the lower id (blocks and their candidates are in column order,
            # except a block's K rounds, whose ties already come lowest column first)
            w = tl.max(v, axis=0)
            at = tl.min(tl.where(v == w, ids, 0x7FFFFFFFFFFFFFFF), axis=0)
            top = tl.where(kk == r, w, top)
            top_ids = tl.where(kk == r, at, top_ids)
            v = tl.where((v == w) & (ids == at), float("-inf"), v)
        tl.store(TOP_LP + b * K + kk, top - lse, mask=kk < K)
        tl.store(TOP_IDS + b * K + kk, top_ids, mask=kk < K)


def student_scores_fused(logits_BV: torch.Tensor, tok_B: torch.Tensor, temperature: torch.Tensor, k: int,
                         block: int = BLOCK, threshold: bool = True):
    """draw.student_scores' (lp_B, ids_Bk, lp_Bk, ent_B) by the four kernels above. `temperature`: a 0-dim fp32
    tensor on the logits' device (the decoder's own), read by the kernels. `threshold=False`: every block keeps its
    K largest by K rounds (the same results, slower)."""
    B, V = logits_BV.shape
    if k > block:
        raise ValueError(f"student_scores_fused: k = {k} exceeds the block of {block} columns")
    x = logits_BV if logits_BV.stride(1) == 1 else logits_BV.contiguous()
    n = triton.cdiv(V, block)
    f32 = dict(device=x.device, dtype=torch.float32)
    m_Bn, s_Bn, e_Bn = (torch.empty(B, n, **f32) for _ in range(3))
    lse_B, tau_B, lp_B, ent_B = (torch.empty(B, **f32) for _ in range(4))
    vals = torch.empty(B, max(n * k, 1), **f32)
    ids = torch.empty(B, max(n * k, 1), device=x.device, dtype=torch.int64)
    top_lp = torch.empty(B, k, **f32)
    top_ids = torch.empty(B, k, device=x.device, dtype=torch.int64)
    temp = temperature.reshape(()).to(**f32)
    kp, np_ = max(1, triton.next_power_of_2(k)), triton.next_power_of_2(n)
    _stats[(B, n)](x, temp, m_Bn, s_Bn, V, x.stride(0), n, BLOCK=block)
    _row[(B,)](m_Bn, s_Bn, lse_B, tau_B, n, K=k, THRESHOLD=threshold and 0 < k <= n, NP=np_)
    _select[(B, n)](x, temp, lse_B, tau_B, e_Bn, vals, ids, V, x.stride(0), n, K=k, KP=kp, BLOCK=block)
    _merge[(B,)](x, temp, tok_B, lse_B, e_Bn, vals, ids, lp_B, top_ids, top_lp, ent_B, x.stride(0), n, K=k, KP=kp,
                 NP=np_, CP=triton.next_power_of_2(max(n * k, 1)))
    return lp_B, top_ids, top_lp, ent_B
