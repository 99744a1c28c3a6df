#!/usr/bin/env bash
# AVSPO (virtual samples for collapsed groups, guided by the advantage collapse rate; docs/algo/avspo.md) on
# Qwen2.5-VL-7B-Instruct. The paper trains text LLMs: DIVA's hyperparameters, with the paper's group size G = 8.
#   bash run_scripts/qwen25vl7b_avspo.sh              # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_avspo.sh    # CPU preflight
# Knobs: the avspo: block of recipe/diva_grpo/config/diva_grpo.yaml (AVSPO_MODE=released: the authors' rule).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-8}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" avspo avspo.mode="${AVSPO_MODE:-paper}" "$@"
