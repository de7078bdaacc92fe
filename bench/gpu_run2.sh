#!/usr/bin/env bash
# Second device call: compiled-layer update variants, the real-shape 03_opd_train run, and the fused Gumbel sampler.
set -uo pipefail
export PYTHONUNBUFFERED=1 OPD_DATA_DIR=${OPD_DATA_DIR:-.device/data} NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "
import torch; from lib import sampling as S
z = torch.randn(64, 151936, device='cuda').double(); idx = torch.arange(151936, device='cuda').expand(64, -1)
lo, hi = S.split_seeds(list(range(64)), 'cuda')
print('fused == eager on CUDA:', all(torch.equal(S.noisy_argmax(z, idx, lo, hi, s), S.fused_noisy_argmax(z, idx, lo, hi, s)) for s in range(5)))"
echo "== 03_opd_train, real shapes ==" && timeout 240 python3 03_opd_train.py --pair shape-1.5b --run-dir /tmp/shape --reward delta-topk \
   --steps 3 --batch-prompts 16 --rollouts 4 --max-response-len 512 --micro-batch 16 --save-every 100 --drop-overlong 2>&1 | grep -v Warn | tail -6
cp /tmp/shape/train/delta-topk/metrics.jsonl "$OUT/train_metrics.jsonl" 2>/dev/null
echo "== train step ==" && timeout 200 python3 bench/train_step.py --shape qwen2.5-1.5b --batch 16 --seq 1024 --compile --out "$OUT/train_step.json" 2>&1 | grep -v Warn | grep -v warn
echo "== sampling ==" && timeout 100 python3 bench/sampling.py --shape qwen2.5-1.5b --methods hf,generate --out "$OUT/sampling.json" 2>&1 | grep -v Warn | tail -6
