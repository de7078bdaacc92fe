"""07_raft.py — the RAFT teacher (DESIGN.md §9): rejection sampling of π_pre on its own verified samples, then SFT.

The campaign's mechanism experiment: a post-teacher that differs from π_pre only by π_pre's own correct samples is
an on-support shift (π_post ≈ π_pre wherever π_pre is right), the pair with which Direct-OPD stayed stable.

Stage 1 `sample`  k samples per training prompt from π_pre (seeds 0..k-1 through lib.data.stable_seed, exactly the
                  eval protocol's draws; T 0.7, top_p 0.95, π_pre's eval token cap), graded by lib.eval.grading; the
                  first sample in seed order that is correct and stopped is kept. Prompts go in round-robin chunks
                  (prompt i → chunk i % 4, chunk 0 first), appended per batch with fsync: a partial run is a stratified
                  sample and a killed run (or one stopped by --time-limit) resumes. Statistics and gate G1 (≥ --g1-min).
Stage 2 `sft`     SFT of π_pre on the kept (prompt ids under π_pre's template + the kept completion ids, stop token
                  included), loss on the completion only — every example's mask is verified by decoding. 95/5
                  train/val split, AdamW lr 1e-5 cosine to 0 after 5 % warmup, 2 epochs, global batch 64 (token-mean
                  over the global batch), fp32 master weights under bf16 autocast, FSDP2 (lib.train.dist, the code of
                  03_opd_train; a plain `python` run is a group of one). Val loss at 0/25/50/75/100 % and a merged
                  HF checkpoint at each of 25/50/75/100 %: config and tokenizer files byte-identical to π_pre's, a
                  tied lm_head not written. `raft/model` = the 100 % checkpoint (hard links).
Stage 3 `probe`   on the held-out 5 %: the shift sanity (mean |log p_raft − log p_pre| per completion token) and the
                  EOS probe (mean log p of the stop token at the true end, π_pre vs RAFT), both through
                  lib.train.scoring; the weight change; and the shift anatomy of the RAFT pair (lib/gates/anatomy.py,
                  01_gates' driver: the student samples, π_pre and RAFT score) → raft/anatomy/.

Reads:  the pair's π_pre and training prompts (lib/registry.py). Writes <run-dir>/raft/:
    samples/chunk_{0..3}.jsonl, samples/config.json   one row per prompt: its k graded samples, the kept seed
    kept.jsonl, stage1.json                           the kept samples (prompt ids + completion ids) and stage 1 stats
    sft.json, sft_metrics.jsonl, ckpt_{025,050,075,100}/, model/      the SFT (model/ is what `raft` resolves to)
    probe.json, anatomy/                              stage 3
    stats.json, manifest.json                         what 05_stats / 06_report read (keys: see 06_report.py)

A stage whose outputs exist with the same settings is skipped; different settings are refused.

CPU (toy):   python 07_raft.py --run-dir runs/toy --pair toy-raft --g1-min 500 --lr 3e-4 --micro-batch 16 --no-bf16
             (the toy RAFT is of the toy student, fp32: bf16 autocast is emulated on the pinned CPU path, DESIGN.md §9)
GPU:         python 07_raft.py --run-dir runs/raft --pair raft --stage sample --backend vllm
             python 07_raft.py --run-dir runs/raft --pair raft --stage sft --nproc 4 --activation-checkpointing
             python 07_raft.py --run-dir runs/raft --pair raft --stage probe
             (or `torchrun --nproc-per-node 4 07_raft.py --stage sft …`; sampling and the probe run in one process)
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
import torch

from lib import benchmarks, models, pairs, registry, runs
from lib.artifacts import (atomic_write_json, atomic_write_jsonl, read_json, read_jsonl, read_manifest, sha256_bytes,
                           sha256_file, verify_dir, wall_clock, write_manifest)
from lib.cli import (ArgumentParser, HelpFormatter, fraction, nonnegative_float, nonnegative_int, open_fraction,
                     positive_float, positive_int)
from lib.data import assistant_header, evenly_spaced, prompt_ids, refuse_special_text, stable_seed
from lib.gates import anatomy as lib_anatomy     # the shift anatomy of 01_gates, one driver for both stages
from lib.train import raft, sft_fsdp
from lib.train.sft import ADAM_BETAS, batch_plan, completion_labels
EVAL = registry.PROTOCOLS["sample4"]
T_START = time.monotonic()         # --time-limit counts from here: the process start


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    a = p.add_argument
    a("--run-dir", required=True, help="campaign directory; outputs go to <run-dir>/raft/")
    pairs.add_arguments(a, teachers=False)          # whose π_pre and training prompts (toy, toy-raft, raft, a file …)
    a("--train-data", default=None, help="training prompts with gold answers: a registry benchmark or a jsonl/parquet "
                                         "path (default: the pair's); rows without a gold answer are skipped and "
                                         "counted")
    a("--stage", default="all", choices=["sample", "sft", "probe", "all"], help="which stage(s) to run")
    a("--targets", default="samples", choices=["samples", "gold"],
      help="what the SFT learns: `samples`, RAFT (π_pre's own verified samples, DESIGN.md §9); `gold`, a corpus-SFT "
           "teacher instead, whose completion of each row is its gold answer line `Answer: <gold>` (for a π_pre that "
           "almost never states a graded answer, as SmolLM2-135M: the smol recipe)")
    # stage 1
    a("--k", type=positive_int, default=4, help="samples per prompt, seeds 0..k-1 (DESIGN.md §9: 4)")
    a("--temperature", type=positive_float, default=EVAL.temperature, help="sampling temperature (the eval protocol's)")
    a("--top-p", type=fraction, default=EVAL.top_p, help="sampling top-p (the eval protocol's)")
    a("--max-new-tokens", type=positive_int, default=None, help="token cap (default: π_pre's registry eval cap)")
    a("--limit-prompts", type=positive_int, default=None,
      help="only the N evenly spaced training prompts (a smaller run)")
    a("--chunks", type=positive_int, default=4, help="round-robin chunks: prompt i goes to chunk i %% chunks")
    a("--batch-prompts", type=positive_int, default=64,
      help="prompts per sampling batch (each batch is appended + fsynced)")
    a("--backend", default="hf", choices=["hf", "vllm"], help="sampling backend (lib/sample/engine.py)")
    a("--sample-batch", type=positive_int, default=64, help="sequences per generate() call (hf backend)")
    a("--gpu-memory-utilization", type=fraction, default=0.85, help="vLLM's share of GPU memory")
    a("--grade-timeout", type=positive_float, default=5.0, help="wall-clock bound per graded sample, seconds")
    a("--time-limit", type=positive_float, default=None,
      help="wall-clock budget in seconds for stage 1: stop after an appended "
           "batch when the next one is predicted not to fit (a rerun "
           "continues); the SFT and the probe, once started, run to the end")
    a("--g1-min", type=nonnegative_int, default=2000,
      help="gate G1: at least this many kept samples (DESIGN.md §9: 2,000)")
    a("--allow-g1-fail", action="store_true", help="run the SFT even if gate G1 failed (recorded)")
    # stage 2
    a("--val-frac", type=open_fraction, default=0.05, help="held-out fraction of the kept samples (DESIGN.md §9: 5 %%)")
    a("--lr", type=positive_float, default=1e-5, help="peak AdamW learning rate (DESIGN.md §9: 1e-5)")
    a("--warmup-frac", type=open_fraction, default=0.05, help="linear warmup, fraction of the optimizer steps")
    a("--schedule", default="cosine", choices=["cosine", "linear", "constant"], help="lr decay after warmup (to 0)")
    a("--epochs", type=positive_int, default=2, help="passes over the training split")
    a("--batch-size", type=positive_int, default=64, help="global batch: examples per optimizer step")
    a("--micro-batch", type=positive_int, default=2, help="examples per forward/backward on each process")
    a("--weight-decay", type=nonnegative_float, default=0.0, help="AdamW weight decay")
    a("--grad-clip", type=positive_float, default=1.0, help="max global grad norm")
    a("--no-bf16", dest="bf16", action="store_false",
      help="fp32 compute instead of bf16 autocast (fp32 master either way)")
    a("--activation-checkpointing", action="store_true", help="recompute decoder layers in backward")
    a("--seed", type=nonnegative_int, default=42, help="train/val split and batch order")
    a("--nproc", type=positive_int, default=1, help="run the SFT on this many local processes through torchrun")
    # stage 3
    a("--probe-batch", type=positive_int, default=8, help="sequences per scoring forward in the probe")
    a("--anatomy-prompts", type=nonnegative_int, default=64,
      help="prompts of the RAFT pair's shift anatomy (0: skip it)")
    a("--anatomy-bootstrap", type=positive_int, default=10_000, help="bootstrap resamples of the anatomy's AUROC CI")
    return p.parse_args(argv)


def log(msg: str):
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def refuse_changed(path: Path, config: dict, what: str):
    """A stage's recorded settings must match this run's: never mix two configurations in one raft/ folder."""
    if path.exists() and (old := read_json(path)) != config:
        diff = sorted(k for k in config.keys() | old.keys() if config.get(k) != old.get(k))
        sys.exit(f"{path} records {what} with other settings (differing: {diff}); use another --run-dir, or delete "
                 f"{path.parent if what == 'samples' else path} on purpose to redo it")


def fmt_pct(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {'—' if v is None else f'{v:.1f}'}" for k, v in d.items()) + "}"


def check_context(model_path: Path, longest_prompt: int, cap: int) -> None:
    """The longest rendered prompt plus the sampling cap must fit π_pre's positions (read from config.json, before
    the weights load): a longer sample would be cut by the model, not by the cap."""
    limit = read_json(Path(model_path) / "config.json").get("max_position_embeddings")
    if limit is not None and longest_prompt + cap > limit:
        sys.exit(f"[07] context: longest prompt {longest_prompt} tokens + cap {cap} = {longest_prompt + cap} > π_pre's "
                 f"max_position_embeddings {limit}; lower --max-new-tokens")


def split_gold(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(rows with a gradable gold answer, ids of those without one): RAFT keeps only verified samples, so a row
    with no gold (null, empty or blank) cannot be used; it is skipped, counted and listed in stage1.json."""
    keep = [r for r in rows if r.get("answer") is not None and str(r["answer"]).strip()]
    return keep, [r["id"] for r in rows if r not in keep]


