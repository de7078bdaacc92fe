#!/usr/bin/env bash
# One device call: the training-step benchmark, a short real-shape 03_opd_train run, and the sampling benchmark.
# Usage on the GPU machine (from the repo root): OUT=/some/dir bash bench/gpu_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 OPD_DATA_DIR=${OPD_DATA_DIR:-.device/data} NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers, triton; print(torch.__version__, transformers.__version__, triton.__version__)" | tee -a "$OUT/device.txt"
python3 -c "from lib import models as r; [r.resolve_model(m) for m in ('shape-1.5b-pre','shape-1.5b-post','shape-1.5b-student')]" 2>&1 | tail -2
echo "== train step ==" && timeout 200 python3 bench/train_step.py --shape qwen2.5-1.5b --batch 16 --seq 1024 --out "$OUT/train_step.json" 2>&1 | grep -v Warn
echo "== 03_opd_train, real shapes ==" && timeout 260 python3 03_opd_train.py --pair shape-1.5b --run-dir /tmp/shape --reward delta-topk \
   --steps 3 --batch-prompts 16 --rollouts 4 --max-response-len 512 --micro-batch 16 --save-every 100 --lr 1e-6 2>&1 | grep -v Warn | tail -8
cp /tmp/shape/train/delta-topk/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null
echo "== sampling ==" && timeout 150 python3 bench/sampling.py --shape qwen2.5-1.5b --out "$OUT/sampling.json" 2>&1 | grep -v Warn | tail -12
