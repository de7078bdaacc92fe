"""02_baselines.py — every fixed model a pair needs, on every benchmark and protocol of the pair (SPEC §2, §5).

For `--pair P`: π_pre, π_post and the initial student, each on the pair's eval list (real pairs: AIME 2024/2025 ×
sample32, MATH-500 × sample4 and greedy; the toy pair: the toy benchmark × sample4 and greedy). Each unit is made by
04_eval.py's own code, one model loaded once for all its units; finished units are skipped (hashes verified),
so a killed baseline run is resumed by running the same command again.

CPU (toy):  python 02_baselines.py --run-dir runs/toy --pair toy
GPU:        python 02_baselines.py --run-dir runs/openthinker --pair openthinker --backend vllm
"""
from __future__ import annotations

import argparse
import gc
import importlib
import sys

from lib.cpu_repro import pin_if_toy
pin_if_toy(sys.argv)  # the toy world's CPU math is pinned before torch is imported (lib/cpu_repro.py)
from lib import registry

eval04 = importlib.import_module("04_eval")   # the one implementation of an eval unit


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="campaign directory (runs/<name>)")
    p.add_argument("--pair", default="toy", choices=sorted(registry.PAIRS), help="teacher pair (SPEC §2)")
    p.add_argument("--student", default=None, help=f"student (default: the pair's); one of {sorted(registry.STUDENTS)}")
    p.add_argument("--models", default="pi_pre,pi_post,student", help="which of pi_pre,pi_post,student to evaluate")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="sampling backend")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="auto: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--batch-size", type=int, default=64, help="sequences per generate() call (hf backend)")
    p.add_argument("--limit-problems", type=int, default=None, help="probe: N evenly spaced problems per benchmark (a deviation)")
    p.add_argument("--grade-timeout", type=float, default=5.0, help="wall-clock bound per graded sample, seconds")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM's share of GPU memory")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    pair = registry.PAIRS[args.pair]
    student = registry.STUDENTS[args.student or pair.student].model
    roles = {"pi_pre": pair.pi_pre, "pi_post": pair.pi_post, "student": student}
    wanted = [r.strip() for r in args.models.split(",")]
    unknown = [r for r in wanted if r not in roles]
    if unknown:
        sys.exit(f"--models: unknown role(s) {unknown}; choose from {list(roles)}")

    for role in wanted:
        name = roles[role]
        plans = [eval04.plan_unit(args.run_dir, name, bench, proto, limit_problems=args.limit_problems,
                                  backend=args.backend, dtype=args.dtype) for bench, proto in pair.evals]
        todo = [p for p in plans if eval04.existing_state(p, skip_if_exists=True) != "done"]
        print(f"[02_baselines] {role} = {name}: {len(plans) - len(todo)} of {len(plans)} units already done")
        if not todo:
            continue
        engine, tok, n_gpu = eval04.load_engine(todo[0], args.backend, args.dtype, args.batch_size,
                                                args.gpu_memory_utilization)
        for plan in todo:
            eval04.run_unit(plan, engine, tok, script=__file__, args=vars(args) | {"role": role},
                            grade_timeout=args.grade_timeout, gpu_s_per_s=n_gpu)
        del engine
        gc.collect()


if __name__ == "__main__":
    main()