def chat_kwargs(alias: str) -> dict:
    """Template kwargs of a registry model (Qwen3: thinking mode)."""
    return {"enable_thinking": True} if models.model_spec(alias).thinking else {}


# --- stage 1: rejection sampling ---

def gold_targets(tok, stop: list[int], prompts: list[list[int]], rows: list[dict]) -> list[dict]:
    """`--targets gold`: each row's one "sample" is its gold answer line and π_pre's stop token, recorded as a kept,
    correct sample (verify_method `gold`), so that stage 1's statistics, kept.jsonl and the SFT read it unchanged.
    Not RAFT: the teacher's shift is then off-support (a format and a length), like a corpus-SFT teacher's."""
    eos = tok.eos_token_id if tok.eos_token_id in stop else min(stop)
    done = []
    for i, r in enumerate(rows):
        text = f"Answer: {r['answer']}"
        ids = tok(text, add_special_tokens=False)["input_ids"] + [eos]
        sample = {"seed": 0, "completion": text, "n_tokens": len(ids), "finish_reason": "stop",
                  "extractor": "answer_line", "extracted": r["answer"], "correct": True, "verify_method": "gold",
                  "grade_reason": None, "rejection": None}
        done.append({"i": i, "id": r["id"], "level": r.get("level"), "samples": [sample], "n_correct": 1,
                     "kept_seed": 0, "prompt_ids": prompts[i], "completion_ids": ids})
    return done


