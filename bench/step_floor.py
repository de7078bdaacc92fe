"""bench/step_floor.py — each phase of a 03_opd_train step against its hardware floor, measured on the GPU that ran it.

    python bench/step_floor.py RUN/train/delta-topk/metrics.jsonl --shape qwen2.5-1.5b

(a) Measures, in this process: the bf16 matmul rate R (an 8192³ torch.mm, median of --reps timed calls after one
    warm-up) and the device copy rate C (a 2 GiB `dst.copy_(src)`, median: bytes copied per second; each copied byte
    is read once and written once, so the memory traffic rate is 2·C). --matmul-tflops / --copy-gbps skip a
    measurement and use the given number (the unit test does; so can a CPU smoke run).
(b) Reads the run's metrics.jsonl (and, beside it, manifest.json when the run finished: world size W, reward, KL
    reference, activation checkpointing; flags override) and prints one markdown table:
        phase | measured s (median of steps ≥ 3) | floor s | floor formula | % of floor
    where % of floor = floor / measured (100 % = at the floor).

Per step: T = perf/tokens (prompt + response tokens, all ranks; older metrics: perf/tokens_per_s × timing_s/step),
Tr = perf/response_tokens, S = perf/sequences, L = response_length/max, L̄ = Tr / S, p̄ = (T − Tr) / S; Ts and Tu
the tokens the scoring and the update forwards ran (perf/score_forwarded_tokens, perf/forwarded_tokens: under 03's
--share-prompts a prompt once per micro-batch it is shared in; = T without it, and in older metrics).
P = the model's parameters as 03 counts them (numel, tied embeddings once), M = models scored (the student, the
teachers, the reference), kv = 2·layers·kv_heads·head_dim·2 bytes of KV cache per token (bf16). Floors, per rank:
    sync       2·P / C                                       the student's bf16 weights copied once into the sampler
    gen        (L·2P + kv·(S/W)·(p̄·L̄ + L̄(L̄−1)/2)) / 2C     every weight and each live sequence's KV read once per
                                                             decode step (bench/RESULTS.md's rollout bound; its
                                                             bandwidth here the measured 2C instead of 4.3 TB/s)
    score      2·P·Ts·M / (W·R)                              forward only, M models
    update     c·P·Tu / (W·R),  c = 6 (8 with activation checkpointing: the forward again in backward)
    optimizer  40·P / (W·2C)                                 bytes moved per fp32 parameter: AdamW reads param,
                                                             grad, exp_avg, exp_avg_sq (16 B) and writes param and
                                                             both moments (12 B); clip_grad_norm_ reads the grad for
                                                             the norm (4 B) and scales it in place (8 B)
    step       the sum of the floors above
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("sync", "gen", "score", "update", "optimizer")


# --- (a) the device's rates ---

def _median_time(fn, reps: int, sync) -> float:
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def event_median_s(fn, reps: int = 5, warmup: int = 1) -> float:
    """Median seconds of one call of `fn`, CUDA events recorded around each on the current stream, after `warmup`
    calls (bench/source_step.py's rates, bench/swiglu_gemm.py's methods)."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def measure_rates(n: int = 8192, copy_gib: float = 2.0, reps: int = 5, device=None) -> dict:
    """{'matmul_flops': 2n³ / t of a bf16 n×n mm, 'copy_bytes_per_s': bytes / t of a copy_, median of `reps`}."""
    import torch
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t_mm = _median_time(lambda: torch.mm(a, b), reps, sync)
    a = b = None                                       # (freed before the copy buffers are taken)
    nbytes = int(copy_gib * 2**30)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    t_copy = _median_time(lambda: dst.copy_(src), reps, sync)
    return {"matmul_flops": 2 * n ** 3 / t_mm, "copy_bytes_per_s": nbytes / t_copy, "device": str(device),
            "mm_n": n, "copy_bytes": nbytes}


# --- (b) the model, the run, the floors ---

