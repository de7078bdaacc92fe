"""Benchmark the log-ratio kernels (DESIGN.md §12) against naive torch and torch.compile, side by side, on one GPU.

Rows: the teacher path (two bf16 logit tensors → lp_post, lp_pre, delta at K ids), the student path (sampled lp +
top-16 + entropy, forward and forward+backward) and the fused-linear variant (hidden, lm_head → the same outputs),
for N ∈ --ns, V = 151,936, H ∈ --hs. Each row: median time (triton.testing.do_bench), achieved bandwidth (bytes
that must be read/written once) or useful FLOP/s, and peak extra memory over the inputs. A few launch configs of
ours are swept too (the defaults in lib/ come from this sweep). Ceilings measured in the same run: a device copy
and the bf16 matmul of the same shape.

    python bench/logratio.py --json $OUT/logratio.json --md $OUT/logratio.md        # one H200: about 100 s
"""
import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lib.kernels import logratio as L         # noqa: E402
import lib.kernels.linear_logratio as LL      # noqa: E402
import lib.kernels.logratio_triton as KT      # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ns", type=int, nargs="+", default=[4096, 16384], help="rows N = B·T")
ap.add_argument("--hs", type=int, nargs="+", default=[1536, 3584], help="hidden sizes H (fused-linear rows)")
ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary V")
ap.add_argument("--k", type=int, default=16, help="top-K / ids per row")
ap.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition time per measurement (ms)")
ap.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile baselines")
ap.add_argument("--device", default="cuda", help="cpu = smoke test of this script (TRITON_INTERPRET=1 "
                "LOGRATIO_FORCE_TRITON=1, tiny sizes); timings and memory are then meaningless")
ap.add_argument("--json", default=None, help="write all rows here")
ap.add_argument("--md", default=None, help="write the markdown table here")
args = ap.parse_args()
dev, V, K = args.device, args.vocab, args.k
GPU = dev == "cuda"
ROWS = []


def bench_ms(fn):
    if not GPU:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=args.rep_ms, return_mode="median")


def peak_extra(fn):
    """Peak bytes allocated by fn beyond what was allocated before it (outputs included)."""
    if not GPU:
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def row(section, shape, impl, fn, bytes_=None, flops=None, note="", check=None):
    """Time fn, measure its extra memory, print and keep one table row; errors become a row, not a crash."""
    try:
        t0 = time.time()
        fn()                                                   # compile / warm up outside the timing
        if GPU:
            torch.cuda.synchronize()
        first_s = time.time() - t0
        ms = bench_ms(fn)
        mem = peak_extra(fn)
        r = dict(section=section, shape=shape, impl=impl, ms=ms, extra_gib=mem / 2**30, first_call_s=first_s,
                 gbps=bytes_ / ms / 1e6 if bytes_ else None, tflops=flops / ms / 1e9 if flops else None, note=note)
        if check is not None:
            r["max_abs_err"] = check()
    except Exception as e:                                     # noqa: BLE001 — one failed row must not cost the run
        traceback.print_exc()
        r = dict(section=section, shape=shape, impl=impl, error=repr(e)[:200])
    ROWS.append(r)
    print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=DEVICE_NAME, args=vars(args), rows=ROWS), indent=1))
    return r


def compiled(fn):
    return None if args.skip_compile or not GPU else torch.compile(fn, dynamic=False)


def maxdiff(a, b):
    return max((x.float() - y.float()).abs().nan_to_num().max().item() for x, y in zip(a, b))


# --- ceilings ---------------------------------------------------------------------------------------------------------
DEVICE_NAME = torch.cuda.get_device_name() if GPU else "cpu"
print(f"# {DEVICE_NAME} torch {torch.__version__} triton {triton.__version__}", flush=True)
src = torch.randn(2**30 if GPU else 2**10, device=dev, dtype=torch.bfloat16)        # 2 GiB
dst = torch.empty_like(src)
copy = row("ceiling", "copy 2 GiB", "torch copy_", lambda: dst.copy_(src), bytes_=2 * src.numel() * 2)
del src, dst
S = 8192 if GPU else 64
a = torch.randn(S, S, device=dev, dtype=torch.bfloat16)
row("ceiling", f"{S}^3 bf16", "torch.mm", lambda: a @ a, flops=2 * S**3)
del a


