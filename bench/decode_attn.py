"""bench/decode_attn.py — lib/sample/decode_triton.py's split-K decode attention alone, over tilings (issue 15).

For each case S:T:p (S slots, a cache of T positions, every slot decoding at position p; the 1.5B shape's 12 query
and 2 kv heads of 128 unless --heads says otherwise) and each tiling c<chunk>b<block>w<warps>[s<stages>][x]
(s: software-pipelining depth, Triton's default if absent; x: full tiles read through tensor descriptors, the
Hopper copy engine): --layers calls of split + combine,
each over its own cache (as a model's layers are: a cache smaller than L2 is not re-read from L2), captured in one
CUDA graph and replayed --reps times. Reported: µs per call, the K and V bytes it must read
(S · H_kv · (p + 1) · D · 2 · itemsize) over that time in TB/s, the split kernel's registers, spills and shared
memory, and the max |error| against a float32 torch reference (masked softmax attention over the same cache, the
new K/V row included), which every tiling must pass.

`--share n --prompt P` (03's rollouts: n requests of one prompt in neighbouring slots): the slots come in groups of
n whose first P rows are the same, and each tiling is timed twice, each slot reading its own copy (`reads: own`) and
the followers reading the first slot's (`reads: shared`, lib/sample/decode.py's `shared_reads`); TB/s counts the
bytes of every slot's copy in both, so the shared row's figure is what it reads as if unshared.

    python3 bench/decode_attn.py --out /tmp/attn.json                                  # GPU: the default sweep
    python3 bench/decode_attn.py --cases 256:704:356 --share 4 --prompt 154 --tilings c128b64w4s2   # shared reads
    TRITON_INTERPRET=1 python bench/decode_attn.py --cases 2:64:40 --tilings c16b16w1 --reps 1 --dtype float32
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.sample.decode_triton import SplitAttention  # noqa: E402

TILINGS = ("c64b64w4s1,c64b64w4s2,c128b32w4,c256b32w4s4,c128b64w4s2,c256b64w4,"                    # pointer loads
           "c64b64w4x,c128b32w4x,c256b32w4s4x,c512b32w4s4x,c128b64w8x,c256b64w8x,c256b64w4x,c512b64w8s4x")  # tma


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", default="64:1088:1024,64:704:456,256:1536:1024,256:704:456",
                   help="comma-separated S:T:p")
    p.add_argument("--heads", default="12:2:128", help="H:H_kv:D")
    p.add_argument("--tilings", default=TILINGS, help="comma-separated c<chunk>b<block>w<warps>[s<stages>][x]")
    p.add_argument("--reps", type=int, default=200, help="graph replays timed per case and tiling")
    p.add_argument("--layers", type=int, default=4, help="calls per replay, each over its own cache")
    p.add_argument("--dtype", default="bfloat16", help="cache and query dtype")
    p.add_argument("--share", type=int, default=1, help="slots per shared prompt (groups of neighbouring slots)")
    p.add_argument("--prompt", type=int, default=0, help="with --share: the rows [0, P) a group shares (P ≤ p)")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    return p.parse_args(argv)


def tiling(name: str) -> dict:
    m = re.fullmatch(r"c(\d+)b(\d+)w(\d+)(?:s(\d+))?(x?)", name)
    if not m:
        raise SystemExit(f"decode_attn: tiling {name!r} is not c<chunk>b<block>w<warps>[s<stages>][x]")
    return dict(chunk=int(m[1]), block=int(m[2]), warps=int(m[3]), stages=int(m[4]) if m[4] else None,
                tma=m[5] == "x")


def reference(q, k, v, kc, vc, pos, scale):
    """float32 masked attention over positions ≤ pos, the step's k, v in place of the cache row at pos."""
    S, H, D = q.shape
    Hkv, T = kc.shape[1], kc.shape[2]
    kc, vc = kc.float().clone(), vc.float().clone()
    rows = torch.arange(S, device=q.device)
    kc[rows, :, pos], vc[rows, :, pos] = k.float(), v.float()
    G = H // Hkv
    w = torch.einsum("sjgd,sjtd->sjgt", q.float().view(S, Hkv, G, D), kc) * scale
    w = w.masked_fill(torch.arange(T, device=q.device)[None, None, None] > pos[:, None, None, None], float("-inf"))
    return torch.einsum("sjgt,sjtd->sjgd", torch.softmax(w, -1), vc).reshape(S, H, D)


