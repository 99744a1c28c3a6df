#!/usr/bin/env bash
# Durian (difficulty-aware group normalisation; docs/algo/durian.md) on Qwen2.5-VL-7B-Instruct with the paper's
# setting: batch 128, 8 rollouts, lr 1e-6, 0.9 accuracy + 0.1 format reward. The training parquet needs the
# visual_entropy column: diva-prep entropy --model "$MODEL_PATH" --input F --output F.
#   bash run_scripts/qwen25vl7b_durian.sh             # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_durian.sh   # CPU preflight
# Knobs: the durian: block of recipe/diva_grpo/config/diva_grpo.yaml.
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-8}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" durian \
  durian.reason_buckets="${REASON_BUCKETS:-12}" "$@"