def stage_sample(args, out, base, pre, tok, rows, skipped):
    cap = args.max_new_tokens or models.model_spec(base).eval_max_new_tokens
    config = {"base": base, "model": {k: v for k, v in pre.provenance().items() if k != "path"},
              "train_data": args.train_data, "problem_ids_sha256":
              sha256_bytes("\n".join(r["id"] for r in rows).encode()), "n_prompts": len(rows), "k": args.k,
              "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": cap, "chunks": args.chunks,
              "backend": args.backend, "seeds": "lib.data.stable_seed(problem id, s), s = 0..k-1"}
    if args.targets == "gold":                   # (left out for RAFT, so that earlier RAFT samples keep their identity)
        config["targets"] = "gold"
    refuse_changed(out / "samples" / "config.json", config, "samples")
    if (out / "stage1.json").exists():
        verify_dir(out, ["stage1.json", "kept.jsonl"])
        log(f"[07] stage 1 done earlier ({read_json(out / 'stage1.json')['kept']} kept): skipped")
        return
    atomic_write_json(out / "samples" / "config.json", config)
    from lib.eval.grading import grade_many
    from lib.sample.engine import load_engine, sample
    kw = chat_kwargs(base)
    refuse_special_text(tok, rows, "the RAFT training prompts")
    prompts = [prompt_ids(tok, r["problem"], **kw) for r in rows]
    check_context(pre.path, max(map(len, prompts)), cap)          # config.json only: before any weights are read
    if args.targets == "gold":
        from lib.sample.engine import stop_ids
        done = gold_targets(tok, stop_ids(tok, pre.path), prompts, rows)
        return write_stage1(args, out, base, cap, config, done, skipped, k=1)
    engine = None

    def draw(batch):   # one row per prompt: its k graded samples and which one is kept
        nonlocal engine
        if engine is None:
            cuda = torch.cuda.is_available()
            dt = torch.bfloat16 if cuda else torch.float32
            engine = (load_engine("vllm", str(pre.path), tok, dtype=str(dt).removeprefix("torch."),
                                  max_model_len=max(map(len, prompts)) + cap,
                                  gpu_memory_utilization=args.gpu_memory_utilization, logprob_every=0)
                      if args.backend == "vllm" else load_engine("hf", pre.path, tok, batch_size=args.sample_batch,
                                                                  dtype=dt))
        reqs = [(it["i"], s) for it in batch for s in range(args.k)]
        outs = sample(engine, [prompts[i] for i, _ in reqs], [stable_seed(rows[i]["id"], s) for i, s in reqs],
                      temperature=args.temperature, top_p=args.top_p, max_new_tokens=cap,
                      progress=f"raft: sampling {len(batch)} prompts × {args.k}")
        grades = grade_many([(o.text, rows[i]["answer"]) for (i, _), o in zip(reqs, outs)],
                            timeout_s=args.grade_timeout, progress=False)
        new = []
        for b, it in enumerate(batch):
            i, samples = it["i"], []
            for s in range(args.k):
                o, g = outs[b * args.k + s], grades[b * args.k + s]
                samples.append({"seed": s, "completion": o.text, "n_tokens": len(o.token_ids),
                                "finish_reason": o.finish_reason, "extractor": g.extractor, "extracted": g.extracted,
                                "correct": bool(g.correct), "verify_method": g.verify_method, "grade_reason": g.reason,
                                "rejection": raft.rejection(g.correct, g.extractor, g.reason, o.finish_reason)})
            j = raft.first_kept(samples)
            new.append({"i": i, "id": rows[i]["id"], "level": rows[i].get("level"), "samples": samples,
                        "n_correct": sum(x["correct"] for x in samples),
                        "kept_seed": None if j is None else samples[j]["seed"],
                        "prompt_ids": None if j is None else prompts[i],
                        "completion_ids": None if j is None else outs[b * args.k + j].token_ids})
        return new

    items = [{"i": i, "id": r["id"]} for i, r in enumerate(rows)]
    done = raft.rejection_sample(items, draw, out / "samples", n_chunks=args.chunks, batch_prompts=args.batch_prompts,
                                 log=log, budget=runs.Budget(args.time_limit, t0=T_START))
    if len(done) < len(items):
        log(f"[07] stopped for the time budget (--time-limit {args.time_limit:g}s): {len(done)} of {len(items)} "
            f"prompts sampled and on disk; rerun the same command to continue")
        return "time_limit"
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return write_stage1(args, out, base, cap, config, done, skipped, k=args.k)


