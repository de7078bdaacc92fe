"""lib/sample/draw.student_scores as two Triton passes over a decode step's logits (03's `--student-scores sampler`).

For row b of the (B, V) logits x and z = x / T (fp32), in blocks of BLOCK columns:

    pass 1   one program per (b, block): the block's max m_c, its mass s_c = Σ exp(z − m_c), and its own top-K
             (K rounds of one max-with-index reduction, each winner masked out): values and column ids
    merge    (torch, small) lse = M + log Σ_c s_c · exp(m_c − M) with M = max_c m_c; the row's top-K among the blocks'
             B × (blocks · K) candidates (exact: a row's K largest are among their blocks' K largest)
    pass 2   one program per (b, block): Σ exp(z − lse) · (lse − z), the block's share of the entropy (each term ≥ 0:
             no cancellation between two large sums)
    the drawn token's log-prob is z[tok] − lse, a gather

so the logits are read twice, where student_scores' compiled torch ops read them about five times and spend most of
their time in one torch.topk per row (bench/RESULTS.md §8: 891 µs a step at 256 rows against an 18 µs read). The
results equal student_scores' up to float rounding (the sums run in another order); tied logits may come back in
another order. Graph-safe: a static grid, no host sync. On CPU the kernels run under TRITON_INTERPRET=1
(tests/test_sampling.py), set before this module is imported.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _block_pass(X, TEMP, M, S, VALS, IDS, V, stride_b, n_blocks,
                K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
    b, c = tl.program_id(0), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(TEMP)
    z = tl.load(X + b * stride_b + cols, mask=cols < V, other=float("-inf")).to(tl.float32) / t
    m = tl.max(z, axis=0)
    tl.store(M + b * n_blocks + c, m)
    tl.store(S + b * n_blocks + c, tl.sum(tl.exp(z - m), axis=0))
    kk = tl.arange(0, KP)
    vals = tl.full([KP], float("-inf"), tl.float32)
    ids = tl.zeros([KP], dtype=tl.int64)
    for i in tl.static_range(K):
        v, j = tl.max(z, axis=0, return_indices=True)
        vals = tl.where(kk == i, v, vals)
        ids = tl.where(kk == i, (c * BLOCK + j).to(tl.int64), ids)
        z = tl.where(cols == c * BLOCK + j, float("-inf"), z)
    out = (b * n_blocks + c) * K + kk
    tl.store(VALS + out, vals, mask=kk < K)
    tl.store(IDS + out, ids, mask=kk < K)


@triton.jit
def _entropy_pass(X, TEMP, LSE, E, V, stride_b, n_blocks, BLOCK: tl.constexpr):
    b, c = tl.program_id(0), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    t = tl.load(TEMP)
    ok = cols < V
    z = tl.load(X + b * stride_b + cols, mask=ok, other=0.0).to(tl.float32) / t
    lse = tl.load(LSE + b)
    tl.store(E + b * n_blocks + c, tl.sum(tl.where(ok, tl.exp(z - lse) * (lse - z), 0.0), axis=0))


def student_scores_fused(logits_BV: torch.Tensor, tok_B: torch.Tensor, temperature: torch.Tensor, k: int,
                         block: int = BLOCK):
    """draw.student_scores' (lp_B, ids_Bk, lp_Bk, ent_B) by the two passes above. `temperature`: a 0-dim fp32
    tensor on the logits' device (the decoder's own), read by the kernels."""
    B, V = logits_BV.shape
    if k > block:
        raise ValueError(f"student_scores_fused: k = {k} exceeds the block of {block} columns")
    x = logits_BV if logits_BV.stride(1) == 1 else logits_BV.contiguous()
    n = triton.cdiv(V, block)
    f32 = dict(device=x.device, dtype=torch.float32)
    m_Bn, s_Bn, e_Bn = (torch.empty(B, n, **f32) for _ in range(3))
    vals = torch.empty(B, n * k, **f32)
    ids = torch.empty(B, n * k, device=x.device, dtype=torch.int64)
    temp = temperature.reshape(()).to(**f32)
    kp = max(1, triton.next_power_of_2(k))
    _block_pass[(B, n)](x, temp, m_Bn, s_Bn, vals, ids, V, x.stride(0), n, K=k, KP=kp, BLOCK=block)
    mx_B = m_Bn.max(1).values
    lse_B = mx_B + (s_Bn * torch.exp(m_Bn - mx_B[:, None])).sum(1).log()
    _entropy_pass[(B, n)](x, temp, lse_B, e_Bn, V, x.stride(0), n, BLOCK=block)
    top_Bk, j_Bk = torch.topk(vals, k, dim=-1)
    lp_B = x.gather(1, tok_B[:, None])[:, 0].float() / temp - lse_B
    return lp_B, ids.gather(1, j_Bk), top_Bk - lse_B[:, None], e_Bn.sum(1)
