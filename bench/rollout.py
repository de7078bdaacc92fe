"""Rollout throughput at the real shapes: lib/sample/decode.py's decoder (its current and its previous configuration,
and ablations), vLLM and transformers `generate`, side by side in one process run, random weights, no early stop.

    python bench/rollout.py --check --out results.jsonl                  (one H200: every shape, length, B, method)
    python bench/rollout.py --shapes qwen2.5-1.5b --lengths 256+400 --batches 256 --slots 64,128,256 --methods ours
                                                                     (03's step: 256 rollouts through S slots)
    python bench/rollout.py --shapes tiny --batches 4 --lengths 16+8 --methods ours,ours_prev --check  (CPU smoke)

Every request has a prompt of P random ids and samples exactly N tokens (`--lengths P+N,…`) at T = 1, top-p = 1
(the stop id is the vocabulary size, which no method can emit), so each method does B × N tokens of work.
tokens/s = B × N / wall seconds of the whole call (prefill included), measured after one identical untimed call (vLLM's
untimed call: the same requests, `--vllm-warmup-tokens` new tokens each); `--repeats K` times K calls in a row, one row
each (`rep`), for the spread within one process. vLLM keeps a prefix cache across calls, so a timed call would find
every prompt the untimed call already prefilled and skip its prefill; the `vllm*` methods drop that cache before each
timed call (`LLM.reset_prefix_cache()`, as 03 does after every weight push), so they prefill as ours does. `vllm_cached`
keeps it: the yardstick of every vLLM row of this script from its first version (880d446) to 2026-12-03, kept for
comparison. Each vLLM row carries `cached_prompt_tokens`, the prompt tokens its timed call took from the prefix cache
(RequestOutput.num_cached_tokens). `--share n` gives the B requests B / n distinct prompts, each asked n times in a row,
as 03 asks for a prompt's rollouts (ours prefills each once and copies its K/V into its n slots; vLLM's prefix cache may
share them too); its rows carry `share`.

Methods: `ours` (the decoder's CUDA defaults: fused q|k|v and gate|up GEMMs, compiled layer blocks, Triton split-K
attention over the live length, the fast draw's two-level search, the draw compiled whole), `ours_prev` (the
configuration before them: bench/RESULTS.md §6, decoder run 2), `ours_exact` (ours with exact Gumbel-max draws),
ablations `ours_nofuse`, `ours_nocompile`, `ours_matmul`, `ours_plaindraw`, `ours_eagerdraw`, `ours_modprefill` (ours
with one optimization off; modprefill: the packed prefill through the model's own modules, as before fast_prefill),
`ours_autotune` (the blocks compiled with mode max-autotune-no-cudagraphs: minutes of compile per slot count),
`vllm` (vLLM's LLM on the same random weights, saved with save_pretrained; one engine per shape, started after the other
methods and freed before the next shape; in this process, as lib/sample/vllm_engine.py runs it, unless
`--vllm-multiprocess`; no seed, no log-probs) and its variants in VLLM_VARIANTS: `vllm_seeded` (as
lib/sample/vllm_engine.py asks it to: a seed per request and the sampled token's raw log-prob), `vllm_seeded_nolp`
(seeds, no log-probs), `vllm_seeded_lp4` (seeds, the log-prob on every 4th request only: 03's --logprob-gap-every),
`vllm_cached` (`vllm` with the untimed call's prompts left in its prefix cache),
`generate_static`, `generate_dynamic` (transformers). An ours* method followed by `@TILING` (bench/decode_attn.py's
grammar, e.g. `ours@c256b64w4x`) runs with that attention tiling; followed by `%GEMMS` (bench/skinny_gemm.py's, e.g.
`ours%qkv=n64k128s4w4`), with those GEMMs by lib/sample/skinny_gemm.py's Triton kernel. A method that fails prints a row
with its error and the run goes on; the script then exits with status 1, so bench/device.sh marks the part failed.

Bandwidth bound (what a decode step must at least read: every weight once, every sequence's KV cache once):
    t_step(t) = (W + B · kv · (P + t)) / BW,   bound = B · N / Σ_{t<N} t_step(t)
W = parameter bytes (bf16), kv = 2 · layers · kv_heads · head_dim · 2 bytes per cached token, BW = --bandwidth
(default 4.3 TB/s, the H200's attained streaming read used for the issue's bounds).
`--check` first runs correctness checks on the device (greedy = generate on a tiny fp32 Qwen2 with CUDA graphs;
sampled tokens independent of the slot count; a prompt's requests reading its rows from the leader's slot draw what
they draw from their own copies; weights changed in place reach the next run; bf16 log-prob gap
against a forward pass at each real shape). Each result row is appended to `--out` (JSONL) as soon as measured.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lib.sample.decode import Decoder  # noqa: E402
from lib.shapes import SHAPES as REAL  # noqa: E402

SHAPES = REAL | {"tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=512)}      # for a CPU smoke run of this script
VARIANTS = {   # decoder options per method (mode + the switches lib/sample/decode.py documents); {} = its defaults
    "ours": dict(mode="fast"), "ours_exact": dict(mode="exact"),
    "ours_prev": dict(mode="fast", fuse_gemms=False, compile_step=False, attn_impl="matmul", draw_blocked=False),
    "ours_nofuse": dict(mode="fast", fuse_gemms=False), "ours_nocompile": dict(mode="fast", compile_step=False),
    "ours_matmul": dict(mode="fast", attn_impl="matmul"), "ours_plaindraw": dict(mode="fast", draw_blocked=False),
    "ours_autotune": dict(mode="fast", compile_step="max-autotune-no-cudagraphs"),
    "ours_eagerdraw": dict(mode="fast", compile_draw=False),
    "ours_modprefill": dict(mode="fast", fast_prefill=False),     # the packed prefill through the model's modules
}
VLLM_VARIANTS = {   # vLLM method: (a seed per request, log-prob on every k-th request: 0 none, 1 all, prefix cache
    #                  dropped before each timed call)
    "vllm": (False, 0, True), "vllm_seeded": (True, 1, True), "vllm_seeded_nolp": (True, 0, True),
    "vllm_seeded_lp4": (True, 4, True), "vllm_cached": (False, 0, False)}
args = None


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b", help="comma-separated lib/shapes.py shapes, or tiny")
    p.add_argument("--batches", default="64,256", help="comma-separated batch sizes B")
    p.add_argument("--lengths", default="512+1024", help="comma-separated PROMPT+NEW token counts, e.g. 512+1024,256+400")
    p.add_argument("--methods", default="ours,ours_prev,vllm", help=f"comma-separated, of {sorted(VARIANTS)}, {sorted(VLLM_VARIANTS)}, "
                   "generate_static, generate_dynamic")
    p.add_argument("--slots", default=None, type=lambda x: [int(v) for v in x.split(",")],
                   help="comma-separated decoder slot counts for ours* (default B; 03_opd_train's HFEngine has "
                   "8 × --micro-batch): B requests through S slots, continuous batching")
    p.add_argument("--attn", default=None, help="override the decoder's attention for every ours* method")
    p.add_argument("--vllm-mem", type=float, default=0.5, help="vLLM gpu_memory_utilization")
    p.add_argument("--vllm-warmup-tokens", type=int, default=64, help="new tokens of vLLM's untimed call (its "
                   "graphs are captured at start; the other methods' untimed call is the timed one's twin)")
    p.add_argument("--vllm-multiprocess", action="store_true", help="vLLM's engine core in its own process (vLLM's "
                   "default); without it the engine runs in this process, as lib/sample/vllm_engine.py runs it")
    p.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s for the bound")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    p.add_argument("--share", type=int, default=1, help="requests per distinct prompt (B / share distinct prompts, "
                   "each asked share times in a row, as 03 asks for its rollouts)")
    p.add_argument("--repeats", type=int, default=1, help="timed calls per method and case (one row each), after "
                   "the one untimed call")
    p.add_argument("--check", action="store_true", help="run the on-device correctness checks first")
    p.add_argument("--out", default=None, help="append result rows here (JSONL)")
    return p.parse_args(argv)


def cuda() -> bool:
    return args.device.startswith("cuda")


def sync():
    if cuda():
        torch.cuda.synchronize()


def free():
    gc.collect()
    if cuda():
        torch.cuda.empty_cache()


ERRORS = []         # rows that carry an error: the exit status is 1 if any


def emit(row: dict):
    if "error" in row:
        ERRORS.append(row)
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")


def variant(name: str) -> dict | None:
    """An ours* method's decoder options (`base@tiling`: the base's, with that attention tiling; `base%GEMMS`: with
    those GEMMs by lib/sample/skinny_gemm.py, bench/skinny_gemm.py's spec), else None."""
    name, _, g = name.partition("%")
    base, _, t = name.partition("@")
    if base not in VARIANTS:
        return None
    from bench.decode_attn import tiling
    from bench.skinny_gemm import spec
    return VARIANTS[base] | ({"attn_opts": tiling(t)} if t else {}) | ({"gemm_opts": spec(g)} if g else {})


