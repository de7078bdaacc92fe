"""bench/update_phase.py — the update phase of 03_opd_train against a plain Hugging Face forward+backward, one run.

Both sides see the same randomly initialised Qwen2.5-shaped model (lib/shapes.py) and the same B × T tokens:
  hf        AutoModelForCausalLM(labels=…) forward + backward, bf16 weights, gradient checkpointing on/off
            (the issue's anchor: 16 × 1,024 tokens, checkpointing on → 33.5k tokens/s, 33 % MFU on one H200)
  ours      03_opd_train's update: TokenScorer (fp32 master weights, FSDP2 bf16 compute / fp32 reduce) → fused-linear
            student log-probs → PPO clipped surrogate + k3 KL → backward, checkpointing on/off
MFU = 6 · n_params · tokens / time / peak (dense bf16 peak: --peak-tflops, default 989 for H100/H200).

    python bench/update_phase.py --shape qwen2.5-1.5b --batch 16 --seq 1024      # GPU
    python bench/update_phase.py --shape tiny --batch 2 --seq 64                   # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.train import dist as D, opd                           # noqa: E402
from lib.train.scoring import TokenScorer, pack                # noqa: E402


def build(shape: str, dtype, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from lib.shapes import SHAPES
    cfg = dict(SHAPES[shape]) if shape in SHAPES else dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                                           num_attention_heads=2, num_key_value_heads=1,
                                                           vocab_size=1000, tie_word_embeddings=True)
    cfg.pop("architectures", None), cfg.pop("model_type", None), cfg.pop("dtype", None)
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(Qwen2Config(**cfg)).to(dtype)


def timed(fn, warmup, iters, cuda):
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-1.5b", help="lib/shapes.py shape, or 'tiny' for a CPU smoke")
    p.add_argument("--batch", type=int, default=16, help="sequences")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--prompt", type=int, default=1, help="prompt tokens per sequence (the rest is scored response)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations (median reported)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of one device")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile'd decoder layers")
    p.add_argument("--skip-hf", action="store_true", help="skip the hf baseline rows")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    d = D.init()
    cuda = d.device.type == "cuda"
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(0)
    rows = []

    def record(name, secs, n_params, extra=None):
        tokens = B * T
        r = {"variant": name, "ms": 1e3 * secs, "tokens_per_s": tokens / secs,
             "mfu": 6 * n_params * tokens / secs / (args.peak_tflops * 1e12) if cuda else None,
             "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None} | (extra or {})
        rows.append(r)
        print(json.dumps(r), flush=True)

    # --- hf: labels → cross-entropy over the full logits, bf16 weights ---
    for ac in (() if args.skip_hf else (True, False)):
        model = build(args.shape, torch.bfloat16 if cuda else torch.float32, d.device)
        n_params = sum(p.numel() for p in model.parameters())
        if ac:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g).to(d.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()

        def step():
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        record(f"hf fwd+bwd, checkpointing {'on' if ac else 'off'}", timed(step, 2, args.iters, cuda), n_params)
        del model
        torch.cuda.empty_cache() if cuda else None

    # --- ours: the update phase of 03_opd_train ---
    for ac, comp in ((True, False), (False, False), (True, True), (False, True)):
        if comp and not args.compile:
            continue
        lm = build(args.shape, torch.float32, d.device)
        n_params = sum(p.numel() for p in lm.parameters())
        student = D.shard(TokenScorer(lm, fused_linear=True), bf16=cuda, activation_checkpointing=ac, compile=comp)
        optim = torch.optim.AdamW(student.parameters(), lr=1e-6)
        V = lm.config.vocab_size
        prompts = [torch.randint(0, V, (args.prompt,), generator=g).tolist() for _ in range(B)]
        resp = [torch.randint(0, V, (T - args.prompt,), generator=g).tolist() for _ in range(B)]
        batch = pack(prompts, resp, pad_id=0).to(d.device)
        N = batch.targets_N.numel()
        adv = torch.randn(N, generator=g).to(d.device) * 0.1
        with torch.no_grad():
            old, _, _, _ = student(batch, None, topk=0)
        ref = old + 0.01
        if cuda:
            torch.cuda.reset_peak_memory_stats()

        def step():
            lp, _, _, _ = student(batch, None, topk=0)
            pg, _, _ = opd.ppo_clip_terms(lp, old, adv)
            ((pg.sum() + 2.5 * opd.low_var_kl(lp, ref).sum()) / N).backward()
        secs = timed(step, 2, args.iters, cuda)
        t_opt = timed(lambda: (optim.step(), optim.zero_grad(set_to_none=False)), 1, 3, cuda)
        record(f"ours update fwd+bwd, checkpointing {'on' if ac else 'off'}{', compiled layers' if comp else ''}",
               secs, n_params,
               {"optimizer_ms": 1e3 * t_opt})
        del student, optim, lm
        torch.cuda.empty_cache() if cuda else None

    meta = {"shape": args.shape, "batch": B, "seq": T, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__}
    print(json.dumps(meta))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