def model_info(shape_or_dir: str) -> dict:
    """{'params', 'layers', 'kv_heads', 'head_dim'} of a lib/shapes.py shape or a folder with config.json; params
    counted as 03_opd_train counts them (the meta-device model's numel, tied embeddings once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config
    from lib.shapes import SHAPES
    if shape_or_dir in SHAPES:
        cfg = dict(SHAPES[shape_or_dir])
        for k in ("architectures", "model_type", "dtype"):
            cfg.pop(k, None)
        config = Qwen2Config(**cfg)
    else:
        config = AutoConfig.from_pretrained(shape_or_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"params": sum(p.numel() for p in model.parameters()), "layers": config.num_hidden_layers,
            "kv_heads": config.num_key_value_heads, "head_dim": head_dim}


def run_settings(metrics_path: Path) -> dict:
    """world, scored models and activation checkpointing from the run's manifest.json (or resume/loop_state.json)."""
    run = Path(metrics_path).parent
    args, world = {}, None
    for f in (run / "manifest.json", run / "resume" / "loop_state.json"):
        if f.exists():
            data = json.loads(f.read_text())
            args, world = data.get("args", {}), data.get("world_size")
            break
    if not args:
        return {}
    teachers = 1 if args.get("reward") == "opd" else 2
    student = args.get("student_scores", "recompute") != "sampler"      # --student-scores sampler: no student forward
    return {"world": world, "scored_models": student + teachers + (args.get("kl_ref", "init") == "init"),
            "activation_checkpointing": bool(args.get("activation_checkpointing"))}


def step_counts(r: dict) -> dict:
    """T, Tr, S, L, Ts, Tu of one metrics row (older rows: T from tokens/s × step time, Ts = Tu = T)."""
    T = r.get("perf/tokens") or r["perf/tokens_per_s"] * r["timing_s/step"]
    S = r.get("perf/sequences")
    Tr = r.get("perf/response_tokens") or (r["response_length/mean"] * S if S else None)
    if S is None or Tr is None:
        raise KeyError("the metrics lack perf/sequences and perf/response_tokens: rerun 03 at this commit")
    return {"T": T, "Tr": Tr, "S": S, "L": r["response_length/max"],
            "Ts": r.get("perf/score_forwarded_tokens") or T, "Tu": r.get("perf/forwarded_tokens") or T}


def floors(row: dict, info: dict, rates: dict, world: int, scored_models: int, ac: bool) -> dict:
    """{phase: (floor seconds, formula)} for one step's counts (step_counts), per rank."""
    P, R, C = info["params"], rates["matmul_flops"], rates["copy_bytes_per_s"]
    T, Tr, S, L = row["T"], row["Tr"], row["S"], row["L"]
    Ts, Tu = row.get("Ts", T), row.get("Tu", T)
    kv = 2 * info["layers"] * info["kv_heads"] * info["head_dim"] * 2
    Lbar, pbar = Tr / S, (T - Tr) / S
    c = 8 if ac else 6
    out = {"sync": (2 * P / C, "2·P / C"),
           "gen": ((L * 2 * P + kv * (S / world) * (pbar * Lbar + Lbar * (Lbar - 1) / 2)) / (2 * C),
                   "(L·2P + kv·(S/W)·(p̄·L̄ + L̄(L̄−1)/2)) / 2C"),
           "score": (2 * P * Ts * scored_models / (world * R), f"2·P·Ts·{scored_models} / (W·R)"),
           "update": (c * P * Tu / (world * R), f"{c}·P·Tu / (W·R)"),
           "optimizer": (40 * P / (world * 2 * C), "40·P / (W·2C)")}
    out["step"] = (sum(v for v, _ in out.values()), "sum of the above")
    return out