# --- teacher path: two bf16 logit tensors -> lp_post, lp_pre, delta ------------------------------------------------
def naive_teacher(post, pre, ids):
    lp_post = torch.log_softmax(post.float(), -1).gather(1, ids)
    lp_pre = torch.log_softmax(pre.float(), -1).gather(1, ids)
    return lp_post, lp_pre, lp_post - lp_pre


compiled_teacher = compiled(naive_teacher)
for N in args.ns:
    post = torch.randn(N, V, device=dev, dtype=torch.bfloat16) * 3
    pre = torch.randn(N, V, device=dev, dtype=torch.bfloat16) * 3
    by = 2 * N * V * 2
    for k in (K, 1):
        ids = torch.randint(0, V, (N, k), device=dev)
        shape = f"N={N} V={V} K={k}"
        want = naive_teacher(post, pre, ids)
        if k == K:
            row("teacher", shape, "naive", lambda: naive_teacher(post, pre, ids), bytes_=by)
            if compiled_teacher:
                row("teacher", shape, "torch.compile", lambda: compiled_teacher(post, pre, ids), bytes_=by)
        row("teacher", shape, "ours", lambda: L.teacher_logprobs(post, pre, ids), bytes_=by,
            check=lambda: maxdiff(L.teacher_logprobs(post, pre, ids), want))
        del want
    if N == max(args.ns):                                      # launch-config sweep on the largest shape
        default = dict(KT.CONFIG["token"])
        for block, warps in [(2048, 2), (4096, 4), (8192, 4), (8192, 8), (16384, 8)]:
            KT.CONFIG["token"] = dict(block=block, num_warps=warps)
            row("sweep", f"teacher N={N} K={K}", f"token block={block} warps={warps}",
                lambda: L.teacher_logprobs(post, pre, ids), bytes_=by,
                check=lambda: maxdiff(L.teacher_logprobs(post, pre, ids), naive_teacher(post, pre, ids)))
        KT.CONFIG["token"] = default
    del post, pre
if GPU:
    torch.cuda.empty_cache()


# --- student path: sampled lp + top-K + entropy, forward and forward+backward --------------------------------------
def naive_student(x, ids):
    lsm = torch.log_softmax(x.float(), -1)
    topk_ids = x.detach().topk(K, dim=-1).indices
    ent = -(lsm.exp() * lsm).sum(-1)
    return lsm.gather(1, ids[:, None])[:, 0], topk_ids, lsm.gather(1, topk_ids), ent.detach()


def fwd_bwd(fn, x, ids):
    def run():
        lp, _, topk_lp, _ = fn(x, ids)
        return torch.autograd.grad(lp.sum() + topk_lp.sum(), x)
    return run


