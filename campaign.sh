#!/usr/bin/env bash
# campaign.sh — the whole Direct-OPD campaign, every stage in order (like nanochat's speedrun.sh).
#
#   bash campaign.sh                                   # the toy world on this CPU (the default) → runs/toy/report/
#   PAIR=openthinker NPROC=4 BACKEND=vllm bash campaign.sh                 # a real pair on 4 GPUs
#   SEEDS="42 1 2 3" JOBS=1 bash campaign.sh           # seeds per reward (toy: "42 1 2"), runs at once (toy: 2)
#   COLLAPSE_ARM=all bash campaign.sh                  # the toy's collapse arm with every fix for every seed
#                                                      # (DESIGN.md §10; default: the other five fixes for the first
#                                                      # seed only); COLLAPSE_ARM=0: without it
#   RAFT=0 bash campaign.sh                            # the toy without the RAFT teacher and its students (3 of
#                                                      # its 26 training runs); the report lists their units pending
#   TRAIN_EXTRA="--packing off --no-share-prompts" bash campaign.sh   # flags added to every training run (a
#                                                      # later value overrides the campaign's own; these two give
#                                                      # the toy's padded layout, its default until 2026-12-06)
#
# Every stage skips what is already done (finished eval units, finished training runs) and refuses files whose
# hashes no longer match their manifest, so a killed campaign is continued by running the same command again.
set -euo pipefail
cd "$(dirname "$0")"

PAIR=${PAIR:-toy}                    # a registered pair's name, or a .toml pair file (lib/pairs.py)
RUN=${RUN:-runs/$(basename "$PAIR" .toml)}
NPROC=${NPROC:-1}
BACKEND=${BACKEND:-hf}
# Training seeds per reward (the toy: three, so that a gain must hold beyond one run's noise; a real pair: one)
if [ "$PAIR" = toy ]; then SEEDS=${SEEDS:-42 1 2}; else SEEDS=${SEEDS:-42}; fi
# Training runs at once (the toy: two one-thread processes on a 2-core machine; a real pair: one, on all GPUs)
if [ "$PAIR" = toy ]; then JOBS=${JOBS:-2}; else JOBS=${JOBS:-1}; fi
TRAIN_EXTRA=${TRAIN_EXTRA:-}          # 03 flags for every training run, split on spaces (none may hold one)
export PYTHONUNBUFFERED=1

# one campaign per run dir: a flock held (by this shell and every stage it starts) until the campaign ends
mkdir -p "$RUN"
exec 9>>"$RUN/.campaign.lock"
if ! flock -n 9; then
  echo "$RUN is in use by another campaign (pid $(cat "$RUN/.campaign.lock")); wait for it or stop it, then rerun" >&2
  exit 1
fi
echo $$ > "$RUN/.campaign.lock"

# A TERM or INT (kill <pid>, Ctrl-C) ends the stages this campaign started, not only this shell: every descendant is
# sent TERM (a stage left running would hold its run lock as an orphan). Stages run in the background and are waited
# for, so that the trap runs at once (bash defers a trap until a foreground command ends).
descendants() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done; }
on_signal() {
  trap - TERM INT
  echo "campaign.sh: stopped by a signal; ending its stages" >&2
  # shellcheck disable=SC2046  (one pid per word)
  kill -TERM $(descendants $$) 2>/dev/null || true
  wait || true
  exit 143
}
trap on_signal TERM INT
run() { "$@" & wait $!; }
STARTED=()
spawn() {   # NAME CMD…: CMD in the background once fewer than JOBS run, its output in $RUN/logs/NAME.log (JOBS 1: here)
  local NAME=$1; shift
  if [ "$JOBS" -le 1 ]; then run "$@"; return; fi
  mkdir -p "$RUN/logs"
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
  echo "   $NAME: started at $(date +%T) (log: $RUN/logs/$NAME.log)"
  "$@" > "$RUN/logs/$NAME.log" 2>&1 &
  STARTED+=("$!:$NAME")
}
wait_all() {   # [FAILED]: every spawned run waited for; a failed one (or FAILED, already) stops the campaign after them
  local JOB NAME FAILED=${1:-}
  for JOB in "${STARTED[@]}"; do
    if wait "${JOB%%:*}"; then echo "   ${JOB#*:}: done"; else FAILED="$FAILED ${JOB#*:}"; fi
  done
  STARTED=()
  if [ -n "$FAILED" ]; then
    for NAME in $FAILED; do echo "$NAME failed: see $RUN/logs/$NAME.log" >&2; done
    exit 1
  fi
}
wait_job() {   # NAME: one spawned run waited for (JOBS 1: it already ran); if it failed, the others, then the exit
  local I JOB
  for I in "${!STARTED[@]}"; do
    JOB=${STARTED[$I]}
    [ "${JOB#*:}" = "$1" ] || continue
    unset "STARTED[$I]"
    if wait "${JOB%%:*}"; then echo "   $1: done"; else wait_all "$1"; fi
  done
}

