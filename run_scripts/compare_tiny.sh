#!/usr/bin/env bash
# See the methods learn, on a laptop: verl's GRPO, DIVA-GRPO and every toolkit method trained on the CPU from one
# supervised warm start of the tiny Qwen2-VL on the `diva-prep swatch` task (colour squares a tiny model can learn),
# with the same seed, data, steps and responses per question, validated before training and every TEST_FREQ steps;
# then `diva-report` over all of them into $OUT/report/ and the figures in $OUT/comparison.json
# (verl_ext/cpu/compare.py). About 30 minutes on 2 cores for all seven methods.
#   OUT=DIR bash run_scripts/compare_tiny.sh
#   OUT=DIR METHODS="grpo diva_grpo" STEPS=8 bash run_scripts/compare_tiny.sh     # a quick look
# METHODS: adv_estimator names (default: grpo diva_grpo avspo codapo durian pgpo mupo; the first is the report's
# baseline). STEPS (12), TEST_FREQ (4), SEED (0), QUESTIONS (4 per step), ROLLOUT_N (4 per DIVA prompt; the others
# get twice as many per question's one prompt). WORKDIR (default $OUT/work) keeps the model, data and warm start.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
if [ -z "${OUT:-}" ]; then
  echo "error: set OUT to the output folder: OUT=outputs/compare_tiny bash run_scripts/compare_tiny.sh" >&2
  exit 2
fi
ARGS=(--out "$OUT" --methods "${METHODS:-grpo diva_grpo avspo codapo durian pgpo mupo}" --steps "${STEPS:-12}"
  --test-freq "${TEST_FREQ:-4}" --seed "${SEED:-0}" --questions "${QUESTIONS:-4}" --rollout-n "${ROLLOUT_N:-4}")
if [ -n "${WORKDIR:-}" ]; then ARGS+=(--workdir "$WORKDIR"); fi
exec python -m verl_ext.cpu.compare "${ARGS[@]}"
