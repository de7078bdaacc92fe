"""03_opd_train.py — Direct-OPD and classic OPD: the hand-written torchrun FSDP2 training loop (DESIGN.md §7).

Per step: take the next B prompts (one pass over the data, shuffled once with seed 42) → sample n rollouts each from
the current student → score the sampled tokens (and the student's top-K candidates) under π_pre, π_post (or the one
teacher of classic OPD), the reference (the student's initial weights) and the student → token rewards → one
on-policy optimizer step (PPO clipped surrogate + k3 KL to the reference) → one JSON line of metrics.

Shapes (the suffix of a tensor's name): B = sequences (a step takes --batch-prompts B prompts × n rollouts; in
`input_ids_BT` the micro-batch's sequences), T = padded length (packed: Σ lengths, lib/kernels/varlen.py), N = response
tokens (flattened, padding removed), K = candidates scored per token (the student's top-K for delta-topk, else the one
sampled token, K = 1), J = 1 + K ids a teacher scores per token ([sampled | top-K]). Every advantage is (N, K).

At --temperature T ≠ 1 the student and the reference are scored at logits / T, as verl's actor and reference are
(the teachers at 1); rollout/logprob_gap then compares those with the sampler's raw (T = 1) log-probs.

`--student-scores sampler` (ours, not the method's; DESIGN.md §7.1) skips the student's scoring forward: its top-K
candidates, their log-probs, the sampled token's log-prob and the entropy come from the logits the built-in sampler
drew each token from, and the PPO ratio's denominator is the update's own forward, detached (verl's on-policy case:
one update per batch, so the ratio is exactly 1 as it is under recompute).

Reads:  the pair's models and training prompts (lib/registry.py); a rerun reads train/<run>/resume/ (or resume.old/).
Writes: <run-dir>/train/<run>/metrics.jsonl   one JSON object per step (DESIGN.md §7.4 names)
                             /summary.json    the collapse watch (DESIGN.md §7.5) and the run's settings
                             /step_000020/    merged Hugging Face checkpoint (+ checkpoint.json) every --save-every
                             /resume/         model + optimizer (safetensors) + loop state (JSON) of the last checkpoint
                             /manifest.json   written last: the run is finished
                             /run.lock        held (flock) by the one trainer of this folder

Rerunning the same command continues anything (lib/runs.py): a finished run says so; a killed one continues from
its last complete checkpoint with the settings it started with (different ones are refused, flag by flag), or
restarts cleanly if it had none; checkpoints are swapped in without a moment when none is complete, their sha256s
verified on load. `--time-limit` stops after a checkpoint before a wall-clock budget runs out.

CPU (toy, 1 process):   python 03_opd_train.py --pair toy --run-dir runs/toy --reward delta-sampled
CPU (2 gloo processes): torchrun --nproc-per-node 2 03_opd_train.py --pair toy --run-dir runs/toy
GPUs:                   torchrun --nproc-per-node 4 03_opd_train.py --pair openthinker --run-dir runs/openthinker
                        (or `python 03_opd_train.py --nproc 4 …`, which launches itself through torchrun: current
                        torchrun rejects its own short `--nproc` as ambiguous)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
import numpy as np
import torch

from lib import benchmarks, models, pairs, registry, runs, tracking
from lib.artifacts import atomic_write_json, atomic_write_text, read_json, wall_clock, write_manifest
from lib.cli import (ArgumentParser, HelpFormatter, fraction, nonnegative_float, nonnegative_int, path_name,
                     positive_float, positive_int)
from lib.data import prompt_ids, refuse_special_text, require_rows, stable_seed
from lib.sample.completion import stop_ids
from lib.sample.engine import HFEngine, load_engine, sample
from lib.sample.resident import explain_oom
from lib.train import dist as D
from lib.train import checkpoint, opd
from lib.train.model_init import build_scorer
from lib.train.scoring import pack, regroup, sampler_gap, score_ids, to_device
from lib.train.step_phases import (PhaseClock, balanced_token_budget, equal_plan, freeze_heap, micro_batch_arg,
                                   peak_tflops, resolve_auto, resolve_micro_batch, sampler_reserve, sampler_slots,
                                   score_limits)


# --- config ---

def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    a = p.add_argument
    pairs.add_arguments(a)
    a("--student", default=None, help=f"student (default: the pair's): one of {sorted(registry.STUDENTS)}, "
                                      "a model alias, a hub id[@revision] or a folder")
    a("--reward", default="delta-topk", choices=opd.REWARDS, help="token reward (DESIGN.md §7.2)")
    a("--teacher", default=None, help="classic OPD's teacher: alias, hub id[@revision] or folder (default: the "
                                      "student's registry teacher)")
    a("--train-data", default=None, help="training prompts: a registry name or any jsonl/parquet with id, problem "
                                          "(default: the pair's)")
    a("--run-dir", default=None, help="campaign directory (default runs/<pair>)")
    a("--run-name", type=path_name, default=None, help="folder under train/ (default <reward>)")
    a("--steps", type=positive_int, default=100, help="optimizer steps (capped by one pass over the data)")
    a("--batch-prompts", type=positive_int, default=64, help="B: prompts per step (global)")
    a("--rollouts", type=positive_int, default=4, help="n: samples per prompt")
    a("--temperature", type=positive_float, default=1.0,
      help="rollout temperature; the student and reference are scored at it too (logits / T, as verl), teachers at 1")
    a("--top-p", type=fraction, default=1.0, help="rollout top-p, in (0, 1]")
    a("--topk", type=positive_int, default=16, help="K of delta-topk")
    a("--lr", type=positive_float, default=1e-6, help="AdamW learning rate, constant")
    a("--weight-decay", type=nonnegative_float, default=0.01, help="AdamW weight decay")
    a("--grad-clip", type=positive_float, default=1.0, help="max global grad norm")
    a("--clip-eps", type=positive_float, default=0.2, help="PPO clip ε")
    a("--kl-mode", default="adaptive", choices=["adaptive", "constant"],
      help="KL coefficient controller (DESIGN.md §7.3)")
    a("--kl-coef", type=nonnegative_float, default=2.5, help="initial KL coefficient (adaptive: clamped to [0.5, 2.5])")
    a("--kl-ref", default="init", choices=["init", "none"], help="KL anchor: the student's init weights, or no KL")
    a("--reward-center", action="store_true", help="shift rewards so the batch-mean reward is non-negative")
    a("--eos-policy", default="raw", choices=list(opd.EOS_POLICIES),
      help="reward at the stop token: raw, neutral (0 where the student stopped), clamp, neutral-all (neutral, and 0 "
           "wherever the stop token is a candidate), conditional (teachers conditioned on going on, the student's stop "
           "probability left alone; Direct-OPD rewards only); DESIGN.md §7.6")
    a("--eos-floor", type=nonnegative_float, default=0.0,
      help="with --eos-policy clamp: the stop-token reward is ≥ −floor")
    a("--truncated-policy", default="raw", choices=["raw", "mask"],
      help="reward on a response the cap cut: raw (as scored) or mask (0 on every one of its tokens; DESIGN.md §7.6)")
    a("--stop-on-collapse", action="store_true", help="stop (after saving) once the collapse watch fires")
    a("--max-prompt-len", type=positive_int, default=None, help="prompt cap (default: the student's, DESIGN.md §4)")
    a("--max-response-len", type=positive_int, default=None, help="response cap (default: the student's, DESIGN.md §4)")
    a("--drop-overlong", action="store_true", help="drop prompts over the cap (listed by id) instead of refusing")
    a("--save-every", type=positive_int, default=20, help="checkpoint every N steps (and at the last step)")
    a("--micro-batch", type=micro_batch_arg, default=8,
      help="sequences per forward/backward on each rank, or auto: on CUDA a token budget from the memory left at the "
           "first step (lib/train/step_phases.resolve_micro_batch), on CPU 8")
    a("--max-tokens-per-micro", type=positive_int, default=None,
      help="pack micro-batches by padded tokens instead (sequences sorted by length; overrides --micro-batch)")
    a("--score-tokens-per-micro", type=positive_int, default=None,
      help="scoring's own token budget per micro-batch (no grad: bigger than the update's; default on CUDA 4× the "
           "update's micro-batch, on CPU the update's plan)")
    a("--backend", default="hf", choices=["hf", "vllm"], help="rollout engine: in-process torch/hf, or colocated vLLM")
    a("--gpu-memory-utilization", type=fraction, default=0.3,
      help="vLLM's share of GPU memory (colocated with the trainer)")
    a("--logprob-gap-every", type=positive_int, default=4, help="vLLM: the sampler's log-probs (for "
      "rollout/logprob_gap only) from every K-th rollout, as returning them slows vLLM; hf returns all for free")
    a("--vllm-sleep", action=argparse.BooleanOptionalAction, default=True, help="colocated vLLM frees its GPU memory "
      "outside generation (CUDA); --no-vllm-sleep keeps it resident, no weight copies to host and back, if both fit")
    a("--activation-checkpointing", action="store_true", help="recompute decoder layers in backward")
    a("--compile", nargs="?", const="on", default="auto", choices=["auto", "on", "off"],
      help="torch.compile each decoder layer of the student, teachers and reference (torchtitan-style); auto: on "
           "on CUDA, off on CPU; a bare --compile is on")
    a("--no-compile", dest="compile", action="store_const", const="off", default=argparse.SUPPRESS,
      help="--compile off")
    a("--packing", default="auto", choices=["auto", "on", "off"],
      help="padding-free micro-batches (lib/kernels/varlen.py): sequences end to end, FlashAttention varlen on CUDA; "
           "auto: on on CUDA, off on CPU")
    a("--share-prompts", action=argparse.BooleanOptionalAction, default=False,
      help="ours, exact: in packed micro-batches each prompt is forwarded once for all its rollouts, scoring and "
           "update alike, and each response attends to it (lib/train/scoring.pack_shared); needs --packing on")
    a("--scoring", default="fused-linear", choices=["fused-linear", "logits"],
      help="project hidden states tile by tile (logits never exist) or materialise logits then the kernel")
    a("--resume", action="store_true", help="an alias: rerunning the same command always continues the run")
    a("--keep-last", type=positive_int, default=None, help="keep only the N newest HF checkpoints (default: keep all)")
    a("--time-limit", type=positive_float, default=None,
      help="wall-clock budget in seconds: stop after a checkpoint when the "
           "next step and a checkpoint are predicted not to fit")
    a("--logger", default="none", choices=tracking.LOGGERS, help="also log the metrics to TensorBoard or W&B")
    a("--wandb-project", default=None, help="W&B project (default: $WANDB_PROJECT, else direct-opd); the run is "
                                            "named <campaign>/<run>")
    a("--seed", type=nonnegative_int, default=42, help="data order and rollout seeds")
    a("--nproc", type=positive_int, default=1, help="launch this many local processes through torchrun")
    a("--peak-tflops", type=positive_float, default=None, help="per-device bf16 peak for MFU (default: by device name)")
    a("--offload-optimizer", action="store_true",
      help="AdamW's moments in host memory, streamed through the GPU at each step (lib/train/dist.OffloadAdamW; the "
           "same arithmetic): 8 bytes a parameter off the device, e.g. a 7B student beside its reference on one GPU")
    a("--sampler-slots", type=positive_int, default=None,
      help="the built-in sampler's slot count, fixed (default: on CUDA all of a rank's rollouts where the KV budget "
           "holds them — the device's free memory less what the trainer still needs, lib/train/step_phases."
           "sampler_reserve — else as many as it holds; on CPU --micro-batch × 8)")
    a("--sampler-kv-margin", type=nonnegative_float, default=None,
      help="GiB the built-in sampler's KV cache leaves free when it is sized (default: computed, see "
           "lib/train/step_phases.sampler_reserve)")
    a("--student-scores", default="recompute", choices=["recompute", "sampler"],
      help="the student's pre-update scores of its rollouts (top-K candidates, log-probs, entropy): recompute (the "
           "method's: a scoring forward) or sampler (ours: from the built-in sampler's own logits, one forward of the "
           "student fewer a step; --backend hf only; DESIGN.md §7.1)")
    a("--sampler-sleep", action="store_true",
      help="the built-in sampler (--backend hf) frees its KV cache and CUDA graphs after each generation and rebuilds "
           "them for the next (as colocated vLLM sleeps): the trainer gets that memory for scoring and the update "
           "(1.5B shapes on an H100: 10 GB freed, generation 0.02 s slower a step; bench/RESULTS.md §8)")
    args = p.parse_args(argv)
    if args.eos_policy == "conditional" and args.reward == "opd":
        p.error("--eos-policy conditional conditions π_post and π_pre on going on: use it with delta-topk or "
                "delta-sampled, not opd")
    if args.student_scores == "sampler" and args.backend != "hf":
        p.error("--student-scores sampler takes the scores from the built-in sampler's logits: use it with --backend "
                "hf (vLLM returns no entropy, and its top-K log-probs only as Python objects per token)")
    cuda = torch.cuda.is_available()                     # both recorded as what ran: on or off
    args.compile, args.packing = resolve_auto(args.compile, cuda), resolve_auto(args.packing, cuda, "--packing")
    if args.share_prompts and not args.packing:
        p.error("--share-prompts lays each prompt out once in a packed micro-batch: add --packing on (off is the CPU "
                "default)")
    return args


def log(d: D.Dist, msg: str):
    if d.main:
        print(msg, flush=True)


# --- data: prompts rendered under the STUDENT's template; teachers score the same ids verbatim ---

def load_prompts(args, pair, tokenizer, chat_kwargs, d):
    rows, src = benchmarks.load_benchmark(args.train_data or pair.train_data, require_answer=False)
    rows = [rows[i] for i in np.random.default_rng(args.seed).permutation(len(rows))]   # shuffled once
    refuse_special_text(tokenizer, rows, src)
    ids = [prompt_ids(tokenizer, r["problem"], **chat_kwargs) for r in rows]
    over = [(r["id"], len(x)) for r, x in zip(rows, ids) if len(x) > args.max_prompt_len]
    if over and not args.drop_overlong:
        listed = "; ".join(f"prompt {i} is {n} tokens" for i, n in over[:10])
        sys.exit(f"{len(over)} training prompts exceed the prompt cap {args.max_prompt_len} under the student's "
                 f"template: {listed}{' …' if len(over) > 10 else ''}. Raise --max-prompt-len or drop them "
                 f"explicitly with --drop-overlong (they are listed in the run's summary.json).")
    if over:
        log(d, f"[03] dropping {len(over)} overlong prompts: {[i for i, _ in over]}")
        keep = {i for i, _ in over}
        rows, ids = (zip(*[(r, x) for r, x in zip(rows, ids) if r["id"] not in keep]) if len(keep) < len(rows)
                     else ([], []))
    return list(rows), list(ids), src, over


# --- models: built on the meta device, sharded, then filled from the checkpoint (lib/train/model_init.py) ---

def frozen_scorer(path, args, d, bf16, temperature=1.0):
    """A teacher or the reference: bf16 on CUDA (no fp32 copy; FSDP2 casts nothing), fp32 on CPU; no grad."""
    return build_scorer(path, torch.bfloat16 if bf16 else torch.float32, d.device, frozen=True,
                        fused_linear=args.scoring == "fused-linear", temperature=temperature, compile=args.compile,
                        packed=args.packing)


def make_engine(args, student_path, tokenizer, d, bf16, kv_reserve=None):
    if args.backend == "vllm":
        # one engine per rank, colocated with the trainer; under torchrun each rank samples its own prompts
        # (vLLM's external launcher, data parallel): verified on 1 CPU process, not on multi-GPU (no vLLM there)
        multi = (dict(data_parallel_size=d.world, distributed_executor_backend="external_launcher") if d.world > 1
                 else {})
        return load_engine("vllm", str(student_path), tokenizer, dtype="bfloat16" if bf16 else "float32",
                           max_model_len=args.max_prompt_len + args.max_response_len,
                           gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed,
                           logprob_every=args.logprob_gap_every, enable_sleep_mode=args.vllm_sleep, **multi)
    from transformers import AutoModelForCausalLM
    sampler_lm = AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.bfloat16 if bf16 else torch.float32)
    # GPU rollouts draw in lib/sample/draw.py's fast mode, all of a rank's rollouts at once where the memory the
    # trainer leaves holds them (kv_reserve: step_phases.sampler_reserve); CPU runs keep the exact Gumbel-max draws
    # of the eval units
    # --student-scores sampler: the decoder also records the student's scores of every token it draws
    k = (args.topk if args.reward == "delta-topk" else 0) if args.student_scores == "sampler" else None
    return HFEngine(sampler_lm.to(d.device).eval(), tokenizer,
                    batch_size=args.sampler_slots or sampler_slots(args, d.world, bf16), kv_reserve=kv_reserve,
                    mode="fast" if bf16 else "exact", decoder_options={"candidates": k} if k is not None else None)


# --- one micro-batch of the loop (steps 2 and 4), functions so that tests run exactly this code ---

def score_micro_batch(student, teachers, ref, batch, K, completions, stop_t=None):
    """Step 2, no grad: the student's own log-probs ("old": before this step's update), its top-K candidates when
    K > 0, and each teacher's log-probs (and entropy) at [sampled | top-K]; the reference's at the sampled tokens.
    stop_t (the stop ids, for --eos-policy conditional): each teacher's log p(stop) at every position too.
    Completions that carry the sampler's scores (`--student-scores sampler`) give the student's part without a
    forward: their rows, concatenated, are the packed batch's response tokens in order."""
    dev = batch.targets_N.device
    with torch.no_grad():
        if completions and completions[0].student is not None:
            lp_N, topk_ids_NK, topk_lp_NK, ent_N = (torch.cat([getattr(o.student, f) for o in completions]).to(dev)
                                                    for f in ("logprobs", "topk_ids", "topk_logprobs", "entropy"))
            if topk_ids_NK.shape[1] != K:
                raise ValueError(f"the sampler recorded {topk_ids_NK.shape[1]} candidates a token, the step scores "
                                 f"{K}: build the engine with candidates=K (make_engine)")
        else:
            lp_N, topk_ids_NK, topk_lp_NK, ent_N = student(batch, None, topk=K)
        ids_NJ = torch.cat([batch.targets_N[:, None], topk_ids_NK], 1)
        n_stop = 0 if stop_t is None else len(stop_t)       # the stop ids ride along as the last columns
        if n_stop:
            ids_NJ = torch.cat([ids_NJ, stop_t.to(ids_NJ.device).expand(len(ids_NJ), n_stop)], 1)
        scored = {k: m(batch, ids_NJ, with_entropy=True) for k, m in teachers.items()}
        lp_stop_t = {k: lp.float()[:, -n_stop:].logsumexp(-1) for k, (lp, _) in scored.items()} if n_stop else None
        scored = {k: (lp[:, :lp.shape[1] - n_stop], ent) for k, (lp, ent) in scored.items()}
        ref_N = score_ids(ref, batch, batch.targets_N[:, None])[:, 0] if ref is not None else None
    is_stop_N = torch.zeros(len(lp_N), dtype=torch.bool)
    is_stop_N[[int(e) for e, o in zip(np.cumsum([len(o.token_ids) for o in completions]) - 1, completions)
               if o.finish_reason == "stop"]] = True
    # every token of a response the cap cut (its finish "length"): what --truncated-policy mask zeroes
    is_trunc_N = torch.tensor([o.finish_reason == "length" for o in completions for _ in o.token_ids], dtype=torch.bool)
    # the sampled token's Δ = log π_post − log π_pre (opd: log π_T − log π_θ), logged for every reward
    delta_N = (scored["pi_post"][0][:, 0] - scored["pi_pre"][0][:, 0]) if "pi_post" in scored \
        else scored["teacher"][0][:, 0] - lp_N
    sampler = [x for o in completions for x in o.logprobs or [math.nan] * len(o.token_ids)]  # NaN: vLLM gave none
    return dict(batch=batch, old_N=lp_N, topk_ids=topk_ids_NK, old_topk=topk_lp_NK, ent_N=ent_N,
                lp_t={k: v[0] for k, v in scored.items()}, ent_t={k: v[1] for k, v in scored.items()}, ref_N=ref_N,
                lp_stop_t=lp_stop_t, delta_N=delta_N, is_stop_N=to_device(is_stop_N, dev),
                is_trunc_N=to_device(is_trunc_N, dev), sampler_N=to_device(torch.tensor(sampler), dev))


