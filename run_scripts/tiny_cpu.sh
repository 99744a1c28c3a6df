#!/usr/bin/env bash
# See it train, on a laptop: real DIVA-GRPO steps on the CPU with verl's own trainer, FSDP2 workers and rollout
# server (transformers), on a tiny Qwen2.5-VL built locally (no hub; the 7B job's model class, TINY_ARCH=qwen2_vl:
# Qwen2-VL) and the `diva-prep synth` set, submitted with
# `ray job submit` to a local Ray head (one logical GPU). It trains STEPS steps, saves a checkpoint, resumes from it
# for RESUME_STEPS more in a fresh trainer, checks the run (finite non-zero loss and gradient, rollout log-probs
# equal to the actor's after each weight sync, difficulty state restored), prints a summary (every figure in
# RUN_DIR/summary.json) and writes the run's report (diva-report: RUN_DIR/report/report.md and its figures). A few
# minutes.
# The console shows the run's own lines and one line per step; the job's whole output is RUN_DIR/job.log
# (VERBOSE=1 shows it on the console too).
# RESUME_STEPS=0 trains STEPS steps and stops (no resume, no checks); SAVE_FREQ (default STEPS) is verl's
# trainer.save_freq; MAX_RESTARTS=N resubmits a failed job with resume up to N times (run_scripts/_submit.sh).
#   bash run_scripts/tiny_cpu.sh                     # DIVA-GRPO
#   METHOD=grpo bash run_scripts/tiny_cpu.sh         # verl's GRPO baseline, same responses per question
#   METHOD=<method> bash run_scripts/tiny_cpu.sh     # a toolkit method (verl_ext.methods), e.g. avspo
#   ROLLOUT=vllm bash run_scripts/tiny_cpu.sh        # the main job's own stack: verl's vLLM rollout (vLLM's CPU
#                                                    # build), configured by the method's GPU launcher
#   NODES=2 bash run_scripts/tiny_cpu.sh             # a cluster of two Ray nodes on this machine (127.0.0.1): two
#                                                    # training ranks (FSDP over gloo), two rollout replicas
#   GPUS_PER_NODE=2 bash run_scripts/tiny_cpu.sh     # world size 2 on one node
#   ROLLOUT=vllm GPUS_PER_NODE=2 TP=2 bash run_scripts/tiny_cpu.sh   # one vLLM replica, tensor parallel 2
#   USE_REMOVE_PADDING=1 bash run_scripts/tiny_cpu.sh   # verl's packed sequences, as the GPU launchers run them
#                                                    # (a CPU stand-in for flash-attn: verl_ext/cpu/varlen_attention.py)
#   PRECISION=bf16 bash run_scripts/tiny_cpu.sh     # the GPU job's mixed precision for the actor (bf16 compute,
#                                                    # fp32 gradient reduction and master weights; rollout fp32)
#   WITHOUT="global_stream rrb" bash run_scripts/tiny_cpu.sh   # DIVA-GRPO with additions removed (verl_ext/cpu/
#                                                    # ablations.py; WITHOUT=all: verl's GRPO in the DIVA trainer)
# ROLLOUT=vllm needs the GPU stack's environment first on PATH: bash run_scripts/setup_vllm_cpu.sh DIR, then
# PATH="DIR/bin:$PATH". WORKDIR (default outputs/tiny_cpu) keeps the tiny model and data between launches; each
# launch writes its checkpoints, metrics and actor-input records to a fresh RUN_DIR inside it. Extra Hydra overrides
# may follow.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
abspath() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
# shellcheck source=run_scripts/_numbers.sh
. "$REPO_ROOT/run_scripts/_numbers.sh"

METHOD="${METHOD:-diva}"
ROLLOUT="${ROLLOUT:-hf_cpu}"
STEPS="${STEPS:-3}"
RESUME_STEPS="${RESUME_STEPS:-1}"
SAVE_FREQ="${SAVE_FREQ:-$STEPS}"
NODES="${NODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-1}"
TP="${TP:-1}"
need_count STEPS RESUME_STEPS NODES GPUS_PER_NODE TP
need_int SAVE_FREQ
WORKDIR="$(abspath "${WORKDIR:-$REPO_ROOT/outputs/tiny_cpu}")"
RUN_DIR="$(abspath "${RUN_DIR:-$WORKDIR/run_$(date +%Y%m%d_%H%M%S)_$$}")"
case "$ROLLOUT" in
  hf_cpu) ;;
  vllm)
    # Found, not imported (an import costs seconds per launch): a vLLM that is installed but broken fails in the job
    # with vLLM's own error.
    if ! python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)' >/dev/null 2>&1; then
      echo "error: ROLLOUT=vllm needs vLLM's CPU build in this Python ($(command -v python)). Build the GPU stack's" >&2
      echo "environment and put it first on PATH:" >&2
      echo "    bash run_scripts/setup_vllm_cpu.sh ~/venvs/diva-vllm-cpu && PATH=~/venvs/diva-vllm-cpu/bin:\$PATH" >&2
      exit 2
    fi
    ;;
  *) echo "error: ROLLOUT=$ROLLOUT: expected hf_cpu (default) or vllm" >&2; exit 2 ;;
