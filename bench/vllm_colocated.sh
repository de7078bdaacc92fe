#!/usr/bin/env bash
# Colocated vLLM on one GPU (issue: the loop must survive every step). Run on the GPU machine, from the repo root,
# with vLLM importable (see bench/RESULTS.md for how it was installed offline):
#   OUT=/some/dir STEPS=20 [GAP_EVERY=4] [EXTRA="--no-vllm-sleep …"] [PROBE=calls.jsonl] bash bench/vllm_colocated.sh
# (PROBE: the engine's wake / push / generate / sleep calls timed by bench/colocated_probe.py, medians printed;
#  PROBE_CPROFILE=n also profiles the n-th LLM.generate call; PROBE_LLM_KWARGS='{"enable_prefix_caching": false}'
#  hands the engine's LLM(...) more keywords)
# Trains STEPS steps of delta-topk at random Qwen2.5-1.5B shapes (64 prompts × 4 rollouts × 400 new tokens) with
# --backend vllm, then checks: exit status 0 (no OOM), every step logged, rollout/logprob_gap steady (a missed weight
# push would make it jump: the engine would sample from stale weights), and the process gone within 30 s of its
# last step. Writes $OUT/vllm_metrics.jsonl and $OUT/vllm_train.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 VLLM_USE_FLASHINFER_SAMPLER=0 OPD_DATA_DIR=${OPD_DATA_DIR:-.device/data}
OUT=${OUT:-/tmp/out}; STEPS=${STEPS:-20}; mkdir -p "$OUT"
RUN=/tmp/vllm-colocated; rm -rf "$RUN"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
M="$RUN/train/delta-topk/metrics.jsonl"
( while sleep 5; do cp "$M" "$OUT/vllm_metrics.jsonl" 2>/dev/null; done ) & COPIER=$!
# every output line stamped with its time: the exit is measured from the stage's last line ("[03] done: …")
LAUNCH=(python3); [ -n "${PROBE:-}" ] && rm -f "$PROBE" && LAUNCH=(python3 bench/colocated_probe.py "$PROBE")
timeout "${LIMIT:-540}" "${LAUNCH[@]}" 03_opd_train.py --pair shape-1.5b --run-dir "$RUN" --reward delta-topk --steps "$STEPS" \
  --batch-prompts 64 --rollouts 4 --max-response-len 400 --micro-batch 16 --compile --backend vllm \
  --gpu-memory-utilization 0.3 --logprob-gap-every "${GAP_EVERY:-4}" ${EXTRA:-} --save-every 1000 --lr 1e-6 --drop-overlong 2>&1 | grep --line-buffered -v Warn \
  | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done | tee "$OUT/vllm_train.log"
rc=${PIPESTATUS[0]}; t_exit=$(date +%s.%N); kill $COPIER 2>/dev/null
cp "$M" "$OUT/vllm_metrics.jsonl" 2>/dev/null
t_last=$(tail -n 1 "$OUT/vllm_train.log" | cut -d' ' -f1)
python3 - "$M" "$STEPS" "$rc" "$t_exit" "${t_last:-0}" <<'PY'
import json, os, statistics, sys
path, steps, rc, t_exit, t_last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
gap = [r["rollout/logprob_gap"] for r in rows]
keys = ["timing_s/sync", "timing_s/gen", "timing_s/score", "timing_s/update", "timing_s/optimizer", "timing_s/step",
        "perf/mfu", "perf/gc_s_sync", "perf/gc_s_gen", "memory/peak_gb_gen", "memory/peak_gb_score", "memory/peak_gb_update", "memory/peak_gb_optimizer"]
for r in rows:
    print(f"step {r['step']:>3} " + " ".join(f"{k.split('/')[1]} {r[k]:.2f}" for k in keys if r.get(k) is not None)
          + f" gap {r['rollout/logprob_gap']:.4f}")
steady = rows[2:] or rows
med = {k: statistics.median(r[k] for r in steady) for k in keys if steady and steady[0].get(k) is not None}
print("median over steps 3..:", json.dumps({k: round(v, 3) for k, v in med.items()}))
killed = f", killed by LIMIT={os.environ.get('LIMIT', 540)} s: raise it" if rc in (124, 137) else ""
checks = {f"exit status 0 (no OOM; rc {rc}{killed})": rc == 0, f"{steps} steps logged": len(rows) == steps,
          "logprob gap steady (max <= 3 x median)": bool(gap) and max(gap) <= 3 * statistics.median(gap),
          "exited within 30 s of its last line": t_last > 0 and t_exit - t_last <= 30}
for k, v in checks.items():
    print(("PASS " if v else "FAIL ") + k)
print(f"exit {t_exit - t_last:.1f} s after the last line")
probe = os.environ.get("PROBE")
if probe and os.path.exists(probe):
    calls = {}
    for c in map(json.loads, open(probe)):
        calls.setdefault(c["call"], []).append(c)
    for name, cs in calls.items():
        late = cs[2:] or cs
        print(f"probe {name}: n {len(cs)}, median {statistics.median(c['seconds'] for c in late):.3f} s "
              f"[{min(c['seconds'] for c in late):.3f}, {max(c['seconds'] for c in late):.3f}], "
              f"gc median {statistics.median(c['gc_s'] for c in late):.3f} s, thread CPU median "
              f"{statistics.median(c.get('cpu_s', 0) for c in late):.3f} s (calls 3..)")
    profiled = int(os.environ.get("PROBE_CPROFILE", "0"))
    for i, c in enumerate(calls.get("llm.generate", []), 1):   # does vLLM's pace follow the host's speed?
        print(f"llm.generate {i}: {c['seconds']:.3f} s, host_ms {c.get('host_ms', 0):.1f}, thread CPU "
              f"{c.get('cpu_s', 0):.2f} s, process CPU {c.get('proc_cpu_s', 0):.2f} s, host busy "
              f"{c.get('host_busy', 0):.3f}, steal {c.get('steal_s', 0):.2f} s" + (" (cProfiled)" if i == profiled else ""))
    late = [c for i, c in enumerate(calls.get("llm.generate", []), 1) if i > 2 and i != profiled]
    if len(late) > 2 and len({c.get("host_ms") for c in late}) > 1:
        print(f"corr(seconds, host_ms) over calls 3.. (the cProfiled one left out): "
              f"{statistics.correlation([c['seconds'] for c in late], [c['host_ms'] for c in late]):.2f}")
sys.exit(0 if all(checks.values()) else 1)
PY