def write_stage1(args, out, base, cap, config, done, skipped, k):
    stats = raft.stage1_stats(done, k, args.g1_min)
    kept = [{"i": r["i"], "id": r["id"], "level": r["level"], "seed": r["kept_seed"], "prompt_ids": r["prompt_ids"],
             "completion_ids": r["completion_ids"],
             "completion": next(s["completion"] for s in r["samples"] if s["seed"] == r["kept_seed"])}
            for r in done if r["kept_seed"] is not None]
    atomic_write_jsonl(out / "kept.jsonl", kept)
    atomic_write_json(out / "stage1.json", {**stats, "base": base, "max_new_tokens": cap, "config": config,
                                            "skipped_no_gold": {"n": len(skipped), "ids": skipped}})
    g1 = stats["gate_g1"]
    log(f"[07] stage 1: {stats['kept']} of {stats['n_prompts']} prompts kept ({stats['keep_rate_pct']:.1f} %), "
        f"by level {fmt_pct(stats['keep_rate_by_level_pct'])}; n-correct-of-{k} {stats['n_correct_of_k']}; "
        f"rejections {stats['rejection_reasons']}; truncation {stats['truncation_rate_pct']:.2f} %")
    log(f"[07] gate G1 (≥ {g1['threshold']} kept): {'PASS' if g1['pass'] else 'FAIL'} ({g1['kept']})")


