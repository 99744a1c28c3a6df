#!/usr/bin/env bash
# What each DIVA-GRPO addition and every method does to learning, over seeds, on the CPU: GRPO at 2n and 4n responses
# per question, DIVA-GRPO with the paper's defaults and without each addition in turn, the authors' released options
# and every toolkit method, each trained from one warm start of the tiny Qwen2-VL on the swatch task at each seed,
# validated greedily and with the paper's sampling (mean of 4 samples at temperature 0.6, top-p 0.95); then the table
# (mean and range over seeds, paired differences from GRPO) in $OUT/sweep.json and its last printed line, and the
# curves in $OUT/sweep_sampled.png and $OUT/sweep_greedy.png (verl_ext/lab/sweep.py). About 8 minutes a run on two
# idle cores (7.7 measured for DIVA-GRPO at 12 steps): the 16 configurations at 3 seeds take about 6.5 hours.
# Interrupted, it resumes: finished runs are kept. Runs pair only on one machine kind (the warm start's floats
# differ by CPU): on another kind it stops before training (docs/learning.md, "Which runs pair").
#   OUT=DIR bash run_scripts/sweep_tiny.sh
#   OUT=DIR CONFIGS="grpo diva_grpo diva_no_rrb" SEEDS="0 1 2" bash run_scripts/sweep_tiny.sh
#   OUT=DIR SUMMARY_ONLY=1 bash run_scripts/sweep_tiny.sh     # the table and figures of the runs finished so far
# CONFIGS: names of verl_ext.lab.sweep_configs.CONFIGS (must include grpo), STEPS (12), TEST_FREQ (4), SEEDS ("0 1 2"),
# WORKDIR (default $OUT/work: the model, data and warm start, reused), TASK (swatch, the default, or sparse: DIVA-GRPO's
# regime, verl_ext/lab/sparse_task.py; its three properties are printed before training).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
if [ -z "${OUT:-}" ]; then
  echo "error: set OUT to the output folder: OUT=outputs/sweep_tiny bash run_scripts/sweep_tiny.sh" >&2
  exit 2
fi
ARGS=(--out "$OUT" --task "${TASK:-swatch}" --seeds "${SEEDS:-0 1 2}" --steps "${STEPS:-12}" --test-freq "${TEST_FREQ:-4}")
if [ -n "${CONFIGS:-}" ]; then ARGS+=(--configs "$CONFIGS"); fi
if [ -n "${WORKDIR:-}" ]; then ARGS+=(--workdir "$WORKDIR"); fi
if [ -n "${SUMMARY_ONLY:-}" ]; then ARGS+=(--summary-only); fi
exec python -m verl_ext.lab.sweep "${ARGS[@]}"
