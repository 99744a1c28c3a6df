#!/usr/bin/env bash
# GRPO baseline at DIVA's response budget: the same questions per step, no variants, 10 rollouts per
# prompt (DIVA: 2 prompts x 5 rollouts per question). Same data files (DIVA parquet loads in verl's dataset) and the
# same images: MAX_PIXELS limits them as it limits DIVA's (verl_ext/data/pixel_limit.py).
#   bash run_scripts/qwen25vl7b_grpo.sh              # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_grpo.sh    # CPU preflight
# verl's GRPO estimator on the toolkit trainer, which logs grpo/collapse_rate beside DIVA's for diva-report;
# TRAINER_MODE=sync runs it on verl's own trainer instead (same advantages, no collapse or accuracy metrics).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ADV_ESTIMATOR=grpo
export TRAINER_MODE="${TRAINER_MODE:-toolkit}"
export VARIANTS_PER_QUESTION=0
export ROLLOUT_N="${ROLLOUT_N:-10}"
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-qwen25vl7b_grpo_n${ROLLOUT_N}}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen25vl7b_diva.sh" \
  data.custom_cls.path=pkg://verl_ext.data.pixel_limit data.custom_cls.name=PixelLimitedDataset "$@"
