#!/usr/bin/env bash
# See it train, on a laptop: real DIVA-GRPO steps on the CPU with verl's own trainer, FSDP2 workers and rollout
# server (transformers), on a tiny Qwen2-VL built locally (no hub) and the `diva-prep synth` set, submitted with
# `ray job submit` to a local Ray head (one logical GPU). It trains STEPS steps, saves a checkpoint, resumes from it
# for RESUME_STEPS more in a fresh trainer, checks the run (finite non-zero loss and gradient, rollout log-probs
# equal to the actor's after each weight sync, difficulty state restored) and prints a summary. A few minutes.
#   bash run_scripts/tiny_cpu.sh                     # DIVA-GRPO
#   METHOD=grpo bash run_scripts/tiny_cpu.sh         # verl's GRPO baseline, same responses per question
#   METHOD=<method> bash run_scripts/tiny_cpu.sh     # a toolkit method (verl_ext.methods), e.g. avspo
# WORKDIR (default outputs/tiny_cpu) keeps the tiny model and data between launches; each launch writes its
# checkpoints, metrics and actor-input records to a fresh RUN_DIR inside it. Extra Hydra overrides may follow.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }

METHOD="${METHOD:-diva}"
STEPS="${STEPS:-3}"
RESUME_STEPS="${RESUME_STEPS:-1}"
WORKDIR="$(abspath "${WORKDIR:-$REPO_ROOT/outputs/tiny_cpu}")"
RUN_DIR="$(abspath "${RUN_DIR:-$WORKDIR/run_$(date +%Y%m%d_%H%M%S)_$$}")"
mkdir -p "$RUN_DIR"

# One source for the settings (verl_ext/cpu/launch.py): builds the model and data once, prints the overrides.
python -m verl_ext.cpu.launch --workdir "$WORKDIR" --run-dir "$RUN_DIR" --method "$METHOD" --steps "$STEPS" \
  --runtime-env-out "$RUN_DIR/runtime_env.yaml" >"$RUN_DIR/overrides.txt"
mapfile -t ARGS <"$RUN_DIR/overrides.txt"
ARGS+=("+cpu_run.resume_steps=$RESUME_STEPS")

# CPU mode of the shared submit script: no GPU check, a head with one logical GPU, this job's runtime env.
# VERL_PLATFORM=cpu also goes to the head itself, so that every process it starts runs verl's CPU platform.
export CPU_E2E=1 DIVA_RUNTIME_ENV="$RUN_DIR/runtime_env.yaml" VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-run_scripts/tiny_cpu.sh}"
echo "[cpu] run folder $RUN_DIR"
exec bash "$REPO_ROOT/run_scripts/_submit.sh" "${ARGS[@]}" "$@"
