"""bench/varlen_cpu.py — the packed attention's CPU fallback on the toy's shapes: one SDPA call per segment (what
lib/kernels/varlen.reference does, the campaign's path on CPU) against one batched SDPA call over every segment of
the micro-batch, padded to the longest and masked.

Why: with shared prompts (the toy campaign's layout since b1a9577) a toy micro-batch of the collapse arm is 8 prompt
segments and 32 response segments, each a few dozen tokens. Under cProfile, 8 steps of the arm's run spent 1.54 s of
their 14.4 s in the fallback's forward, at about 0.25 ms an SDPA call. The script first showed where the fallback's
time really went: its backward, quadratic in the segments (46 ms at 40 segments, 201 ms at 80), because each
segment was a slice of the whole input and a write into a preallocated output, and autograd passed whole tensors
through every one. Since the reference splits and concatenates instead (same bits: tests/test_varlen.py), the
backward takes 17-49 ms there, and batching the calls into one (padded, masked; other float bytes, the largest
difference printed) is within the runs' noise of it (0.78-1.31× in one session): not worth a second layout.

A third variant stacks only the segments of one (query, key) shape into one SDPA call each, which needs no padding.
It was meant to keep every byte, and it does not: a segment's own call passes 3-D tensors, which SDPA sends to its math
backend, and that backend's batched matmuls give other last bits for some lengths when more segments share the call
(`--sweep` lists the lengths). bench/RESULTS.md §17 has the rows.

    python bench/varlen_cpu.py                          # the arm's micro-batch: 8 prompts × 4 responses, 2 heads of 64
    python bench/varlen_cpu.py --prompts 16 --out /tmp/varlen_cpu.json
    python bench/varlen_cpu.py --sweep                  # which segment lengths the by-shape stacking changes

Writes OUT (optional): the medians of each variant and the shapes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lib.cpu_repro import cpu_info, pin  # noqa: E402

pin()              # the toy campaign's CPU math paths (lib/cpu_repro.py), set before torch is imported: its bytes

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from lib.kernels import varlen  # noqa: E402
from lib.train.scoring import pack_shared  # noqa: E402


def batched(q, k, v, cu, scale, cu_k):
    """The same attention as varlen.reference (bottom-right causal within each segment) as ONE SDPA call: every
    query segment padded to the longest, every key segment likewise, a (B, 1, Lq, Lk) mask."""
    bq, bk = cu.tolist(), cu_k.tolist()
    lq = [b - a for a, b in zip(bq[:-1], bq[1:])]
    lk = [b - a for a, b in zip(bk[:-1], bk[1:])]
    B, Lq, Lk, H, D = len(lq), max(lq), max(lk), q.shape[1], q.shape[2]
    iq = torch.tensor([a + min(j, n - 1) for a, n in zip(bq[:-1], lq) for j in range(Lq)])        # (B·Lq,)
    ik = torch.tensor([a + min(j, n - 1) for a, n in zip(bk[:-1], lk) for j in range(Lk)])        # (B·Lk,)
    qs = q.index_select(0, iq).view(B, Lq, H, D).transpose(1, 2)
    ks = k.index_select(0, ik).view(B, Lk, k.shape[1], D).transpose(1, 2)
    vs = v.index_select(0, ik).view(B, Lk, v.shape[1], D).transpose(1, 2)
    if H != ks.shape[1]:
        ks, vs = ks.repeat_interleave(H // ks.shape[1], 1), vs.repeat_interleave(H // vs.shape[1], 1)
    jq, jk = torch.arange(Lq)[None, :, None], torch.arange(Lk)[None, None, :]
    nq, nk = torch.tensor(lq)[:, None, None], torch.tensor(lk)[:, None, None]
    see = (jk <= jq + (nk - nq)) & (jk < nk)                     # (B, Lq, Lk); padded query rows see key 0 only
    see = see | (jk == 0)
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=see[:, None], scale=scale)          # (B, H, Lq, D)
    rows = torch.tensor([b * Lq + j for b, n in enumerate(lq) for j in range(n)])
    return o.transpose(1, 2).reshape(B * Lq, H, D).index_select(0, rows)


def by_shape(q, k, v, cu, scale, cu_k):
    """varlen.reference with the segments of one (query, key) shape stacked into one SDPA call per shape, on the math
    backend (the one SDPA gives a single segment's 3-D tensors): no padding, no extra mask."""
    bq, bk = cu.tolist(), cu_k.tolist()
    lq = [b - a for a, b in zip(bq[:-1], bq[1:])]
    lk = [b - a for a, b in zip(bk[:-1], bk[1:])]
    q_seg, k_seg, v_seg = q.split(lq), k.split(lk), v.split(lk)
    groups = q.shape[1] // k.shape[1]
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(zip(lq, lk)):
        shapes.setdefault(shape, []).append(i)
    outs = [None] * len(lq)
    for (nq, nk), idx in shapes.items():
        qs, ks, vs = (torch.stack([seg[i] for i in idx]).transpose(1, 2) for seg in (q_seg, k_seg, v_seg))
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1)
        see = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=see, scale=scale).transpose(1, 2)
        for i, oi in zip(idx, o.unbind(0)):          # unbind, not indexing: no whole-tensor gradient per segment
            outs[i] = oi
    return torch.cat(outs, 0)


