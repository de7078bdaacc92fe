"""bench/toy_step.py — the toy campaign's training step on this CPU under other layouts, one after another in one run.

The toy campaign's time is its training steps (2,856 of its 3,208 logged stage-seconds on the 2-core AMD EPYC,
campaign of 379bb75), and a toy step is compute-bound on the tokens it forwards: the toy student's matmuls ran at
≈ 87 GFLOP/s on one Zen 4 core under torch's profiler, near what one core's AVX2 FMA units do. Its prompts (67-71
tokens under the chat template) are longer than its responses (≈ 20-50), so the step's cost follows how many tokens
a micro-batch forwards, which the layout decides:

    padded           --packing off --no-share-prompts: each row its prompt + response, right-padded to the
                     micro-batch's longest (the campaign's layout until 2026-12-06)
    packed           --packing on --no-share-prompts: rows end to end, no padding (attention: lib/kernels/varlen.py's
                     CPU fallback)
    shared           --packing on --share-prompts: each prompt forwarded once for its rollouts (the campaign's
                     layout since 2026-12-06)

Every variant trains the same run (same pair, seed, flags; one thread, pinned as the campaign pins it) for --steps
steps in its own folder, and the script prints the median of each phase over steps ≥ 2 (03's `timing_s/*`), the
rollout tokens a step trains on (`perf/tokens`: the same in every layout) and each variant's step time against the
first's (the variant's flags come last, so they override the campaign's own layout). The layouts are the same
arithmetic, not the same float bytes: the step-1 metrics agree to rounding (printed), later steps drift apart as any
two float paths do, so changing the campaign's layout changes every trained toy number on both CPU vendors
(bench/RESULTS.md §17 has what it measured, and the campaign that adopted shared prompts).

    python bench/toy_step.py --out /tmp/toystep                        # the collapse arm's step, 8 steps a variant
    python bench/toy_step.py --out /tmp/toystep --preset main          # the main runs' step (32 × 4, cap 48)
    python bench/toy_step.py --out /tmp/toystep --dry-run              # the 03 commands, not run

Writes OUT/toy_step.json (one row per variant: the medians, the tokens, the step-1 metrics).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from lib.cpu_repro import cpu_info, pinned_env  # noqa: E402
from nostop_probe import campaign_array  # noqa: E402

VARIANTS = {"padded": ["--packing", "off", "--no-share-prompts"], "packed": ["--packing", "on", "--no-share-prompts"],
            "shared": ["--packing", "on", "--share-prompts"]}
# the campaign's own flags, read from campaign.sh (the arm's COLLAPSE_FLAGS; the main runs' toy TRAIN_FLAGS with the
# delta-topk reward); --steps and --save-every after them override theirs
PRESETS = {"arm": lambda: campaign_array("COLLAPSE_FLAGS"),
           "main": lambda: ["--pair", "toy", "--reward", "delta-topk", *campaign_array("TRAIN_FLAGS")]}
PHASES = ("step", "gen", "score", "update", "optimizer")
STEP1 = ("delta_opd/weighted_reward_mean", "response_length/mean", "actor/grad_norm", "actor/entropy")


def command(out: Path, name: str, args) -> list[str]:
    return [sys.executable, str(REPO / "03_opd_train.py"), "--nproc", "1", *PRESETS[args.preset](),
            "--seed", str(args.seed), "--steps", str(args.steps), "--save-every", str(args.steps),
            "--run-dir", str(out / name), "--run-name", "bench", *VARIANTS[name]]


def run_variant(out: Path, name: str, args) -> dict:
    run_dir, flags, cmd = out / name, VARIANTS[name], command(out, name, args)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=pinned_env(), capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"variant {name}: 03_opd_train.py exited {p.returncode}:\n{p.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "train" / "bench" / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r["step"] >= 2] or rows
    return dict(variant=name, flags=flags, wall_s=round(wall, 1),
                median_s={ph: statistics.median(r[f"timing_s/{ph}"] for r in later) for ph in PHASES},
                tokens=statistics.median(r["perf/tokens"] for r in later),
                step1={k: rows[0].get(k) for k in STEP1})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preset", choices=sorted(PRESETS), default="arm")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=1800, help="seconds a variant may take")
    p.add_argument("--dry-run", action="store_true", help="print each variant's 03 command and stop")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be ≥ 2: the medians leave step 1 (its first-call costs) out")
    if args.dry_run:
        for v in args.variants:
            print(" ".join(command(args.out, v, args)[1:]))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if any((args.out / v).exists() for v in args.variants):
        sys.exit(f"{args.out} already holds a variant's folder: give another --out (each run must start fresh)")
    rows = [run_variant(args.out, v, args) for v in args.variants]
    base = rows[0]["median_s"]["step"]
    print(f"toy step, preset {args.preset}, seed {args.seed}, {args.steps} steps a variant; medians of steps ≥ 2 (s)")
    print(f"{'variant':8s} {'step':>6s} {'gen':>6s} {'score':>6s} {'update':>6s} {'optim':>6s} {'rollout tokens':>14s} "
          f"{'vs ' + rows[0]['variant']:>10s}   step-1 weighted reward / mean length")
    for r in rows:
        m = r["median_s"]
        print(f"{r['variant']:8s} {m['step']:6.2f} {m['gen']:6.2f} {m['score']:6.2f} {m['update']:6.2f} "
              f"{m['optimizer']:6.2f} {r['tokens']:14.0f} {m['step'] / base:9.2f}×   "
              f"{r['step1']['delta_opd/weighted_reward_mean']:+.6f} / {r['step1']['response_length/mean']:.3f}")
    meta = dict(preset=args.preset, flags=PRESETS[args.preset](), seed=args.seed, steps=args.steps,
                cpu=cpu_info(), threads=1)
    (args.out / "toy_step.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    print(f"wrote {args.out / 'toy_step.json'}")


if __name__ == "__main__":
    main()
