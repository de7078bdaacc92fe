#!/usr/bin/env bash
# Seventh run, calls with vLLM installed (issue 15): this tree against an older one (.h7/old, from `git archive`),
# side by side with vLLM in the same call. PART=3: on-device checks, the decode step's profile old/new, the 1.5B
# rollouts old/new/vLLM. PART=4: the 1.5B rollouts again (new, vLLM, old) and the 7B shape (new, vLLM).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; OLD=${OLD:-.h7/old}
rows() { grep '"method"' | python3 -c "
import json, sys
for r in map(json.loads, sys.stdin):
    print(*(r.get(k) for k in ('shape', 'P', 'N', 'B', 'method')), r.get('tokens_per_s'), r.get('pct_of_bound'), r.get('error', ''))"; }
S15=${S15:-qwen2.5-1.5b}; S7=${S7:-qwen2.5-7b}   # tiny for a CPU smoke run of this script
R15=${R15:-"--shapes $S15 --batches 64,256 --lengths 256+400,512+1024"}
if [ "${PART:-3}" = 3 ]; then
  echo "== checks, new ==" && timeout 150 python3 bench/rollout.py --shapes $S15 --batches 8 --lengths 16+8 \
    --methods ours --check 2>&1 | grep -i "check\|gap\|false\|error" | head -20
  for t in new old; do
    d=.; [ $t = old ] && d=$OLD
    echo "== profile, $t ==" && (cd $d && timeout 120 python3 bench/decode_profile.py --shape $S15 --batch ${PB:-64} \
      --at ${PAT:-1024} --prompt ${PP:-512} --variants ours --out "$OUT/profile_$t.json" 2>&1 | grep "^==\|classes")
  done
  echo "== rollouts B: new + vLLM ==" && timeout 240 python3 bench/rollout.py $R15 --methods ours,vllm --out "$OUT/rollout_B.jsonl" 2>&1 | rows
  echo "== rollouts B: old ==" && (cd $OLD && timeout 100 python3 bench/rollout.py $R15 --methods ours --out "$OUT/rollout_B_old.jsonl" 2>&1 | rows)
else
  echo "== rollouts C: old ==" && (cd $OLD && timeout 100 python3 bench/rollout.py $R15 --methods ours --out "$OUT/rollout_C_old.jsonl" 2>&1 | rows)
  echo "== rollouts C: new + vLLM ==" && timeout 240 python3 bench/rollout.py $R15 --methods ours,vllm --out "$OUT/rollout_C.jsonl" 2>&1 | rows
  echo "== 7B: new + vLLM ==" && timeout 220 python3 bench/rollout.py --shapes $S7 --batches 64,256 --lengths 512+1024 \
    --methods ours,vllm --out "$OUT/rollout_7b.jsonl" 2>&1 | rows
fi
