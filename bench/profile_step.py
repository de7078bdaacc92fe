"""bench/profile_step.py — where the scoring and update phases of a 03_opd_train step spend their time, per kernel.

Builds what 03 builds at a lib/shapes.py shape, with random weights: the student (fp32 master weights, FSDP2 bf16
compute) and three frozen bf16 scorers (π_pre, π_post, the reference), each decoder layer compiled (`--compile`), and
runs 03's own step 2 → 4 functions (score_micro_batch, opd.advantages, micro_batch_loss + backward, AdamW) on S
synthetic rollouts: prompts of uniformly random length in [--prompt-min, --prompt-max] tokens (the MATH prompts under
the chat template are ~60–260), each drawn --rollouts times in a row as 03 draws them (default 1: every rollout its
own prompt, as every run before --rollouts measured), every response --resp tokens (random weights never stop). For
each variant (`--variants`: packing off|on|shared — shared is 03's --share-prompts —, scoring micro-batch sequences,
update micro-batch sequences):
  - wall seconds of score / update / optimizer, median of --reps steps after one warm-up step;
  - % of floor: score 2·P·Ts·M / R, update 6·P·Tu / R (Ts, Tu = the tokens the variant's scoring and update
    forwards run: every real token, a shared prompt once per micro-batch; M = 4 models, R = the measured bf16 matmul
    rate of bench/step_floor.py), and the update's MFU against --peak-tflops;
  - one profiled step: device time per kernel class (matmul, attention, Triton = ours + Inductor's, copies /
    elementwise, collectives, other), the largest kernels, and the device-idle share (wall − kernel time) / wall.
Packed and padded scores of the same rollouts are compared (max |Δ log-prob|, bf16).

    python bench/profile_step.py --shape qwen2.5-1.5b --out /tmp/profile.json          # GPU
    python bench/profile_step.py --shape tiny --seqs 8 --resp 16 --reps 1             # CPU smoke
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.step_floor import measure_rates                         # noqa: E402
from bench.update_phase import build                                # noqa: E402
from lib.kernels import varlen
from lib.sample.completion import Completion                        # noqa: E402
from lib.train import dist as D, opd                              # noqa: E402
from lib.train.scoring import TokenScorer, micro_batch_plan, pack, regroup  # noqa: E402

CLASSES = [("attention", ("flash", "fmha", "attention", "sdpa")), ("matmul", ("gemm", "cutlass", "nvjet", "sm90",
           "cublas", "ampere", "xmma")), ("triton", ("triton",)), ("collective", ("nccl", "all_gather", "reduce_scat")),
           ("copy/elementwise", ("copy", "memcpy", "memset", "elementwise", "vectorized", "reduce", "cat", "index",
                                 "fill", "gather", "scatter", "unrolled"))]


def load_03():
    spec = importlib.util.spec_from_file_location("opd_train_03", ROOT / "03_opd_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CLASSES if any(k in low for k in keys)), "other")


def set_packing(scorer: TokenScorer, on: bool) -> None:
    scorer.packed = on
    if on:
        varlen.use_packing(scorer.lm)
    else:
        scorer.lm.config._attn_implementation = "sdpa"


def profile_table(fn, cuda: bool, top: int = 12) -> dict:
    """Run fn once under torch.profiler: device seconds per kernel class, the `top` kernels, idle share of wall."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize() if cuda else None
        wall = time.perf_counter() - t
    per_class, per_kernel = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if cuda and ev.device_type.name != "CUDA":
            continue
        if not cuda and ev.device_type.name != "CPU":
            continue
        secs = (ev.device_time if cuda else ev.cpu_time) / 1e6
        if not cuda and ev.cpu_parent is not None:       # CPU smoke: top-level ops only
            continue
        per_class[kernel_class(ev.name)] += secs
        per_kernel[ev.name][0] += secs
        per_kernel[ev.name][1] += 1
    busy = sum(per_class.values())
    biggest = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {"wall_s": wall, "kernel_s": busy, "idle_share": max(0.0, 1 - busy / wall) if cuda else None,
            "classes_s": dict(sorted(per_class.items(), key=lambda kv: -kv[1])),
            "top": [{"name": n[:110], "s": s, "calls": c} for n, (s, c) in biggest]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--seqs", type=int, default=256, help="rollouts per step (64 prompts × 4)")
    p.add_argument("--resp", type=int, default=400)
    p.add_argument("--prompt-min", type=int, default=60)
    p.add_argument("--prompt-max", type=int, default=260)
    p.add_argument("--rollouts", type=int, default=1, help="rollouts per prompt, consecutive (03: 4)")
    p.add_argument("--topk", type=int, default=16)
    p.add_argument("--variants", default="on:64:16,on:64:32",
                   help="packing:score-seqs:update-seqs, comma-separated, packing off|on|shared (default: 03's "
                        "packing, its update micro-batch 16 and 32; off:64:16 adds the padded batches, shared:64:16 "
                        "03's --share-prompts, with --rollouts > 1)")
    p.add_argument("--reps", type=int, default=3, help="timed steps after the warm-up (median reported)")
    p.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    d = D.init()
    cuda = d.device.type == "cuda"
    comp = cuda if args.compile == "auto" else args.compile == "on"
    m03 = load_03()
    rates = measure_rates(device=d.device) if cuda else {"matmul_flops": 1e12, "copy_bytes_per_s": 1e10}
    print(json.dumps({"rates": rates}), flush=True)

    lm = build(args.shape, torch.float32, d.device)
    P = sum(x.numel() for x in lm.parameters())
    student = D.shard(TokenScorer(lm), bf16=cuda, compile=comp)
    frozen = {}
    for seed, k in enumerate(("pi_pre", "pi_post", "ref")):
        torch.manual_seed(seed + 1)
        m = TokenScorer(build(args.shape, torch.bfloat16 if cuda else torch.float32, d.device)).requires_grad_(False)
        frozen[k] = D.shard(m.eval(), bf16=False, compile=comp)
    teachers, ref = {k: frozen[k] for k in ("pi_pre", "pi_post")}, frozen["ref"]
    everyone = [student, ref, *teachers.values()]
    optim = torch.optim.AdamW(student.parameters(), lr=1e-7)
    V = lm.config.vocab_size
    g = torch.Generator().manual_seed(0)
    n_prompts = -(-args.seqs // args.rollouts)
    plens = torch.randint(args.prompt_min, args.prompt_max + 1, (n_prompts,), generator=g).tolist()
    prompts = [p for n in plens for p in [torch.randint(0, V, (n,), generator=g).tolist()] * args.rollouts]
    prompts, plens = prompts[:args.seqs], [len(p) for p in prompts[:args.seqs]]
    resp = [torch.randint(0, V, (args.resp,), generator=g).tolist() for _ in plens]
    outs = [Completion(token_ids=r, text="", logprobs=[0.0] * len(r), finish_reason="length") for r in resp]
    T = sum(plens) + args.seqs * args.resp
    lens = [len(a) + len(b) for a, b in zip(prompts, resp)]
    M = 1 + len(teachers) + 1

    def sync():
        torch.cuda.synchronize() if cuda else None

    def batch(idx, packed, shared):
        return pack([prompts[i] for i in idx], [resp[i] for i in idx], 0, packed, shared).to(d.device)

    def forwarded(packed, shared, seqs):
        """Tokens one model's forwards run over micro-batches of `seqs` sequences (a shared prompt once in each)."""
        return sum(pack([prompts[i] for i in idx], [resp[i] for i in idx], 0, packed, shared).tokens
                   for idx in micro_batch_plan(lens, seqs))

    def score_phase(packed, shared, score_seqs, upd_seqs):
        """03's steps 2-3: scoring micro-batches, regrouped into the update's, delta-topk advantages."""
        splan, uplan = micro_batch_plan(lens, score_seqs), micro_batch_plan(lens, upd_seqs)
        scored = [m03.score_micro_batch(student, teachers, ref, batch(idx, packed, shared), args.topk,
                                        [outs[i] for i in idx]) for idx in splan]
        mbs = [mb | {"batch": batch(idx, packed, shared)} for mb, idx in
               zip(regroup(scored, splan, uplan, [len(r) for r in resp], skip="batch"), uplan)]
        for mb in mbs:
            mb["adv"], _ = opd.advantages("delta-topk", mb["lp_t"], mb["old_N"], mb["old_topk"])
        sync()
        return scored, mbs

    def update_phase(mbs):
        """03's step 4 without the optimizer: forward + backward of every update micro-batch."""
        student.train()
        n_tok = sum(len(r) for r in resp)
        for mb in D.micro_batches(student, mbs):
            m03.micro_batch_loss(student, mb, 0.01, n_tok, 0.2)[0].backward()
        sync()

    def optimizer_phase():
        optim.step()
        optim.zero_grad(set_to_none=True)
        student.eval()
        sync()

    def timed(fn, *a):
        sync()
        t = time.perf_counter()
        out = fn(*a)
        return out, time.perf_counter() - t

    results = {"meta": {"shape": args.shape, "params": P, "tokens": T, "seqs": args.seqs, "resp": args.resp,
                        "prompt_range": [args.prompt_min, args.prompt_max], "models_scored": M, "compile": comp,
                        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                        "rollouts_per_prompt": args.rollouts, "rates": rates},
               "variants": []}
    first = {}
    for spec in args.variants.split(","):
        pk, ss, us = spec.split(":")
        if pk not in ("off", "on", "shared"):
            raise SystemExit(f"variant {spec!r}: packing is off, on or shared")
        packed, shared, ss, us = pk != "off", pk == "shared", int(ss), int(us)
        Ts, Tu = forwarded(packed, shared, ss), forwarded(packed, shared, us)
        score_floor, update_floor = 2 * P * Ts * M / rates["matmul_flops"], 6 * P * Tu / rates["matmul_flops"]
        for s in everyone:
            set_packing(s, packed)
        torch.cuda.reset_peak_memory_stats() if cuda else None
        scored, mbs = score_phase(packed, shared, ss, us)           # warm-up (compiles)
        update_phase(mbs)
        optimizer_phase()
        first.setdefault(pk, scored[0]["old_N"].float().cpu())
        times = []
        for _ in range(args.reps):
            (_, mbs), t_s = timed(score_phase, packed, shared, ss, us)
            _, t_u = timed(update_phase, mbs)
            _, t_o = timed(optimizer_phase)
            times.append((t_s, t_u, t_o))
        sc, up, op = (statistics.median(x) for x in zip(*times))
        row = {"variant": spec, "packing": packed, "shared_prompts": shared, "score_seqs": ss, "update_seqs": us,
               "score_tokens": Ts, "update_tokens": Tu, "score_s": sc, "update_s": up, "optimizer_s": op,
               "score_floor_s": score_floor, "update_floor_s": update_floor,
               "score_pct_of_floor": 100 * score_floor / sc, "update_pct_of_floor": 100 * update_floor / up,
               "update_mfu_pct": 100 * 6 * P * Tu / up / (args.peak_tflops * 1e12) if cuda else None,
               "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
        print(json.dumps(row), flush=True)
        if not args.no_profile:
            box = {}
            row["profile"] = {"score": profile_table(
                lambda: box.setdefault("mbs", score_phase(packed, shared, ss, us)[1]), cuda),
                              "update": profile_table(lambda: update_phase(box["mbs"]), cuda)}
            optimizer_phase()
            for phase, pr in row["profile"].items():
                print(f"  {phase}: wall {pr['wall_s']:.2f} s, kernels {pr['kernel_s']:.2f} s, idle {pr['idle_share']}"
                      f"; by class " + ", ".join(f"{k} {v:.2f}" for k, v in pr["classes_s"].items()))
                for kk in pr["top"]:
                    print(f"    {kk['s']:7.3f} s  {kk['calls']:6d}×  {kk['name']}")
        results["variants"].append(row)
    if "on" in first and "off" in first:
        results["meta"]["packed_vs_padded_max_abs_lp"] = (first["on"] - first["off"]).abs().max().item()
        print(json.dumps({"packed_vs_padded_max_abs_topk_lp": results["meta"]["packed_vs_padded_max_abs_lp"]}))
    if "on" in first and "shared" in first:
        results["meta"]["shared_vs_packed_max_abs_lp"] = (first["shared"] - first["on"]).abs().max().item()
        print(json.dumps({"shared_vs_packed_max_abs_lp": results["meta"]["shared_vs_packed_max_abs_lp"]}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