if [ "$PAIR" = toy ]; then
  # The toy models are tiny and start far from the teacher: a larger learning rate, and fewer, smaller steps (one
  # pass over the 1,440 toy training prompts). Each prompt is forwarded once for its rollouts (--share-prompts, in
  # packed micro-batches): a toy prompt is longer than its responses, so this takes 21-31 % off a toy step and 15 %
  # off the campaign on the Zen 4 EPYC, every verdict the same in six seeds there (bench/RESULTS.md §17; on a GPU
  # host running the Xeon world, every verdict but the arm's collapse with its previous π_post, §15). Everything else is
  # DESIGN.md §7's default.
  TRAIN_FLAGS=(--steps 45 --batch-prompts 32 --lr 2e-4 --save-every 15 --micro-batch 32 --packing on --share-prompts)
  CKPT_EVALS="toy:sample4"
  # RAFT of the toy student (DESIGN.md §9: toy π_pre's own samples hold nothing it does not already write): gate G1
  # at 500 kept samples (1,109 of the 1,440 prompts keep one), a toy learning rate, fp32 compute (bf16 autocast is
  # emulated on the pinned AVX2 path: 8 min 13 s for the SFT instead of 1 min 1 s)
  RAFT_PAIR=toy-raft
  RAFT_FLAGS=(--sample-batch 256 --g1-min 500 --lr 3e-4 --micro-batch 16 --no-bf16)
  if [ "${RAFT:-1}" = 0 ]; then RAFT_PAIR=""; fi   # RAFT=0: the report lists the RAFT units as pending
else
  TRAIN_FLAGS=()
  CKPT_EVALS="aime24:curve8 aime25:curve8 math500:sample4"
  RAFT_PAIR=""           # the real RAFT teacher is its own campaign: PAIR=raft (07_raft.py runs first, see README)
  RAFT_FLAGS=()
fi

echo "== 0. the toy world (cached by a hash of its code; checked against the committed lib/toy/world.sha256) =="
if [ "$PAIR" = toy ]; then
  run python -c "from lib.toy import builder; print(builder.build()); print(builder.check_expected(builder.world())[1])"
fi

if [ "$PAIR" = raft ]; then   # the pair's π_post IS the RAFT teacher: make it before anything reads it
  echo "== 7. RAFT teacher (π_post of this pair) =="
  run python 07_raft.py --run-dir "$RUN" --pair raft --backend "$BACKEND" --nproc "$NPROC"
fi

echo "== 1. gates: tokenizers, prompt lengths, context, templates, shift anatomy (exits non-zero on a FAIL) =="
run python 01_gates.py --run-dir "$RUN" --pair "$PAIR" --backend "$BACKEND"

# From here on every stage's unit of work (the baselines, the RAFT teacher, each training run with its evals) is one
# job of a single pool of JOBS processes, so that no core idles while a phase's last run finishes. The only order the
# work needs is the RAFT teacher before its students, so the teacher starts first; then the 45-step runs, then the
# collapse arm's 40- and 20-step ones (the longer jobs first, so that a short one ends the pool). Each job's output is
# in $RUN/logs/<job>.log.
echo "== 2. baselines: π_pre, π_post and the initial student on every benchmark and protocol =="
spawn baselines python 02_baselines.py --run-dir "$RUN" --pair "$PAIR" --backend "$BACKEND"

if [ -n "$RAFT_PAIR" ]; then
  echo "== 7. RAFT teacher: π_pre's own verified samples, SFT, probes; then its eval units (gate G2 in 05) =="
  raft_teacher() {
    python 07_raft.py --run-dir "$RUN" --pair "$RAFT_PAIR" --backend "$BACKEND" "${RAFT_FLAGS[@]}"
    python 02_baselines.py --run-dir "$RUN" --pair "$RAFT_PAIR" --models pi_post --backend "$BACKEND"
  }
  spawn raft-teacher raft_teacher