def micro_batch_loss(student, mb, kl_coef, n_tokens, clip_eps, old_from_update=False):
    """Step 4 for one micro-batch: the student re-scores its rollouts WITH grad at the candidates step 2 stored (the
    stored top-K ids, never re-selected), then opd.update_loss. Returns opd.update_loss's (loss, pg_N, clipped_NK,
    neg_log_ratio_NK, kl_N). old_from_update (`--student-scores sampler`): PPO's old log-probs are this forward's
    own, detached (the one update of a step starts from the weights that drew the rollouts), and the forward's
    log-probs are kept in mb as "update_N" / "update_topk" for rollout/logprob_gap and candidate_logprob_gap."""
    lp_N, _, topk_lp_NK, _ = student(mb["batch"], None, topk_ids_NK=mb["topk_ids"])
    on_topk = mb["topk_ids"].shape[1] > 0                          # delta-topk: the advantage is on the K candidates
    if old_from_update:
        mb["update_N"], mb["update_topk"] = lp_N.detach(), topk_lp_NK.detach()
        lp_NK = topk_lp_NK if on_topk else lp_N[:, None]
        old_NK = lp_NK.detach()
    else:
        lp_NK, old_NK = (topk_lp_NK, mb["old_topk"]) if on_topk else (lp_N[:, None], mb["old_N"][:, None])
    return opd.update_loss(lp_NK, old_NK, mb["adv"], lp_N, mb["ref_N"], kl_coef, n_tokens, clip_eps)


