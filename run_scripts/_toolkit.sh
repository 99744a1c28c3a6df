#!/usr/bin/env bash
# Shared by the toolkit methods' launchers: `_toolkit.sh METHOD [hydra overrides...]` runs METHOD
# (algorithm.adv_estimator) on the toolkit trainer and verl's own dataset (no variants; every image limited to
# MAX_PIXELS as DIVA's are: verl_ext/data/pixel_limit.py), with every other setting
# of the DIVA launcher (qwen25vl7b_diva.sh: environment variables, ray job submit, DRY_RUN=1 preflight, the fast
# failure without GPUs). data.train_batch_size counts prompts: QUESTIONS_PER_STEP of them, one per question.
set -euo pipefail
METHOD="$1"
shift
export ADV_ESTIMATOR="$METHOD"
export TRAINER_MODE=toolkit
export VARIANTS_PER_QUESTION=0
export QUESTIONS_PER_STEP="${QUESTIONS_PER_STEP:-128}"
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-qwen25vl7b_${METHOD}}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen25vl7b_diva.sh" \
  data.custom_cls.path=pkg://verl_ext.data.pixel_limit data.custom_cls.name=PixelLimitedDataset "$@"