def table(rows: list[dict], info: dict, rates: dict, world: int, scored_models: int, ac: bool,
          min_step: int = 3) -> tuple[str, dict]:
    """The markdown table (medians over steps ≥ min_step; all steps when there are none) and its numbers."""
    steady = [r for r in rows if r["step"] >= min_step] or rows
    counts = {k: statistics.median(step_counts(r)[k] for r in steady) for k in ("T", "Tr", "S", "L", "Ts", "Tu")}
    fl = floors(counts, info, rates, world, scored_models, ac)
    lines = ["| phase | measured s (median of steps ≥ %d) | floor s | floor formula | %% of floor |" % min_step,
             "|---|---|---|---|---|"]
    numbers = {}
    for phase in (*PHASES, "step"):
        vals = [r[f"timing_s/{phase}"] for r in steady if r.get(f"timing_s/{phase}") is not None]
        measured = statistics.median(vals) if vals else None
        floor, formula = fl[phase]
        pct = 100 * floor / measured if measured else None
        numbers[phase] = {"measured_s": measured, "floor_s": floor, "pct_of_floor": pct}
        lines.append(f"| {phase} | {'—' if measured is None else f'{measured:.3f}'} | {floor:.3f} | {formula} | "
                     f"{'—' if pct is None else f'{pct:.1f} %'} |")
    numbers["counts"] = counts
    return "\n".join(lines), numbers


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics", help="a 03_opd_train metrics.jsonl")
    p.add_argument("--shape", default="qwen2.5-1.5b", help="lib/shapes.py shape, or a model folder with config.json")
    p.add_argument("--world", type=int, default=None, help="W, processes of the run (default: its manifest, else 1)")
    p.add_argument("--scored-models", type=int, default=None,
                   help="M (default: from the manifest, else 4, or 3 under --student-scores sampler)")
    p.add_argument("--activation-checkpointing", action="store_true", default=None, help="c = 8 (default: manifest)")
    p.add_argument("--min-step", type=int, default=3, help="median over steps ≥ this")
    p.add_argument("--matmul-tflops", type=float, default=None, help="use this R instead of measuring it")
    p.add_argument("--copy-gbps", type=float, default=None, help="use this C (GB/s copied) instead of measuring it")
    p.add_argument("--mm-n", type=int, default=8192, help="matmul size n (n×n @ n×n, bf16)")
    p.add_argument("--copy-gib", type=float, default=2.0, help="GiB copied by the copy measurement")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per measurement (median)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in open(args.metrics) if line.strip()]
    if not rows:
        sys.exit(f"{args.metrics} holds no steps")
    run = run_settings(Path(args.metrics))
    world = args.world or run.get("world") or 1
    # no manifest beside the metrics (bench/device.sh copies them out): 4, or 3 where the rows show the sampler
    # recorded the student's scores (--student-scores sampler logs rollout/candidate_logprob_gap)
    scored = args.scored_models or run.get("scored_models") or (
        3 if any("rollout/candidate_logprob_gap" in r for r in rows) else 4)
    ac = args.activation_checkpointing if args.activation_checkpointing is not None else \
        run.get("activation_checkpointing", False)
    rates = {}
    if args.matmul_tflops is None or args.copy_gbps is None:
        rates = measure_rates(args.mm_n, args.copy_gib, args.reps)
    if args.matmul_tflops is not None:
        rates["matmul_flops"] = args.matmul_tflops * 1e12
    if args.copy_gbps is not None:
        rates["copy_bytes_per_s"] = args.copy_gbps * 1e9
    info = model_info(args.shape)
    text, numbers = table(rows, info, rates, world, scored, ac, args.min_step)
    c = numbers["counts"]
    print(f"R = {rates['matmul_flops'] / 1e12:.1f} TFLOP/s (bf16 mm), C = {rates['copy_bytes_per_s'] / 1e9:.1f} GB/s "
          f"copied (traffic 2C = {2 * rates['copy_bytes_per_s'] / 1e12:.2f} TB/s) | P = {info['params'] / 1e9:.3f} B "
          f"({args.shape}) | W = {world}, M = {scored}, activation checkpointing {'on' if ac else 'off'} | "
          f"T = {c['T']:.0f} tokens (forwarded: scoring {c['Ts']:.0f}, update {c['Tu']:.0f}), Tr = {c['Tr']:.0f}, "
          f"S = {c['S']:.0f}, L = {c['L']:.0f} (medians)\n")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"rates": rates, "model": info, "world": world, "scored_models": scored,
                                               "activation_checkpointing": ac, **numbers}, indent=2, default=str))


if __name__ == "__main__":
    main()