def main(argv=None):
    args = parse(argv)
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda" if cuda else "cpu"), getattr(torch, args.dtype)
    H, Hkv, D = (int(x) for x in args.heads.split(":"))
    rows = []
    for case in args.cases.split(","):
        S, T, p = (int(x) for x in case.split(":"))
        g = torch.Generator(device=dev).manual_seed(S + T + p)
        rnd = lambda *shape: torch.randn(*shape, generator=g, device=dev).to(dtype)  # noqa: E731
        q, k, v = rnd(S, H, D), rnd(S, Hkv, D), rnd(S, Hkv, D)
        kc, vc = rnd(S, Hkv, T, D), rnd(S, Hkv, T, D)
        caches = [(rnd(S, Hkv, T, D), rnd(S, Hkv, T, D)) for _ in range(args.layers - 1)] if cuda else []
        pos = torch.full((S,), p, device=dev, dtype=torch.int64)
        scale = D ** -0.5
        lead = torch.arange(S, device=dev, dtype=torch.int32) // args.share * args.share    # each group's first
        pre = torch.full((S,), min(args.prompt, p), device=dev, dtype=torch.int32)
        for a, b in [(kc, vc)] + caches:                                  # the followers' copies of the prompt
            a[:, :, :args.prompt].copy_(a[lead.long(), :, :args.prompt])
            b[:, :, :args.prompt].copy_(b[lead.long(), :, :args.prompt])
        ref = reference(q, k, v, kc, vc, pos, scale)
        nbytes = S * Hkv * (p + 1) * D * 2 * dtype.itemsize
        reads = {"own": ()} | ({"shared": (lead, pre)} if args.share > 1 and args.prompt > 0 else {})
        for name, (how, extra) in ((n, r) for n in args.tilings.split(",") for r in reads.items()):
            try:
                att = SplitAttention(S, H, Hkv, D, T, dtype, dev, **tiling(name))
                err = (att(q, k, v, kc.clone(), vc.clone(), pos, scale, *extra).float() - ref).abs().max().item()
                if cuda:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for a, b in [(kc, vc)] + caches:
                            att(q, k, v, a, b, pos, scale, *extra)
                    graph.replay()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    for _ in range(args.reps):
                        graph.replay()
                    e1.record()
                    torch.cuda.synchronize()
                    us = e0.elapsed_time(e1) * 1e3 / args.reps / (1 + len(caches))
                else:
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        att(q, k, v, kc, vc, pos, scale, *extra)
                    us = (time.perf_counter() - t0) * 1e6 / args.reps
                r = {"S": S, "T": T, "p": p, "tiling": name, **({"reads": how} if len(reads) > 1 else {}),
                     "us": round(us, 2),
                     "TB_s": round(nbytes / us / 1e6, 3), "max_err": err, "programs": att.n_items,
                     **{k: getattr(att.compiled, k, None) for k in ("n_regs", "n_spills")},
                     "shared": getattr(getattr(att.compiled, "metadata", None), "shared", None)}
            except Exception as e:  # noqa: BLE001  (one tiling failing to compile must not lose the others)
                r = {"S": S, "T": T, "p": p, "tiling": name, **({"reads": how} if len(reads) > 1 else {}),
                     "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(r)
            print(json.dumps(r), flush=True)
        best = min((r for r in rows if r.get("S") == S and r.get("T") == T and r.get("p") == p and "us" in r),
                   key=lambda r: r["us"], default=None)
        if best:
            print(f"== best for {case}: {best['tiling']} {best.get('reads', '')} {best['us']} µs, {best['TB_s']} TB/s",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                                              "date": time.strftime("%Y-%m-%d"), "heads": args.heads,
                                              "dtype": args.dtype, "share": args.share, "prompt": args.prompt,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