# --- stage 2: SFT of π_pre on its kept samples ---

def sft_config(args, base, kept_sha) -> dict:
    keys = ("val_frac", "lr", "warmup_frac", "schedule", "epochs", "batch_size", "weight_decay", "grad_clip", "bf16",
            "seed")
    return {"base": base,
            "kept_sha256": kept_sha,
            "adam_betas": list(ADAM_BETAS),
            **{k: getattr(args, k) for k in keys}}


def stage_sft(args, out, base, pre, tok):
    from lib.sample.engine import stop_ids
    from lib.train import dist as D
    d = D.init()
    t0 = time.monotonic()
    verify_dir(out, ["kept.jsonl", "stage1.json"])
    stage1 = read_json(out / "stage1.json")
    config = sft_config(args, base, sha256_file(out / "kept.jsonl"))
    if (out / "sft.json").exists():
        if read_json(out / "sft.json")["config"] != config:
            sys.exit(f"{out / 'sft.json'} records an SFT with other settings; use another --run-dir, or delete "
                     f"{out}/sft.json and {out}/model on purpose to redo it")
        verify_dir(out, ["sft.json", "model/config.json"])
        log("[07] stage 2 done earlier: skipped")
        return
    if not stage1["gate_g1"]["pass"] and not args.allow_g1_fail:
        sys.exit(f"gate G1 failed: {stage1['kept']} kept < {stage1['gate_g1']['threshold']}; sample more prompts, "
                 f"or train anyway on purpose with --allow-g1-fail (recorded)")

    # examples: prompt ids + completion ids (stop token included), the mask checked by decoding on every one
    kept = read_jsonl(out / "kept.jsonl")
    header, stop = assistant_header(tok, **chat_kwargs(base)), set(stop_ids(tok, pre.path))
    examples, mask_check = [], None
    for r in kept:
        ids, labels = completion_labels(r["prompt_ids"], r["completion_ids"])
        check = raft.check_example(tok, ids, labels, len(r["prompt_ids"]), header, stop, name=f"kept sample {r['id']}")
        mask_check = mask_check or {"example_id": r["id"], **check}
        examples.append((ids, labels))
    train_idx, val_idx = raft.split(len(examples), args.val_frac, args.seed)
    plan = [[train_idx[i] for i in step]
            for step in batch_plan(len(train_idx), args.batch_size, args.epochs, args.seed)]
    total, warmup = len(plan), int(args.warmup_frac * len(plan))
    saves: dict[int, list[str]] = {}                 # step → checkpoint tags (a short run may put two on one step)
    for tag, step in raft.checkpoint_steps(total).items():
        saves.setdefault(step, []).append(tag)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    # model: fp32 master weights, FSDP2-sharded (a group of one on CPU), bf16 autocast for the compute
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(pre.path, dtype=torch.float32).to(d.device)
    tied = bool(model.config.tie_word_embeddings)
    D.shard(model, bf16=False, activation_checkpointing=args.activation_checkpointing)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=ADAM_BETAS, weight_decay=args.weight_decay)
    log(f"[07] SFT of {base} on {len(train_idx)} kept samples ({len(val_idx)} held out) | {d.world} process(es) on "
        f"{d.device.type} | {total} steps × {args.batch_size} ({args.epochs} epochs), warmup {warmup}, lr "
        f"{args.lr:g} {args.schedule} | {'bf16 autocast' if args.bf16 else 'fp32'} | mask verified on "
        f"{len(examples)} examples")

    metrics_f = out / "sft_metrics.jsonl"
    if d.main:
        metrics_f.unlink(missing_ok=True)

    def record(row):
        if d.main:
            with open(metrics_f, "a") as f:
                f.write(json.dumps(row) + "\n")

    def save(step, v, tags):                           # a merged HF checkpoint, hard-linked under every tag
        sd = D.full_state_dict(model)
        if d.main:
            first = out / f"ckpt_{tags[0]}"
            meta = {"base": base, "stage": "07_raft", "pair": args.pair, "step": step, "steps": total, "val_loss": v}
            # not checkpoint.json, which 04_eval reads as a training-run checkpoint: this model is evaluated as
            # the registry alias `raft`, under its base's settings (models.BASE_FILE)
            D.save_hf(sd, pre.path, first, D.config_dtype(pre.path), meta, meta_name=models.BASE_FILE)
            for tag in tags[1:]:
                raft.link_tree(first, out / f"ckpt_{tag}")

    res = sft_fsdp.train(model, optim, examples, train_idx, val_idx, plan, d, lr=args.lr, warmup=warmup,
                         schedule=args.schedule, grad_clip=args.grad_clip, micro_batch=args.micro_batch, bf16=args.bf16,
                         pad_id=pad_id, saves=saves, save=save, record=record, log=log)
    val_curve, train_curve = res["val_curve"], res["train_curve"]
    tokens_seen, max_gn = res["tokens_seen"], res["max_gn"]
    if d.main:
        raft.link_tree(out / "ckpt_100", out / "model")
        atomic_write_json(out / "sft.json", {
            "config": config,
            "n_train": len(train_idx),
            "n_val": len(val_idx),
            "val_ids": [kept[i]["id"] for i in val_idx],
            "steps": total,
            "warmup_steps": warmup,
            "checkpoints": raft.checkpoint_steps(total),
            "val_loss": val_curve,
            "train_loss": train_curve,
            "supervised_tokens": tokens_seen,
            "max_grad_norm": max_gn,
            "tied_embeddings": tied,
            "mask_check": {"n_checked": len(examples), **mask_check},
            "precision": "fp32 master weights, " + ("bf16 autocast" if args.bf16 else "fp32 compute"),
            "world_size": d.world,
            "device": d.device.type,
            "wall_s": time.monotonic() - t0})
        log(f"[07] SFT done: val loss {' → '.join(f'{v:.4f}' for _, v in val_curve)}; {out / 'model'}")
    D.finish()


