#!/usr/bin/env bash
# See the methods learn, on a laptop: verl's GRPO, DIVA-GRPO and every toolkit method trained on the CPU from one
# supervised warm start of the tiny Qwen2-VL on the `diva-prep swatch` task (colour squares a tiny model can learn),
# with the same seed, data, steps and responses per question, validated before training and every TEST_FREQ steps;
# then `diva-report` over all of them into $OUT/report/ and the figures in $OUT/comparison.json
# (verl_ext/lab/compare.py). About 25 minutes on 2 cores for all eight methods.
#   OUT=DIR bash run_scripts/compare_tiny.sh
#   OUT=DIR METHODS="grpo diva_grpo" bash run_scripts/compare_tiny.sh     # the quick form (CI's test)
# METHODS: adv_estimator names (default: grpo diva_grpo avspo codapo durian pgpo mupo noise_contrastive_grpo; the
# first is the report's baseline). STEPS (8), TEST_FREQ (2), SEED (0), QUESTIONS (8 per step), ROLLOUT_N (4 per DIVA
# prompt; the others get twice as many per question's one prompt). WORKDIR (default $OUT/work) keeps the model,
# data and warm start. TASK: swatch (the default) or sparse (hard questions GRPO's groups never
# solve, hints that teach what the original needs; verl_ext/lab/sparse_task.py): its three properties are measured
# from the warm start and printed before training, and it refuses to train when one does not hold.
#   OUT=DIR TASK=sparse METHODS="grpo diva_grpo" bash run_scripts/compare_tiny.sh   # ~15 minutes from nothing
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
if [ -z "${OUT:-}" ]; then
  echo "error: set OUT to the output folder: OUT=outputs/compare_tiny bash run_scripts/compare_tiny.sh" >&2
  exit 2
fi
ARGS=(--out "$OUT" --task "${TASK:-swatch}" --methods "${METHODS:-grpo diva_grpo avspo codapo durian pgpo mupo noise_contrastive_grpo}"
  --steps "${STEPS:-8}" --test-freq "${TEST_FREQ:-2}" --seed "${SEED:-0}" --questions "${QUESTIONS:-8}"
  --rollout-n "${ROLLOUT_N:-4}")
if [ -n "${WORKDIR:-}" ]; then ARGS+=(--workdir "$WORKDIR"); fi
exec python -m verl_ext.lab.compare "${ARGS[@]}"