# --- the step's metrics (step 5) ---

def step_metrics(step, args, d, clock, *, mbs, outs, prompts, upd, n_tok, reward_pair_mean, reward_token_mean,
                 grad_norm, kl_coef, skipped, plan, score_plan, score_fwd_tokens, seq_lens, n_params, peak, bf16):
    """Step 5 (DESIGN.md §7.4): the step's line of metrics.jsonl, its keys in the order they are written. Named sums
    are reduced across ranks and each metric sits beside the sums it divides; times and memory come from `clock`,
    whose step ends here. `prompts` are this rank's rollout prompts (one per rollout), `plan` and `score_plan` its
    micro-batches."""
    W = d.world
    pairs = torch.cat([mb["delta"].flatten() for mb in mbs])     # (token, candidate) log-ratios: the method's
    dl = torch.cat([mb["delta_N"] for mb in mbs])                 # the sampled token's log-ratio (ours)
    lens = [len(o.token_ids) for o in outs]
    two_teachers = args.reward != "opd"                           # π_post and π_pre (opd: one teacher)
    sampler_scores = args.student_scores == "sampler"             # then the trainer's own numbers are the update's
    gap_sum, gap_tokens = sampler_gap([mb["sampler_N"] for mb in mbs],
                                      [mb["update_N" if sampler_scores else "old_N"] for mb in mbs])
    local = {"pairs": pairs.numel(),
             "pair": pairs.sum(),
             "pair_sq": (pairs ** 2).sum(),
             "pair_pos": (pairs > 0).sum(),
             "pair_abs": pairs.abs().sum(),
             "dl": dl.sum(),
             "dl_sq": (dl ** 2).sum(),
             "dl_pos": (dl > 0).sum(),
             "dl_abs": dl.abs().sum(),
             "resp_tokens": sum(lens),
             "seqs": len(lens),
             "truncated": sum(o.finish_reason == "length" for o in outs),
             "entropy": sum(mb["ent_N"].sum() for mb in mbs),
             "teacher_entropy": sum(mb["ent_t"]["pi_post" if two_teachers else "teacher"].sum() for mb in mbs),
             "ref_entropy": sum(mb["ent_t"]["pi_pre"].sum() for mb in mbs) if two_teachers else 0.0,
             **upd,
             "logprob_gap": gap_sum,
             "gap_tokens": gap_tokens,
             # --student-scores sampler: Σ |sampler − update| over the (token, candidate) pairs, and their count
             "cand_gap": sum((mb["old_topk"] - mb["update_topk"]).abs().sum() for mb in mbs) if sampler_scores else 0,
             "cand_pairs": sum(mb["update_topk"].numel() for mb in mbs) if sampler_scores else 0,
             "prompt_tokens": sum(len(p) for p in prompts),
             # the tokens one model's forwards ran (--share-prompts: a prompt once per micro-batch it is shared in)
             "fwd_tokens": sum(mb["batch"].tokens for mb in mbs),
             "score_fwd_tokens": score_fwd_tokens}
    s = dict(zip(local, D.all_sum(*(float(v) for v in local.values()), device=d.device)))
    mx = dict(zip(["len_max", "len_neg_min", "pair_max", "pair_neg_min"],
                  D.all_max(max(lens), -min(lens), pairs.max().item(), -pairs.min().item(), device=d.device)))
    dt, ts, gb = clock.total(), clock.seconds, clock.peak_gb
    pair_mean, dl_mean, all_tokens = s["pair"] / s["pairs"], s["dl"] / n_tok, s["resp_tokens"] + s["prompt_tokens"]
    return {"step": step,
            # the method's log-ratio statistics: over all (token, candidate) pairs (K = 1: the sampled token)
            "delta_opd/log_ratio_mean": pair_mean,
            "delta_opd/log_ratio_std": math.sqrt(max(s["pair_sq"] / s["pairs"] - pair_mean ** 2, 0.0)),
            "delta_opd/log_ratio_pos_frac": s["pair_pos"] / s["pairs"],
            "delta_opd/log_ratio_abs_mean": s["pair_abs"] / s["pairs"],
            "delta_opd/log_ratio_min": -mx["pair_neg_min"],
            "delta_opd/log_ratio_max": mx["pair_max"],
            # ours: the same on the sampled token only
            "delta_opd/log_ratio_mean_sampled": dl_mean,
            "delta_opd/log_ratio_std_sampled": math.sqrt(max(s["dl_sq"] / n_tok - dl_mean ** 2, 0.0)),
            "delta_opd/log_ratio_pos_frac_sampled": s["dl_pos"] / n_tok,
            "delta_opd/log_ratio_abs_mean_sampled": s["dl_abs"] / n_tok,
            "delta_opd/weighted_reward_mean": reward_pair_mean,            # (before --reward-center / --eos-policy)
            "delta_opd/weighted_reward_token_mean": reward_token_mean,
            "response_length/mean": s["resp_tokens"] / s["seqs"],
            "response_length/max": mx["len_max"],
            "response_length/min": -mx["len_neg_min"],
            "response_length/clip_ratio": s["truncated"] / s["seqs"],
            "actor/entropy": s["entropy"] / n_tok,
            "actor/pg_loss": s["pg"] / n_tok,                               # Σ_k per token, token-mean (verl)
            "actor/kl_loss": s["kl"] / n_tok,
            "actor/pg_clipfrac": s["clipped"] / s["pairs"],                 # per candidate (verl)
            "actor/ppo_kl": s["neg_log_ratio"] / n_tok,                     # Σ_k −log ρ per token, token-mean (verl)
            "actor/ppo_kl_candidate_mean": s["neg_log_ratio"] / s["pairs"],
            "actor/grad_norm": grad_norm,
            "actor/kl_coef": kl_coef,
            "actor/skipped_step": skipped,
            "teacher/entropy": s["teacher_entropy"] / n_tok,
            "teacher_ref/entropy": s["ref_entropy"] / n_tok if two_teachers else None,
            "teacher/entropy_minus_ref": (s["teacher_entropy"] - s["ref_entropy"]) / n_tok if two_teachers else None,
            "rollout/logprob_gap": s["logprob_gap"] / max(s["gap_tokens"], 1),   # tokens with a sampler log-prob
            # ours, --student-scores sampler only: the sampler's top-K log-probs (at T) against the update forward's
            **({"rollout/candidate_logprob_gap": s["cand_gap"] / s["cand_pairs"] if s["cand_pairs"] else None}
               if sampler_scores else {}),
            **{f"timing_s/{k}": v for k, v in ts.items()},
            "timing_s/step": dt,
            "perf/tokens": all_tokens,
            "perf/response_tokens": s["resp_tokens"],
            "perf/sequences": s["seqs"],
            "perf/tokens_per_s": all_tokens / dt,
            **{f"perf/gc_s_{k}": v for k, v in clock.gc_seconds.items()},
            "perf/micro_batch_sizes": [len(i) for i in plan],            # rank 0's
            "perf/score_micro_batch_sizes": [len(i) for i in score_plan],
            "perf/padding_frac": 1 - sum(seq_lens) / sum(len(i) * max(seq_lens[j] for j in i) for i in plan),
            "perf/forwarded_tokens": s["fwd_tokens"],
            "perf/score_forwarded_tokens": s["score_fwd_tokens"],
            "perf/mfu": (6 * n_params * s["fwd_tokens"] / ts["update"] / (peak * 1e12 * W)) if peak else None,
            "memory/max_allocated_gb": max(gb.values()) if bf16 else None,
            **{f"memory/peak_gb_{k}": v for k, v in gb.items()}}