# --- stage 3: shift sanity, EOS probe, weight change, shift anatomy ---

def stage_probe(args, out, base, pre, tok, lp):
    m = verify_dir(out, ["kept.jsonl", "sft.json"])
    verify_dir(out, [f for f in m["outputs"] if f.startswith("model/")])      # the weights the probe reads
    sft = read_json(out / "sft.json")
    val_ids = set(sft["val_ids"])
    seqs = [(r["prompt_ids"], r["completion_ids"]) for r in read_jsonl(out / "kept.jsonl") if r["id"] in val_ids]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    lp_pre = raft.token_logprobs(pre.path, seqs, pad_id, device, args.probe_batch)
    lp_raft = raft.token_logprobs(out / "model", seqs, pad_id, device, args.probe_batch)
    last = torch.zeros(len(lp_pre), dtype=torch.bool)
    last[torch.tensor([len(r) for _, r in seqs]).cumsum(0) - 1] = True          # each completion's stop token
    probe = raft.shift_probe(lp_pre.numpy(), lp_raft.numpy(), last.numpy())
    probe["weights"] = raft.weight_change(pre.path, out / "model")
    probe["dtype"] = "float32"
    s, e = probe["shift"], probe["eos_probe"]
    log(f"[07] shift sanity on {s['n_sequences']} held-out completions ({s['n_tokens']} tokens): mean |Δ log p| "
        f"{s['abs_mean']:.4f} per token (mean {s['mean']:+.4f}, p90 {s['abs_p90']:.4f}, max {s['abs_max']:.3f})")
    log(f"[07] EOS probe: mean log p(stop) at the true end: π_pre {e['pi_pre']:.4f}, RAFT {e['raft']:.4f} "
        f"(Δ {e['delta']:+.4f}); weights moved L2 {probe['weights']['l2']:.3f}")

    raft_pairs = [lp] if lp.pair.pi_post == "raft" else [
        pairs.load(n) for n, p in registry.PAIRS.items() if p.pi_post == "raft" and p.pi_pre == base]
    if args.anatomy_prompts and raft_pairs:
        probe["anatomy"] = anatomy(args, out, raft_pairs[0])
    elif args.anatomy_prompts:
        log(f"[07] no registered pair has π_pre {base} and π_post raft: shift anatomy skipped")
    atomic_write_json(out / "probe.json", probe)


