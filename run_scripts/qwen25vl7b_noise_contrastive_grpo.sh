#!/usr/bin/env bash
# NC-GRPO (latent noise at the branch point for half of each group; README, NC-GRPO) on Qwen2.5-VL-7B-Instruct
# trained on Geometry3K, the paper's setting (its abstract states no other value: group size, lr and c are the
# toolkit's). Point TRAIN_FILES / VAL_FILES at a Geometry3K parquet in the project's schema (README, Data).
# The rollout is verl's vLLM with the noise worker extension (the noise goes into the prefill of the flagged
# requests), the agent loop that flags them, and no prefix caching.
#   bash run_scripts/qwen25vl7b_noise_contrastive_grpo.sh             # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_noise_contrastive_grpo.sh   # CPU preflight
# Knobs: the noise_contrastive_grpo: block of recipe/diva_grpo/config/diva_grpo.yaml (NOISE_SCALE, NOISY_FRACTION).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-8}"
# vLLM's worker extension that applies the noise (verl's own plus the prefill hook); vLLM's CPU build needs
# verl_ext.nc_grpo.vllm_noise.CpuNoiseWorkerExtension (the tiny CPU run sets it).
WORKER_EXTENSION="${WORKER_EXTENSION:-verl_ext.nc_grpo.vllm_noise.NoiseWorkerExtension}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" noise_contrastive_grpo \
  noise_contrastive_grpo.noise_scale="${NOISE_SCALE:-0.1}" \
  noise_contrastive_grpo.noisy_fraction="${NOISY_FRACTION:-0.5}" \
  actor_rollout_ref.rollout.agent.default_agent_loop=noise_contrastive_agent \
  actor_rollout_ref.rollout.enable_prefix_caching=false \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls="$WORKER_EXTENSION" \
  "$@"
