"""04_eval.py — one model × one benchmark × one protocol → one eval unit (SPEC §4–5).

Samples every problem of a benchmark under a protocol (seeds 0..n-1, the protocol's temperature and top-p), with the
model's OWN chat template and the DAPO prompt, grades each sample with lib.grading (last `Answer:` line, else last
`\\boxed{}`), and writes the unit:

    <run-dir>/evals/<alias>/<benchmark>/<protocol>/samples.jsonl   one row per sample
                                                  /scores.json     accuracy ± CI, truncation, provenance, deviations
                                                  /manifest.json   sha256 of both, code, args, times

Probes and reduced runs (`--limit-problems N`, evenly spaced; `--max-new-tokens M` other than the model's cap) get an
alias suffix (`_subN`, `_capM`) and a `deviations` list, so they can never pass for canonical units. A killed run
resumes from `generations.partial.jsonl`; `--skip-if-exists` returns a finished unit untouched (after checking its
hashes); a unit is never overwritten by a different configuration.

CPU (toy):  python 04_eval.py --run-dir runs/toy --model toy-pre --benchmark toy --protocol sample4
GPU:        python 04_eval.py --run-dir runs/openthinker --model openthinker3-1.5b --benchmark aime24 \\
                --protocol sample32 --backend vllm
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
from lib import registry
from lib.artifacts import (ArtifactError, atomic_write_json, atomic_write_jsonl, code_hashes, read_json,
                           sha256_bytes, sha256_file, verify_dir, wall_clock, write_manifest)
from lib.data import assistant_header, evenly_spaced, prompt_ids, render_chat, dapo_prompt, stable_seed
from lib.campaign import check_unit
from lib.units import SAMPLES, SCORES, config_sha256, summarize, unit_dir

PARTIAL = "generations.partial.jsonl"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="campaign directory (runs/<name>)")
    p.add_argument("--model", required=True, help="registry alias, or a model / checkpoint folder")
    p.add_argument("--alias", default=None, help="unit alias (default: the registry alias, or <run>-step<N> for a checkpoint)")
    p.add_argument("--benchmark", required=True, help=f"one of {sorted(registry.BENCHMARKS)} or a jsonl/parquet path")
    p.add_argument("--protocol", required=True, choices=sorted(registry.PROTOCOLS), help="sampling protocol (SPEC §5)")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="sampling backend")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate() call (hf backend)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the model's cap (recorded as a deviation)")
    p.add_argument("--limit-problems", type=int, default=None, help="probe: the N evenly spaced problems (a deviation)")
    p.add_argument("--skip-if-exists", action="store_true", help="leave a finished unit with the same config untouched")
    p.add_argument("--grade-timeout", type=float, default=5.0, help="wall-clock bound per graded sample, seconds")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM's share of GPU memory")
    return p.parse_args(argv)


# --- planning: everything that decides the unit's identity, before any model is loaded ---

@dataclass
class Plan:
    alias: str
    benchmark: str
    protocol: str
    out: Path
    model: registry.Resolved
    spec: registry.Model
    rows: list
    bench_src: str
    max_new_tokens: int
    deviations: list
    config: dict
    chat_kwargs: dict = field(default_factory=dict)


def plan_unit(run_dir, model_name, benchmark, protocol, *, alias=None, limit_problems=None, max_new_tokens=None,
              backend="hf", dtype="auto") -> Plan:
    model = registry.resolve_model(model_name, run_dir)
    ckpt_file = model.path / "checkpoint.json"
    ckpt = read_json(ckpt_file) if ckpt_file.exists() else {}
    # a checkpoint is evaluated under its initial student's registry entry (cap, template kwargs)
    spec = registry.model_spec(ckpt.get("student_init") or model_name, run_dir)
    if alias is None:
        alias = f"{ckpt['run']}-step{ckpt['step']}" if ckpt else model.alias
    model.extra.update({k: ckpt.get(k) for k in ("run", "step", "student_init")})

    rows, src = registry.load_benchmark(benchmark)
    bench_name = benchmark if benchmark in registry.BENCHMARKS else Path(benchmark).stem
    deviations = []
    if limit_problems is not None and limit_problems < len(rows):
        deviations.append(f"limit-problems: {limit_problems} of {len(rows)} problems, evenly spaced")
        alias += f"_sub{limit_problems}"
        rows = evenly_spaced(rows, limit_problems)
    cap = spec.eval_max_new_tokens
    if max_new_tokens is not None and max_new_tokens != cap:
        deviations.append(f"max-new-tokens: {max_new_tokens} instead of the model's {cap}")
        alias += f"_cap{max_new_tokens}"
        cap = max_new_tokens
    proto = registry.PROTOCOLS[protocol]
    bench_sha = sha256_file(src) if Path(src).exists() else src
    identity = {k: v for k, v in model.provenance().items() if k != "path"}  # a path is not an identity
    config = {"model": identity | {"train_run": ckpt.get("run"), "train_step": ckpt.get("step"),
                                             "student_init": ckpt.get("student_init")},
              "benchmark": bench_name, "benchmark_sha256": bench_sha, "problem_ids": [r["id"] for r in rows],
              "protocol": protocol, "n": proto.n, "temperature": proto.temperature, "top_p": proto.top_p,
              "max_new_tokens": cap, "backend": backend, "dtype": dtype}
    chat_kwargs = {"enable_thinking": True} if spec.thinking else {}
    return Plan(alias, bench_name, protocol, unit_dir(run_dir, alias, bench_name, protocol), model, spec, rows, src,
                cap, deviations, config, chat_kwargs)


def existing_state(plan: Plan, skip_if_exists: bool) -> str:
    """'done' (finished, same config, hashes verified), 'fresh' (nothing there), or refuse a different config."""
    if not (plan.out / "manifest.json").exists():
        return "fresh"
    try:
        old = read_json(plan.out / SCORES)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{plan.out / SCORES} is unreadable ({e}); delete {plan.out} and re-run") from e
    if old.get("config_sha256") != config_sha256(plan.config):
        raise ArtifactError(f"{plan.out} holds a unit with a different configuration (config sha256 "
                            f"{old.get('config_sha256', '?')[:12]}… vs {config_sha256(plan.config)[:12]}…); refusing to "
                            f"overwrite it. Use another --alias or --run-dir, or delete that folder on purpose.")
    if skip_if_exists:
        verify_dir(plan.out, [SAMPLES, SCORES])  # a corrupted unit is refused, never silently reused
    return "done" if skip_if_exists else "fresh"


# --- the context gate (SPEC §4): longest rendered prompt + cap must fit the model's positions ---

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

def load_partial(path: Path, cfg_sha: str) -> dict:
    done = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a killed run: that sample is simply redone
            if r.get("config_sha256") == cfg_sha:
                done[(r["problem_id"], r["seed"])] = r
    return done


def generate(plan: Plan, engine, tokenizer, prompts: list[list[int]], chunk: int = 256) -> list[dict]:
    from lib.sampling import sample
    proto = registry.PROTOCOLS[plan.protocol]
    cfg_sha = config_sha256(plan.config)
    partial = plan.out / PARTIAL
    done = load_partial(partial, cfg_sha)
    todo = [(i, s) for i in range(len(plan.rows)) for s in range(proto.n) if (plan.rows[i]["id"], s) not in done]
    if done:
        print(f"[04_eval] {plan.alias}/{plan.benchmark}/{plan.protocol}: resuming, {len(done)} samples already generated")
    plan.out.mkdir(parents=True, exist_ok=True)
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
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
    return [done[(r["id"], s)] for r in plan.rows for s in range(proto.n)]


# --- one unit, end to end ---

def run_unit(plan: Plan, engine, tokenizer, *, script=__file__, args: dict | None = None,
             grade_timeout: float = 5.0, gpu_s_per_s: float = 0.0) -> Path:
    from lib.grading import grade_many
    started, t0 = wall_clock()
    prompts = [prompt_ids(tokenizer, r["problem"], **plan.chat_kwargs) for r in plan.rows]
    gate = context_gate(plan, prompts)
    gens = generate(plan, engine, tokenizer, prompts)

    gold = {r["id"]: r["answer"] for r in plan.rows}
    level = {r["id"]: r.get("level") for r in plan.rows}
    grades = grade_many([(g["completion"], gold[g["problem_id"]]) for g in gens], timeout_s=grade_timeout,
                        progress=f"grade {plan.alias} {plan.benchmark}")
    samples = []
    for g, gr in zip(gens, grades):
        d = gr.as_dict()
        samples.append({"problem_id": g["problem_id"], "seed": g["seed"], "pass": g["seed"],
                        "completion": g["completion"], "n_tokens": g["n_tokens"], "truncated": g["truncated"],
                        "extractor": d["extractor"], "extracted": d["extracted"], "correct": bool(d["correct"]),
                        "verify_method": d["verify_method"], "grade_reason": d.get("reason"),
                        "level": level[g["problem_id"]]})
    proto = registry.PROTOCOLS[plan.protocol]

    rendered = render_chat(tokenizer, dapo_prompt(plan.rows[0]["problem"]), **plan.chat_kwargs)
    header = assistant_header(tokenizer, **plan.chat_kwargs)
    if not rendered.endswith(header):
        raise SystemExit(f"{plan.alias}: the rendered prompt does not end with the assistant header {header!r}")
    scores = summarize(samples) | {
        "alias": plan.alias, "benchmark": plan.benchmark, "protocol": plan.protocol,
        "n_samples_per_problem": proto.n, "seeds": list(range(proto.n)), "max_new_tokens": plan.max_new_tokens,
        "deviations": plan.deviations, "config": plan.config, "config_sha256": config_sha256(plan.config),
        "context_gate": gate,
        "provenance": {"model": plan.config["model"] | {"path": str(plan.model.path)}, "benchmark_source": plan.bench_src,
                       "benchmark_sha256": plan.config["benchmark_sha256"],
                       "chat_template_sha256": sha256_bytes((tokenizer.chat_template or "").encode()),
                       "rendered_tail_example": rendered[-64:],
                       "generation": {k: plan.config[k] for k in ("n", "temperature", "top_p", "max_new_tokens",
                                                                   "backend", "dtype")},
                       "code": code_hashes(__file__)}}
    check_unit(str(plan.out), scores, samples)          # one row per (problem, seed), every problem present
    atomic_write_jsonl(plan.out / SAMPLES, samples)
    atomic_write_json(plan.out / SCORES, scores)
    wall = time.monotonic() - t0
    inputs = {"benchmark": plan.bench_src} if Path(plan.bench_src).exists() else {}
    write_manifest(plan.out, stage="04_eval", script=__file__, args=args or {}, inputs=inputs,
                   outputs=[SAMPLES, SCORES], started=started, wall_s=wall, gpu_s=wall * gpu_s_per_s,
                   extra={"unit": [plan.alias, plan.benchmark, plan.protocol], "driver": Path(script).name})
    (plan.out / PARTIAL).unlink(missing_ok=True)
    ci = scores["accuracy_ci95"]
    print(f"[04_eval] {plan.alias} {plan.benchmark} {plan.protocol}: accuracy {scores['accuracy']:.2f}% "
          f"[{ci[0]:.2f}, {ci[1]:.2f}]  truncated {100 * scores['truncation_rate']:.1f}%  "
          f"mean tokens {scores['mean_tokens']:.0f}  → {plan.out}")
    return plan.out


def load_engine(plan: Plan, backend: str, dtype: str, batch_size: int, gpu_memory_utilization: float = 0.85):
    """(engine, tokenizer, GPU count) for a plan's model: the only place 04_eval and 02_baselines load weights."""
    import torch
    from transformers import AutoTokenizer
    from lib import sampling
    tokenizer = AutoTokenizer.from_pretrained(plan.model.path)
    cuda = torch.cuda.is_available()
    dt = {"auto": torch.bfloat16 if cuda else torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    if backend == "vllm":
        engine = sampling.VLLMEngine(str(plan.model.path), dtype=str(dt).removeprefix("torch."),
                                     max_model_len=context_limit(plan), gpu_memory_utilization=gpu_memory_utilization)
    else:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(plan.model.path, dtype=dt).to("cuda" if cuda else "cpu").eval()
        engine = sampling.HFEngine(model, tokenizer, batch_size=batch_size)
    return engine, tokenizer, (1 if cuda else 0)


def context_limit(plan: Plan) -> int:
    return json.loads((plan.model.path / "config.json").read_text()).get("max_position_embeddings", 32_768)


def main(argv=None):
    args = parse_args(argv)
    plan = plan_unit(args.run_dir, args.model, args.benchmark, args.protocol, alias=args.alias,
                     limit_problems=args.limit_problems, max_new_tokens=args.max_new_tokens, backend=args.backend,
                     dtype=args.dtype)
    if existing_state(plan, args.skip_if_exists) == "done":
        print(f"[04_eval] {plan.out} exists with the same config and verified hashes: skipped (--skip-if-exists)")
        return plan.out
    engine, tok, n_gpu = load_engine(plan, args.backend, args.dtype, args.batch_size, args.gpu_memory_utilization)
    return run_unit(plan, engine, tok, args=vars(args), grade_timeout=args.grade_timeout, gpu_s_per_s=n_gpu)


if __name__ == "__main__":
    main()
