"""Rollout throughput: lib.sample.engine's `hf` backend vs plain `model.generate` vs transformers' `generate_batch`.

A random-init Qwen2-architecture model of a named shape samples `--n-seqs` sequences × `--new-tokens` new tokens
from random prompts of `--prompt-len` tokens. The stop id is unreachable (= vocab size), so every method does the
same work: n_seqs × new_tokens tokens. Each method runs once untimed on a small case (warm-up), then timed.

    hf             lib.sample.engine.sample: lib/sample/decode.py's loop (fast inverse-CDF draws, per-request seeds)
    hf_greedy      the same engine at T = 0 (the draw's cost = hf − hf_greedy)
    generate       model.generate(do_sample=True, temperature, top_p): transformers' own multinomial sampler
    generate_batch model.generate_batch (continuous batching, paged KV cache; return_logprobs=True)

CPU:  python bench/sampling.py --shape toy --threads 1
GPU:  python bench/sampling.py --shape qwen2.5-1.5b            (bf16 on cuda, 64 × 256: the DESIGN.md §12 setting)

The decode loop this note once proposed is lib/sample/decode.py (HFEngine's engine since issue 15); bench/rollout.py
measures it against `generate` at the real shapes on the GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.sample.engine import HFEngine, sample  # noqa: E402

SHAPES = {   # Qwen2 architecture at each shape (smollm2-135m: SmolLM2's sizes, though SmolLM2 itself is a Llama)
    "toy": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, vocab_size=8192),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, vocab_size=151936),
}

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--shape", choices=sorted(SHAPES), default="toy", help="model shape (random init)")
p.add_argument("--n-seqs", type=int, default=64, help="sequences sampled")
p.add_argument("--new-tokens", type=int, default=256, help="new tokens per sequence (no early stop)")
p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens per sequence")
p.add_argument("--batch-size", type=int, default=64, help="rows per generate call for hf / generate")
p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass")
p.add_argument("--methods", default="hf,hf_greedy,generate,generate_batch", help="comma-separated methods to time")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
p.add_argument("--dtype", default=None, help="model dtype (default: bfloat16 on cuda, float32 on cpu)")
p.add_argument("--cb-page-size", type=int, default=None, help="generate_batch page size (CPU default 64)")
p.add_argument("--cb-max-batch-tokens", type=int, default=None, help="generate_batch tokens per step (CPU default 512)")
p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is steadier on a shared machine)")
p.add_argument("--out", default=None, help="also write the results as JSON here")
args = p.parse_args()

# --- model and prompts ---

from transformers import ContinuousBatchingConfig, GenerationConfig, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

if args.threads:
    torch.set_num_threads(args.threads)
dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
cfg = Qwen2Config(**SHAPES[args.shape], max_position_embeddings=args.prompt_len + args.new_tokens + 64,
                  tie_word_embeddings=args.shape != "qwen2.5-1.5b")
torch.manual_seed(0)
with torch.device(args.device):
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()
V, STOP = cfg.vocab_size, cfg.vocab_size          # an id the model cannot emit: every row runs to the cap
g = torch.Generator().manual_seed(1)
prompts = torch.randint(0, V, (args.n_seqs, args.prompt_len), generator=g).tolist()


class NoTokenizer:   # the bench needs no text: decode to "" (HFEngine asks only for decode / pad / eos)
    pad_token_id, eos_token_id = 0, None

    def decode(self, ids, skip_special_tokens=True):
        return ""


def sync():
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


# --- the methods: each returns the number of generated tokens ---

def run_hf(prompts, new_tokens, temperature):
    eng = HFEngine(model, NoTokenizer(), batch_size=args.batch_size, stop_token_ids=[STOP])
    outs = sample(eng, prompts, list(range(len(prompts))), temperature=temperature, top_p=args.top_p,
                  max_new_tokens=new_tokens, progress=False)
    return sum(len(c.token_ids) for c in outs)


def run_generate(prompts, new_tokens):
    n = 0
    gc = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                          max_new_tokens=new_tokens, eos_token_id=STOP, pad_token_id=0)
    for s in range(0, len(prompts), args.batch_size):
        ids = torch.tensor(prompts[s:s + args.batch_size], device=args.device)   # equal lengths: no padding
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        n += out[:, ids.shape[1]:].numel()
    return n


def run_generate_batch(prompts, new_tokens):
    gc = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0,
                          max_new_tokens=new_tokens, eos_token_id=STOP, pad_token_id=0)
    kw = {}
    if args.device == "cpu" or args.cb_page_size or args.cb_max_batch_tokens:   # CPU: no memory probe, size it
        page = args.cb_page_size or 64
        kw = dict(page_size=page, max_batch_tokens=args.cb_max_batch_tokens or 512,
                  num_blocks=-(-len(prompts) * (args.prompt_len + new_tokens) // page) + 8)
    cbc = ContinuousBatchingConfig(return_logprobs=True, seed=0, **kw)
    outs = model.generate_batch(inputs=prompts, generation_config=gc, continuous_batching_config=cbc)
    return sum(len(o.generated_tokens) for o in outs.values())


METHODS = {"hf": lambda ps, n: run_hf(ps, n, args.temperature), "hf_greedy": lambda ps, n: run_hf(ps, n, 0.0),
           "generate": run_generate, "generate_batch": run_generate_batch}

# --- timing ---

rows = []
for name in args.methods.split(","):
    METHODS[name](prompts[:2], 4)                                     # warm-up: allocator, kernels, graphs
    sync()
    t = time.perf_counter()
    n_tok = METHODS[name](prompts, args.new_tokens)
    sync()
    dt = time.perf_counter() - t
    rows.append({"method": name, "tokens": n_tok, "seconds": round(dt, 3), "tokens_per_s": round(n_tok / dt, 1)})
    print(f"{name:>15}: {n_tok} tokens in {dt:.2f} s", flush=True)

device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu × {torch.get_num_threads()} threads"
print(f"\nshape {args.shape} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, {dtype}), {device_name}, "
      f"{args.n_seqs} seqs × {args.new_tokens} new tokens, prompt {args.prompt_len}, batch {args.batch_size}, "
      f"T {args.temperature}, top_p {args.top_p}")
print(f"| {'method':<15} | {'tokens':>7} | {'seconds':>8} | {'tokens/s':>9} |\n|{'-' * 17}|{'-' * 9}|{'-' * 10}|{'-' * 11}|")
for r in rows:
    print(f"| {r['method']:<15} | {r['tokens']:>7} | {r['seconds']:>8.2f} | {r['tokens_per_s']:>9.1f} |")
if args.out:
    Path(args.out).write_text(json.dumps({"args": vars(args), "device": device_name, "results": rows}, indent=1))
