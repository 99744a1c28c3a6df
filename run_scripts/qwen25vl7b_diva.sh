#!/usr/bin/env bash
# DIVA-GRPO on Qwen2.5-VL-7B-Instruct with the paper's hyperparameters (docs/algo/diva_grpo.md).
# Every value below can be overridden by the environment variable of the same name; extra Hydra
# overrides can be appended as arguments. DRY_RUN=1 runs the CPU preflight instead of training.
#   bash run_scripts/qwen25vl7b_diva.sh                      # train (needs GPUs or RAY_ADDRESS)
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh            # CPU preflight, about a minute
#   MAX_RESTARTS=3 bash run_scripts/qwen25vl7b_diva.sh       # a failed job is resubmitted (up to 3 times) and
#                                                            # resumes from its latest complete checkpoint
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=run_scripts/_numbers.sh
. "$REPO_ROOT/run_scripts/_numbers.sh"
# The job runs in Ray's copy of the code (without data/ and checkpoints/): paths are made absolute here.
# On a remote cluster they must name storage that the cluster's nodes see.
abspath() { case "$1" in /*|*://*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-VL-7B-Instruct}"
TRAIN_FILES="$(abspath "${TRAIN_FILES:-$REPO_ROOT/data/diva_train.parquet}")"
VAL_FILES="$(abspath "${VAL_FILES:-$REPO_ROOT/data/diva_val.parquet}")"
NNODES="${NNODES:-1}"
N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-8}"
VARIANTS_PER_QUESTION="${VARIANTS_PER_QUESTION:-1}"
QUESTIONS_PER_STEP="${QUESTIONS_PER_STEP:-64}"
need_count NNODES N_GPUS_PER_NODE VARIANTS_PER_QUESTION QUESTIONS_PER_STEP
# data.train_batch_size counts prompts: questions x (original + variants).
TRAIN_BATCH_SIZE="${TRAIN_BATCH_SIZE:-$((QUESTIONS_PER_STEP * (1 + VARIANTS_PER_QUESTION)))}"
ROLLOUT_N="${ROLLOUT_N:-5}"
LR="${LR:-1e-6}"
WEIGHT_DECAY="${WEIGHT_DECAY:-1e-2}"
TOTAL_EPOCHS="${TOTAL_EPOCHS:-5}"
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-2048}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-4096}"
MAX_PIXELS="${MAX_PIXELS:-1048576}"
CLIP_LOW="${CLIP_LOW:-0.2}"
CLIP_HIGH="${CLIP_HIGH:-0.3}"
TEMPERATURE="${TEMPERATURE:-1.0}"
VAL_TEMPERATURE="${VAL_TEMPERATURE:-0.6}"
VAL_TOP_P="${VAL_TOP_P:-0.95}"
DIFFICULTY_K="${DIFFICULTY_K:-0.1}"
DIFFICULTY_RULE="${DIFFICULTY_RULE:-continuous}"
PLANNER="${PLANNER:-paper}"
TP_SIZE="${TP_SIZE:-1}"
PROJECT_NAME="${PROJECT_NAME:-diva_grpo}"
EXPERIMENT_NAME="${EXPERIMENT_NAME:-qwen25vl7b_diva_v${VARIANTS_PER_QUESTION}}"
CKPT_DIR="$(abspath "${CKPT_DIR:-$REPO_ROOT/checkpoints/${PROJECT_NAME}/${EXPERIMENT_NAME}}")"
SAVE_FREQ="${SAVE_FREQ:-50}"
TEST_FREQ="${TEST_FREQ:-25}"
need_count TRAIN_BATCH_SIZE ROLLOUT_N TOTAL_EPOCHS MAX_PROMPT_LENGTH MAX_RESPONSE_LENGTH MAX_PIXELS TP_SIZE
need_int SAVE_FREQ TEST_FREQ
need_number LR WEIGHT_DECAY CLIP_LOW CLIP_HIGH TEMPERATURE VAL_TEMPERATURE VAL_TOP_P DIFFICULTY_K
ADV_ESTIMATOR="${ADV_ESTIMATOR:-diva_grpo}"
TRAINER_MODE="${TRAINER_MODE:-diva_grpo}"
# Metrics go to the console and to verl's file logger (JSONL, read by diva-report). That logger truncates its file
# when it opens it, so each launch (a resume too) gets its own file in the run's folder; diva-report merges them.
LOGGER="${LOGGER:-[console,file]}"
# METRICS_LOG= (set, empty) leaves verl's own file location: <VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl.
METRICS_LOG="${METRICS_LOG-$CKPT_DIR/logs/metrics_$(date -u +%Y%m%dT%H%M%SZ)_$$.jsonl}"

ARGS=(
  algorithm.adv_estimator="$ADV_ESTIMATOR"
  trainer.v1.trainer_mode="$TRAINER_MODE"
  data.train_files="$TRAIN_FILES"
  data.val_files="$VAL_FILES"
  data.train_batch_size="$TRAIN_BATCH_SIZE"
  data.max_prompt_length="$MAX_PROMPT_LENGTH"
  data.max_response_length="$MAX_RESPONSE_LENGTH"
  actor_rollout_ref.model.path="$MODEL_PATH"
  actor_rollout_ref.actor.optim.lr="$LR"
  actor_rollout_ref.actor.optim.weight_decay="$WEIGHT_DECAY"
  actor_rollout_ref.actor.ppo_mini_batch_size="$TRAIN_BATCH_SIZE"
  actor_rollout_ref.actor.clip_ratio_low="$CLIP_LOW"
  actor_rollout_ref.actor.clip_ratio_high="$CLIP_HIGH"
  actor_rollout_ref.rollout.n="$ROLLOUT_N"
  actor_rollout_ref.rollout.temperature="$TEMPERATURE"
  actor_rollout_ref.rollout.tensor_model_parallel_size="$TP_SIZE"
  actor_rollout_ref.rollout.val_kwargs.temperature="$VAL_TEMPERATURE"
  actor_rollout_ref.rollout.val_kwargs.top_p="$VAL_TOP_P"
  diva.variants.variants_per_question="$VARIANTS_PER_QUESTION"
  diva.variants.planner="$PLANNER"
  diva.variants.max_pixels="$MAX_PIXELS"
  diva.advantage.k="$DIFFICULTY_K"
  diva.difficulty.rule="$DIFFICULTY_RULE"
  trainer.nnodes="$NNODES"
  trainer.n_gpus_per_node="$N_GPUS_PER_NODE"
  trainer.total_epochs="$TOTAL_EPOCHS"
  trainer.project_name="$PROJECT_NAME"
  trainer.experiment_name="$EXPERIMENT_NAME"
  trainer.default_local_dir="$CKPT_DIR"
  trainer.save_freq="$SAVE_FREQ"
  trainer.test_freq="$TEST_FREQ"
  trainer.logger="$LOGGER"
)
if [ -n "$METRICS_LOG" ]; then
  ARGS+=(+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH="$(abspath "$METRICS_LOG")")
fi
if [ "${DRY_RUN:-0}" = "1" ]; then
  ARGS+=(diva.dry_run=true)
fi

export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/_submit.sh" "${ARGS[@]}" "$@"