def decoder(model, name, S, P, N, **kw):
    opts = variant(name) | ({"attn_impl": args.attn} if args.attn else {}) | kw
    return Decoder(model, slots=S, max_len=P + N, max_new_tokens=N, stop_ids=[model.config.vocab_size], **opts)


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
    refs = [tiny.generate(torch.tensor([p], device=args.device), do_sample=False, max_new_tokens=N,
                          eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    for name in ("ours", "ours_prev"):
        try:
            res = {}
            for slots in (3, 7):
                dec = decoder(tiny, name, slots, 16, N)      # a 40-position cache
                res[("greedy", slots)] = dec.run(prompts, [0] * 7, temperature=0, top_p=1.0)
                for mode in ("fast", "exact"):
                    dec.mode = mode
                    res[(mode, slots)] = dec.run(prompts, list(range(7)), temperature=0.9, top_p=0.9)
                res[("graphs", slots)] = len(dec.graphs)
            shared = [p for p in prompts for _ in range(3)]            # 03's layout: a prompt asked n times
            res["shared"] = [decoder(tiny, name, 4, 16, N, mode="fast", shared_reads=on).run(
                shared, list(range(len(shared))), temperature=0.9, top_p=0.9) for on in (True, False)]
            dec = decoder(tiny, name, 3, 16, N, mode="fast", compile_draw=False)    # the step's draw eager
            res["eager_draw"] = dec.run(prompts, list(range(7)), temperature=0.9, top_p=0.9)
            with torch.no_grad():                       # weights changed in place reach the next run (fused copies)
                saved = [t.clone() for t in tiny.parameters()]
                for t in tiny.parameters():
                    t.mul_(1.5)
                dec.mode = VARIANTS[name]["mode"]
                after = dec.run(prompts, list(range(7)), temperature=1.0, top_p=1.0)
                fresh = decoder(tiny, name, 7, 16, N).run(prompts, list(range(7)), temperature=1.0, top_p=1.0)
                for t, s in zip(tiny.parameters(), saved):
                    t.copy_(s)
            emit({"check": f"tiny fp32, CUDA graphs, {name}", "greedy_equals_generate": all(
                    ids == r for r, (ids, _) in zip(refs, res[("greedy", 3)])),
                  "graphs_captured": res[("graphs", 3)],
                  **{f"{m}_same_tokens_3_vs_7_slots": [a[0] for a in res[(m, 3)]] == [b[0] for b in res[(m, 7)]]
                     for m in ("greedy", "fast", "exact")},
                  "in_place_update_reaches_next_run": [a[0] for a in after] == [b[0] for b in fresh],
                  "shared_reads_same_tokens_and_logprobs": res["shared"][0] == res["shared"][1],
                  "compiled_draw_same_tokens_as_eager": [a[0] for a in res["eager_draw"]] == [
                      b[0] for b in res[("fast", 3)]]})
        except Exception as e:  # noqa: BLE001
            emit({"check": f"tiny fp32, {name}", "error": f"{type(e).__name__}: {e}"[:400]})


def logprob_gap(model, name, B=8, P=64, N=64):
    """bf16: max |decoder log-prob − a teacher-forced forward pass| on sampled tokens (what rollout/logprob_gap is)."""
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, model.config.vocab_size, (B, P), generator=g).tolist()
    try:
        outs = decoder(model, name, B, P, N).run(prompts, list(range(B)), temperature=1.0, top_p=1.0)
        ids = torch.tensor([pr + o[0] for pr, o in zip(prompts, outs)], device=args.device)
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[:, P - 1:-1].float(), -1).gather(2, ids[:, P:, None])[..., 0]
        gap = (lp - torch.tensor([o[1] for o in outs], device=args.device)).abs()
        emit({"check": f"logprob gap bf16, {name}", "max": gap.max().item(), "mean": gap.mean().item()})
    except Exception as e:  # noqa: BLE001
        emit({"check": f"logprob gap bf16, {name}", "error": f"{type(e).__name__}: {e}"[:400]})
    free()


