#!/usr/bin/env bash
# GRPO baseline at DIVA's response budget: the same questions per step, no variants, 10 rollouts per
# prompt (DIVA: 2 prompts x 5 rollouts per question). Same data files (DIVA parquet loads in verl's dataset).
set -euo pipefail
export ADV_ESTIMATOR=grpo
export TRAINER_MODE=sync
export VARIANTS_PER_QUESTION=0
export ROLLOUT_N="${ROLLOUT_N:-10}"
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-qwen25vl7b_grpo_n${ROLLOUT_N}}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen25vl7b_diva.sh" \
  data.custom_cls.path=null data.custom_cls.name=null "$@"
