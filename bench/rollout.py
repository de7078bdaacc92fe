"""Rollout throughput at the real shapes: transformers `generate` (dynamic cache), `generate` (static cache, which
compiles itself) and lib/decode.py's decoder (fast and exact draws), side by side, random weights, no early stop.

    python bench/rollout.py --check --out results.jsonl                 (one H200: every shape, B and method)
    python bench/rollout.py --shapes tiny --batches 4 --prompt-len 16 --new-tokens 8 --check     (a CPU smoke run)

Every request has a prompt of `--prompt-len` random ids and samples exactly `--new-tokens` tokens at T = 1,
top-p = 1 (the stop id is the vocabulary size, which no method can emit), so each method does B × N tokens of work.
tokens/s = B × N / wall seconds of the whole call (prefill included), measured after one identical untimed call.

Bandwidth bound (what a decode step must at least read: every weight once, every sequence's KV cache once):
    t_step(t) = (W + B · kv · (P + t)) / BW,   bound = B · N / Σ_{t<N} t_step(t)
W = parameter bytes (bf16), kv = 2 · layers · kv_heads · head_dim · 2 bytes per cached token, P = prompt length,
BW = --bandwidth (default 4.3 TB/s, the H200's attained streaming read used for the issue's bounds).
`--check` first runs correctness checks on the device (greedy = generate on a tiny fp32 Qwen2 with CUDA graphs;
sampled tokens independent of the slot count; bf16 log-prob gap against a forward pass at the 1.5B shape).
Each result row is appended to `--out` (JSONL) as soon as it is measured.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.decode import Decoder  # noqa: E402
from lib.shapes import SHAPES as REAL  # noqa: E402

SHAPES = REAL | {"tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=512)}      # for a CPU smoke run of this script

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b", help="comma-separated lib/shapes.py shapes, or tiny")
p.add_argument("--batches", default="64,256", help="comma-separated batch sizes B")
p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens P")
p.add_argument("--new-tokens", type=int, default=1024, help="new tokens N per request")
p.add_argument("--methods", default="ours,ours_exact,generate_static,generate_dynamic", help="comma-separated")
p.add_argument("--attn", default="sdpa", help="decoder attention: sdpa | matmul")
p.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s for the bound")
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
p.add_argument("--check", action="store_true", help="run the on-device correctness checks first")
p.add_argument("--out", default=None, help="append result rows here (JSONL)")
args = p.parse_args()


def sync():
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()


def emit(row: dict):
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


# --- on-device correctness ---

def check():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(3)
    cfg = Qwen2Config(vocab_size=400, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, initializer_range=0.2)
    tiny = Qwen2ForCausalLM(cfg).to(args.device).eval()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 400, (n,), generator=g).tolist() for n in (1, 7, 3, 12, 5, 9, 2)]
    N = 24
    res = {}
    for slots in (3, 7):
        dec = Decoder(tiny, slots=slots, max_len=40, max_new_tokens=N, stop_ids=[400], mode="fast", attn_impl=args.attn)
        res[("greedy", slots)] = dec.run(prompts, [0] * 7, temperature=0, top_p=1.0)
        for mode in ("fast", "exact"):
            dec.mode = mode
            res[(mode, slots)] = dec.run(prompts, list(range(7)), temperature=0.9, top_p=0.9)
        res[("graphs", slots)] = len(dec.graphs)
    same_greedy = all(ids == tiny.generate(torch.tensor([p], device=args.device), do_sample=False, max_new_tokens=N,
                                           eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
                      for p, (ids, _) in zip(prompts, res[("greedy", 3)]))
    emit({"check": "tiny fp32, CUDA graphs", "greedy_equals_generate": same_greedy,
          "graphs_captured": res[("graphs", 3)],
          **{f"{m}_same_tokens_3_vs_7_slots": [a[0] for a in res[(m, 3)]] == [b[0] for b in res[(m, 7)]]
             for m in ("greedy", "fast", "exact")}})


def logprob_gap(model, B=8, P=64, N=64):
    """bf16: max |decoder log-prob − a teacher-forced forward pass| on sampled tokens (what rollout/logprob_gap is)."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, V, (B, P), generator=g).tolist()
    dec = Decoder(model, slots=B, max_len=P + N, max_new_tokens=N, stop_ids=[V], mode="fast", attn_impl=args.attn)
    outs = dec.run(prompts, list(range(B)), temperature=1.0, top_p=1.0)
    ids = torch.tensor([pr + o[0] for pr, o in zip(prompts, outs)], device=args.device)
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[:, P - 1:-1].float(), -1).gather(2, ids[:, P:, None])[..., 0]
    gap = (lp - torch.tensor([o[1] for o in outs], device=args.device)).abs()
    emit({"check": "logprob gap bf16", "max": gap.max().item(), "mean": gap.mean().item()})


# --- the methods: each samples B × N tokens ---

def run_ours(model, prompts, N, mode):
    dec = decoders.setdefault((mode, len(prompts)), Decoder(
        model, slots=len(prompts), max_len=args.prompt_len + N, max_new_tokens=N, stop_ids=[model.config.vocab_size],
        mode=mode, attn_impl=args.attn))
    outs = dec.run(prompts, list(range(len(prompts))), temperature=1.0, top_p=1.0)
    return sum(len(o[0]) for o in outs)


def run_generate(model, prompts, N, static):
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=N,
                          eos_token_id=model.config.vocab_size, pad_token_id=0,
                          cache_implementation="static" if static else None)
    ids = torch.tensor(prompts, device=args.device)                  # equal lengths: no padding
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[:, ids.shape[1]:].numel()


METHODS = {"ours": lambda m, ps, n: run_ours(m, ps, n, "fast"), "ours_exact": lambda m, ps, n: run_ours(m, ps, n, "exact"),
           "generate_dynamic": lambda m, ps, n: run_generate(m, ps, n, False),
           "generate_static": lambda m, ps, n: run_generate(m, ps, n, True)}


def bound(cfg, n_params: int, B: int, P: int, N: int) -> float:
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    seconds = sum((2 * n_params + B * kv * (P + t)) / args.bandwidth for t in range(N))
    return B * N / seconds


# --- timing ---

if args.check:
    check()
device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
for shape in args.shapes.split(","):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16 if args.device.startswith("cuda") else torch.float32).eval()
    n_params = sum(t.numel() for t in model.parameters())
    if args.check:
        logprob_gap(model)
    decoders: dict = {}
    for B in map(int, args.batches.split(",")):
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(0, cfg.vocab_size, (B, args.prompt_len), generator=g).tolist()
        for name in args.methods.split(","):
            try:
                METHODS[name](model, prompts, args.new_tokens)         # warm-up: compile, graphs, allocator
                sync()
                t = time.perf_counter()
                n_tok = METHODS[name](model, prompts, args.new_tokens)
                sync()
                dt = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001  (one method failing must not lose the others' rows)
                emit({"shape": shape, "B": B, "method": name, "error": f"{type(e).__name__}: {e}"[:400]})
                continue
            bd = bound(cfg, n_params, B, args.prompt_len, args.new_tokens)
            emit({"shape": shape, "B": B, "P": args.prompt_len, "N": args.new_tokens, "method": name,
                  "attn": args.attn if name.startswith("ours") else None, "tokens": n_tok, "seconds": round(dt, 3),
                  "tokens_per_s": round(n_tok / dt), "bound_tokens_per_s": round(bd),
                  "pct_of_bound": round(100 * n_tok / dt / bd, 1), "device": device_name,
                  "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if device_name != "cpu" else None})
        decoders.clear()
        if device_name != "cpu":
            torch.cuda.empty_cache()
    del model