fi

echo "== 3. training: classic OPD from the stronger teacher, then Direct-OPD with both rewards, each for every seed =="
# Seed 42's run is train/<reward> with every checkpoint evaluated (the curves); another seed S's is
# train/<reward>-seed<S>, its last checkpoint evaluated: the per-seed and pooled gains of the report.
run_name() { local NAME=$1; [ "$2" = 42 ] || NAME="$1-seed$2"; echo "$NAME"; }   # BASE SEED → the run's name
train_and_eval() {   # TRAIN_PAIR REWARD SEED BASE: one training run, train/BASE[-seed<S>], then its checkpoints' evals
  local TRAIN_PAIR=$1 REWARD=$2 SEED=$3 NAME OUT CKPTS CKPT EVAL
  NAME=$(run_name "$4" "$SEED")
  OUT="$RUN/train/$NAME"
  if [ -f "$OUT/manifest.json" ]; then
    echo "$OUT is finished: skipped"
  else
    # the same command starts, continues (from the last complete checkpoint) or seals a killed run
    # shellcheck disable=SC2086  (TRAIN_EXTRA: flags split on spaces, none holds one)
    python 03_opd_train.py --nproc "$NPROC" --pair "$TRAIN_PAIR" --run-dir "$RUN" --reward "$REWARD" --seed "$SEED" \
      --run-name "$NAME" "${TRAIN_FLAGS[@]}" $TRAIN_EXTRA
  fi
  echo "== 4. evaluating the $NAME checkpoints =="
  mapfile -t CKPTS < <(ls -d "$OUT"/step_*/ | sort -V)        # one path a line: a run dir may hold spaces
  [ "$SEED" = 42 ] || CKPTS=("${CKPTS[@]: -1}")
  for CKPT in "${CKPTS[@]}"; do
    for EVAL in $CKPT_EVALS; do
      python 04_eval.py --run-dir "$RUN" --model "$CKPT" --benchmark "${EVAL%%:*}" --protocol "${EVAL##*:}" \
        --backend "$BACKEND" --skip-if-exists
    done
  done
}
for REWARD in opd delta-sampled delta-topk; do
  for SEED in $SEEDS; do
    spawn "$(run_name "$REWARD" "$SEED")" train_and_eval "$PAIR" "$REWARD" "$SEED" "$REWARD"
  done
done

if [ -n "$RAFT_PAIR" ]; then
  echo "== 3b. the RAFT student: Direct-OPD (delta-topk) on the RAFT pair, every seed (DESIGN.md §9, source §18) =="
  wait_job raft-teacher
  for SEED in $SEEDS; do
    spawn "$(run_name delta-topk-raft "$SEED")" train_and_eval "$RAFT_PAIR" delta-topk "$SEED" delta-topk-raft
  done
fi

