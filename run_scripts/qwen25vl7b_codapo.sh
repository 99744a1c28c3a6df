#!/usr/bin/env bash
# CoDaPO (confidence- and difficulty-adaptive weighting, and resampling; docs/algo/codapo.md) on Qwen2.5-VL-7B-Instruct.
# The authors' example run: group size 8, lr 1e-6; everything else DIVA's. Every training batch is rolled out
# twice (fresh, then its highest-weight questions), so a step count covers half as many fresh batches.
#   bash run_scripts/qwen25vl7b_codapo.sh             # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_codapo.sh   # CPU preflight
# Knobs: the codapo: block of recipe/diva_grpo/config/diva_grpo.yaml (CODAPO_RESAMPLE=false: weighting only).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-8}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" codapo codapo.resample="${CODAPO_RESAMPLE:-true}" "$@"