def anatomy(args, out, lp) -> dict:
    """01_gates' shift anatomy of the RAFT pair (lib/gates/anatomy.py, the same driver): the pair's student samples the
    training prompts, π_pre and RAFT score its tokens. Written to raft/anatomy/; the headline numbers are returned."""
    pair, student, pair_name = lp.pair, lp.student, lp.name
    cfg = lib_anatomy.Settings(max_prompt_len=student.max_prompt_len, max_response_len=student.max_response_len,
                               prompts=args.anatomy_prompts, backend=args.backend, bootstrap=args.anatomy_bootstrap)
    roles = lib_anatomy.load_roles(pair, pair.student, args.run_dir)
    rows, _ = benchmarks.load_benchmark(pair.train_data, require_answer=False)
    (out / "anatomy").mkdir(parents=True, exist_ok=True)
    rep = lib_anatomy.run(roles, rows, cfg, out / "anatomy", pair_name)
    atomic_write_json(out / "anatomy" / "anatomy.json", {k: v for k, v in rep.items() if k != "table"})
    (out / "anatomy" / "anatomy.md").write_text(rep["table"] + "\n")
    log(rep["table"])
    a = rep["auroc"]
    return {"pair": pair_name, "student": student.model, "status": rep["status"], "reasons": rep["reasons"],
            "n_sequences": rep["n_sequences"], "n_tokens": rep["n_tokens"], "token_mean_delta": rep["token_mean_delta"],
            "student_weighted_mean": rep["student_weighted_mean"],
            "pos_frac_pct": None if rep["pos_frac"] is None else 100 * rep["pos_frac"],
            "abs_mean_delta": rep["abs_mean_delta"], "stop_mean_delta": rep["stop"]["mean_delta"],
            "logp_stop_at_answer_end": rep["logp_stop_at_answer_end"],
            "auroc_length_controlled": a.get("length_controlled"), "auroc_ci95": a.get("ci95")}


# --- stats.json (the keys 05_stats / 06_report read) and the manifest ---

def write_stats(args, out, base, pre, started, wall, stage, lp):
    s1 = read_json(out / "stage1.json") if (out / "stage1.json").exists() else {}
    sft = read_json(out / "sft.json") if (out / "sft.json").exists() else {}
    pr = read_json(out / "probe.json") if (out / "probe.json").exists() else {}
    keys = ("n_prompts", "k", "kept", "keep_rate_pct", "keep_rate_by_level_pct", "n_correct_of_k", "rejection_reasons",
            "gate_g1", "kept_by_seed", "sample_accuracy_pct", "pass_at_k_pct", "truncation_rate_pct", "kept_tokens",
            "kept_extractors", "kept_verify_methods", "max_new_tokens")
    stats = {"base": base, "pair": lp.name, **{k: s1[k] for k in keys if k in s1}}
    if "skipped_no_gold" in s1:
        stats["skipped_no_gold"] = s1["skipped_no_gold"]["n"]
    if sft:
        stats["sft"] = ({k: sft[k] for k in ("val_loss", "train_loss", "n_train", "n_val", "steps", "warmup_steps",
                                             "checkpoints", "supervised_tokens", "max_grad_norm", "precision",
                                             "world_size")}
                        | {"lr": sft["config"]["lr"],
                           "epochs": sft["config"]["epochs"],
                           "batch_size": sft["config"]["batch_size"]})
    if pr:
        stats |= {"shift_abs_dlogp_per_token": pr["shift"]["abs_mean"],
                  "shift": pr["shift"],
                  "eos_probe": pr["eos_probe"],
                  "weights": pr["weights"]}
        if "anatomy" in pr:
            stats["anatomy"] = pr["anatomy"]
    atomic_write_json(out / "stats.json", stats)
    try:
        prev = read_manifest(out).get("stages", {})
    except Exception:  # first stage of this folder: nothing to carry
        prev = {}
    gpu = wall * ((args.nproc if stage == "sft" else 1) if torch.cuda.is_available() else 0)
    stages = {**prev, stage: {"started": started, "wall_s": round(wall, 3), "gpu_s": round(gpu, 3),
                              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}}
    names = ["samples", "kept.jsonl", "stage1.json", "sft.json", "sft_metrics.jsonl", "ckpt_025", "ckpt_050",
             "ckpt_075", "ckpt_100", "model", "probe.json", "anatomy", "stats.json"]
    train_src = benchmarks.benchmark_source(args.train_data)
    inputs = {"pi_pre": pre.provenance()} | ({"train_data": train_src} if Path(train_src).exists() else {})
    write_manifest(out, stage="07_raft", script=__file__, args=vars(args), inputs=inputs,
                   outputs=[n for n in names if (out / n).exists()], started=min(v["started"] for v in stages.values()),
                   wall_s=sum(v["wall_s"] for v in stages.values()), gpu_s=sum(v["gpu_s"] for v in stages.values()),
                   extra={"stages": stages, "base": base} | lp.record())


