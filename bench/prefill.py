"""bench/prefill.py — the sampler's prefill in 03's step, packed (prompts end to end) against right-padded (issue 35).

03 hands the built-in sampler a step's B prompts × n rollouts; the decoder forwards each distinct prompt once and
copies its K/V into the n slots (lib/sample/decode.py). Right-padded, that pass costs B × the step's longest prompt;
packed, the sum of the B lengths. Training prompts are ragged (MATH under the DAPO template and Qwen's chat template:
median ≈ 130 tokens, up to the 768 cap), so the longest prompt of a step, not the step's tokens, set the padded cost.

For each of the first --steps steps of 03's prompt order (the data shuffled once with seed 42, prompts over
--max-prompt-len dropped, as 03 does with --drop-overlong), both variants prefill the step's B × n requests into
B × n slots: --reps timed passes after one warm-up, each a whole `Decoder._prefill` (host work, the forward, the
K/V copies and the first draw) between device syncs. Prints the tokens each variant forwards, its milliseconds,
and how far apart the two variants' results are: the K/V they wrote (max difference over the largest value, first
and last layer) and the first tokens drawn. A random model's next-token distribution is nearly uniform over 151,936
ids (entropy 11.6 nats), so at T = 1 any rounding difference redraws most first tokens: that column is not a check.
What checks the packed prefill on the device is 03's `rollout/logprob_gap` (the sampler's log-probs of its 400 tokens
against the scorer's, every one conditioned on the prompt's K/V).
Random weights of a real shape (lib/shapes.py); the prompts are the real tokenized ones (lengths are what matter).

    python3 bench/prefill.py --data .device/data/math_train.jsonl --out /tmp/prefill.json       # GPU, 1.5B shape
    python bench/prefill.py --shape tiny --steps 2 --prompts 4 --reps 1                         # CPU smoke
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.rollout import SHAPES  # noqa: E402  (lib/shapes.py's real shapes and bench/rollout.py's tiny one)
from lib.sample.decode import Decoder  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-1.5b", help="lib/shapes.py shape, or tiny")
    p.add_argument("--data", default=None,
                   help="training rows (jsonl with `problem`), tokenized with the real Qwen2.5 tokenizer; without it, "
                        "prompt lengths drawn uniformly from 60–830 (seed 0)")
    p.add_argument("--steps", type=int, default=6, help="steps of 03's prompt order measured")
    p.add_argument("--prompts", type=int, default=64, help="distinct prompts a step (03's --batch-prompts)")
    p.add_argument("--rollouts", type=int, default=4, help="requests per prompt (03's --rollouts)")
    p.add_argument("--max-prompt-len", type=int, default=768, help="longer prompts dropped, as 03 --drop-overlong")
    p.add_argument("--reps", type=int, default=3, help="timed passes per step and variant (after one warm-up)")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="every prompt this many random ids (no --data): the rollout benchmark's prompts")
    p.add_argument("--variants", default="packed,padded",
                   help="comma-separated, of " + ", ".join(VARIANTS) + "; the first two are compared (K/V, tokens)")
    p.add_argument("--profile", action="store_true",
                   help="after each step, one more prefill of each variant under torch.profiler: device time per "
                   "kernel class and the largest kernels (bench/profile_step.py's table)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


VARIANTS = {"packed": dict(packed_prefill=True),                   # the CUDA default (fast_prefill with v2)
            "padded": dict(packed_prefill=False),
            "packed_modules": dict(packed_prefill=True, fast_prefill=False)}   # packed, the model's own modules


def step_prompts(args, vocab: int) -> list[list[list[int]]]:
    """Per step, its --prompts distinct prompts' token ids in 03's order."""
    import numpy as np
    need = args.steps * args.prompts
    if args.data:
        from lib.data import prompt_ids
        from lib.qwen_tokenizer import build
        tok = build("qwen2.5")
        rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
        rows = [rows[i] for i in np.random.default_rng(42).permutation(len(rows))]    # 03's shuffle (seed 42)
        ids = []
        for r in rows:
            x = prompt_ids(tok, r["problem"])
            if len(x) <= args.max_prompt_len:
                ids.append([t % vocab for t in x])
            if len(ids) == need:
                break
        if len(ids) < need:
            sys.exit(f"{args.data} holds {len(ids)} prompts of ≤ {args.max_prompt_len} tokens; --steps × --prompts "
                     f"needs {need}: pass fewer --steps")
    else:
        g = torch.Generator().manual_seed(0)
        lens = [args.prompt_len] * need if args.prompt_len else torch.randint(60, 831, (need,), generator=g).tolist()
        ids = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]
    return [ids[s * args.prompts:(s + 1) * args.prompts] for s in range(args.steps)]


def timed_prefill(dec: Decoder, prompts, seeds, cuda: bool) -> float:
    """Seconds for one whole prefill of every request into slots 0…len − 1, between device syncs."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    dec._prefill(list(range(len(prompts))), prompts, seeds)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None):
    args = parse(argv)
    cuda = torch.cuda.is_available()
    from transformers import Qwen2Config, Qwen2ForCausalLM
    shape = {k: v for k, v in SHAPES[args.shape].items() if k not in ("architectures", "dtype")}
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16 if cuda else torch.float32).eval()
    steps = step_prompts(args, model.config.vocab_size)
    T = -(-(args.max_prompt_len + 8) // 256) * 256
    S = args.prompts * args.rollouts
    results = {"shape": args.shape, "data": args.data, "prompts": args.prompts, "rollouts": args.rollouts,
               "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d"), "steps": []}
    names = args.variants.split(",")
    decs = {name: Decoder(model, slots=S, max_len=T, max_new_tokens=8, stop_ids=[model.config.vocab_size],
                          mode="fast", **VARIANTS[name]) for name in names}
    for d in decs.values():
        d.greedy, d.use_top_p = False, False                     # what run() sets for 03's T = 1 rollouts
    print(f"prefill of {args.prompts} prompts × {args.rollouts} requests into {S} slots, shape {args.shape}, "
          f"{results['device']}")
    a_, b_ = names[0], names[1] if len(names) > 1 else names[0]
    print(f"| step | longest | Σ prompt tokens | padded tokens | " + " | ".join(f"{n} ms" for n in names) +
          f" | {b_} / {a_} | first tokens equal | K/V max diff / max: layer 0 K | last layer V |")
    print("|---|---|---|---|" + "---|" * len(names) + "---|---|---|---|")
    with torch.no_grad():
        for i, ps in enumerate(steps, 1):
            prompts = [p for p in ps for _ in range(args.rollouts)]
            seeds = list(range(len(prompts)))
            row = {"step": i, "longest": max(map(len, ps)), "tokens": sum(map(len, ps)),
                   "padded_tokens": len(ps) * max(map(len, ps))}
            for name, dec in decs.items():
                timed_prefill(dec, prompts, seeds, cuda)                       # warm-up (kernels for this shape)
                row[f"{name}_s"] = statistics.median(timed_prefill(dec, prompts, seeds, cuda)
                                                     for _ in range(args.reps))
            # the two variants' results after the step's last pass: first tokens, their log-probs, the K/V written
            a, b = decs[a_], decs[b_]
            row["first_tokens_equal"] = int((a.tok_S == b.tok_S).sum())
            for key, x, y in (("k0", a.k[0], b.k[0]), ("v_last", a.v[-1], b.v[-1])):
                xs = torch.cat([x[r, :, :len(p)].flatten() for r, p in enumerate(prompts)]).float()
                ys = torch.cat([y[r, :, :len(p)].flatten() for r, p in enumerate(prompts)]).float()
                row[f"kv_rel_diff_{key}"] = float((xs - ys).abs().max() / ys.abs().max())
            if args.profile:
                from bench.profile_step import profile_table
                for name, dec in decs.items():
                    row[f"{name}_profile"] = tab = profile_table(lambda d=dec: d._prefill(
                        list(range(len(prompts))), prompts, seeds), cuda, top=15)
                    print(f"profile {name}: {json.dumps(tab)}", flush=True)
            results["steps"].append(row)
            print(f"| {i} | {row['longest']} | {row['tokens']:,} | {row['padded_tokens']:,} | "
                  + "".join(f"{row[n + '_s'] * 1e3:.1f} | " for n in names) +
                  f"{row[b_ + '_s'] / row[a_ + '_s']:.2f}× | {row['first_tokens_equal']}/{len(prompts)} | "
                  f"{row['kv_rel_diff_k0']:.2g} | {row['kv_rel_diff_v_last']:.2g} |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