# --- the methods: each samples B × N tokens, returns the count ---

def run_generate(model, prompts, N, static):
    from transformers import GenerationConfig
    gc_ = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=N,
                           eos_token_id=model.config.vocab_size, pad_token_id=0,
                           cache_implementation="static" if static else None)
    ids = torch.tensor(prompts, device=args.device)                  # equal lengths: no padding
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc_)
    return out[:, ids.shape[1]:].numel()


def timed(fn, warm=None, before=None):
    """(tokens, [seconds of each of --repeats calls]) of fn() after one untimed call, `warm()` or else identical
    (compile, graphs, allocator); `before()`, untimed, ahead of each timed call."""
    (warm or fn)()
    seconds = []
    for _ in range(args.repeats):
        if before is not None:
            before()
        sync()
        t = time.perf_counter()
        n = fn()
        sync()
        seconds.append(time.perf_counter() - t)
    return n, seconds


def row(shape, cfg, n_params, B, P, N, name, n_tok, seconds, concurrency=None, per_rep=None, **extra):
    """One row per timed call (`rep` 0, 1, … of --repeats); `per_rep[rep]`, fields of that call alone."""
    bd = bound(cfg, n_params, concurrency or B, P, N)              # the bound of `concurrency` sequences at a time
    for rep, dt in enumerate(seconds):
        emit({"shape": shape, "B": B, "P": P, "N": N, "method": name, "rep": rep, "tokens": n_tok,
              "seconds": round(dt, 3), "tokens_per_s": round(n_tok / dt), "bound_tokens_per_s": round(bd),
              "pct_of_bound": round(100 * n_tok / dt / bd, 1),
              "device": torch.cuda.get_device_name() if cuda() else "cpu",
              "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda() else None,
              **({"share": args.share} if args.share > 1 else {}), **extra, **(per_rep[rep] if per_rep else {})})


