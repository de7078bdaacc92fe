"""03_opd_train.py — Direct-OPD and classic OPD: the hand-written torchrun FSDP2 training loop (SPEC §7).

Per step: take the next B prompts (one pass over the data, shuffled once with seed 42) → sample n rollouts each from
the current student → score the sampled tokens (and the student's top-K candidates) under π_pre, π_post (or the one
teacher of classic OPD), the reference (the student's initial weights) and the student → token rewards → one
on-policy optimizer step (PPO clipped surrogate + k3 KL to the reference) → one JSON line of metrics.

Reads:  the pair's models and training prompts (lib/registry.py); `--resume` reads train/<run>/resume/.
Writes: <run-dir>/train/<run>/metrics.jsonl   one JSON object per step (SPEC §7.4 names)
                             /summary.json    the collapse watch (SPEC §7.5) and the run's settings
                             /step_000020/    merged Hugging Face checkpoint (+ checkpoint.json) every --save-every
                             /resume/         sharded model + optimizer + loop state of the last checkpoint
                             /manifest.json

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
import sys
import time
from pathlib import Path

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
import numpy as np
import torch

from lib import dist as D
from lib import opd, registry
from lib.artifacts import atomic_write_json, atomic_write_text, read_jsonl, wall_clock, write_manifest
from lib.data import prompt_ids, stable_seed
from lib.scoring import TokenScorer, pack, score_ids


# --- config ---

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--pair", default="toy", choices=sorted(registry.PAIRS), help="teacher pair (SPEC §2)")
    a("--student", default=None, help=f"student (default: the pair's); one of {sorted(registry.STUDENTS)}")
    a("--reward", default="delta-topk", choices=opd.REWARDS, help="token reward (SPEC §7.2)")
    a("--teacher", default=None, help="classic OPD's teacher (default: the student's registry teacher)")
    a("--train-data", default=None, help="training prompts: a registry name or any jsonl/parquet with id, problem "
                                          "(default: the pair's)")
    a("--run-dir", default=None, help="campaign directory (default runs/<pair>)")
    a("--run-name", default=None, help="folder under train/ (default <reward>)")
    a("--steps", type=int, default=100, help="optimizer steps (capped by one pass over the data)")
    a("--batch-prompts", type=int, default=64, help="B: prompts per step (global)")
    a("--rollouts", type=int, default=4, help="n: samples per prompt")
    a("--temperature", type=float, default=1.0, help="rollout temperature")
    a("--top-p", type=float, default=1.0, help="rollout top-p")
    a("--topk", type=int, default=16, help="K of delta-topk")
    a("--lr", type=float, default=1e-6, help="AdamW learning rate, constant")
    a("--weight-decay", type=float, default=0.01, help="AdamW weight decay")
    a("--grad-clip", type=float, default=1.0, help="max global grad norm")
    a("--clip-eps", type=float, default=0.2, help="PPO clip ε")
    a("--kl-mode", default="adaptive", choices=["adaptive", "constant"], help="KL coefficient controller (SPEC §7.3)")
    a("--kl-coef", type=float, default=2.5, help="initial KL coefficient (adaptive: clamped to [0.5, 2.5])")
    a("--kl-ref", default="init", choices=["init", "none"], help="KL anchor: the student's init weights, or no KL")
    a("--reward-center", action="store_true", help="shift rewards so the batch-mean reward is non-negative")
    a("--eos-policy", default="raw", choices=["raw", "neutral", "clamp"], help="reward at the terminal stop token")
    a("--eos-floor", type=float, default=0.0, help="with --eos-policy clamp: the stop-token reward is ≥ −floor")
    a("--stop-on-collapse", action="store_true", help="stop (after saving) once the collapse watch fires")
    a("--max-prompt-len", type=int, default=None, help="prompt cap (default: the student's, SPEC §4)")
    a("--max-response-len", type=int, default=None, help="response cap (default: the student's, SPEC §4)")
    a("--drop-overlong", action="store_true", help="drop prompts over the cap (listed by id) instead of refusing")
    a("--save-every", type=int, default=20, help="checkpoint every N steps (and at the last step)")
    a("--micro-batch", type=int, default=8, help="sequences per forward/backward on each rank")
    a("--backend", default="hf", choices=["hf", "vllm"], help="rollout engine: in-process torch/hf, or colocated vLLM")
    a("--vllm-gpu-memory", type=float, default=0.3, help="vLLM's share of GPU memory when colocated")
    a("--activation-checkpointing", action="store_true", help="recompute decoder layers in backward")
    a("--compile", action="store_true", help="torch.compile each decoder layer of the student (torchtitan-style)")
    a("--scoring", default="fused-linear", choices=["fused-linear", "logits"],
      help="project hidden states tile by tile (logits never exist) or materialise logits then the kernel")
    a("--resume", action="store_true", help="continue train/<run-name>/ from its last checkpoint")
    a("--seed", type=int, default=42, help="data order and rollout seeds")
    a("--nproc", type=int, default=1, help="launch this many local processes through torchrun")
    a("--peak-tflops", type=float, default=None, help="per-device bf16 peak for MFU (default: by device name)")
    return p.parse_args(argv)


def relaunch(args, argv):
    """`python 03_opd_train.py --nproc N …` → `torchrun --nproc-per-node N 03_opd_train.py …`."""
    from torch.distributed.run import main as torchrun
    rest, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--nproc":
            skip = True
        elif not tok.startswith("--nproc="):
            rest.append(tok)
    torchrun(["--nproc-per-node", str(args.nproc), __file__, *rest])


PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}   # dense bf16, vendor datasheets


def log(d: D.Dist, msg: str):
    if d.main:
        print(msg, flush=True)


# --- data: prompts rendered under the STUDENT's template; teachers score the same ids verbatim ---

def load_prompts(args, pair, tokenizer, chat_kwargs, d):
    rows, src = registry.load_benchmark(args.train_data or pair.train_data, require_answer=False)
    rows = [rows[i] for i in np.random.default_rng(args.seed).permutation(len(rows))]   # shuffled once
    ids = [prompt_ids(tokenizer, r["problem"], **chat_kwargs) for r in rows]
    over = [(r["id"], len(x)) for r, x in zip(rows, ids) if len(x) > args.max_prompt_len]
    if over and not args.drop_overlong:
        listed = "; ".join(f"prompt {i} is {n} tokens" for i, n in over[:10])
        sys.exit(f"{len(over)} training prompts exceed the prompt cap {args.max_prompt_len} under the student's "
                 f"template: {listed}{' …' if len(over) > 10 else ''}. Raise --max-prompt-len or drop them "
                 f"explicitly with --drop-overlong (they are listed in the manifest).")
    if over:
        log(d, f"[03] dropping {len(over)} overlong prompts: {[i for i, _ in over]}")
        keep = {i for i, _ in over}
        rows, ids = zip(*[(r, x) for r, x in zip(rows, ids) if r["id"] not in keep]) if len(keep) < len(rows) else ([], [])
    return list(rows), list(ids), src, over


# --- models ---

def load_lm(path, dtype, device):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)


def frozen_scorer(path, args, d, bf16):
    m = TokenScorer(load_lm(path, torch.bfloat16 if bf16 else torch.float32, d.device),
                    fused_linear=args.scoring == "fused-linear")
    m.requires_grad_(False).eval()
    return D.shard(m, bf16=False)   # already in its compute dtype: nothing to cast


def make_engine(args, student_path, tokenizer, d, bf16):
    from lib import sampling
    if args.backend == "vllm":
        # one engine per rank, colocated with the trainer; under torchrun each rank samples its own prompts
        # (vLLM's external launcher, data parallel): verified on 1 CPU process, not on multi-GPU (no vLLM there)
        multi = dict(data_parallel_size=d.world, distributed_executor_backend="external_launcher") if d.world > 1 else {}
        return sampling.VLLMEngine(str(student_path), dtype="bfloat16" if bf16 else "float32",
                                   max_model_len=args.max_prompt_len + args.max_response_len, tokenizer=tokenizer,
                                   gpu_memory_utilization=args.vllm_gpu_memory, seed=args.seed,
                                   enable_sleep_mode=d.device.type == "cuda", **multi)
    sampler_lm = load_lm(student_path, torch.bfloat16 if bf16 else torch.float32, d.device).eval()
    return sampling.HFEngine(sampler_lm, tokenizer, batch_size=args.micro_batch * 8)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.nproc > 1 and "RANK" not in os.environ:
        return relaunch(args, argv)
    d = D.init()
    torch.manual_seed(args.seed)
    bf16 = d.device.type == "cuda"
    pair = registry.PAIRS[args.pair]
    student_name = args.student or pair.student
    sspec = registry.STUDENTS[student_name]
    args.max_prompt_len = args.max_prompt_len or sspec.max_prompt_len
    args.max_response_len = args.max_response_len or sspec.max_response_len
    run_dir = Path(args.run_dir or f"runs/{args.pair}")
    out = run_dir / "train" / (args.run_name or args.reward)
    started, t_start = wall_clock()

    # every rank resolves the same folders; rank 0 first, so a toy world is built once
    roles = {"student": sspec.model}
    if args.reward == "opd":
        roles["teacher"] = args.teacher or sspec.teacher or pair.pi_post
    else:
        roles |= {"pi_pre": pair.pi_pre, "pi_post": pair.pi_post}
    if d.main:
        resolved = {k: registry.resolve_model(v, run_dir) for k, v in roles.items()}
    torch.distributed.barrier()
    if not d.main:
        resolved = {k: registry.resolve_model(v, run_dir) for k, v in roles.items()}
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(resolved["student"].path)
    chat_kwargs = {"enable_thinking": True} if registry.model_spec(sspec.model).thinking else {}
    rows, prompts, data_src, dropped = load_prompts(args, pair, tokenizer, chat_kwargs, d)
    B, n, W = args.batch_prompts, args.rollouts, d.world
    if B % W:
        sys.exit(f"--batch-prompts {B} must be divisible by the number of processes {W}")
    steps = min(args.steps, len(rows) // B)
    if steps < args.steps:
        log(d, f"[03] one pass over {len(rows)} prompts allows {steps} steps of {B} (asked {args.steps})")

    # --- models: student (trainable, fp32 master weights), reference, teachers — all FSDP2-sharded ---
    student = TokenScorer(load_lm(resolved["student"].path, torch.float32, d.device),
                          fused_linear=args.scoring == "fused-linear")
    n_params = sum(p.numel() for p in student.parameters())
    D.shard(student, bf16=bf16, activation_checkpointing=args.activation_checkpointing, compile=args.compile)
    ref = frozen_scorer(resolved["student"].path, args, d, bf16) if args.kl_ref == "init" else None
    teachers = {k: frozen_scorer(resolved[k].path, args, d, bf16) for k in roles if k != "student"}
    optim = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    engine = make_engine(args, resolved["student"].path, tokenizer, d, bf16)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    kl = opd.KLController(coef=args.kl_coef, mode=args.kl_mode)
    watch = opd.CollapseWatch()
    start = 0
    if args.resume:
        state = D.load_resume(student, optim, out / "resume")
        start, kl.coef = state["step"], state["kl_coef"]
        watch = opd.CollapseWatch(**state["watch"])
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        if d.main:   # metrics past the checkpoint belong to the killed run: drop them, they are recomputed
            kept = [r for r in read_jsonl(out / "metrics.jsonl") if r["step"] <= start]
            atomic_write_text(out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        log(d, f"[03] resumed {out} at step {start} (kl_coef {kl.coef:.4f})")
    elif d.main and (out / "metrics.jsonl").exists():
        sys.exit(f"{out} already holds a run; pass --resume to continue it or --run-name for a new one")
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in torch.cuda.get_device_name(d.device)),
                                    None) if bf16 else args.peak_tflops
    log(d, f"[03] {args.reward} | pair {args.pair} | student {sspec.model} ({n_params / 1e6:.1f}M) | {W} process(es) "
           f"on {d.device.type} | {steps} steps × {B} prompts × {n} rollouts | caps {args.max_prompt_len}/"
           f"{args.max_response_len}")

    # --- the loop ---
    for step in range(start + 1, steps + 1):
        t0 = time.monotonic()
        if bf16:
            torch.cuda.reset_peak_memory_stats()
        lo = (step - 1) * B + d.rank * (B // W)                    # this rank's slice of the step's prompts
        mine = list(range(lo, lo + B // W))

        # 1. rollouts from the current student: weights pushed into the engine, n samples per prompt
        if args.backend == "vllm":
            engine.wake_up()
        engine.update_weights(D.full_params(student))
        from lib.sampling import sample
        req_prompts = [prompts[i] for i in mine for _ in range(n)]
        req_seeds = [stable_seed(args.seed, "rollout", rows[i]["id"], j) for i in mine for j in range(n)]
        outs = sample(engine, req_prompts, req_seeds, temperature=args.temperature, top_p=args.top_p,
                      max_new_tokens=args.max_response_len, progress=False)
        if args.backend == "vllm":
            engine.sleep()
        t_gen = time.monotonic()

        # 2. scoring, no grad: the student's own log-probs and top-K, then teachers and reference on the same ids
        K = args.topk if args.reward == "delta-topk" else 0
        mbs = []
        for c in range(0, len(outs), args.micro_batch):
            chunk = outs[c:c + args.micro_batch]
            batch = pack(req_prompts[c:c + args.micro_batch], [o.token_ids for o in chunk], pad_id).to(d.device)
            with torch.no_grad():
                lp_N, topk_ids_NK, topk_lp_NK, ent_N = student(batch, None, topk=K)
                ids_NK = batch.targets_N[:, None] if K == 0 else torch.cat([batch.targets_N[:, None], topk_ids_NK], 1)
                lp_t = {k: score_ids(m, batch, ids_NK) for k, m in teachers.items()}
                ref_N = score_ids(ref, batch, batch.targets_N[:, None])[:, 0] if ref is not None else None
            last = torch.tensor([len(o.token_ids) for o in chunk], device=d.device).cumsum(0) - 1
            is_stop_N = torch.zeros_like(lp_N, dtype=torch.bool)
            is_stop_N[last[torch.tensor([o.finish_reason == "stop" for o in chunk], device=d.device)]] = True
            sampler_N = torch.tensor([x for o in chunk for x in o.logprobs], device=d.device)
            mbs.append(dict(batch=batch, old_N=lp_N, topk_ids=topk_ids_NK, old_topk=topk_lp_NK, ent_N=ent_N,
                            lp_t=lp_t, ref_N=ref_N, is_stop_N=is_stop_N, sampler_N=sampler_N))

        # 3. rewards (SPEC §7.2); Δ on the realized token is logged for every reward
        for mb in mbs:
            if args.reward == "opd":
                mb["delta_N"] = mb["lp_t"]["teacher"][:, 0] - mb["old_N"]
                mb["adv"] = opd.opd_reward(mb["old_N"], mb["lp_t"]["teacher"][:, 0])
            else:
                dlt_NK = mb["lp_t"]["pi_post"] - mb["lp_t"]["pi_pre"]
                mb["delta_N"] = dlt_NK[:, 0]
                mb["adv"] = (opd.delta_topk_advantage(mb["old_topk"], mb["lp_t"]["pi_post"][:, 1:],
                                                      mb["lp_t"]["pi_pre"][:, 1:])
                             if K else opd.delta_sampled_reward(mb["lp_t"]["pi_post"][:, 0], mb["lp_t"]["pi_pre"][:, 0]))
        tok_reward = lambda mb: mb["adv"].sum(-1) if mb["adv"].dim() == 2 else mb["adv"]  # noqa: E731  Σ_k A_{t,k}
        n_tok, r_sum = D.all_sum(sum(len(mb["old_N"]) for mb in mbs),
                                 sum(tok_reward(mb).sum().item() for mb in mbs), device=d.device)
        reward_mean = r_sum / n_tok
        # the method's order: the adaptive coefficient moves on THIS step's reward mean before the update uses it
        kl.update(reward_mean)
        for mb in mbs:
            stop = mb["is_stop_N"] if mb["adv"].dim() == 1 else mb["is_stop_N"][:, None]
            if args.reward_center:
                mb["adv"] = opd.center_reward(mb["adv"], reward_mean, opd.topk_weights(mb["old_topk"]) if K else None)
            mb["adv"] = opd.eos_policy(mb["adv"], stop.expand_as(mb["adv"]), args.eos_policy, args.eos_floor)
        t_score = time.monotonic()

        # 4. update: PPO clipped surrogate + kl_coef · k3, token-mean over the GLOBAL batch; one optimizer step
        student.train()
        optim.zero_grad(set_to_none=True)
        sums = dict(pg=0.0, klv=0.0, clip=0.0, ppo_kl=0.0)
        for mb in mbs:
            lp_N, _, topk_lp_NK, _ = student(mb["batch"], None, topk=K)
            if K:
                pg, clipped, pkl = opd.ppo_clip_terms(topk_lp_NK, mb["old_topk"], mb["adv"], args.clip_eps)
                pg, clipped, pkl = pg.sum(-1), clipped.mean(-1), pkl.mean(-1)
            else:
                pg, clipped, pkl = opd.ppo_clip_terms(lp_N, mb["old_N"], mb["adv"], args.clip_eps)
            klv = opd.low_var_kl(lp_N, mb["ref_N"]) if ref is not None else torch.zeros_like(pg)
            # FSDP averages gradients over W ranks; × W turns that back into the global token-mean
            loss = (pg.sum() + kl.coef * klv.sum()) / n_tok * W
            loss.backward()
            sums["pg"] += pg.sum().item(); sums["klv"] += klv.sum().item()
            sums["clip"] += clipped.sum().item(); sums["ppo_kl"] += pkl.sum().item()
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.grad_clip)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        skipped = not math.isfinite(grad_norm)
        if skipped:
            optim.zero_grad(set_to_none=True)
            log(d, f"[03] step {step}: non-finite grad norm ({grad_norm}); optimizer step skipped")
        else:
            optim.step()
        student.eval()
        t_update = time.monotonic()

        # 5. metrics (SPEC §7.4): sums and extrema across ranks, then the collapse watch and the KL controller
        dl = torch.cat([mb["delta_N"] for mb in mbs])
        lens = [len(o.token_ids) for o in outs]
        s = D.all_sum(dl.sum().item(), (dl ** 2).sum().item(), (dl > 0).sum().item(), dl.abs().sum().item(),
                      sum(lens), len(lens), sum(o.finish_reason == "length" for o in outs),
                      sum(mb["ent_N"].sum().item() for mb in mbs), sums["pg"], sums["klv"], sums["clip"],
                      sums["ppo_kl"], sum((mb["sampler_N"] - mb["old_N"]).abs().sum().item() for mb in mbs),
                      sum(len(p) for p in req_prompts), device=d.device)
        mx = D.all_max(max(lens), -min(lens), device=d.device)
        dt = time.monotonic() - t0
        mean_dl = s[0] / n_tok
        m = {"step": step,
             "delta_opd/log_ratio_mean": mean_dl,
             "delta_opd/log_ratio_std": math.sqrt(max(s[1] / n_tok - mean_dl ** 2, 0.0)),
             "delta_opd/log_ratio_pos_frac": s[2] / n_tok, "delta_opd/log_ratio_abs_mean": s[3] / n_tok,
             "delta_opd/weighted_reward_mean": reward_mean,
             "response_length/mean": s[4] / s[5], "response_length/max": mx[0], "response_length/min": -mx[1],
             "response_length/clip_ratio": s[6] / s[5],
             "actor/entropy": s[7] / n_tok, "actor/pg_loss": s[8] / n_tok, "actor/kl_loss": s[9] / n_tok,
             "actor/pg_clipfrac": s[10] / n_tok, "actor/ppo_kl": s[11] / n_tok, "actor/grad_norm": grad_norm,
             "actor/kl_coef": kl.coef, "actor/skipped_step": skipped,
             "teacher/entropy_minus_ref": None,
             "rollout/logprob_gap": s[12] / n_tok,
             "timing_s/gen": t_gen - t0, "timing_s/score": t_score - t_gen, "timing_s/update": t_update - t_score,
             "timing_s/step": dt, "perf/tokens_per_s": (s[4] + s[13]) / dt,
             "perf/mfu": (6 * n_params * (s[4] + s[13]) / (t_update - t_score) / (peak * 1e12 * W)) if peak else None,
             "memory/max_allocated_gb": torch.cuda.max_memory_allocated(d.device) / 2**30 if bf16 else None}
        events = watch.update(step, m["response_length/clip_ratio"], m["response_length/mean"])
        if d.main:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(m) + "\n")
            print(f"step {step:>4}/{steps} | reward {reward_mean:+.4f} | Δ>0 {100 * m['delta_opd/log_ratio_pos_frac']:4.1f}% "
                  f"| len {m['response_length/mean']:6.1f} clip {m['response_length/clip_ratio']:.2f} | ent "
                  f"{m['actor/entropy']:.3f} | kl {m['actor/kl_loss']:.4f}×{m['actor/kl_coef']:.3f} | gn {grad_norm:.3f} "
                  f"| {dt:.1f}s (gen {m['timing_s/gen']:.1f} score {m['timing_s/score']:.1f} upd "
                  f"{m['timing_s/update']:.1f})" + "".join(f"\n  !! {e}" for e in events), flush=True)

        # 6. checkpoint: merged HF folder + resume state
        stop_now = args.stop_on_collapse and watch.collapsed
        if step % args.save_every == 0 or step == steps or stop_now:
            meta = {"run": out.name, "step": step, "pair": args.pair, "reward": args.reward,
                    "student_init": sspec.model, "campaign": run_dir.name}
            sd = D.full_state_dict(student)
            if d.main:
                D.save_hf(sd, resolved["student"].path, out / f"step_{step:06d}", D.config_dtype(resolved["student"].path), meta)
            D.save_resume(student, optim, {"step": step, "kl_coef": kl.coef, "watch": watch.__dict__,
                                           "torch_rng": torch.get_rng_state().tolist()}, out / "resume")
            log(d, f"[03] saved {out / f'step_{step:06d}'}")
        if stop_now:
            log(d, f"[03] --stop-on-collapse: collapse onset at step {watch.collapse_onset_step}; stopping")
            break

    # --- summary + manifest ---
    if d.main:
        summary = watch.summary() | {"pair": args.pair, "reward": args.reward, "student": sspec.model,
                                     "teachers": {k: resolved[k].provenance() for k in roles},
                                     "steps": steps, "last_step": step if steps else 0,
                                     "dropped_prompts": [i for i, _ in dropped]}
        atomic_write_json(out / "summary.json", summary)
        outputs = ["metrics.jsonl", "summary.json"] + sorted(p.name for p in out.glob("step_*") if p.is_dir())
        wall = time.monotonic() - t_start
        write_manifest(out, stage="03_opd_train", script=__file__, args=vars(args), inputs={"train_data": data_src},
                       outputs=outputs, started=started, wall_s=wall, gpu_s=wall * W if bf16 else 0.0,
                       extra={"world_size": W})
        print(f"[03] done: {out} | collapse watch {json.dumps(watch.summary())}")
    if args.backend != "vllm":   # vLLM tears the groups down itself at exit (destroying them first breaks that)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
