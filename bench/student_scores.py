"""bench/student_scores.py — what recording the student's scores costs the decoder per step (03's `--student-scores
sampler`): lib/sample/draw.student_scores on one step's logits, with its top-K in one torch.topk over the whole
vocabulary or in two stages (draw.topk_two_stage, by chunk size), its parts alone, and lib/sample/scores_triton.py's
Triton kernels (the block threshold, and K rounds in every block as before it), against the floor of reading the
step's bf16 logits once.

Each variant runs on (B, V) bf16 logits as the decoder hands them over, compiled as the decoder compiles it
(torch.compile, fullgraph, static shapes) or eagerly, inside one CUDA graph of `--per-graph` calls on distinct
logits (no variant reads its input from L2 twice), replayed `--reps` times; µs per call from CUDA events. A decode
step of 03 pays one call per generated token: × 400 at 03's 400-token rollouts. Every variant's ids, log-probs and
entropy are checked against the eager one-stage reference (values within 1e-4; each id carries its log-prob:
bf16 logits tie often, and tied ids may come in another order).

    python3 bench/student_scores.py --out /tmp/student_scores.json          # one GPU; --batches 64 256
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.skinny_gemm import timed  # noqa: E402
from bench.step_floor import measure_rates  # noqa: E402
from lib.sample.draw import student_scores, topk_two_stage  # noqa: E402


def variants(k: int) -> dict:
    """name → (fn(logits, tok, temp) → tuple of tensors, compiled?)."""
    def full(chunk):
        return lambda x, t, T: student_scores(x, t, T, k, chunk)

    def lse_ent(x, t, T):
        return student_scores(x, t, T, 0, None)

    def topk_only(chunk):
        return lambda x, t, T: (topk_two_stage(x.float(), k, chunk) if chunk else torch.topk(x.float(), k, -1))

    def on_bf16(chunk):        # the top-K of the bf16 logits themselves (T > 0 keeps their order), half the bytes
        def fn(x, t, T):
            z = x.float() / T
            lse = torch.logsumexp(z, -1)
            lp = z - lse[:, None]
            _, ids = topk_two_stage(x, k, chunk)
            return (z.gather(1, t[:, None])[:, 0] - lse, ids, lp.gather(1, ids), -(lp.exp() * lp).sum(-1))
        return fn

    def fused(block, threshold=True):    # lib/sample/scores_triton.py's kernels, by block size
        from lib.sample.scores_triton import student_scores_fused
        return lambda x, t, T: student_scores_fused(x, t, T, k, block, threshold)

    from lib.sample.scores_triton import BLOCK
    out = {"eager one-stage": (full(None), False), "fused Triton, threshold": (fused(BLOCK), False),
           "fused Triton, K rounds in every block": (fused(BLOCK, False), False)}
    out.update({f"fused Triton, threshold, blocks of {b}": (fused(b), False) for b in (1024, 4096) if b != BLOCK})
    for name, fn in [("one-stage", full(None)), ("two-stage 256", full(256)), ("two-stage 1024", full(1024)),
                     ("two-stage 4096", full(4096)), ("two-stage 1024, top-K of the bf16 logits", on_bf16(1024)),
                     ("lse + entropy + lp only", lse_ent),
                     ("topk only, one-stage", topk_only(None)), ("topk only, two-stage 1024", topk_only(1024))]:
        out[name] = (fn, True)
    return out


def time_variant(fn, xs, tok, temp, reps: int) -> float:
    """µs per call: one CUDA graph over len(xs) calls (bench/skinny_gemm.timed, warmed up first), replayed `reps`
    times."""
    fn(xs[0], tok, temp)                                      # the first call compiles, outside the timed warm-up
    return timed(lambda i: fn(xs[i], tok, temp), len(xs), reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--per-graph", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=400, help="decode steps a rollout takes (03's bench: 400)")
    ap.add_argument("--variants", default=None,
                    help="only these variants, their names separated by '|' (default: all; the eager one-stage "
                         "reference always runs)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    C = measure_rates(n=1024)["copy_bytes_per_s"]              # bench/step_floor.py's C, measured the same way
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | C = {C / 1e9:.0f} GB/s copied "
          f"(read + write 2C = {2 * C / 1e12:.2f} TB/s)")
    rows = []
    for B in args.batches:
        xs = [torch.randn(B, args.vocab, device="cuda").mul_(3).bfloat16() for _ in range(args.per_graph)]
        tok = torch.randint(0, args.vocab, (B,), device="cuda")
        temp = torch.ones((), device="cuda")
        floor_us = B * args.vocab * 2 / (2 * C) * 1e6                # the bf16 logits read once
        ref = None
        chosen = variants(args.k)
        if args.variants:
            keep = set(args.variants.split("|")) | {"eager one-stage"}
            if keep - set(chosen):
                raise SystemExit(f"--variants: no variant named {sorted(keep - set(chosen))}; the names are "
                                 f"{list(chosen)}")
            chosen = {n: v for n, v in chosen.items() if n in keep}
        for name, (fn, compiled) in chosen.items():
            f = torch.compile(fn, dynamic=False, fullgraph=True) if compiled else fn
            got = f(xs[0], tok, temp)
            if name.startswith("eager one-stage"):
                ref = got
            elif not name.startswith(("lse", "topk only")):
                # bf16 logits tie often near the top, and tied ids may come in another order: the values must
                # agree, and each returned id must carry its returned log-prob
                z = xs[0].float()
                at_ids = z.gather(1, got[1]) - torch.logsumexp(z, -1, keepdim=True)
                ok = all(torch.allclose(got[i], ref[i], atol=1e-4, rtol=0) for i in (0, 2, 3))
                ok = ok and torch.allclose(at_ids, got[2], atol=1e-4, rtol=0)
                if not ok:
                    raise SystemExit(f"student_scores: {name} at B = {B} disagrees with the eager one-stage reference")
            us = time_variant(f, xs, tok, temp, args.reps)
            row = dict(batch=B, vocab=args.vocab, k=args.k, variant=name, compiled=compiled, us=us,
                       floor_us=floor_us, pct_of_floor=100 * floor_us / us, s_per_rollout=us * args.tokens / 1e6)
            rows.append(row)
            print(f"B {B:4d} | {name:28s} | {us:8.1f} µs | floor {floor_us:6.1f} µs ({row['pct_of_floor']:5.1f} %) "
                  f"| × {args.tokens} steps: {row['s_per_rollout']:.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                                  copy_bytes_per_s=C, rows=rows), indent=1))


if __name__ == "__main__":
    main()
