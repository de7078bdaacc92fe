"""The decode step's GEMMs with few rows, as a Triton kernel that leaves the last reduction to its consumer
(lib/sample/decode_step.py, `gemms=`): y (M, N) = x (M, K) · Wᵀ (+ b), W the (N, K) weight of a Linear, M = the slots.

At decode, M is 64 or so and the weights are all there is to read. cuBLAS tiles such a product into too few tiles
for 132 SMs: on one H200 at the 1.5B shape, B = 64, q|k|v and o_proj read their weights at about 1 TB/s
(bench/RESULTS.md, sixth run). Here each program owns a (BM, BN) output tile and one of SPLIT slices of K:

    partials   P[s] = x[:, K_s] · W[:, K_s]ᵀ in fp32, s = 0 … SPLIT−1      (grid: M tiles × SPLIT × N tiles)
    consumer   y = round(Σ_s P[s] + b)                                       (in the caller's compiled graph)

so SPLIT × (N / BN) programs stream the weights, with no atomics, no zeroing and no reduction kernel: the sum over
SPLIT (≤ 8, written as pointwise adds in a fixed order) and the bias fuse into the elementwise kernel that reads y
anyway (rope, the residual add and norm, act·up). y is rounded once, from fp32, as cuBLAS rounds it; the order of the
fp32 additions differs, so results agree with F.linear to bf16 rounding, not bit for bit.

A tiling is `n<BN>k<BK>s<SPLIT>w<warps>[t<stages>][m<BM>]` (`tiling()`); bench/skinny_gemm.py sweeps them. The
kernel is a torch.library custom op (opaque to torch.compile, which calls it between its own kernels; captured
in the decoder's CUDA graph like them). On CPU it runs under
TRITON_INTERPRET=1 (set before this is imported), bf16 operands upcast to fp32 (the interpreter's bf16 dot is
wrong).
"""
from __future__ import annotations

import os
import re

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _partials_kernel(X, W, P, M, N, K, sx_m, sx_k, sw_n, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     KS: tl.constexpr, EVEN: tl.constexpr, UPCAST: tl.constexpr):
    """Program (m tile, split s, n tile): P[s, m, n] = Σ_{k in [s·KS, (s+1)·KS) ∩ [0, K)} X[m, k] · W[n, k]."""
    pm, ps, pn = tl.program_id(0), tl.program_id(1), tl.program_id(2)   # m fastest: its tiles share W in L2
    m = pm * BM + tl.arange(0, BM)
    n = pn * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for i in range(0, KS, BK):                                          # a fixed trip count: pipelined
        k = ps * KS + i + tl.arange(0, BK)
        xp, wp = X + m[:, None] * sx_m + k[None, :] * sx_k, W + n[:, None] * sw_n + k[None, :]
        if EVEN:                                   # every tile full: unmasked loads, which pipeline best
            x, w = tl.load(xp), tl.load(wp)
        else:
            x = tl.load(xp, mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(wp, mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    out = P + (ps * M + m[:, None]).to(tl.int64) * N + n[None, :]
    if EVEN:
        tl.store(out, acc)
    else:
        tl.store(out, acc, mask=(m[:, None] < M) & (n[None, :] < N))


@torch.library.custom_op("opd::skinny_partials", mutates_args=())
def skinny_partials(x: torch.Tensor, w: torch.Tensor, bn: int, bk: int, split: int, warps: int, stages: int,
                    bm: int) -> torch.Tensor:
    """x (M, K), w (N, K) → (split, M, N) fp32 partial products over K's split slices (sum them over dim 0)."""
    M, K = x.shape
    N = w.shape[0]
    bm = min(bm, max(16, triton.next_power_of_2(M)))
    ks = -(-(-(-K // split)) // bk) * bk                                  # each slice a whole number of BK
    out = torch.empty(split, M, N, device=x.device, dtype=torch.float32)
    even = M % bm == 0 and N % bn == 0 and ks * split == K
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    _partials_kernel[(triton.cdiv(M, bm), split, triton.cdiv(N, bn))](
        x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), BM=bm, BN=bn, BK=bk, KS=ks, EVEN=even,
        UPCAST=INTERPRET and x.dtype != torch.float32, **launch)
    return out


@skinny_partials.register_fake
def _(x, w, bn, bk, split, warps, stages, bm):
    return x.new_empty(split, x.shape[0], w.shape[0], dtype=torch.float32)


def tiling(name: str) -> dict:
    """`n64k128s4w4t3m64` → the keyword arguments of `linear` (t: pipeline stages, Triton's default if absent;
    m: the row tile, 64 if absent)."""
    m = re.fullmatch(r"n(\d+)k(\d+)s(\d+)w(\d+)(?:t(\d+))?(?:m(\d+))?", name)
    if not m or int(m[3]) > 8:
        raise ValueError(f"skinny_gemm: tiling {name!r} is not n<BN>k<BK>s<SPLIT ≤ 8>w<warps>[t<stages>][m<BM>]")
    return dict(bn=int(m[1]), bk=int(m[2]), split=int(m[3]), warps=int(m[4]), stages=int(m[5] or 0),
                bm=int(m[6] or 64))


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, **t) -> torch.Tensor:
    """F.linear(x, w, b) through the partials: Σ_s P[s] (+ b) in fp32, rounded once to x's dtype. Written as
    pointwise ops so that, compiled, they join the consumer's kernel."""
    p = skinny_partials(x, w, t["bn"], t["bk"], t["split"], t["warps"], t["stages"], t["bm"])
    y = p[0]
    for s in range(1, t["split"]):
        y = y + p[s]
    return (y if b is None else y + b.float()).to(x.dtype)


# The decoder's default on CUDA for ≤ MAX_ROWS slots: down_proj alone, its tiling by the projection's inner size (the
# MLP's intermediate size). Measured on one H200, B = 64, position 1,024 (bench/RESULTS.md §5): at the 1.5B shape
# (8,960) n32k128s8w4 took the step from 2,521 to 2,483 µs and rollouts +1.4 % / +2.0 % (512+1024, 256+400); at the
# 7B shape (18,944) that tiling ran down_proj at 2.8 TB/s, slower than cuBLAS (3.22), and n64k128s4w4 (3.59 TB/s)
# took 7B rollouts from 9.35k to 9.87k tokens/s (cuBLAS: 9.75k). Inner sizes between the two measured ones take the
# nearer's tiling. q|k|v needs v materialised by one more kernel (step +20 µs); o_proj at SPLIT 8 moves its saving
# into the norm that reads the partials. At B = 256 the kernel ran 8–10 % slower: cuBLAS stays there.
DOWN_TILINGS: dict[int, str] = {8960: "n32k128s8w4", 18944: "n64k128s4w4"}    # inner size → tiling, as measured
MAX_ROWS = 64


def defaults(slots: int, cuda: bool, down_in: int = 8960) -> dict:
    """The decoder's default {projection: tiling dict}: on CUDA for ≤ MAX_ROWS slots down_proj through the tiling
    measured at the nearest inner size `down_in` (DOWN_TILINGS), else none (cuBLAS throughout)."""
    if not (cuda and slots <= MAX_ROWS):
        return {}
    return {"down": tiling(DOWN_TILINGS[min(DOWN_TILINGS, key=lambda k: abs(k - down_in))])}
