"""02_baselines.py — every fixed model a pair needs, on every benchmark and protocol of the pair (DESIGN.md §2, §5).

For `--pair P`: π_pre, π_post and the initial student, each on the pair's eval list (real pairs: AIME 2024/2025 ×
sample32, MATH-500 × sample4 and greedy; the toy pair: the toy benchmark × sample4 and greedy). Each unit is one
run of 04_eval.py as its own process (the stage contract: this script imports no other stage); 04's
`--skip-if-exists` leaves finished units untouched (hashes verified), so a killed baseline run is resumed by running
the same command again. Each unit loads its model afresh: on a real pair that is one engine start per unit.

CPU (toy):  python 02_baselines.py --run-dir runs/toy --pair toy
GPU:        python 02_baselines.py --run-dir runs/openthinker --pair openthinker --backend vllm
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lib.cli import ArgumentParser, HelpFormatter, fraction, positive_float, positive_int
from lib import models, pairs, registry

EVAL = Path(__file__).resolve().parent / "04_eval.py"      # the one implementation of an eval unit


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--run-dir", required=True, help="campaign directory (runs/<name>)")
    pairs.add_arguments(p.add_argument)
    p.add_argument("--student", default=None, help=f"student (default: the pair's); one of {sorted(registry.STUDENTS)}")
    p.add_argument("--models", default="pi_pre,pi_post,student", help="which of pi_pre,pi_post,student to evaluate")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="sampling backend")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto: fp32 on CPU, bf16 on CUDA")
    p.add_argument("--sample-batch", type=positive_int, default=64, help="sequences per generate() call (hf backend)")
    p.add_argument("--limit-problems", type=positive_int, default=None,
                   help="probe: N evenly spaced problems per benchmark (a deviation)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="probe: token cap of every unit instead of each model's own (a deviation); a model whose "
                        "context cannot hold its own cap needs it")
    p.add_argument("--grade-timeout", type=positive_float, default=5.0,
                   help="CPU-seconds bound per graded sample (04_eval.py's; another than the default joins each "
                        "unit's identity)")
    p.add_argument("--gpu-memory-utilization", type=fraction, default=0.85, help="vLLM's share of GPU memory")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    lp = pairs.from_args(args)
    pair = lp.pair
    student = (models.student_spec(args.student) if args.student else lp.student).model
    roles = {"pi_pre": pair.pi_pre, "pi_post": pair.pi_post, "student": student}
    wanted = [r.strip() for r in args.models.split(",")]
    unknown = [r for r in wanted if r not in roles]
    if unknown:
        sys.exit(f"--models: unknown role(s) {unknown}; choose from {list(roles)}")

    for role in wanted:
        name = roles[role]
        print(f"[02_baselines] {role} = {name}: {len(pair.evals)} units", flush=True)
        for bench, proto in pair.evals:
            cmd = [sys.executable, str(EVAL), "--run-dir", str(args.run_dir), "--model", name, "--benchmark", bench,
                   "--protocol", proto, "--backend", args.backend, "--dtype", args.dtype, "--sample-batch",
                   str(args.sample_batch), "--grade-timeout", str(args.grade_timeout), "--gpu-memory-utilization",
                   str(args.gpu_memory_utilization), "--skip-if-exists"]
            if args.limit_problems is not None:
                cmd += ["--limit-problems", str(args.limit_problems)]
            if args.max_new_tokens is not None:
                cmd += ["--max-new-tokens", str(args.max_new_tokens)]
            if lp.file is not None:                       # its declared models and benchmarks
                cmd += ["--pair", lp.file]
            if subprocess.run(cmd).returncode:
                sys.exit(f"[02_baselines] 04_eval.py failed on {name} × {bench} × {proto}; rerun it alone to see "
                         f"why: {' '.join(cmd[1:])}")


if __name__ == "__main__":
    main()
