"""bench/swiglu_gemm.py — the SwiGLU half of an MLP, silu(x · W_gateᵀ) · (x · W_upᵀ), as scoring runs it, against one
fused Triton GEMM (lib/kernels/swiglu_gemm.py). CUDA only.

Methods, each on the same bf16 operands (random, seeded), at the rows of one scoring micro-batch:
    eager      two cuBLAS GEMMs, then silu and the product as two elementwise kernels (Hugging Face's eager MLP)
    inductor   the same expression under torch.compile: two cuBLAS GEMMs and one fused elementwise kernel (what 03's
               compiled decoder layers run; bench/RESULTS.md §12 profiles it in the step)
    merged     one cuBLAS GEMM against [W_gate; W_up] (2N columns), then the compiled elementwise kernel
    ours@T     lib/kernels/swiglu_gemm.py at tiling T (one kernel; the products never reach memory)
Each is timed by CUDA events over --reps calls after --warmup, the median reported with its rate: FLOPs 4·M·N·K
(two GEMMs) over the time, against R, the bf16 matmul rate measured in the same run (an 8192² product). Its error is
the largest |a − ref| / max |ref| against the product in fp32 from the same bf16 operands.

    python bench/swiglu_gemm.py --out swiglu_gemm.json                       # 1.5B and 7B shapes, M 8192 and 28672
    python bench/swiglu_gemm.py --shapes qwen2.5-1.5b --rows 28672 --tilings m128n64k64w8t3,m128n128k64w8t3

Writes one JSON row per (shape, M, method) to --out and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lib.kernels.swiglu_gemm import swiglu  # noqa: E402

SHAPES = {"qwen2.5-1.5b": (1536, 8960), "qwen2.5-7b": (3584, 18944)}         # hidden K, intermediate N
TILINGS = ["m128n64k64w4t3", "m128n64k64w8t3", "m128n64k64w8t4", "m128n128k64w8t3", "m128n128k64w8t4",
           "m128n128k32w8t4", "m64n128k64w4t3", "m64n64k64w4t4", "m128n64k128w8t3", "m256n64k64w8t3",
           "m128n64k64w8t3g4", "m128n64k64w8t3g16"]


def timed(fn, warmup: int, reps: int) -> float:
    """Median µs of one call, CUDA events around each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def matmul_rate(warmup: int, reps: int) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    us = timed(lambda: a @ a, warmup, reps)
    return 2 * 8192 ** 3 / (us * 1e-6) / 1e12


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
    R = matmul_rate(args.warmup, args.reps)
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
        K, N = SHAPES[shape]
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
            del x, ref
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
