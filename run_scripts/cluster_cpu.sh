#!/usr/bin/env bash
# Every method trained on the CPU cluster of two Ray nodes (two training ranks, two rollout replicas), each with a
# checkpoint and a resume: `NODES=2 bash run_scripts/tiny_cpu.sh` once per method, then one line per method.
#   bash run_scripts/cluster_cpu.sh                          # hf_cpu rollout, every method (~4 min each on 2 cores)
#   ROLLOUT=vllm bash run_scripts/cluster_cpu.sh             # verl's vLLM rollout (the GPU stack first on PATH)
#   METHODS="diva codapo" bash run_scripts/cluster_cpu.sh    # some of them
# NODES, GPUS_PER_NODE, TP, STEPS and RESUME_STEPS are passed on (defaults 2, 1, 1, 2, 1). Each launch's output is
# kept in OUT/<method>.log (OUT default outputs/cluster_cpu/<rollout>); the tiny model and data are built once in OUT.
# Exit status 1 if any method failed.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

ROLLOUT="${ROLLOUT:-hf_cpu}"
METHODS="${METHODS:-diva grpo avspo codapo durian pgpo mupo noise_contrastive_grpo}"
OUT="${OUT:-$REPO_ROOT/outputs/cluster_cpu/$ROLLOUT}"
export ROLLOUT NODES="${NODES:-2}" GPUS_PER_NODE="${GPUS_PER_NODE:-1}" TP="${TP:-1}"
export STEPS="${STEPS:-2}" RESUME_STEPS="${RESUME_STEPS:-1}" WORKDIR="$OUT"
mkdir -p "$OUT"

failed=0
summary=()
for method in $METHODS; do
  log="$OUT/$method.log"
  echo "[cluster_cpu] $method: $NODES node(s) x $GPUS_PER_NODE GPU(s), rollout $ROLLOUT (TP $TP): log $log"
  started=$SECONDS
  if METHOD="$method" RUN_DIR="$OUT/run_$method" bash run_scripts/tiny_cpu.sh >"$log" 2>&1 &&
    grep -q "\[cpu\] PASSED" "$log"; then
    verdict=passed
  else
    verdict=FAILED
    failed=1
  fi
  ranks="$(grep -o '\[cluster\] training ranks: .*' "$log" | head -n 1 | cut -d: -f2- || true)"
  replicas="$(grep -o '\[cluster\] rollout replicas: .*' "$log" | head -n 1 | cut -d: -f2- || true)"
  line="$(printf '%-24s %-7s %5d s  ranks:%s  replicas:%s' "$method" "$verdict" $((SECONDS - started)) "$ranks" "$replicas")"
  echo "[cluster_cpu] $line"
  summary+=("$line")
done
echo "[cluster_cpu] every method at world size $((NODES * GPUS_PER_NODE)) on $ROLLOUT:"
printf '  %s\n' "${summary[@]}"
exit "$failed"
