"""The SwiGLU half of a Qwen2 / Llama MLP in one Triton GEMM: a (M, N) = silu(x · W_gateᵀ) · (x · W_upᵀ).

Scoring runs three frozen models forward over ~110k tokens a step at the 1.5B shape, and the profile of that phase
(bench/RESULTS.md §12) finds its gate and up GEMMs at cuBLAS's full rate but followed by one more kernel a layer,
Inductor's `silu(gate) · up`, which reads the two (M, N) products back and writes a third: 0.20–0.22 s of the phase,
bandwidth-bound. Here each program owns one (BM, BN) tile of the output and accumulates BOTH products for it, gate
and up, over K in fp32; the epilogue applies silu to the gate accumulator, multiplies by the up accumulator and rounds
once to x's dtype. The two (M, N) intermediates never reach memory.

    program (i, j)   acc_g = x[i-rows, :] · W_gate[j-cols, :]ᵀ      acc_u = x[i-rows, :] · W_up[j-cols, :]ᵀ
                     a[i-rows, j-cols] = round(acc_g · sigmoid(acc_g) · acc_u)

Programs are ordered in groups of GROUP row tiles (Triton's matmul tutorial's L2 swizzle), so that consecutive
programs share their weight columns. No grad: this is for frozen models (teachers, the reference); a backward would
need the two products, which this kernel exists not to keep.

Numerics differ from the unfused path only in rounding: the unfused path rounds gate and up to bf16 before silu and
the product; this rounds once. bench/swiglu_gemm.py measures it against cuBLAS + Inductor; nothing in the loop calls it
yet. A tiling is `m<BM>n<BN>k<BK>w<warps>t<stages>g<GROUP>` (`tiling()`). The kernel is a torch.library custom op
(opaque to torch.compile). On CPU it runs under TRITON_INTERPRET=1 (set before this is imported), bf16 operands
upcast to fp32 (the interpreter's bf16 dot is wrong).
"""
from __future__ import annotations

import os
import re

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _swiglu_kernel(X, WG, WU, A, M, N, K, sx_m, sw_n, sa_m, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """Program pid → output tile (pm, pn), grouped: GROUP row tiles walk one column tile before the next."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP)
    pm = first_m + (pid % per_group) % rows_in_group
    pn = (pid % per_group) // rows_in_group
    m = pm * BM + tl.arange(0, BM)
    n = pn * BN + tl.arange(0, BN)
    # out-of-range rows and columns read row 0 / column 0 (in bounds) and are never stored: no masks in the K loop
    m_in = tl.where(m < M, m, 0).to(tl.int64)
    n_in = tl.where(n < N, n, 0).to(tl.int64)
    acc_g = tl.zeros([BM, BN], tl.float32)
    acc_u = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        xp = X + m_in[:, None] * sx_m + k[None, :]
        gp = WG + n_in[:, None] * sw_n + k[None, :]
        up = WU + n_in[:, None] * sw_n + k[None, :]
        if EVEN_K:
            x, g, u = tl.load(xp), tl.load(gp), tl.load(up)
        else:
            x = tl.load(xp, mask=k[None, :] < K, other=0.0)
            g = tl.load(gp, mask=k[None, :] < K, other=0.0)
            u = tl.load(up, mask=k[None, :] < K, other=0.0)
        if UPCAST:
            x, g, u = x.to(tl.float32), g.to(tl.float32), u.to(tl.float32)
        acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision="ieee")
        acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision="ieee")
    a = acc_g * tl.sigmoid(acc_g) * acc_u
    out = A + m.to(tl.int64)[:, None] * sa_m + n[None, :]
    tl.store(out, a.to(A.dtype.element_ty), mask=(m[:, None] < M) & (n[None, :] < N))


@torch.library.custom_op("opd::swiglu_gemm", mutates_args=())
def swiglu_gemm(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, bm: int, bn: int, bk: int, warps: int,
                stages: int, group: int) -> torch.Tensor:
    """x (M, K), w_gate and w_up (N, K) → silu(x · w_gateᵀ) · (x · w_upᵀ), (M, N) in x's dtype."""
    M, K = x.shape
    N = w_gate.shape[0]
    a = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M == 0:
        return a
    launch = {"num_warps": warps} | ({"num_stages": stages} if stages else {})
    _swiglu_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        x, w_gate, w_up, a, M, N, K, x.stride(0), w_gate.stride(0), a.stride(0), BM=bm, BN=bn, BK=bk, GROUP=group,
        EVEN_K=K % bk == 0, UPCAST=INTERPRET and x.dtype != torch.float32, **launch)
    return a


@swiglu_gemm.register_fake
def _(x, w_gate, w_up, bm, bn, bk, warps, stages, group):
    return x.new_empty(x.shape[0], w_gate.shape[0])


def tiling(name: str) -> dict:
    """`m128n64k64w8t3g8` → swiglu()'s keyword arguments (t: pipeline stages, Triton's default if absent; g: the
    row tiles a group walks together, 8 if absent)."""
    t = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)(?:t(\d+))?(?:g(\d+))?", name)
    if not t:
        raise ValueError(f"swiglu_gemm: tiling {name!r} is not m<BM>n<BN>k<BK>w<warps>[t<stages>][g<GROUP>]")
    return dict(bm=int(t[1]), bn=int(t[2]), bk=int(t[3]), warps=int(t[4]), stages=int(t[5] or 0),
                group=int(t[6] or 8))


DEFAULT = "m128n64k64w8t3g8"


def swiglu(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, tiling_name: str = DEFAULT) -> torch.Tensor:
    """silu(x · w_gateᵀ) · (x · w_upᵀ) for x of any leading shape (…, K); w_gate and w_up (N, K) as nn.Linear stores
    them. Contiguous rows are required along K (a weight's stride along K must be 1, as nn.Linear's is)."""
    if w_gate.shape != w_up.shape or w_gate.dim() != 2 or x.shape[-1] != w_gate.shape[1]:
        raise ValueError(f"swiglu: need x (…, K) and two (N, K) weights, got {tuple(x.shape)}, "
                         f"{tuple(w_gate.shape)}, {tuple(w_up.shape)}")
    if torch.is_grad_enabled() and (x.requires_grad or w_gate.requires_grad or w_up.requires_grad):
        raise ValueError("swiglu: forward only (frozen models): call it under torch.no_grad()")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    a = swiglu_gemm(x2, w_gate.contiguous(), w_up.contiguous(), **tiling(tiling_name))
    return a.reshape(*lead, w_gate.shape[0])