compiled_student = compiled(naive_student)
ours_student = lambda x, ids: L.student_logprobs(x, ids, K)            # noqa: E731
for N in args.ns:
    x = (torch.randn(N, V, device=dev, dtype=torch.bfloat16) * 3).requires_grad_()
    ids = torch.randint(0, V, (N,), device=dev)
    shape = f"N={N} V={V} K={K}"
    impls = [("naive", naive_student), ("torch.compile", compiled_student), ("ours", ours_student)]
    for name, fn in impls:
        if fn is None:
            continue
        check = (lambda: maxdiff(ours_student(x, ids)[::2], naive_student(x, ids)[::2])) if name == "ours" else None
        with torch.no_grad():
            row("student fwd", shape, name, lambda: fn(x, ids), bytes_=N * V * 2, check=check)
        row("student fwd+bwd", shape, name, fwd_bwd(fn, x, ids), bytes_=3 * N * V * 2,
            note="bytes: read logits twice, write grad once")
    if N == max(args.ns):
        default = dict(KT.CONFIG["student"])
        for block, warps in [(512, 1), (512, 2), (1024, 2), (2048, 4)]:
            KT.CONFIG["student"] = dict(block=block, num_warps=warps)
            with torch.no_grad():
                row("sweep", f"student fwd N={N}", f"student block={block} warps={warps}",
                    lambda: ours_student(x, ids), bytes_=N * V * 2)
        KT.CONFIG["student"] = default
        default = dict(KT.CONFIG["grad"])
        for block, warps in [(4096, 4), (8192, 4)]:
            KT.CONFIG["grad"] = dict(block=block, num_warps=warps)
            row("sweep", f"student fwd+bwd N={N}", f"grad block={block} warps={warps}",
                fwd_bwd(ours_student, x, ids), bytes_=3 * N * V * 2)
        KT.CONFIG["grad"] = default
    del x
if GPU:
    torch.cuda.empty_cache()


# --- fused-linear variant: hidden, lm_head -> the same outputs -----------------------------------------------------
def naive_linear_token(h, w, ids):
    return torch.log_softmax((h @ w.T).float(), -1).gather(1, ids)


