#!/usr/bin/env bash
# NC-GRPO (latent noise on the prompt for half of each group; docs/algo/noise_contrastive_grpo.md) on
# Qwen2.5-VL-7B-Instruct trained on Geometry3K, the paper's setting (its abstract states no other value: group size,
# lr and c are the toolkit's). Point TRAIN_FILES / VAL_FILES at a Geometry3K parquet in the project's schema.
# The rollout is verl's vLLM with the noise worker extension (the noise goes into the prefill of the flagged
# requests), the agent loop that flags them, no prefix caching, and an eager vLLM model: the default reading
# (NOISE_TARGET=layer_input) adds the noise in a hook inside the model's forward, which vLLM's torch.compile and CUDA
# graphs would not run per step (the method refuses to start without actor_rollout_ref.rollout.enforce_eager=true).
#   bash run_scripts/qwen25vl7b_noise_contrastive_grpo.sh             # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_noise_contrastive_grpo.sh   # CPU preflight
# Knobs: the noise_contrastive_grpo: block of recipe/diva_grpo/config/diva_grpo.yaml (NOISE_SCALE, NOISY_FRACTION,
# NOISE_TARGET, NOISE_LAYER). NOISE_TARGET=final_hidden (the first-token reading) runs outside the compiled model:
# ENFORCE_EAGER=false then gives vLLM its CUDA graphs back. ROLLOUT_IS (sequence) and ROLLOUT_IS_THRESHOLD (2.0):
# verl's rollout correction (algorithm.rollout_correction), which weighs each noisy response by how likely the clean
# policy is to draw it, truncated (ROLLOUT_IS=token: per token; null: none, the noisy half trained as the clean
# policy's own samples).
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-8}"
# vLLM's worker extension that applies the noise (verl's own plus the prefill hooks); vLLM's CPU build needs
# verl_ext.nc_grpo.vllm_noise.CpuNoiseWorkerExtension (the tiny CPU run sets it).
WORKER_EXTENSION="${WORKER_EXTENSION:-verl_ext.nc_grpo.vllm_noise.NoiseWorkerExtension}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" noise_contrastive_grpo \
  noise_contrastive_grpo.noise_scale="${NOISE_SCALE:-2.0}" \
  noise_contrastive_grpo.noisy_fraction="${NOISY_FRACTION:-0.5}" \
  noise_contrastive_grpo.target="${NOISE_TARGET:-layer_input}" \
  noise_contrastive_grpo.layer="${NOISE_LAYER:--1}" \
  algorithm.rollout_correction.rollout_is="${ROLLOUT_IS:-sequence}" \
  algorithm.rollout_correction.rollout_is_threshold="${ROLLOUT_IS_THRESHOLD:-2.0}" \
  actor_rollout_ref.rollout.agent.default_agent_loop=noise_contrastive_agent \
  actor_rollout_ref.rollout.enable_prefix_caching=false \
  actor_rollout_ref.rollout.enforce_eager="${ENFORCE_EAGER:-true}" \
  +actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls="$WORKER_EXTENSION" \
  "$@"