def sweep(heads: int, dim: int, lengths: range, stacked: tuple[int, ...]) -> list[tuple[int, int]]:
    """(length, segments) where by_shape's output differs in any bit from varlen.reference's, for causal segments of
    one length stacked `stacked` at a time."""
    changed = []
    for n in lengths:
        for s in stacked:
            g = torch.Generator().manual_seed(n)
            q, k, v = (torch.randn(n * s, heads, dim, generator=g) for _ in range(3))
            cu = varlen.cu_seqlens([n] * s)
            with torch.no_grad():
                a = varlen.reference(q, k, v, cu, n, dim ** -0.5)
                b = by_shape(q, k, v, cu, dim ** -0.5, cu)
            if not torch.equal(a, b):
                changed.append((n, s))
    return changed


def micro_batch(prompts: int, rollouts: int, heads: int, kv_heads: int, dim: int, seed: int,
                responses: tuple[int, int] = (20, 64)):
    g = torch.Generator().manual_seed(seed)
    P = [torch.randint(5, 300, (int(torch.randint(67, 72, (1,), generator=g)),), generator=g).tolist()
         for _ in range(prompts)]
    ps, rs = [], []
    for p in P:
        for _ in range(rollouts):
            ps.append(p)
            n = int(torch.randint(responses[0], responses[1] + 1, (1,), generator=g))
            rs.append(torch.randint(5, 300, (n,), generator=g).tolist())
    batch = pack_shared(ps, rs)
    T = batch.input_ids_BT.shape[1]
    q = torch.randn(T, heads, dim, generator=g)
    k, v = (torch.randn(T, kv_heads, dim, generator=g) for _ in range(2))
    return batch, q, k, v


def timed(fn, q, k, v, repeats: int) -> tuple[float, float, torch.Tensor, list[torch.Tensor]]:
    """Median seconds of a forward, and of a forward + backward; the output and gradients of the last run."""
    fwd, both = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        with torch.no_grad():
            fn(q, k, v)
        fwd.append(time.perf_counter() - t)
        x = [a.detach().requires_grad_() for a in (q, k, v)]
        t = time.perf_counter()
        out = fn(*x)
        out.square().sum().backward()
        both.append(time.perf_counter() - t)
    return statistics.median(fwd), statistics.median(both), out.detach(), [a.grad for a in x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts in the micro-batch (the arm: 8 of 32 rows)")
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--heads", type=int, default=2, help="query heads (the toy student: 2)")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=64, help="head_dim (the toy student: 128 / 2)")
    p.add_argument("--response-lengths", type=int, nargs=2, default=[20, 64], metavar=("LO", "HI"),
                   help="each response's length, drawn uniformly from LO-HI (the toy's trained responses: 9-32)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--sweep", action="store_true", help="list the segment lengths 1-199 where stacking 2 or 6 "
                                                        "segments of that length changes a bit, then stop")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.sweep:
        changed = sweep(args.heads, args.dim, range(1, 200), (2, 6))
        print(f"{args.heads} heads of {args.dim}, causal, lengths 1-199 stacked 2 and 6 at a time: "
              f"{len(changed)} of 398 differ from one call per segment: {changed}")
        return
    batch, q, k, v = micro_batch(args.prompts, args.rollouts, args.heads, args.kv_heads, args.dim, args.seed,
                                 tuple(args.response_lengths))
    kv, scale = batch.kv_index, args.dim ** -0.5
    cu, cu_k = batch.cu_seqlens, batch.cu_seqlens_k

    def loop(q, k, v):                                          # the campaign's path: varlen.attention on CPU
        return varlen.reference(q, k.index_select(0, kv), v.index_select(0, kv), cu, batch.max_len, scale, cu_k,
                                batch.max_len_k)

    def one_call(q, k, v):
        return batched(q, k.index_select(0, kv), v.index_select(0, kv), cu, scale, cu_k)

    def stacked(q, k, v):
        return by_shape(q, k.index_select(0, kv), v.index_select(0, kv), cu, scale, cu_k)

    rows = {}
    for name, fn in (("per segment (varlen.reference)", loop), ("one batched call", one_call),
                     ("one call per segment shape", stacked)):
        timed(fn, q, k, v, 3)                                   # warm-up
        rows[name] = timed(fn, q, k, v, args.repeats)
    _, _, o_a, g_a = rows["per segment (varlen.reference)"]
    diffs = {name: max([(o_a - o).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(g_a, g)])
             for name, (_, _, o, g) in rows.items()}
    segs, shapes = len(cu) - 1, len(set(zip((cu[1:] - cu[:-1]).tolist(), (cu_k[1:] - cu_k[:-1]).tolist())))
    print(f"{segs} segments of {shapes} (query, key) shapes ({args.prompts} prompts × {args.rollouts} responses), "
          f"{batch.tokens} tokens, {args.heads} heads of {args.dim}; one thread; medians of {args.repeats}")
    base = rows["per segment (varlen.reference)"]
    for name, (f, fb, _, _) in rows.items():
        print(f"{name:32s} forward {f * 1e3:7.2f} ms ({f / base[0]:.2f}×)   forward + backward {fb * 1e3:7.2f} ms "
              f"({fb / base[1]:.2f}×)   largest difference {diffs[name]:.2e}")
    if args.out:
        args.out.write_text(json.dumps(dict(cpu=cpu_info(), torch=torch.__version__, args=vars(args) | {"out": None},
                                            segments=segs, shapes=shapes, tokens=batch.tokens, max_abs_diff=diffs,
                                            rows={n: dict(forward_s=r[0], forward_backward_s=r[1])
                                                  for n, r in rows.items()}), indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
