#!/usr/bin/env bash
# PGPO (token-level advantages from visual dependency; docs/algo/pgpo.md) on Qwen2.5-VL-7B-Instruct with the paper's
# DAPO-style recipe: 5 rollouts, lr 1e-6, max response 2048 tokens, clip 0.2 / 0.28, no KL. One more actor pass per
# step computes the blind log-probs (visual tokens hidden; the paper reports +10.6% training time).
#   bash run_scripts/qwen25vl7b_pgpo.sh               # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_pgpo.sh     # CPU preflight
# Knobs: the pgpo: block of recipe/diva_grpo/config/diva_grpo.yaml (PGPO_TAU, PGPO_BETA).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-5}"
export MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-2048}"
export CLIP_HIGH="${CLIP_HIGH:-0.28}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" pgpo \
  pgpo.tau="${PGPO_TAU:-0.4}" pgpo.beta="${PGPO_BETA:-2.0}" "$@"