esac
NEW_RUN_DIR=0
[ -e "$RUN_DIR" ] || NEW_RUN_DIR=1
mkdir -p "$RUN_DIR"

# One source for the settings (verl_ext/cpu/launch.py): checks them (METHOD, WITHOUT, the cluster's shape) before it
# builds anything, builds the model and data once, prints the overrides (ROLLOUT=vllm: those the GPU launcher has no
# variable for, and the launcher's variables in launcher_env.txt). A refused setting leaves no run folder behind.
python -m verl_ext.cpu.launch --workdir "$WORKDIR" --run-dir "$RUN_DIR" --method "$METHOD" --steps "$STEPS" \
  --save-freq "$SAVE_FREQ" --without "${WITHOUT:-}" --rollout "$ROLLOUT" --nodes "$NODES" --gpus-per-node "$GPUS_PER_NODE" --tp "$TP" \
  --launcher-env-out "$RUN_DIR/launcher_env.txt" --arch "${TINY_ARCH:-qwen2_5_vl}" ${USE_REMOVE_PADDING:+--use-remove-padding} \
  --precision "${PRECISION:-fp32}" \
  --runtime-env-out "$RUN_DIR/runtime_env.yaml" >"$RUN_DIR/overrides.txt" || {
  status=$?
  [ "$NEW_RUN_DIR" = 1 ] && rm -rf "$RUN_DIR"
  exit "$status"
}
mapfile -t ARGS <"$RUN_DIR/overrides.txt"
ARGS+=("+cpu_run.resume_steps=$RESUME_STEPS" "+cpu_run.summary_path=$RUN_DIR/summary.json")

# CPU mode of the shared submit script: no GPU check, a local cluster of NODES nodes with GPUS_PER_NODE logical GPUs
# each, this job's runtime env. VERL_PLATFORM=cpu also goes to the nodes themselves, so that every process they start
# runs verl's CPU platform.
export CPU_E2E=1 DIVA_RUNTIME_ENV="$RUN_DIR/runtime_env.yaml" VERL_PLATFORM=cpu VERL_ENGINE_DEVICE=cuda
export LOCAL_NODES="$NODES" LOCAL_GPUS_PER_NODE="$GPUS_PER_NODE"
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-run_scripts/tiny_cpu.sh}"
# The job's whole output (verl's config dump, every actor's lines) goes to the run folder; the console shows the
# run's own lines, one line per step and errors (recipe/diva_grpo/console.py); VERBOSE=1 shows everything.
export DIVA_JOB_LOG="$RUN_DIR/job.log"
# The CPU cluster's "GPUs" are logical: Ray's resource name for a training rank, each a CPU process here.
echo "[cpu] run folder $RUN_DIR (rollout $ROLLOUT; $NODES Ray node(s) x $GPUS_PER_NODE training rank(s) on the CPU," \
  "rollout TP $TP)"
# vLLM's engine processes die with the job, leaving their shared-memory segments behind: remove those no process
# has open once the run is over (verl_ext/cpu/shared_memory.py).
SHM_MARK="$RUN_DIR/.shm_before"
python -m verl_ext.cpu.shared_memory snapshot "$SHM_MARK"
clean_shared_memory() { python -m verl_ext.cpu.shared_memory clean "$SHM_MARK" || true; }
trap clean_shared_memory EXIT
if [ "$ROLLOUT" = vllm ]; then
  while IFS='=' read -r key value; do export "$key=$value"; done <"$RUN_DIR/launcher_env.txt"
  # The GPU launcher's own settings; the CPU's and the tiny model's changes come after its own arguments.
  echo "[cpu] GPU launcher run_scripts/$DIVA_GPU_LAUNCHER with the CPU changes listed in docs/stack.md"
  bash "$REPO_ROOT/run_scripts/$DIVA_GPU_LAUNCHER" "${ARGS[@]}" "$@"
else
  bash "$REPO_ROOT/run_scripts/_submit.sh" "${ARGS[@]}" "$@"
fi
# The run folder is what diva-report reads: metrics/<project>/<experiment>.jsonl and its _resumed part (merged into
# one run), the checkpoints' difficulty states, the validation before training and at the last step.
if [ "$RESUME_STEPS" != 0 ]; then
  diva-report "$RUN_DIR" --output "$RUN_DIR/report" >"$RUN_DIR/report.log" 2>&1 || {
    cat "$RUN_DIR/report.log" >&2
    echo "error: diva-report could not write the run's report (above; $RUN_DIR/report.log)" >&2
    exit 1
  }
  echo "[cpu] report: $RUN_DIR/report/report.md (figures beside it)"
fi
