"""04_eval.py — one model × one benchmark × one protocol → one eval unit (DESIGN.md §4–5).

Samples every problem of a benchmark under a protocol (seeds 0..n-1, the protocol's temperature and top-p), with the
model's OWN chat template and the DAPO prompt, grades each sample with lib.eval.grading (last `Answer:` line, else last
`\\boxed{}`; a prose Answer: line falls back, and each row records which path decided), and writes the unit:

    <run-dir>/evals/<alias>/<benchmark>/<protocol>/samples.jsonl   one row per sample
                                                  /scores.json     accuracy ± CI, truncation, grading, provenance
                                                  /manifest.json   sha256 of both, code, args, times

A checkpoint (or any model folder a stage made) is evaluated only if every file matches the manifest.json that
sealed it; otherwise a one-line refusal names the file. Probes and reduced runs (`--limit-problems N`, evenly spaced;
`--max-new-tokens M` other than the model's cap) get an alias suffix (`_subN`, `_capM`) and a `deviations` list, so
they can never pass for canonical units. A killed run resumes from `generations.partial.jsonl`; `--skip-if-exists`
returns a finished unit untouched (after checking its hashes); a unit is never overwritten by a different
configuration. The unit's planning, identity checks and writing are lib/eval/units.py; the stage reads top to bottom.

CPU (toy):  python 04_eval.py --run-dir runs/toy --model toy-pre --benchmark toy --protocol sample4
GPU:        python 04_eval.py --run-dir runs/openthinker --model openthinker3-1.5b --benchmark aime24 \\
                --protocol sample32 --backend vllm
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
from lib import models, pairs, registry
from lib.artifacts import ArtifactError, code_hashes, sha256_bytes, wall_clock
from lib.cli import ArgumentParser, HelpFormatter, fraction, path_name, positive_float, positive_int
from lib.data import assistant_header, dapo_prompt, prompt_ids, render_chat, special_text, stable_seed
from lib.errors import UserError
from lib.eval.units import (GRADE_TIMEOUT_S, Plan, config_sha256, existing_state, grading_summary, plan_unit,
                            sample_rows, summarize, write_unit)

PARTIAL = "generations.partial.jsonl"


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--run-dir", required=True, help="campaign directory (runs/<name>)")
    p.add_argument("--model", required=True,
                   help="registry alias, hub id (owner/name[@revision]), or a model / checkpoint folder")
    pairs.add_arguments(p.add_argument, teachers=False, default=None)    # only to know a pair file's models
    p.add_argument("--revision", default=None, help="hub commit of --model (default: the registry's pin, else main)")
    p.add_argument("--alias", default=None, type=path_name,
                   help="unit alias (default: the registry alias, or <run>-step<N> for a checkpoint)")
    p.add_argument("--benchmark", required=True, help=f"one of {sorted(registry.BENCHMARKS)} or a jsonl/parquet path")
    p.add_argument("--protocol", required=True, choices=sorted(registry.PROTOCOLS),
                   help="sampling protocol (DESIGN.md §5)")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="sampling backend")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--sample-batch", type=positive_int, default=64, help="sequences per generate() call (hf backend)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="override the model's cap (recorded as a deviation)")
    p.add_argument("--limit-problems", type=positive_int, default=None, help="probe: the N evenly spaced problems "
                   "(a deviation)")
    p.add_argument("--skip-if-exists", action="store_true", help="leave a finished unit with the same config untouched")
    p.add_argument("--grade-timeout", type=positive_float, default=GRADE_TIMEOUT_S,
                   help="CPU-seconds bound per graded sample (lib.eval.grading); another bound than the default is "
                        "part of the unit's identity")
    p.add_argument("--gpu-memory-utilization", type=fraction, default=0.85, help="vLLM's share of GPU memory")
    return p.parse_args(argv)


# --- the context gate (DESIGN.md §4): longest rendered prompt + cap must fit the model's positions ---

def context_gate(plan: Plan, prompts: list[list[int]]) -> dict:
    config = json.loads((plan.model.path / "config.json").read_text())
    limit = config.get("max_position_embeddings")
    longest = max(len(p) for p in prompts)
    verdict = {"longest_prompt": longest, "max_new_tokens": plan.max_new_tokens, "max_position_embeddings": limit}
    if limit is not None and longest + plan.max_new_tokens > limit:
        raise SystemExit(f"context gate: {plan.alias} on {plan.benchmark}: longest prompt {longest} tokens + cap "
                         f"{plan.max_new_tokens} = {longest + plan.max_new_tokens} > max_position_embeddings {limit}. "
                         f"Lower --max-new-tokens (recorded as a deviation) or use a model with a longer context.")
    return verdict


# --- sampling with resume: finished generations are appended to a partial file chunk by chunk ---

def row_sha256(r: dict) -> str:
    """The sha256 a partial row carries of itself: a row damaged on disk (a flipped byte in its completion, still
    valid JSON) no longer matches and is generated again, never graded (lib/runs.py's integrity.json, per row)."""
    return sha256_bytes(json.dumps({k: v for k, v in r.items() if k != "row_sha256"}, sort_keys=True,
                                   ensure_ascii=False).encode())


def load_partial(path: Path, cfg_sha: str) -> dict:
    done, damaged = {}, 0
    if path.exists():
        for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                damaged += 1
                continue  # a torn last line from a killed run: that sample is simply redone
            if not isinstance(r, dict) or r.get("row_sha256") != row_sha256(r):
                damaged += 1
                continue  # damaged on disk, or written before rows carried their sha256: redone
            del r["row_sha256"]
            if r.get("config_sha256") == cfg_sha:
                done[(r["problem_id"], r["seed"])] = r
    if damaged:
        print(f"[04_eval] {path}: {damaged} row(s) torn, damaged or unverifiable: generated again")
    return done


def generate(plan: Plan, engine, tokenizer, prompts: list[list[int]], chunk: int = 256) -> list[dict]:
    from lib.sample.engine import sample
    proto = registry.PROTOCOLS[plan.protocol]
    cfg_sha = config_sha256(plan.config)
    partial = plan.out / PARTIAL
    done = load_partial(partial, cfg_sha)
    todo = [(i, s) for i in range(len(plan.rows)) for s in range(proto.n) if (plan.rows[i]["id"], s) not in done]
    if done:
        print(f"[04_eval] {plan.alias}/{plan.benchmark}/{plan.protocol}: resuming, "
              f"{len(done)} samples already generated")
    plan.out.mkdir(parents=True, exist_ok=True)
    if partial.exists() and not partial.read_bytes().endswith(b"\n") and partial.stat().st_size:
        with open(partial, "ab") as f:             # a torn last line: end it, so the next row starts a line of its own
            f.write(b"\n")
    with open(partial, "a", encoding="utf-8") as f:
        for c in range(0, len(todo), chunk):
            part = todo[c:c + chunk]
            outs = sample(engine, [prompts[i] for i, _ in part],
                          [stable_seed(plan.rows[i]["id"], s) for i, s in part],
                          temperature=proto.temperature, top_p=proto.top_p, max_new_tokens=plan.max_new_tokens,
                          progress=f"sample {plan.alias} {plan.benchmark} [{c + len(part)}/{len(todo)}]")
            for (i, s), o in zip(part, outs):
                r = {"config_sha256": cfg_sha, "problem_id": plan.rows[i]["id"], "seed": s, "completion": o.text,
                     "n_tokens": len(o.token_ids), "truncated": o.finish_reason == "length"}
                done[(r["problem_id"], s)] = r
                f.write(json.dumps(r | {"row_sha256": row_sha256(r)}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return [done[(r["id"], s)] for r in plan.rows for s in range(proto.n)]


# --- grading and the unit's files ---

def grade_and_write(plan: Plan, tokenizer, gens: list[dict], gate: dict, *, args: dict, started: str, t0: float,
                    grade_timeout: float, gpu_s_per_s: float) -> Path:
    from lib.eval.grading import grade_many
    gold = {r["id"]: r["answer"] for r in plan.rows}
    grades = grade_many([(g["completion"], gold[g["problem_id"]]) for g in gens], timeout_s=grade_timeout,
                        progress=f"grade {plan.alias} {plan.benchmark}")
    samples = sample_rows(plan, gens, grades)
    proto = registry.PROTOCOLS[plan.protocol]

    rendered = render_chat(tokenizer, dapo_prompt(plan.rows[0]["problem"]), **plan.chat_kwargs)
    header = assistant_header(tokenizer, **plan.chat_kwargs)
    if not rendered.endswith(header):
        raise SystemExit(f"{plan.alias}: the rendered prompt does not end with the assistant header {header!r}")
    scores = summarize(samples) | {
        "alias": plan.alias, "benchmark": plan.benchmark, "protocol": plan.protocol,
        "n_samples_per_problem": proto.n, "seeds": list(range(proto.n)), "max_new_tokens": plan.max_new_tokens,
        "deviations": plan.deviations, "config": plan.config, "config_sha256": config_sha256(plan.config),
        "context_gate": gate, "grading": grading_summary(samples, grades, grade_timeout),
        "provenance": {"model": plan.config["model"] | {"path": str(plan.model.path), "sealed_by": plan.sealed_by},
                       "benchmark_source": plan.bench_src, "benchmark_sha256": plan.config["benchmark_sha256"],
                       "chat_template_sha256": sha256_bytes((tokenizer.chat_template or "").encode()),
                       "rendered_tail_example": rendered[-64:],
                       "rendered_example": rendered,          # the first problem's prompt, as the model read it
                       "generation": {k: plan.config[k] for k in ("n", "temperature", "top_p", "max_new_tokens",
                                                                   "backend", "dtype")},
                       "code": code_hashes(__file__)}}
    wall = time.monotonic() - t0
    write_unit(plan, samples, scores, script=__file__, args=args, started=started, wall_s=wall,
               gpu_s=wall * gpu_s_per_s, driver=Path(__file__).name)
    (plan.out / PARTIAL).unlink(missing_ok=True)
    ci, g = scores["accuracy_ci95"], scores["grading"]
    print(f"[04_eval] {plan.alias} {plan.benchmark} {plan.protocol}: accuracy {scores['accuracy']:.2f}% "
          f"[{ci[0]:.2f}, {ci[1]:.2f}]  truncated {100 * scores['truncation_rate']:.1f}%  "
          f"mean tokens {scores['mean_tokens']:.0f}  grading timeouts {g['n_timeouts']}  → {plan.out}")
    return plan.out


# --- the engine: lib.sample.engine.load_engine, with this plan's dtype and context ---

def plan_tokenizer(plan: Plan):
    """The model's tokenizer, after checking that no problem holds the text of one of its added tokens (`<|im_end|>`,
    `<tool_call>`, `<think>`): the tokenizer would read it as that token's id and forge a turn of the prompt. Refused
    in one line naming the row and the token, before the model is loaded (DESIGN.md §3)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(plan.model.path)
    for r in plan.rows:
        if (found := special_text(tokenizer, r["problem"])) is not None:
            raise UserError(f"{plan.bench_src} (id={r['id']!r}): problem holds the text {found!r}, which "
                            f"{plan.alias}'s tokenizer reads as a special token (a forged turn in the prompt); remove "
                            f"or rewrite it in the row")
    return tokenizer


def open_engine_for(plan: Plan, backend: str, dtype: str, batch_size: int, gpu_memory_utilization: float = 0.85,
                    tokenizer=None):
    """(engine, tokenizer, GPU count) for a plan's model."""
    import torch
    from transformers import AutoTokenizer
    from lib.sample.engine import load_engine
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(plan.model.path)
    cuda = torch.cuda.is_available()
    dt = {"auto": torch.bfloat16 if cuda else torch.float32,
          "float32": torch.float32,
          "bfloat16": torch.bfloat16}[dtype]
    if backend == "vllm":
        limit = json.loads((plan.model.path / "config.json").read_text()).get("max_position_embeddings", 32_768)
        # logprob_every=0: grading never reads the log-probs, and they slow vLLM (lib/sample/vllm_engine.py)
        engine = load_engine("vllm", str(plan.model.path), tokenizer, dtype=str(dt).removeprefix("torch."),
                             max_model_len=limit, gpu_memory_utilization=gpu_memory_utilization, logprob_every=0)
    else:
        engine = load_engine("hf", plan.model.path, tokenizer, batch_size=batch_size, dtype=dt)
    return engine, tokenizer, (1 if cuda else 0)


def main(argv=None):
    args = parse_args(argv)
    if args.pair is not None:
        pairs.from_args(args)                             # declares the pair file's models and benchmarks
    model = models.with_revision(args.model, args.revision)
    plan = plan_unit(args.run_dir, model, args.benchmark, args.protocol, alias=args.alias,
                     limit_problems=args.limit_problems, max_new_tokens=args.max_new_tokens, backend=args.backend,
                     dtype=args.dtype, grade_timeout=args.grade_timeout)   # a tampered checkpoint is refused here
    if existing_state(plan, args.skip_if_exists) == "done":
        print(f"[04_eval] {plan.out} exists with the same config and verified hashes: skipped (--skip-if-exists)")
        return plan.out
    tok = plan_tokenizer(plan)                            # a problem holding a special token's text: refused here
    prompts = [prompt_ids(tok, r["problem"], **plan.chat_kwargs) for r in plan.rows]
    gate = context_gate(plan, prompts)                    # config.json only: refused before any weights load
    engine, tok, n_gpu = open_engine_for(plan, args.backend, args.dtype, args.sample_batch, args.gpu_memory_utilization,
                                         tok)
    started, t0 = wall_clock()
    gens = generate(plan, engine, tok, prompts)
    return grade_and_write(plan, tok, gens, gate, args=vars(args), started=started, t0=t0,
                           grade_timeout=args.grade_timeout, gpu_s_per_s=n_gpu)


if __name__ == "__main__":
    try:
        main()
    except ArtifactError as e:                            # a refusal: one line naming the file and the fix
        raise SystemExit(f"04_eval: {e}")
