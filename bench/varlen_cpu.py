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
bench/RESULTS.md §17 has the rows.

    python bench/varlen_cpu.py                          # the arm's micro-batch: 8 prompts × 4 responses, 2 heads of 64
    python bench/varlen_cpu.py --prompts 16 --out /tmp/varlen_cpu.json

Writes OUT (optional): the medians of each variant and the shapes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lib.cpu_repro import cpu_info  # noqa: E402
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


def micro_batch(prompts: int, rollouts: int, heads: int, kv_heads: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    P = [torch.randint(5, 300, (int(torch.randint(67, 72, (1,), generator=g)),), generator=g).tolist()
         for _ in range(prompts)]
    ps, rs = [], []
    for p in P:
        for _ in range(rollouts):
            ps.append(p)
            rs.append(torch.randint(5, 300, (int(torch.randint(20, 65, (1,), generator=g)),), generator=g).tolist())
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
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    batch, q, k, v = micro_batch(args.prompts, args.rollouts, args.heads, args.kv_heads, args.dim, args.seed)
    kv, scale = batch.kv_index, args.dim ** -0.5
    cu, cu_k = batch.cu_seqlens, batch.cu_seqlens_k

    def loop(q, k, v):                                          # the campaign's path: varlen.attention on CPU
        return varlen.reference(q, k.index_select(0, kv), v.index_select(0, kv), cu, batch.max_len, scale, cu_k,
                                batch.max_len_k)

    def one_call(q, k, v):
        return batched(q, k.index_select(0, kv), v.index_select(0, kv), cu, scale, cu_k)

    rows = {}
    for name, fn in (("per segment (varlen.reference)", loop), ("one batched call", one_call)):
        timed(fn, q, k, v, 3)                                   # warm-up
        rows[name] = timed(fn, q, k, v, args.repeats)
    (_, _, o_a, g_a), (_, _, o_b, g_b) = rows.values()
    diff = max([(o_a - o_b).abs().max().item()] + [(a - b).abs().max().item() for a, b in zip(g_a, g_b)])
    segs = len(cu) - 1
    print(f"{segs} segments ({args.prompts} prompts × {args.rollouts} responses), {batch.tokens} tokens, "
          f"{args.heads} heads of {args.dim}; one thread; medians of {args.repeats}")
    base = next(iter(rows.values()))
    for name, (f, fb, _, _) in rows.items():
        print(f"{name:32s} forward {f * 1e3:7.2f} ms ({f / base[0]:.2f}×)   forward + backward {fb * 1e3:7.2f} ms "
              f"({fb / base[1]:.2f}×)")
    print(f"largest difference, output and gradients: {diff:.2e}")
    if args.out:
        args.out.write_text(json.dumps(dict(cpu=cpu_info(), torch=torch.__version__, args=vars(args) | {"out": None},
                                            segments=segs, tokens=batch.tokens, max_abs_diff=diff,
                                            rows={n: dict(forward_s=r[0], forward_backward_s=r[1])
                                                  for n, r in rows.items()}), indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