compiled_linear_token = compiled(naive_linear_token)
for H in args.hs:
    w = (torch.randn(V, H, device=dev) * H**-0.5 * 3).bfloat16()
    for N in args.ns:
        h = torch.randn(N, H, device=dev, dtype=torch.bfloat16).requires_grad_()
        wg = w.clone().requires_grad_()
        ids = torch.randint(0, V, (N, K), device=dev)
        shape = f"N={N} H={H} V={V} K={K}"
        fl = 2 * N * H * V
        row("linear ceiling", shape, "matmul h@W^T only", lambda: h.detach() @ w.T, flops=fl)
        with torch.no_grad():
            want = naive_linear_token(h, w, ids)
            row("linear token", shape, "naive", lambda: naive_linear_token(h, w, ids), flops=fl)
            if compiled_linear_token:
                row("linear token", shape, "torch.compile", lambda: compiled_linear_token(h, w, ids), flops=fl)
            row("linear token", shape, "ours", lambda: LL.linear_token_logprobs(h, w, ids), flops=fl,
                check=lambda: maxdiff([LL.linear_token_logprobs(h, w, ids)], [want]))
        del want

        def student_run(fn):
            def run():
                lp, _, topk_lp, _ = fn(h, wg, ids[:, 0], K)
                return torch.autograd.grad(lp.sum() + topk_lp.sum(), (h, wg))
            return run
        naive_ls = lambda h_, w_, i_, k_: naive_student(h_ @ w_.T, i_)            # noqa: E731
        row("linear student fwd+bwd", shape, "naive", student_run(naive_ls), flops=3 * fl,
            note="useful FLOPs 6NHV (ours also recomputes the logits: 8NHV done)")
        row("linear student fwd+bwd", shape, "ours", student_run(LL.linear_student_logprobs), flops=3 * fl,
            note="useful FLOPs 6NHV (ours also recomputes the logits: 8NHV done)")
        if N == max(args.ns) and H == min(args.hs):
            default_tiles = dict(LL.TILES)
            for rows_, cols in [(4096, 8192), (16384, 8192), (8192, 4096), (2048, 16384)]:
                LL.TILES.update(rows=rows_, cols=cols)
                with torch.no_grad():
                    row("sweep", f"linear token {shape}", f"tiles {rows_}x{cols}",
                        lambda: LL.linear_token_logprobs(h, w, ids), flops=fl)
            LL.TILES.update(default_tiles)
            # memory must not grow with V: the same call on half the vocabulary
            half = w[: V // 2]
            with torch.no_grad():
                row("linear token", f"N={N} H={H} V={V // 2} K={K}", "ours (half V)",
                    lambda: LL.linear_token_logprobs(h, half, ids % (V // 2)), flops=fl // 2)
            hw = half.clone().requires_grad_()
            row("linear student fwd+bwd", f"N={N} H={H} V={V // 2} K={K}", "ours (half V)",
                lambda: torch.autograd.grad(sum(t.sum() for t in LL.linear_student_logprobs(
                    h, hw, ids[:, 0] % (V // 2), K)[::2]), (h, hw)), flops=3 * fl // 2)
        del h, wg
    del w


# --- table ------------------------------------------------------------------------------------------------------------
def fmt(r):
    if "error" in r:
        return f"| {r['section']} | {r['shape']} | {r['impl']} | error: {r['error']} | | | |"
    rate = f"{r['gbps']:.0f} GB/s" if r.get("gbps") else (f"{r['tflops']:.0f} TFLOP/s" if r.get("tflops") else "")
    err = f"{r['max_abs_err']:.1e}" if r.get("max_abs_err") is not None else ""
    return f"| {r['section']} | {r['shape']} | {r['impl']} | {r['ms']:.3f} | {rate} | {r['extra_gib']:.3f} | {err} |"


def find(section, shape_prefix, impl):
    return next((r for r in ROWS if r["section"] == section and r["shape"].startswith(shape_prefix)
                 and r["impl"] == impl and "ms" in r), None)


checks = []
Nmax, Hmin = max(args.ns), min(args.hs)
ours = find("teacher", f"N={Nmax} V={V} K={K}", "ours")
comp = find("teacher", f"N={Nmax} V={V} K={K}", "torch.compile")
if ours:
    logits_gib = Nmax * V * 2 / 2**30
    checks.append(f"teacher N={Nmax}: ours {ours['ms']:.2f} ms = {ours['ms'] / 2.1:.2f}x the 2.1 ms floor; "
                  f"extra memory {100 * ours['extra_gib'] / logits_gib:.3f} % of one logit tensor"
                  + (f"; {comp['ms'] / ours['ms']:.2f}x faster than torch.compile ({comp['ms']:.2f} ms)" if comp else ""))
mm = find("ceiling", "8192^3", "torch.mm")
for H in args.hs:
    for N in args.ns:
        o = find("linear token", f"N={N} H={H} V={V}", "ours")
        m = find("linear ceiling", f"N={N} H={H} V={V}", "matmul h@W^T only")
        st = find("linear student fwd+bwd", f"N={N} H={H} V={V}", "ours")
        if o and m and mm:
            checks.append(f"linear N={N} H={H}: forward {100 * o['tflops'] / m['tflops']:.0f} % of the same-shape "
                          f"matmul, {100 * o['tflops'] / mm['tflops']:.0f} % of 8192^3"
                          + (f"; student fwd+bwd {100 * st['tflops'] / m['tflops']:.0f} % (useful 6NHV), "
                             f"{100 * st['tflops'] * 4 / 3 / m['tflops']:.0f} % (8NHV done)" if st else ""))
full = find("linear token", f"N={Nmax} H={Hmin} V={V}", "ours")
half = find("linear token", f"N={Nmax} H={Hmin} V={V // 2}", "ours (half V)")
if full and half:
    checks.append(f"linear token extra memory: V={V}: {full['extra_gib']:.3f} GiB, "
                  f"V={V // 2}: {half['extra_gib']:.3f} GiB")
checks.append(f"student backward accumulated through torch.addmm(out_dtype=float32): {LL._FP32_OUT_MM[0]}")
print("\n".join(["", "## checks"] + checks))
table = ["| section | shape | impl | ms (median) | achieved | peak extra GiB | max abs err vs naive |",
         "|---|---|---|---|---|---|---|"] + [fmt(r) for r in ROWS]
print("\n".join(table))
if args.md:
    Path(args.md).write_text("\n".join(table + [""] + checks) + "\n")