def check_context(args, resolved):
    """The prompt cap + the response cap must fit every model's context (config.json's max_position_embeddings):
    refused in one line before any weights are read."""
    need = args.max_prompt_len + args.max_response_len
    ctx = {k: read_json(Path(r.path) / "config.json").get("max_position_embeddings") for k, r in resolved.items()}
    short = [f"{k} {resolved[k].alias} ({n})" for k, n in ctx.items() if isinstance(n, int) and n < need]
    if short:
        sys.exit(f"--max-prompt-len {args.max_prompt_len} + --max-response-len {args.max_response_len} = {need} tokens "
                 f"exceed the context (max_position_embeddings) of {', '.join(short)}: lower --max-response-len")


def diverged(step: int, what: str, args, last_saved: int):
    """A non-finite loss or grad norm: the run stops before anything of this step is written (one line)."""
    sys.exit(f"[03] step {step}: {what} is not finite: the run diverged and stops before writing this step (the "
             f"last checkpoint, step {last_saved}, stays); lower --lr (now {args.lr:g}) and start a new run with "
             f"--run-name")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started, t_start = wall_clock()
    lp = pairs.from_args(args)                       # a pair file's models and benchmarks are declared here
    pair = lp.pair
    sspec = models.student_spec(args.student) if args.student else lp.student
    args.max_prompt_len = args.max_prompt_len or sspec.max_prompt_len
    args.max_response_len = args.max_response_len or sspec.max_response_len
    run_dir = Path(args.run_dir or f"runs/{lp.name}")
    out = run_dir / "train" / (args.run_name or args.reward)
    settings = json.loads(json.dumps(vars(args), default=str)) | {"pair_name": lp.name,
                                                                       "pair_sha256": lp.sha256}
    # one trainer per run folder: the launcher (or rank 0 of a torchrun launch) holds the lock for the run's life
    if os.environ.get("RANK", "0") == "0" and os.environ.get("OPD_RUN_LOCKED") != str(out.resolve()):
        lock = runs.RunLock(out)                                    # noqa: F841  (held until the process exits)
        os.environ["OPD_RUN_LOCKED"] = str(out.resolve())
    mode, src = checkpoint.decide(out, settings)
    if mode == "finished":
        print(f"[03] {out} is finished (manifest.json verified): nothing to do")
        return
    if args.nproc > 1 and "RANK" not in os.environ:
        return D.relaunch(__file__, args.nproc, argv)
    d = D.init()
    torch.manual_seed(args.seed)
    bf16 = d.device.type == "cuda"
    if args.micro_batch == "auto" and not bf16:     # off CUDA `auto` is the flag's default, before anything uses it
        args.micro_batch, _ = resolve_micro_batch(args, None, None, d, cuda=False)
    limits = None                                        # the update's (max sequences, max tokens): at the first step

    # every rank resolves the same folders; rank 0 first, so a toy world is built once
    roles = {"student": sspec.model}
    if args.reward == "opd":
        roles["teacher"] = args.teacher or sspec.teacher or pair.pi_post
    else:
        roles |= {"pi_pre": pair.pi_pre, "pi_post": pair.pi_post}
    if d.main:
        resolved = models.resolve_roles(roles, run_dir, f"pair {lp.name}")
    torch.distributed.barrier()
    if not d.main:
        resolved = models.resolve_roles(roles, run_dir, f"pair {lp.name}")
    check_context(args, resolved)                    # config.json only: before any weights are read
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(resolved["student"].path)
    chat_kwargs = {"enable_thinking": True} if models.model_spec(sspec.model).thinking else {}
    rows, prompts, data_src, dropped = load_prompts(args, pair, tokenizer, chat_kwargs, d)
    B, n, W = args.batch_prompts, args.rollouts, d.world
    require_rows(rows, B, data_src, "--batch-prompts")
    if B % W:
        sys.exit(f"--batch-prompts {B} must be divisible by the number of processes {W}")
    steps = min(args.steps, len(rows) // B)
    if steps < args.steps:
        log(d, f"[03] one pass over {len(rows)} prompts allows {steps} steps of {B} (asked {args.steps})")

    # --- models: student (trainable, fp32 master weights), reference, teachers — all FSDP2-sharded ---
    # student and reference scored at the rollout temperature (logits / T, as verl's actor and ref); teachers at 1
    student = build_scorer(resolved["student"].path, torch.float32, d.device, bf16=bf16, compile=args.compile,
                           fused_linear=args.scoring == "fused-linear", temperature=args.temperature,
                           activation_checkpointing=args.activation_checkpointing, packed=args.packing)
    n_params = sum(p.numel() for p in student.parameters())     # global numel of the sharded (tied: once) params
    ref = frozen_scorer(resolved["student"].path, args, d, bf16, args.temperature) if args.kl_ref == "init" else None
    teachers = {k: frozen_scorer(resolved[k].path, args, d, bf16) for k in roles if k != "student"}
    optim = D.adamw(student, args.lr, args.weight_decay, offload=args.offload_optimizer)
    engine = make_engine(args, resolved["student"].path, tokenizer, d, bf16,
                         kv_reserve=sampler_reserve(args, student, optim, bf16))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop_t = torch.tensor(stop_ids(tokenizer, resolved["student"].path))      # the ids the sampler stops on

    kl = opd.KLController(coef=args.kl_coef, mode=args.kl_mode)
    watch = opd.CollapseWatch()
    start = 0
    if mode == "resume":
        state = D.load_resume(student, optim, src)
        start, kl.coef, watch = state["step"], state["kl_coef"], opd.CollapseWatch(**state["watch"])
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        if d.main:   # metrics and checkpoints past the checkpoint belong to the killed run: dropped, recomputed
            atomic_write_text(out / "metrics.jsonl", checkpoint.kept_metrics(out, start))
            for ck in out.glob("step_*"):
                if not ck.name[5:].isdigit() or int(ck.name[5:]) > start:
                    shutil.rmtree(ck)
            (out / "manifest.json").unlink(missing_ok=True)      # a finished run asked for more steps: unsealed
            runs.tidy(out, src)
        log(d, f"[03] resumed {out} at step {start} from {src.name}/ (kl_coef {kl.coef:.4f})")
    elif d.main and (gone := runs.clear_partial(out)):
        log(d, f"[03] {out} holds no complete checkpoint: restarting it (removed {', '.join(gone)})")
    torch.distributed.barrier()
    # a resumed run whose last checkpoint ended it (the last step, or a collapse with --stop-on-collapse) is sealed
    end = start if start and (start >= steps or (args.stop_on_collapse and watch.collapsed)) else steps
    if start and end == start:
        log(d, f"[03] the checkpoint at step {start} ends the run: sealing it without retraining")
    tracker = tracking.Tracker()
    if d.main:
        tracker = tracking.open_tracker(args.logger, out, settings, resume_step=start, project=args.wandb_project)
    budget = runs.Budget(args.time_limit, t0=t_start)
    step, stopped, t_mark = start, "collapse" if start and end == start < steps else None, time.monotonic()
    last_saved = start
    peak = peak_tflops(args.peak_tflops, d.device, bf16)
    log(d, f"[03] {args.reward} | pair {lp.name} | student {sspec.model} ({n_params / 1e6:.1f}M) | {W} process(es) "
           f"on {d.device.type} | {steps} steps × {B} prompts × {n} rollouts | caps {args.max_prompt_len}/"
           f"{args.max_response_len}")

    # --- the loop ---
    clock = PhaseClock(d, bf16)        # phases timed (on CUDA between device syncs) with their peak memory
    for step in range(start + 1, end + 1):
        clock.start()
        lo = (step - 1) * B + d.rank * (B // W)                    # this rank's slice of the step's prompts
        mine = list(range(lo, lo + B // W))

        # 1. rollouts from the current student: weights pushed into the engine, n samples per prompt. Colocated vLLM
        #    wakes its weights first, takes the trainer's, and only then allocates its KV cache
        engine.wake_up(tags=["weights"])                              # the built-in sampler: no-ops
        engine.update_weights(D.full_params(student))
        clock.mark("sync")
        engine.wake_up(tags=["kv_cache"])
        req_prompts = [prompts[i] for i in mine for _ in range(n)]
        req_seeds = [stable_seed(args.seed, "rollout", rows[i]["id"], j) for i in mine for j in range(n)]
        outs = sample(engine, req_prompts, req_seeds, temperature=args.temperature, top_p=args.top_p,
                      max_new_tokens=args.max_response_len, progress=False)
        if args.backend == "vllm" or args.sampler_sleep:
            engine.sleep()
        elif bf16:                               # the cache stays through scoring and the update: an OOM names it
            engine.record_resident()
        clock.mark("gen")

        # 2. scoring, no grad. "Old" log-probs = the student's scores of its own rollouts before this step's update:
        #    the PPO ratio's denominator (and the delta-topk weights). Teachers score [sampled | top-K] ids in one
        #    pass: the forward over the sequence is the cost, a few more ids per position are nearly free. Scoring
        #    has its own, bigger micro-batches on CUDA (no grad); their per-token results are regrouped, copied, into
        #    the update's micro-batches (the same numbers, the top-K ids included)
        K = args.topk if args.reward == "delta-topk" else 0
        seq_lens = [len(p) + len(o.token_ids) for p, o in zip(req_prompts, outs)]
        if limits is None:          # `--micro-batch auto` on CUDA: from the memory left now (generation ran first)
            limits = resolve_micro_batch(args, student, optim, d, bf16)
            auto = args.micro_batch == "auto" and args.max_tokens_per_micro is None
        plan_args = argparse.Namespace(**vars(args) | dict(zip(("micro_batch", "max_tokens_per_micro"), limits)))
        update_lim = limits if not auto else (limits[0], balanced_token_budget(seq_lens, limits[1]))
        plan = equal_plan(seq_lens, *update_lim, d.device)
        if (score_lim := score_limits(plan_args, bf16)) is not None and auto:  # auto: even groups under each budget
            score_lim = (score_lim[0], balanced_token_budget(seq_lens, score_lim[1]))
        score_plan = plan if score_lim is None else equal_plan(seq_lens, *score_lim, d.device)
        resp, P = [o.token_ids for o in outs], req_prompts

        def packed(idx):
            return pack([P[i] for i in idx], [resp[i] for i in idx], pad_id, args.packing,
                        args.share_prompts).to(d.device)

        scored = [score_micro_batch(student, teachers, ref, packed(idx), K, [outs[i] for i in idx],
                                    stop_t if args.eos_policy == "conditional" else None)
                  for idx in score_plan]
        score_fwd_tokens = sum(mb["batch"].tokens for mb in scored)
        mbs = scored if score_plan == plan else [
            mb | {"batch": packed(idx)} for mb, idx in zip(regroup(scored, score_plan, plan, list(map(len, resp)),
                                                                  skip="batch"), plan)]

        # 3. rewards (DESIGN.md §7.2): an (N, K) advantage per micro-batch, then the means the KL controller reads
        for mb in mbs:
            mb["adv"], mb["delta"] = opd.advantages(args.reward, mb["lp_t"], mb["old_N"], mb["old_topk"])
        n_tok, n_pairs, adv_sum = D.all_sum(sum(len(mb["old_N"]) for mb in mbs), sum(mb["adv"].numel() for mb in mbs),
                                            sum(mb["adv"].sum().item() for mb in mbs), device=d.device)
        reward_pair_mean = adv_sum / n_pairs      # the method's delta_opd/weighted_reward_mean: over (token, candidate)
        reward_token_mean = adv_sum / n_tok       # delta_opd/weighted_reward_token_mean: a token's Σ_k A, token-mean
        # the method's order: the adaptive coefficient moves on THIS step's weighted_reward_mean before the update.
        # (Its delta-sampled mode logs no such key, so its coefficient stays put there; ours moves on the same mean.)
        kl.update(reward_pair_mean)
        # then the fixes (DESIGN.md §7.6), in this order: conditional replaces the advantage, centering shifts it,
        # the stop-token policy and the truncated-response policy zero or lift parts of it
        for mb in mbs:
            cand_NK = mb["topk_ids"] if mb["topk_ids"].shape[1] else mb["batch"].targets_N[:, None]
            is_stop_cand_NK = torch.isin(cand_NK, stop_t.to(cand_NK.device))    # the candidates that are a stop id
            if args.eos_policy == "conditional":
                mb["adv"] = opd.stop_conditional_advantage(args.reward, mb["lp_t"], mb["lp_stop_t"], mb["old_topk"],
                                                           is_stop_cand_NK)
            w_NK = opd.candidate_weights(mb["adv"], mb["old_topk"])
            if args.reward_center:
                mb["adv"] = opd.center_reward(mb["adv"], reward_token_mean, w_NK)
            mb["adv"] = opd.eos_policy(mb["adv"], mb["is_stop_N"], args.eos_policy, args.eos_floor, w_NK,
                                       is_stop_cand_NK)
            mb["adv"] = opd.truncated_policy(mb["adv"], mb["is_trunc_N"], args.truncated_policy)
        clock.mark("score")

        # 4. update: PPO clipped surrogate + kl_coef · k3, token-mean over the GLOBAL batch; one optimizer step
        student.train()
        optim.zero_grad(set_to_none=True)
        upd = dict(pg=0.0, kl=0.0, clipped=0.0, neg_log_ratio=0.0)
        for mb in D.micro_batches(student, mbs):
            # FSDP averages gradients over W ranks: dividing by n_tok / W turns that back into the global token-mean
            loss, pg_N, clipped_NK, neg_log_ratio_NK, kl_N = micro_batch_loss(
                student, mb, kl.coef, n_tok / W, args.clip_eps, old_from_update=args.student_scores == "sampler")
            loss.backward()
            # on device: no host sync per micro-batch
            for k, v in zip(upd, (pg_N, kl_N, clipped_NK, neg_log_ratio_NK)):
                upd[k] = upd[k] + v.sum(dtype=torch.float64)
        clock.mark("update")                                          # forward + backward only
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        skipped = False                  # kept in the metrics' schema: a non-finite step now stops the run
        loss_sum = D.all_sum(float(upd["pg"]) + float(upd["kl"]), device=d.device)[0]
        if not math.isfinite(loss_sum) or not math.isfinite(grad_norm):
            diverged(step, f"the loss ({loss_sum / n_tok:g})" if not math.isfinite(loss_sum)
                     else f"the grad norm ({grad_norm:g})", args, last_saved)
        try:
            optim.step()
        except RuntimeError as e:          # an lr past float32's range: torch refuses the scalar ("… overflow")
            if "overflow" not in str(e):
                raise
            diverged(step, f"the optimizer step at --lr {args.lr:g} (past float32's range)", args, last_saved)
        if not D.params_finite(student):   # (an lr that overflows the weights: caught before the next rollout)
            diverged(step, "a weight after the optimizer step", args, last_saved)
        optim.zero_grad(set_to_none=True)
        student.eval()
        clock.mark("optimizer")                                       # clip + AdamW step + zero_grad

        # 5. metrics (DESIGN.md §7.4): named sums across ranks, each metric beside the sums it divides
        m = step_metrics(step, args, d, clock, mbs=mbs, outs=outs, prompts=req_prompts, upd=upd, n_tok=n_tok,
                         reward_pair_mean=reward_pair_mean, reward_token_mean=reward_token_mean, grad_norm=grad_norm,
                         kl_coef=kl.coef, skipped=skipped, plan=plan, score_plan=score_plan,
                         score_fwd_tokens=score_fwd_tokens, seq_lens=seq_lens,
                         n_params=n_params, peak=peak, bf16=bf16)
        events = watch.update(step, m["response_length/clip_ratio"], m["response_length/mean"])
        if d.main:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(m) + "\n")
            print(f"step {step:>4}/{steps} | reward {reward_token_mean:+.4f} "
                  f"| Δ>0 {100 * m['delta_opd/log_ratio_pos_frac']:4.1f}% "
                  f"| len {m['response_length/mean']:6.1f} clip {m['response_length/clip_ratio']:.2f} "
                  f"| ent {m['actor/entropy']:.3f} | kl {m['actor/kl_loss']:.4f}×{m['actor/kl_coef']:.3f} "
                  f"| gn {grad_norm:.3f} | {m['timing_s/step']:.1f}s (gen {m['timing_s/gen']:.1f} "
                  f"score {m['timing_s/score']:.1f} upd {m['timing_s/update']:.1f})"
                  + "".join(f"\n  !! {e}" for e in events), flush=True)

        # 6. checkpoint: merged HF folder, then the resume state (swapped in whole); then the budget guard
        runs.fault("step-logged", step)
        tracker.log(m, step)
        budget.step(time.monotonic() - t_mark)
        stop_now = args.stop_on_collapse and watch.collapsed
        saved = step % args.save_every == 0 or step == end or stop_now
        if saved:
            last_saved = step
            budget.checkpoint(checkpoint.save(args, d, student, optim, kl, watch, step, out, resolved, sspec, run_dir,
                                              settings))
        if step < end and budget.exhausted():
            if not saved:
                last_saved = step
                checkpoint.save(args, d, student, optim, kl, watch, step, out, resolved, sspec, run_dir, settings)
            stopped = "time_limit"
            log(d, f"[03] --time-limit {args.time_limit:g}s: step {step + 1} and a checkpoint are predicted to take "
                   f"{budget.predicted():.1f}s, past the budget; stopping after the step {step} checkpoint")
            break
        if step == start + 1:
            freeze_heap()     # what survived the first step (models, compiled graphs, engine): not rescanned by gc
        t_mark = time.monotonic()
        if stop_now:
            stopped = "collapse"
            log(d, f"[03] --stop-on-collapse: collapse onset at step {watch.collapse_onset_step}; stopping")
            break

    # --- summary + manifest (not for a run stopped by its time budget: the same command continues it) ---
    runs.fault("before-manifest", step)
    tracker.close()
    if d.main:
        summary = watch.summary() | {"pair": lp.name, "pair_sha256": lp.sha256, "reward": args.reward,
                                     "student": sspec.model,
                                     "teachers": {k: resolved[k].provenance() for k in roles},
                                     "steps": steps, "last_step": step, "stopped": stopped, "seed": args.seed,
                                     "dropped_prompts": [i for i, _ in dropped]}
        atomic_write_json(out / "summary.json", summary)
    if d.main and stopped == "time_limit":
        print(f"[03] stopped for the time budget (--time-limit {args.time_limit:g}s) at step {step} of {steps}, "
              f"checkpoint saved: rerun the same command to continue {out}")
    elif d.main:
        checkpoint.verify_checkpoints(out)        # every checkpoint as written, before the manifest hashes it
        outputs = ["metrics.jsonl", "summary.json"] + sorted(p.name for p in out.glob("step_*") if p.is_dir())
        wall = time.monotonic() - t_start
        write_manifest(out, stage="03_opd_train", script=__file__, args=settings, inputs={"train_data": data_src},
                       outputs=outputs, started=started, wall_s=wall, gpu_s=wall * W if bf16 else 0.0,
                       extra={"world_size": W})
        print(f"[03] done: {out} | collapse watch {json.dumps(watch.summary())}")
    if args.backend != "vllm":   # vLLM tears the groups down itself at exit (destroying them first breaks that)
        D.finish()


if __name__ == "__main__":
    # an OOM beside a resident vLLM engine or the built-in sampler's resident cache: one line naming it and the fixes
    with explain_oom():
        main()
