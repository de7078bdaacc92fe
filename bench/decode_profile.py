"""bench/decode_profile.py — where one decode step of lib/sample/decode.py spends its time, kernel by kernel (issue 15).

Builds the decoder at a real shape with random weights, prefills B random prompts of P tokens, then puts every slot
at position --at (the token being decoded) and replays the captured step: --reps replays timed with CUDA events
(µs per step), then --profile replays under torch.profiler (kernels launched by a graph replay are recorded too).
Prints, per variant, µs per step, the bound (every weight + every slot's KV cache up to --at read once at
--bandwidth), the device-idle share, time per kernel class and the largest kernels per step.

Variants (`--variants`, comma-separated): `ours` (the CUDA defaults), `eagerdraw` (ours with the draw not compiled),
`autotune` (the layer blocks compiled with mode max-autotune-no-cudagraphs: Inductor times its GEMM templates
against cuBLAS per shape), `g:GEMMS` (GEMMs by lib/sample/skinny_gemm.py: bench/skinny_gemm.py's spec,
e.g. g:qkv=n64k128s4w4+o=n32k128s4w4, or g:none for cuBLAS throughout) and attention tilings
`c<chunk>b<block>w<warps>[s<stages>][x]` (e.g. c256b64w4x), passed to SplitAttention.

    python3 bench/decode_profile.py --shape qwen2.5-1.5b --batch 64 --at 1024 --out /tmp/p.json      # GPU
    python bench/decode_profile.py --shape tiny --batch 2 --prompt 8 --at 12 --reps 2 --profile 1    # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.decode_attn import tiling  # noqa: E402
from bench.profile_step import kernel_class  # noqa: E402
from lib.sample.decode import Decoder  # noqa: E402
from bench.rollout import SHAPES  # noqa: E402  (lib/shapes.py's real shapes and bench/rollout.py's tiny one)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-1.5b", help="lib/shapes.py shape, or tiny")
    p.add_argument("--batch", type=int, default=64, help="slots decoding at once")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (prefilled)")
    p.add_argument("--at", type=int, default=1024, help="position every slot decodes at (≥ --prompt)")
    p.add_argument("--reps", type=int, default=200, help="replays timed with CUDA events")
    p.add_argument("--profile", type=int, default=20, help="replays under torch.profiler")
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    p.add_argument("--variants", default="ours",
                   help="comma-separated: ours, eagerdraw, autotune, g:GEMMS, "
                   "c<chunk>b<block>w<warps>[s<stages>][x]")
    p.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s for the bound")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.at < args.prompt:
        p.error(f"--at {args.at} is before the end of the {args.prompt}-token prompt: pass --at ≥ --prompt")
    return args


def variant_opts(name: str) -> dict:
    """ours: the CUDA defaults; eagerdraw: the draw not compiled; autotune: the blocks max-autotuned; else an
    attention tiling (bench/decode_attn.py)."""
    named = {"ours": {}, "eagerdraw": {"compile_draw": False},
             "autotune": {"compile_step": "max-autotune-no-cudagraphs"}}
    if name.startswith("g:"):
        from bench.skinny_gemm import spec
        return {"gemm_opts": spec(name[2:])}
    return named[name] if name in named else {"attn_opts": tiling(name)}


def steady_state(dec: Decoder, at: int) -> None:
    """Every slot live at position `at`, sampling at T = 1 (the graph of run()'s rollouts)."""
    dec.greedy, dec.use_top_p = False, False
    dec.temp.fill_(1.0)
    dec.top_p.fill_(1.0)
    dec.pos_S.fill_(at)
    dec.step_S.fill_(1)
    dec.done_S.fill_(False)


def main(argv=None):
    args = parse(argv)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    from transformers import Qwen2Config, Qwen2ForCausalLM
    shape = {k: v for k, v in SHAPES[args.shape].items() if k not in ("architectures", "dtype")}
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16 if cuda else torch.float32).eval()
    cfg, B, P = model.config, args.batch, args.prompt
    n_params = sum(t.numel() for t in model.parameters())
    D = cfg.hidden_size // cfg.num_attention_heads
    kv_tok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * D * model.dtype.itemsize
    bound_us = (n_params * model.dtype.itemsize + B * kv_tok * (args.at + 1)) / args.bandwidth * 1e6
    T = max(args.at + 64, P + 64)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, cfg.vocab_size, (B, P), generator=g).tolist()
    results = {"shape": args.shape, "B": B, "P": P, "at": args.at, "device": torch.cuda.get_device_name() if cuda
               else "cpu", "n_params": n_params, "bound_us": bound_us, "date": time.strftime("%Y-%m-%d"),
               "variants": {}}
    for name in args.variants.split(","):
        dec = Decoder(model, slots=B, max_len=T, max_new_tokens=T - P, stop_ids=[cfg.vocab_size], mode="fast",
                      **variant_opts(name))
        with torch.no_grad():
            dec.run(prompts, list(range(B)), temperature=1.0, top_p=1.0)  # prefill K/V, capture the graph
            steady_state(dec, args.at)
            kv = dec.T if dec.split_attn is not None else min(dec.T, -(-(args.at + 1) // dec.kv_bucket) * dec.kv_bucket)
            dec._replay(kv)                                              # warm (captures this key if new)
            steady_state(dec, args.at)
            if cuda:
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter()
            for i in range(args.reps):
                if i % 32 == 31:
                    steady_state(dec, args.at)                          # stay near `at`
                dec._replay(kv)
            if cuda:
                e1.record()
                torch.cuda.synchronize()
                us = e0.elapsed_time(e1) * 1e3 / args.reps
            else:
                us = (time.perf_counter() - t0) * 1e6 / args.reps
            steady_state(dec, args.at)
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts) as prof:
                for _ in range(args.profile):
                    dec._replay(kv)
                if cuda:
                    torch.cuda.synchronize()
        per_kernel, per_class = defaultdict(lambda: [0.0, 0]), defaultdict(float)
        for ev in prof.events():
            if ev.device_type.name != ("CUDA" if cuda else "CPU") or (not cuda and ev.cpu_parent is not None):
                continue
            t = (ev.device_time if cuda else ev.cpu_time) / args.profile
            per_kernel[ev.name][0] += t
            per_kernel[ev.name][1] += 1 / args.profile
            per_class[kernel_class(ev.name)] += t
        busy = sum(per_class.values())
        top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:args.top]
        res = {"us_per_step": us, "tokens_per_s": B / us * 1e6, "pct_of_bound": 100 * bound_us / us,
               "kernel_us_per_step": busy, "kernels_per_step": sum(c for _, c in per_kernel.values()),
               "idle_share": max(0.0, 1 - busy / us) if cuda else None,
               "classes_us": dict(sorted(per_class.items(), key=lambda kv: -kv[1])),
               "top": [{"name": n[:120], "us": t, "calls": round(c, 2)} for n, (t, c) in top]}
        results["variants"][name] = res
        print(f"== {args.shape} B={B} at={args.at} {name}: {us:.0f} µs/step ({res['tokens_per_s']:,.0f} tokens/s), "
              f"bound {bound_us:.0f} µs ({res['pct_of_bound']:.1f} %), kernels {busy:.0f} µs in "
              f"{res['kernels_per_step']:.0f} per step" + (f", idle {100 * res['idle_share']:.1f} %" if cuda else ""))
        print("   classes µs: " + ", ".join(f"{k} {v:.0f}" for k, v in res["classes_us"].items()))
        for k in res["top"]:
            print(f"   {k['us']:8.1f} µs  ×{k['calls']:<6} {k['name']}")
        dec = None
        if cuda:
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
