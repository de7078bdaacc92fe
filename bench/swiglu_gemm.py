"""bench/swiglu_gemm.py — the SwiGLU half of an MLP, silu(x · W_gateᵀ) · (x · W_upᵀ), as scoring runs it, against one
fused Triton GEMM written here. CUDA for the timings; the kernel's CPU tests are tests/test_swiglu_gemm.py.

Why a fused kernel was tried: scoring runs three frozen models forward over ~110k tokens a step at the 1.5B shape,
and its profile (bench/RESULTS.md §12) finds the gate and up GEMMs at cuBLAS's full rate, followed by one more kernel
a layer, Inductor's `silu(gate) · up`, which reads the two (M, N) products back and writes a third: 0.20–0.22 s of the
phase, bandwidth-bound. The kernel below gives each program one (BM, BN) tile of the output and accumulates BOTH
products for it over K in fp32; its epilogue applies silu to the gate accumulator, multiplies by the up accumulator
and rounds once, so the two intermediates never reach memory:

    program (i, j)   acc_g = x[i-rows, :] · W_gate[j-cols, :]ᵀ      acc_u = x[i-rows, :] · W_up[j-cols, :]ᵀ
                     a[i-rows, j-cols] = round(acc_g · sigmoid(acc_g) · acc_u)

Programs run in groups of GROUP row tiles (Triton's matmul tutorial's L2 swizzle). Forward only (a backward would need
the two products this kernel exists not to keep). It rounds once where the unfused path rounds gate and up to bf16
first, so it is the more exact of the two (its error below is about half the unfused path's).

What it measured (bench/RESULTS.md §12, three calls on an H100): at 28,672 rows its best tilings ran 0.90–1.09× the
compiled unfused path, the same tiling swinging by 10 % between passes of one call, and 0.93–0.97× at 8,192 rows; one
cuBLAS GEMM against [W_gate; W_up] with the compiled tail ran 1.01–1.06×. The GEMM work is ~85 % of the unfused path's
time and this pointer-based kernel runs it ~10 % under cuBLAS's rate, which eats what the saved elementwise pass
gives back. So nothing in the loop calls it; a TMA / warp-specialised version would be the next thing to try.

Methods, each on the same bf16 operands (random, seeded), at the rows of one scoring micro-batch:
    eager      two cuBLAS GEMMs, then silu and the product as two elementwise kernels (Hugging Face's eager MLP)
    inductor   the same expression under torch.compile: two cuBLAS GEMMs and one fused elementwise kernel (what 03's
               compiled decoder layers run)
    merged     one cuBLAS GEMM against [W_gate; W_up] (2N columns), then the compiled elementwise kernel
    ours@T     the kernel below at tiling T, `m<BM>n<BN>k<BK>w<warps>[t<stages>][g<GROUP>]` (`tiling()`)
Each is timed by CUDA events over --reps calls after --warmup, the median reported with its rate: FLOPs 4·M·N·K
(two GEMMs) over the time, against R, the bf16 matmul rate measured in the same run (an 8192² product). Its error is
the largest |a − ref| / max |ref| against the product in fp32 from the same bf16 operands.

    python bench/swiglu_gemm.py --out swiglu_gemm.json                       # 1.5B and 7B shapes, M 8192 and 28672
    python bench/swiglu_gemm.py --shapes qwen2.5-1.5b --rows 28672 --tilings m128n128k64w8t3g16,m128n128k64w8t3

Writes one JSON row per (shape, M, method) to --out and prints a table. The kernel is a torch.library custom op
(opaque to torch.compile); on CPU it runs under TRITON_INTERPRET=1 (set before this is imported), bf16 operands
upcast to fp32 (the interpreter's bf16 dot is wrong).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.step_floor import event_median_s, measure_rates  # noqa: E402
from lib.shapes import SHAPES  # noqa: E402

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


DEFAULT = "m128n128k64w8t3"        # the best over the H100 calls (bench/RESULTS.md §12)


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


# --- the bench ---

TILINGS = ["m128n128k64w8t3", "m128n128k64w8t3g16", "m128n128k64w8t3g32", "m128n128k64w8t4", "m128n128k32w8t4",
           "m256n64k64w8t3", "m128n64k64w8t3", "m128n64k64w4t3"]   # the best eight of the H100 calls' sixteen


def timed(fn, warmup: int, reps: int) -> float:
    """Median µs of one call (CUDA events around each, bench/step_floor.py)."""
    return event_median_s(fn, reps, warmup) * 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b")
    p.add_argument("--rows", default="8192,28672", help="M values, comma-separated (tokens of a micro-batch)")
    p.add_argument("--tilings", default=",".join(TILINGS))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench/swiglu_gemm.py: needs CUDA (CUDA events); the kernel's CPU tests are tests/test_swiglu_gemm.py")
    torch.manual_seed(0)
    # R as bench/step_floor.py measures it for every floor in bench/RESULTS.md (an 8192² bf16 mm; a small copy beside)
    R = measure_rates(reps=args.reps, copy_gib=0.25)["matmul_flops"] / 1e12
    print(f"R = {R:.0f} TFLOP/s (bf16 8192² mm), {torch.cuda.get_device_name()}")

    def unfused(x, wg, wu):
        return F.silu(F.linear(x, wg)) * F.linear(x, wu)

    def merged_tail(gu):
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    inductor = torch.compile(unfused, dynamic=False)
    tail = torch.compile(merged_tail, dynamic=False)
    rows = []
    for shape in args.shapes.split(","):
        K, N = SHAPES[shape]["hidden_size"], SHAPES[shape]["intermediate_size"]
        wg, wu = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5 for _ in range(2))
        wgu = torch.cat([wg, wu])
        for M in map(int, args.rows.split(",")):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = unfused(x.float(), wg.float(), wu.float())
            scale = ref.abs().max().item()
            methods = {"eager": lambda: unfused(x, wg, wu), "inductor": lambda: inductor(x, wg, wu),
                       "merged": lambda: tail(F.linear(x, wgu))}
            methods |= {f"ours@{t}": (lambda t=t: swiglu(x, wg, wu, t)) for t in args.tilings.split(",")}
            base = None
            for name, fn in methods.items():
                row = dict(shape=shape, M=M, N=N, K=K, method=name, R_tflops=round(R, 1))
                try:
                    with torch.no_grad():
                        err = ((fn().float() - ref).abs().max() / scale).item()
                        us = timed(fn, args.warmup, args.reps)
                except Exception as e:                       # a tiling over the card's shared memory, say
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                    print(f"{shape:13s} M {M:6d} {name:24s} {row['error']}")
                    rows.append(row)
                    continue
                tflops = 4 * M * N * K / (us * 1e-6) / 1e12
                base = us if name == "inductor" else base
                row |= dict(us=round(us, 1), tflops=round(tflops, 1), pct_of_R=round(100 * tflops / R, 1),
                            rel_err=err, vs_inductor=round(base / us, 3) if base else None)
                rows.append(row)
                print(f"{shape:13s} M {M:6d} {name:24s} {us:9.1f} µs {tflops:6.0f} TFLOP/s ({row['pct_of_R']:5.1f} % "
                      f"of R)  err {err:.1e}" + (f"  {row['vs_inductor']:.3f}× inductor" if base else ""))
            x = ref = None                                  # freed before the next M
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