def relaunch_sft(argv):
    """`python 07_raft.py --nproc N …` → `torchrun --nproc-per-node N 07_raft.py … --stage sft`."""
    from torch.distributed.run import main as torchrun
    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--nproc", "--stage"):
            skip = True
        elif not a.startswith(("--nproc=", "--stage=")):
            rest.append(a)
    torchrun(["--nproc-per-node", str(parse_args(argv).nproc), __file__, *rest, "--stage", "sft"])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # A near-converged model's tiny gradients are denormal floats, which x86 CPUs process ~100× slower: measured on
    # the toy SFT, 2.6 s → 0.35 s a step. Flushing them to zero loses only magnitudes below 1.2e-38.
    torch.set_flush_denormal(True)
    under_torchrun = "RANK" in os.environ
    if under_torchrun and args.stage != "sft":
        sys.exit("under torchrun only --stage sft runs (sampling and the probe are single-process): pass --stage sft")
    lp = pairs.from_args(args)                       # a pair file's models and benchmarks are declared here
    args.train_data = args.train_data or lp.pair.train_data
    base = lp.pair.pi_pre
    run_dir, out = Path(args.run_dir), Path(args.run_dir) / "raft"
    # one RAFT process per run dir (a relaunched SFT's ranks run under their launcher's lock), as 03 holds its run's
    if os.environ.get("RANK", "0") == "0" and os.environ.get("OPD_RUN_LOCKED") != str(out.resolve()):
        lock = runs.RunLock(out, what="RAFT stage")                # noqa: F841  (held until the process exits)
        os.environ["OPD_RUN_LOCKED"] = str(out.resolve())
    pre = models.resolve_model(base, run_dir)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(pre.path)

    if args.stage in ("sample", "all"):
        started, t0 = wall_clock()
        rows, skipped = split_gold(benchmarks.load_benchmark(args.train_data, require_answer=False)[0])
        if skipped:
            log(f"[07] {len(skipped)} training row(s) have no gold answer and are skipped (listed in stage1.json): "
                f"{', '.join(skipped[:5])}{' …' if len(skipped) > 5 else ''}")
        rows = evenly_spaced(rows, args.limit_prompts)
        if stage_sample(args, out, base, pre, tok, rows, skipped) == "time_limit":
            return
        write_stats(args, out, base, pre, started, time.monotonic() - t0, "sample", lp)
    if args.stage in ("sft", "all"):
        started, t0 = wall_clock()
        if args.nproc > 1 and not under_torchrun:
            relaunch_sft(argv)
        else:
            stage_sft(args, out, base, pre, tok)
        if int(os.environ.get("RANK", "0")) == 0:
            write_stats(args, out, base, pre, started, time.monotonic() - t0, "sft", lp)
    if args.stage in ("probe", "all"):
        started, t0 = wall_clock()
        stage_probe(args, out, base, pre, tok, lp)
        write_stats(args, out, base, pre, started, time.monotonic() - t0, "probe", lp)
    log(f"[07] wrote {out / 'stats.json'}")


if __name__ == "__main__":
    from lib.artifacts import ArtifactError
    try:
        main()
    except ArtifactError as e:                            # a changed or missing file: one line naming it and the fix
        raise SystemExit(f"07_raft: {e}") from None