def bound(cfg, n_params: int, B: int, P: int, N: int) -> float:
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
    seconds = sum((2 * n_params + B * kv * (P + t)) / args.bandwidth for t in range(N))
    return B * N / seconds


def run_local(shape, model, cases, methods):
    """The in-process methods, case by case (ours* once per --slots value); each decoder freed after its calls."""
    cfg, n_params = model.config, sum(t.numel() for t in model.parameters())
    for B, P, N, prompts in cases:
        for name, S in [(m, min(S, B)) for m in methods for S in (args.slots if variant(m) else [B])]:
            try:
                if variant(name):
                    dec = decoder(model, name, S, P, N)
                    n_tok, dt = timed(lambda d=dec, ps=prompts: sum(len(o[0]) for o in d.run(
                        ps, list(range(len(ps))), temperature=1.0, top_p=1.0)))
                    extra = {"slots": S, "options": variant(name), "attn": dec.attn_impl,
                             "step": "v2" if dec.v2 else "v1"}
                    dec = None
                else:
                    n_tok, dt = timed(lambda ps=prompts, n=N, s=name == "generate_static": run_generate(model, ps, n, s))
                    extra = {}
            except Exception as e:  # noqa: BLE001  (one method failing must not lose the others' rows)
                emit({"shape": shape, "B": B, "P": P, "N": N, "method": name, "error": f"{type(e).__name__}: {e}"[:400]})
                free()
                continue
            free()
            row(shape, cfg, n_params, B, P, N, name, n_tok, dt, concurrency=S, **extra)
            if cuda():
                torch.cuda.reset_peak_memory_stats()