COLLAPSE_ARM=${COLLAPSE_ARM:-default}
if [ "$PAIR" = toy ] && [ "$COLLAPSE_ARM" != 0 ]; then
  echo "== 3c. the collapse arm: Direct-OPD on toy-collapse (π_post has unlearned its stop token), raw and fixes =="
  # DESIGN.md §10. By default the raw condition and the two zero-stop-reward fixes (--eos-policy neutral, the method's
  # terminal form, and neutral-all, ours, for every top-K candidate) for every seed, and the other five fixes for the
  # first seed only (14 runs): enough for the report to say which fixes did not prevent the collapse, within the
  # campaign's time; COLLAPSE_ARM=all runs every fix for every seed (24 runs). One run name per condition and seed;
  # 05 pools only runs of identical settings (lib/report/conditions.py). The learning rates are lib/registry.py's
  # TOY_COLLAPSE_LR / TOY_COLLAPSE_LOW_LR (its hypotheses select the conditions by them); the caps are the student
  # toy-long's (64 response tokens). 20 steps of 16 prompts × 4 at lr 7.5e-4. With the arm's π_post now (world
  # 4208b47b5c8c6571: π_pre with its stop token's mass moved, going on priced ≈ 0) every raw seed collapsed on both
  # CPU vendors (onsets 4 / 5 / 5 on the AMD EPYC, 3 / 4 / 3 on a 2-core Intel Xeon), neutral-all held
  # every seed (peak clip 0.000) and every other fix's onset came by step 9 (DESIGN.md §10). Those runs went 40 steps
  # (80 at low lr), which the campaign ran until 2bf4eb5; a run's first 20 steps are the same bytes whatever --steps
  # says (constant lr, one data order), so halving the arm changed no onset and no verdict, only the cost: the
  # collapsed runs wrote 64-token rollouts for 36 of their 40 steps. The low-lr condition is the source's H5, 5×
  # lower, run twice as long (40 steps; its onsets were 14 on the EPYC and 10 on the Xeon).
  # The raw and low-lr conditions' last checkpoints are evaluated: how often the collapsed student's samples, truncated
  # ones included, still reach its answer (the report's §5.3 "reached %").
  COLLAPSE_FLAGS=(--pair toy-collapse --reward delta-topk --steps 20 --batch-prompts 16 --lr 7.5e-4 --save-every 20
                  --micro-batch 32 --packing on --share-prompts)
  COLLAPSE_CONDITIONS=(   # name: the flags added to COLLAPSE_FLAGS (a later --lr or --steps overrides the first)
    "raw:"
    "eos-neutral:--eos-policy neutral"
    "eos-neutral-all:--eos-policy neutral-all"
  )
  OTHER_FIXES=(          # low-lr last: the arm's longest run, started first below
    "eos-clamp:--eos-policy clamp"
    "center:--reward-center"
    "stop-on-collapse:--stop-on-collapse"
    "kl-max:--kl-mode constant --kl-coef 2.5"
    "low-lr:--lr 1.5e-4 --steps 40"
  )
  read -ra FIRST_SEED <<< "$SEEDS"   # the default runs the other fixes for ${FIRST_SEED[0]} only
  OTHER_SEEDS=${FIRST_SEED[0]}
  [ "$COLLAPSE_ARM" = all ] && OTHER_SEEDS=$SEEDS
  collapse_run() {   # CONDITION SEED: one run, train/collapse-<condition>[-seed<S>]; a raw or low-lr run's last
                     # checkpoint evaluated
    local COND=${1%%:*} FLAGS=${1#*:} SEED=$2 NAME OUT CKPT
    NAME=$(run_name "collapse-$COND" "$SEED")
    OUT="$RUN/train/$NAME"
    if [ -f "$OUT/manifest.json" ]; then
      echo "$OUT is finished: skipped"
    else
      # shellcheck disable=SC2086  (FLAGS: flags split on spaces, none holds one)
      python 03_opd_train.py --nproc "$NPROC" --run-dir "$RUN" --seed "$SEED" --run-name "$NAME" \
        "${COLLAPSE_FLAGS[@]}" $FLAGS $TRAIN_EXTRA
    fi
    if [ "$COND" = raw ] || [ "$COND" = low-lr ]; then
      CKPT=$(ls -d "$OUT"/step_*/ | sort -V | tail -n 1)
      python 04_eval.py --run-dir "$RUN" --model "$CKPT" --benchmark toy --protocol sample4 --backend "$BACKEND" \
        --skip-if-exists
    fi
  }
  spawn_conditions() {   # SEEDS CONDITION…: each condition's run for each seed
    local CSEEDS=$1 CONDITION SEED; shift
    for CONDITION in "$@"; do
      for SEED in $CSEEDS; do
        spawn "$(run_name "collapse-${CONDITION%%:*}" "$SEED")" collapse_run "$CONDITION" "$SEED"
      done
    done
  }
  # low-lr (OTHER_FIXES' last) first: its 40 steps make it the arm's longest job
  spawn_conditions "$OTHER_SEEDS" "${OTHER_FIXES[-1]}"
  spawn_conditions "$SEEDS" "${COLLAPSE_CONDITIONS[@]}"
  spawn_conditions "$OTHER_SEEDS" "${OTHER_FIXES[@]:0:${#OTHER_FIXES[@]}-1}"
fi
wait_all

echo "== 1b. cross-pair anatomy: every pair of this student scored on one frozen set of its rollouts (DESIGN.md §8.5) =="
run python 01_gates.py --run-dir "$RUN" --pair "$PAIR" --gates anatomy_cross --backend "$BACKEND"

echo "== 5. statistics =="
run python 05_stats.py --run-dir "$RUN" --pair "$PAIR"
echo "== 6. report =="
run python 06_report.py --run-dir "$RUN"
echo "done in $((SECONDS / 60)) min $((SECONDS % 60)) s: $RUN/report/README.md"
