#!/usr/bin/env bash
# Seventh device call (issue 15): the split-K attention's tilings, the persistent grid among them, at the 1.5B and
# 7B heads; the best non-default one and Inductor's max-autotune in one decode step's profile and in the rollouts.
#   OUT=… bash bench/h200_run7.sh          (prints the choice it made; rows under $OUT)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
quiet() { grep -v -i "warn"; }
echo "== attention, 1.5B heads ==" && timeout 240 python3 bench/decode_attn.py --out "$OUT/attn_15b.json" 2>&1 | quiet | grep "==\|error"
echo "== attention, 7B heads ==" && timeout 120 python3 bench/decode_attn.py --heads 28:4:128 --cases 64:1536:1024,256:1536:1024 \
  --tilings c64b64w4,c64b64w4s1,c64b64w4p2,c64b64w4p4,c64b64w4p8,c128b64w4p2,c128b64w4p4,c128b128w8p2,c256b64w4s3p2 \
  --out "$OUT/attn_7b.json" 2>&1 | quiet | grep "==\|error"
BEST=$(python3 - "$OUT/attn_15b.json" <<'PY'
import json, sys
from collections import defaultdict
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "us" in r and r["S"] == 64]
tot, n = defaultdict(float), defaultdict(int)
for r in rows:
    tot[r["tiling"]] += r["us"]; n[r["tiling"]] += 1
full = [t for t in tot if n[t] == max(n.values())]
for t in sorted(full, key=tot.get):
    print(f"{t:>16} {tot[t]:8.2f} µs (S = 64 cases summed)", file=sys.stderr)
print(min((t for t in full if t != "c64b64w4"), key=tot.get))
PY
)
echo "== chosen tiling: $BEST =="
echo "== profile ==" && timeout 200 python3 bench/decode_profile.py --shape qwen2.5-1.5b --batch 64 --at 1024 \
  --variants "ours,$BEST,autotune" --out "$OUT/profile_b64.json" 2>&1 | quiet | grep -v "^ \+[0-9.]\+ µs" | tail -40
echo "== rollouts ==" && timeout 240 python3 bench/rollout.py --shapes qwen2.5-1.5b --methods "ours,ours@$BEST,ours_autotune" \
  --batches 64 --lengths 256+400,512+1024 --out "$OUT/rollout.jsonl" 2>&1 | quiet | grep '"method"' | \
  python3 -c "import json,sys; [print(r['P'],r['N'],r['B'],r['method'],r.get('tokens_per_s'),r.get('pct_of_bound'),r.get('error','')) for r in map(json.loads,sys.stdin)]"
