"""bench/source_step.py — the source's step on one GPU: a Qwen2.5-7B-shaped student, its reference, two Qwen2.5-1.5B-
shaped teachers (random weights at real shapes), 64 prompts × 4 rollouts, run by 03_opd_train itself.

    python bench/source_step.py build DIR            the student's folder (random bf16 weights; see below)
    python bench/source_step.py summary METRICS DIR [--json OUT]
                                                      per-step phases, medians of steps ≥ 3, floors, H200-GPU-s

`bash bench/device.sh source-step` runs both around 03 (which builds the 1.5B teachers itself: lib/shapes.py).

The student: lib/shapes.py's qwen2.5-7b config except vocab_size 151,936 (the 1.5B's) instead of 152,064. Random
weights sample every embedding row, and ids 151,936–152,063 (padding rows a real Qwen2.5-7B never samples) would
be ids the 1.5B teachers have no row for: their log-probs NaN, and 03 stops on a non-finite loss. The 128 rows are
0.08 % of the head's columns and 0.006 % of the parameters.

summary: floors as bench/step_floor.py defines them, with the four models' own sizes (gen: the 7B student's weights and
each live sequence's KV read once per decode step at 2C; score = 2·T·ΣP / R over the models scored (the student
left out under --student-scores sampler), update
= c·P_s·T / R, c = 8 with activation checkpointing) and, for the optimizer with --offload-optimizer, the moments'
round trip over PCIe (8·P_s bytes each way at the measured pinned host↔device rate, both directions at once).
R (bf16 8192³ matmul), C (2 GiB device copy) and the pinned host→device / device→host rates are measured here.
The source: 263 A100-GPU-s a step (65.8 s on 4 × A100), ≈ 88 H200-GPU-s at the hardware ratio (issue 35).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB = 151_936
SOURCE_A100_GPU_S, SOURCE_H200_GPU_S = 263.0, 88.0
PHASES = ("sync", "gen", "score", "update", "optimizer")


def build(out: Path, seed: int = 3) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from lib import qwen_tokenizer
    from lib.shapes import SHAPES
    if (out / "config.json").exists():
        return out
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(Qwen2Config(**(SHAPES["qwen2.5-7b"] | {"vocab_size": VOCAB}))).to(torch.bfloat16)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    qwen_tokenizer.build("qwen2.5").save_pretrained(tmp)
    GenerationConfig(bos_token_id=151_643, eos_token_id=[151_645, 151_643], pad_token_id=151_643).save_pretrained(tmp)
    (tmp / "shape.json").write_text(json.dumps({"shape": "qwen2.5-7b", "vocab_size": VOCAB, "seed": seed,
                                                "note": "random weights: speed only"}))
    os.replace(tmp, out)
    return out


def n_params(path: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in lm.parameters())


def rates() -> dict:
    """R (FLOP/s), C (bytes copied/s) and the pinned H2D / D2H rates (bytes/s), medians of 5 after a warm-up."""
    import torch

    from bench.step_floor import event_median_s as timed

    x, y = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    src, dst = torch.empty(2**30, device="cuda", dtype=torch.int16), torch.empty(2**30, device="cuda",
                                                                                    dtype=torch.int16)
    src.random_()
    host = torch.empty(2**29, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(2**29, dtype=torch.float32, device="cuda")
    r = {"R": 2 * 8192**3 / timed(lambda: x @ y), "C": 2**31 / timed(lambda: dst.copy_(src)),
         "H2D": 2**31 / timed(lambda: dev.copy_(host, non_blocking=True)),
         "D2H": 2**31 / timed(lambda: host.copy_(dev, non_blocking=True))}
    up, down = torch.cuda.Stream(), torch.cuda.Stream()
    host2 = torch.empty(2**29, dtype=torch.float32, pin_memory=True)
    dev2 = torch.empty(2**29, dtype=torch.float32, device="cuda")

    def both():
        with torch.cuda.stream(up):
            dev.copy_(host, non_blocking=True)
        with torch.cuda.stream(down):
            host2.copy_(dev2, non_blocking=True)
        torch.cuda.current_stream().wait_stream(up)
        torch.cuda.current_stream().wait_stream(down)
    r["duplex"] = 2 * 2**31 / timed(both)         # bytes moved per second, both directions together
    return r


def summary(metrics: Path, student: Path, teacher: Path, offload: bool, ac: bool, out_json: Path | None):
    rows = [json.loads(line) for line in open(metrics)]
    steady = [r for r in rows if r["step"] >= 3] or rows
    med = {k: statistics.median(r[f"timing_s/{k}"] for r in steady) for k in (*PHASES, "step")}
    P_s, P_t = n_params(student), n_params(teacher)
    T = statistics.median(r["perf/tokens"] for r in steady)
    # the tokens the scoring and update forwards ran (03's --share-prompts lays a prompt out once; T without it)
    Ts, Tu = (statistics.median(r.get(k) or r["perf/tokens"] for r in steady)
              for k in ("perf/score_forwarded_tokens", "perf/forwarded_tokens"))
    rt = rates()
    c = 8 if ac else 6
    S = statistics.median(r["perf/sequences"] for r in steady)
    Tr = statistics.median(r["perf/response_tokens"] for r in steady)
    L, Lm, pm = max(r["response_length/max"] for r in steady), Tr / S, (T - Tr) / S
    kv = 2 * 28 * 4 * 128 * 2                       # bytes of bf16 KV a token at the 7B shape (28 layers, 4 KV heads)
    # the student is scored too unless the sampler recorded its scores (--student-scores sampler: its metrics carry
    # rollout/candidate_logprob_gap); the reference always
    students = 1 if any("rollout/candidate_logprob_gap" in r for r in rows) else 2
    floor = {"sync": 2 * P_s / rt["C"], "score": 2 * Ts * (students * P_s + 2 * P_t) / rt["R"],
             "gen": (L * 2 * P_s + kv * S * (pm * Lm + Lm * (Lm - 1) / 2)) / (2 * rt["C"]),
             "update": c * P_s * Tu / rt["R"],
             "optimizer": (8 * P_s * 2 / rt["duplex"]) if offload else 40 * P_s / (2 * rt["C"])}
    floor["step"] = sum(floor.values())
    print(f"student {P_s / 1e9:.3f}B, teacher {P_t / 1e9:.3f}B, T {T:.0f} tokens a step; R {rt['R'] / 1e12:.0f} "
          f"TFLOP/s, C {rt['C'] / 1e12:.2f} TB/s, pinned H2D {rt['H2D'] / 1e9:.1f} GB/s, D2H {rt['D2H'] / 1e9:.1f} "
          f"GB/s, both at once {rt['duplex'] / 1e9:.1f} GB/s")
    for r in rows:
        print(f"step {r['step']}: " + " ".join(f"{k} {r[f'timing_s/{k}']:.2f}" for k in (*PHASES, "step"))
              + f" | mfu {100 * (r.get('perf/mfu') or 0):.1f} % | peak GiB "
              + "/".join(f"{r.get(f'memory/peak_gb_{k}') or 0:.1f}" for k in PHASES)
              + f" | gap {r.get('rollout/logprob_gap')} | len {r['response_length/mean']:.0f}")
    print("| phase | s (median of steps ≥ 3) | floor s | % of floor |\n|---|---|---|---|")
    for k in (*PHASES, "step"):
        f = floor.get(k)
        print(f"| {k} | {med[k]:.2f} | {f:.3f} | {100 * f / med[k]:.1f} % |" if f else f"| {k} | {med[k]:.2f} | | |")
    print(f"H200-GPU-s a step: {med['step']:.1f} (1 GPU) against the source's {SOURCE_A100_GPU_S:.0f} A100-GPU-s "
          f"(≈ {SOURCE_H200_GPU_S:.0f} H200-GPU-s); goal ≤ 40: {'met' if med['step'] <= 40 else 'not met'}")
    if out_json:
        out_json.write_text(json.dumps({"rows": rows, "median_steps_ge_3": med, "floors": floor, "rates": rt,
                                        "P_student": P_s, "P_teacher": P_t, "T": T, "offload": offload,
                                        "activation_checkpointing": ac}, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir", type=Path)
    s = sub.add_parser("summary")
    s.add_argument("metrics", type=Path)
    s.add_argument("student", type=Path)
    s.add_argument("--teacher", type=Path, required=True)
    s.add_argument("--offload", action="store_true")
    s.add_argument("--activation-checkpointing", action="store_true")
    s.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.cmd == "build":
        print(build(a.dir))
    else:
        summary(a.metrics, a.student, a.teacher, a.offload, a.activation_checkpointing, a.json)


if __name__ == "__main__":
    main()
