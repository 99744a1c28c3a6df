#!/usr/bin/env bash
# Two DIVA steps on a small VLM on one GPU: a first end-to-end check of a cluster setup.
# Data: the synthetic set from `diva-prep synth` unless TRAIN_FILES/VAL_FILES are given.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}"
if [ -z "${TRAIN_FILES:-}" ]; then
  mkdir -p data
  [ -f data/smoke_train.parquet ] || diva-prep synth --output data/smoke_train.parquet --n 64 --seed 0
  [ -f data/smoke_val.parquet ] || diva-prep synth --output data/smoke_val.parquet --n 16 --seed 1 --split test
  export TRAIN_FILES="$PWD/data/smoke_train.parquet" VAL_FILES="$PWD/data/smoke_val.parquet"
fi
export N_GPUS_PER_NODE=1 QUESTIONS_PER_STEP=4 ROLLOUT_N=4 MAX_RESPONSE_LENGTH=512 MAX_PROMPT_LENGTH=1024
export SAVE_FREQ=2 TEST_FREQ=2 EXPERIMENT_NAME="${EXPERIMENT_NAME:-smoke_1gpu}"
exec bash run_scripts/qwen25vl7b_diva.sh trainer.total_training_steps=2 data.dataloader_num_workers=2 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 "$@"