def run_vllm(shape, path, cfg, n_params, cases, variants=("vllm",)):
    """vLLM's LLM over the saved random model: one engine for all cases and variants, one untimed call before each
    timed one."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if args.vllm_multiprocess else "0"
    llm = None
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(model=str(path), dtype="bfloat16", gpu_memory_utilization=args.vllm_mem, enforce_eager=False,
                  seed=0, skip_tokenizer_init=True, generation_config="vllm", logprobs_mode="raw_logprobs",
                  max_model_len=max(P + N for _, P, N, _ in cases), max_num_seqs=max(B for B, _, _, _ in cases))
    except Exception as e:  # noqa: BLE001
        emit({"shape": shape, "method": "vllm", "error": f"{type(e).__name__}: {e}"[:400]})
        return
    for (B, P, N, prompts), method in ((c, m) for c in cases for m in variants):
        seeded, every, reset = VLLM_VARIANTS[method]
        cached = []                                              # per timed call: prompt tokens from the prefix cache

        def call(r, s):
            outs = llm.generate(r, s, use_tqdm=False)
            cached.append(sum(o.num_cached_tokens or 0 for o in outs))
            return sum(len(o.outputs[0].token_ids) for o in outs)

        def drop_cache():
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache (requests in flight?)")
        try:
            def params(n):
                one = dict(n=1, temperature=1.0, top_p=1.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                           detokenize=False)
                return [SamplingParams(**one, seed=i if seeded else None,
                                       logprobs=0 if every and i % every == 0 else None) for i in range(B)]
            sp, warm = params(N), params(min(N, args.vllm_warmup_tokens))
            reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
            n_tok, dt = timed(lambda r=reqs, s=sp: call(r, s),
                              warm=lambda r=reqs, s=warm: llm.generate(r, s, use_tqdm=False),
                              before=drop_cache if reset else None)
        except Exception as e:  # noqa: BLE001
            emit({"shape": shape, "B": B, "P": P, "N": N, "method": method, "error": f"{type(e).__name__}: {e}"[:400]})
            continue
        import vllm
        row(shape, cfg, n_params, B, P, N, method, n_tok, dt, vllm=vllm.__version__,
            prefix_cache="dropped before the call" if reset else "kept from the untimed call",
            per_rep=[{"cached_prompt_tokens": hit} for hit in cached])
    shutdown = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
    if shutdown is not None:                 # the engine process (multiprocessing mode) goes now, not at exit
        shutdown()
    llm = None
    free()


def main(argv=None):
    global args
    args = parse(argv)
    args.slots = args.slots or [1 << 30]                             # min(·, B): B slots unless given
    from transformers import Qwen2Config, Qwen2ForCausalLM
    if args.check:
        check()
    lengths = [tuple(map(int, x.split("+"))) for x in args.lengths.split(",")]
    methods = args.methods.split(",")
    for shape in args.shapes.split(","):
        cfg = Qwen2Config(**SHAPES[shape])
        torch.manual_seed(0)
        with torch.device(args.device):
            model = Qwen2ForCausalLM(cfg).to(torch.bfloat16 if cuda() else torch.float32).eval()
        n_params = sum(t.numel() for t in model.parameters())
        if args.check:
            for name in ("ours", "ours_prev"):
                logprob_gap(model, name)
        cases = []
        for P, N in lengths:
            for B in map(int, args.batches.split(",")):
                g = torch.Generator().manual_seed(1)
                distinct = torch.randint(0, cfg.vocab_size, (-(-B // args.share), P), generator=g).tolist()
                cases.append((B, P, N, [distinct[i // args.share] for i in range(B)]))
        run_local(shape, model, cases, [m for m in methods if not m.startswith("vllm")])
        if vllm_methods := [m for m in methods if m.startswith("vllm")]:
            path = Path(tempfile.mkdtemp(prefix=f"rollout-{shape}-"))
            try:
                model.save_pretrained(path)
                del model
                free()
                run_vllm(shape, path, cfg, n_params, cases, vllm_methods)
            finally:
                shutil.rmtree(path, ignore_errors=True)
        model = None
        free()


if __name__ == "__main__":      # vLLM's engine process re-imports this file (spawn): nothing may run on import
    main()
    if ERRORS:
        print(f"rollout.py: {len(ERRORS)} row(s) failed, first: {ERRORS[0]['error']}", file=sys.stderr)
        sys.exit(1)
