"""bench/skinny_gemm.py — the decode step's four GEMMs (q|k|v, o_proj, gate|up, down) at M = slots rows: cuBLAS
against lib/sample/skinny_gemm.py's Triton partials over a sweep of tilings, against the bandwidth floor (issue 15).

For each shape, projection and M: `--layers` distinct copies of the (N, K) bf16 weight (one per layer: a model does
not re-read one layer's weights from L2), one CUDA graph of one call per copy, replayed `--reps` times; µs per call
from CUDA events. TB/s = weight bytes / time; floor = weight bytes / --bandwidth. The Triton time includes writing
its fp32 partials (SPLIT × M × N × 4 bytes) but not summing them: in the decoder that sum joins the consumer's
elementwise kernel. Each tiling is checked against F.linear in fp32 (max |Δ| / max |y| < 1e-2).

Prints one `BEST shape M spec` line per shape and M: the projections whose best tiling beat cuBLAS by ≥ --margin,
as `qkv=n64k128s4w4+o=…`, the spec bench/decode_profile.py (`g:GEMMS`) and bench/rollout.py (`ours%GEMMS`) take.

    python3 bench/skinny_gemm.py --shapes qwen2.5-1.5b --rows 64 --out /tmp/skinny.json          # one GPU
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.sample.skinny_gemm import linear, skinny_partials, tiling  # noqa: E402
from lib.shapes import SHAPES  # noqa: E402


def spec(s: str) -> dict:
    """`qkv=n64k128s4w4+o=…` → Decoder's gemm_opts ({projection: tiling}); `none` → {} (cuBLAS for all four)."""
    opts = dict(kv.split("=", 1) for kv in s.split("+")) if s != "none" else {}
    for k, v in opts.items():
        if k not in ("qkv", "o", "gate_up", "down"):
            raise SystemExit(f"skinny_gemm: projection {k!r} in {s!r} is not one of qkv, o, gate_up, down")
        tiling(v)
    return opts


def projections(shape: dict) -> dict:
    """name → (N, K, bias) of the decoder's four GEMMs (lib/sample/decode_step.py's fused q|k|v and gate|up)."""
    E, I, H, Hkv = (shape[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                       "num_key_value_heads"))
    D = shape.get("head_dim") or E // H
    return {"qkv": ((H + 2 * Hkv) * D, E, True), "o": (E, H * D, False), "gate_up": (2 * I, E, False),
            "down": (E, I, False)}


def sweep(M: int, N: int, K: int, sms: int) -> list[str]:
    """Tilings worth timing: tiles of 32–128 columns, 64–128 deep, SPLIT 1–8 with ≥ 1 and ≤ 16 programs per SM. Above
    64 rows also row tiles of 128 (`m128`: each weight tile read by half as many programs), and SPLIT ≤ 4: the fp32
    partials (SPLIT × M × N × 4 bytes) grow with the rows and are read again by the consumer."""
    out = []
    big = M > 64
    for bm, bn, bk, split in itertools.product((64, 128) if big else (64,), (32, 64, 128), (64, 128),
                                               (1, 2, 4) if big else (1, 2, 4, 8)):
        programs = -(-M // bm) * split * -(-N // bn)
        if K // split >= bk and sms // 2 <= programs <= 16 * sms:
            out.append(f"n{bn}k{bk}s{split}w{8 if 128 in (bn, bm) else 4}" + ("m128" if bm == 128 else ""))
    return out


def timed(fn, layers: int, reps: int) -> float:
    """µs per call of fn(i) for i in range(layers), captured as one CUDA graph, replayed reps times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(layers):
            fn(i)                                                      # warm: compile, autotune, allocate
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (reps * layers)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b")
    p.add_argument("--rows", default="64,256", help="comma-separated M (slots)")
    p.add_argument("--projections", default="qkv,o,gate_up,down")
    p.add_argument("--tilings", default=None, help="comma-separated tilings instead of the sweep")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--margin", type=float, default=0.03, help="a projection's BEST tiling must beat cuBLAS by this")
    p.add_argument("--bandwidth", type=float, default=4.3e12)
    p.add_argument("--out", default=None, help="write every row as JSON here")
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, t0 = [], time.time()
    for name, M in itertools.product(args.shapes.split(","), map(int, args.rows.split(","))):
        best = {}
        for proj in args.projections.split(","):
            N, K, has_bias = projections(SHAPES[name])[proj]
            torch.manual_seed(0)
            ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5 for _ in range(args.layers)]
            b = torch.randn(N, device="cuda", dtype=torch.bfloat16) if has_bias else None
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), ws[0].float(), None if b is None else b.float())
            floor = N * K * 2 / args.bandwidth * 1e6
            cub = timed(lambda i: F.linear(x, ws[i], b), args.layers, args.reps)
            row = dict(shape=name, M=M, proj=proj, N=N, K=K, floor_us=floor, cublas_us=cub, tilings={})
            for t in (args.tilings.split(",") if args.tilings else sweep(M, N, K, sms)):
                kw = tiling(t)
                try:
                    err = ((linear(x, ws[0], b, **kw).float() - ref).abs().max() / ref.abs().max()).item()
                    us = timed(lambda i: skinny_partials(x, ws[i], kw["bn"], kw["bk"], kw["split"], kw["warps"],
                                                         kw["stages"], kw["bm"]), args.layers, args.reps)
                    row["tilings"][t] = dict(us=us, rel_err=err)
                except Exception as e:                                   # a tiling Triton cannot build
                    row["tilings"][t] = dict(error=f"{type(e).__name__}: {str(e)[:120]}")
            ok = {t: r["us"] for t, r in row["tilings"].items() if "us" in r and r["rel_err"] < 1e-2}
            top = sorted(ok, key=ok.get)[:3]
            print(f"{name} M={M} {proj} N={N} K={K}: floor {floor:.1f} µs, cuBLAS {cub:.1f} µs "
                  f"({N * K * 2 / cub / 1e6:.2f} TB/s); best " + ", ".join(
                      f"{t} {ok[t]:.1f} ({N * K * 2 / ok[t] / 1e6:.2f})" for t in top)
                  + f"  [{time.time() - t0:.0f} s]", flush=True)
            if top and ok[top[0]] < (1 - args.margin) * cub:
                best[proj] = top[0]
            rows.append(row)
            del ws
            torch.cuda.empty_cache()
        print(f"BEST {name} {M} " + ("+".join(f"{k}={v}" for k, v in best.items()) or "none"), flush=True)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"))
        Path(args.out).write_text(json.dumps(meta | dict(rows=rows), indent=1))


if __name__ == "__main__":
    main()
