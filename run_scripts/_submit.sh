#!/usr/bin/env bash
# Shared by the launchers: submit `python -m recipe.diva_grpo.main_diva "$@"` as a Ray job.
#   RAY_ADDRESS set   -> submit to that cluster (the dashboard address, e.g. http://head:8265).
#   RAY_ADDRESS unset -> start a Ray head bound to 127.0.0.1, submit to it, stop it afterwards.
# DRY_RUN=1 runs the CPU preflight through the same path. Without it, a machine with no GPU and no
# RAY_ADDRESS fails at once and names the preflight.
# CPU_E2E=1 (run_scripts/tiny_cpu.sh) trains for real on the CPU: no GPU check, a local cluster of LOCAL_NODES nodes
# (default 1: the head alone) with LOCAL_GPUS_PER_NODE logical GPUs each (default 1), all on 127.0.0.1, and the runtime
# env named by DIVA_RUNTIME_ENV.
# The job is submitted from outside the cluster to the head's dashboard address, as to a remote cluster
# (recipe/diva_grpo/submit.py: `ray job submit`'s SDK, plus the variables the job reads, forwarded by name).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

# DIVA_PRINT_ONLY=1: print the Hydra overrides, one per line, and stop (to inspect or test a launcher).
if [ "${DIVA_PRINT_ONLY:-0}" = "1" ]; then
  printf '%s\n' "$@"
  exit 0
fi

# MAX_RESTARTS=N: a job that fails is submitted again, up to N times, with trainer.resume_mode=auto (verl resumes from
# the latest complete checkpoint in trainer.default_local_dir; the earlier attempts' metrics logs are kept).
MAX_RESTARTS="${MAX_RESTARTS:-0}"
if ! [[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]]; then
  echo "error: MAX_RESTARTS=$MAX_RESTARTS: expected how many times to resubmit a failed job (0, the default: never)" >&2
  exit 2
fi
# NODE_RETURN_S: before a resubmission, how long to wait for the nodes the job was sized for (trainer.nnodes) to be
# alive again; those that are not by then are gone for good, and the job goes on with the nodes it has
# (verl_ext/cluster/resize.py: trainer.nnodes lowered, the batch checked for the new world size, the checkpoint
# resharded on load). LOCAL_NODE_RESTART=0 (the local CPU cluster): a dead node is not started again, as when a
# cluster's node does not come back.
NODE_RETURN_S="${NODE_RETURN_S:-300}"
LOCAL_NODE_RESTART="${LOCAL_NODE_RESTART:-1}"
if ! [[ "$NODE_RETURN_S" =~ ^[0-9]+$ ]]; then
  echo "error: NODE_RETURN_S=$NODE_RETURN_S: expected seconds to wait for lost nodes before going on without them" >&2
  exit 2
fi

if [ "${DRY_RUN:-0}" != "1" ] && [ "${CPU_E2E:-0}" != "1" ] && [ -z "${RAY_ADDRESS:-}" ]; then
  GPU_LIST="$(nvidia-smi -L 2>/dev/null || true)"
  if [[ "$GPU_LIST" != *GPU* ]]; then
    echo "error: no NVIDIA GPU found on this machine and RAY_ADDRESS is not set." >&2
    echo "DIVA-GRPO training needs GPUs (rollout runs on vLLM). Either set RAY_ADDRESS to a GPU cluster's" >&2
    echo "dashboard address, or check everything else on this CPU machine with the preflight:" >&2
    echo "    DRY_RUN=1 bash ${DIVA_LAUNCHER:-run_scripts/qwen25vl7b_diva.sh}" >&2
    exit 2
  fi
fi

if ! command -v ray >/dev/null 2>&1; then
  echo "error: the 'ray' command is not on PATH; install the project first: pip install -e ." >&2
  exit 2
fi

# The job's final config (verl's and the recipe's schema, the overrides given) and the data files, checked in about
# a second before any Ray process starts (the job checks them again). A preflight on the synthetic set (no data
# named) says so on its first line and, from the note file, on its last.
CLOSING_NOTE="$(mktemp /tmp/diva_note_XXXXXX)"
trap 'rm -f "$CLOSING_NOTE"' EXIT
# Where the job's whole output goes (recipe/diva_grpo/submit.py decides; every attempt writes the same file), and
# Ray's logs beside it when the launch fails.
DIVA_JOB_LOG="$(python -m recipe.diva_grpo.submit --print-log-path -- "$@")"
export DIVA_JOB_LOG
RAY_LOGS_DIR="${DIVA_JOB_LOG%.log}_ray"
python -m recipe.diva_grpo.prelaunch --closing-note "$CLOSING_NOTE" "$@" || exit 2

HEAD_PID=""
RAY_TMP=""
LOCAL_NODES="${LOCAL_NODES:-1}"
LOCAL_GPUS_PER_NODE="${LOCAL_GPUS_PER_NODE:-1}"
declare -a NODE_PIDS=()
cleanup() {
  local status=$?
  local pid
  # Further nodes first, then the head (a node whose head is gone would retry its connection for a minute).
  for pid in "${NODE_PIDS[@]}" "$HEAD_PID"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
  for pid in "${NODE_PIDS[@]}" "$HEAD_PID"; do
    [ -n "$pid" ] && wait "$pid" 2>/dev/null || true
  done
  # A failed launch keeps Ray's logs beside the job's log (RAY_LOGS_DIR), not in /tmp. Ray's workers can still write
  # their session files for a moment after the head stops, and rm then fails with "Directory not empty": retry, and
  # never let the removal change the job's exit status (under set -e a failed rm here once turned a finished run into
  # exit 1).
  if [ -n "$RAY_TMP" ] && [ "$status" -ne 0 ] && [ -n "${RAY_LOGS_DIR:-}" ]; then
    if mkdir -p "$RAY_LOGS_DIR" 2>/dev/null; then
      cp "$RAY_TMP"/*.log "$RAY_LOGS_DIR"/ 2>/dev/null || true
      cp -rL "$RAY_TMP/session_latest/logs" "$RAY_LOGS_DIR/session_logs" 2>/dev/null || true
      echo "[diva] Ray's logs of this launch: $RAY_LOGS_DIR" >&2
    else
      RAY_LOGS_DIR=""
    fi
  fi
  if [ -n "$RAY_TMP" ] && { [ "$status" -eq 0 ] || [ -n "${RAY_LOGS_DIR:-}" ]; }; then
    for _ in 1 2 3 4 5; do
      rm -rf "$RAY_TMP" 2>/dev/null && break
      sleep 1
    done
    if [ -e "$RAY_TMP" ]; then
      echo "[diva] note: Ray's temp folder $RAY_TMP is still in use and was kept; remove it later" >&2
    fi
  elif [ -n "$RAY_TMP" ]; then
    echo "[diva] Ray's logs of this launch: $RAY_TMP" >&2
  fi
  if [ -s "${CLOSING_NOTE:-}" ]; then echo "[diva] $(cat "$CLOSING_NOTE")"; fi
  if [ -n "${CLOSING_NOTE:-}" ]; then rm -f "$CLOSING_NOTE" 2>/dev/null || true; fi
  exit "$status"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -z "${RAY_ADDRESS:-}" ]; then
  GCS_PORT="$(free_port)"
  DASH_PORT="$(free_port)"
  CLIENT_PORT="$(free_port)"
  AGENT_PORT="$(free_port)"
  # Ray counts this machine's CPUs and GPUs itself; the CPU preflight gets logical CPUs for TransferQueue's actors.
  CPU_ARGS=()
  if [ "${DRY_RUN:-0}" = "1" ]; then CPU_ARGS=(--num-cpus="${RAY_NUM_CPUS:-16}"); fi
  if [ "${CPU_E2E:-0}" = "1" ]; then
    # Each node of the CPU cluster: logical CPUs for TransferQueue's actors, its logical GPUs, a 2 GB object store
    # (Ray's default, 30% of the memory, would be reserved once per node on this one machine).
    NODE_ARGS=(--num-cpus="${RAY_NUM_CPUS:-16}" --num-gpus="$LOCAL_GPUS_PER_NODE"
      --object-store-memory="${RAY_OBJECT_STORE_BYTES:-2000000000}")
    CPU_ARGS=("${NODE_ARGS[@]}")
  elif [ "$LOCAL_NODES" != "1" ]; then
    echo "error: LOCAL_NODES=$LOCAL_NODES: a local cluster of several nodes is the CPU runs' (run_scripts/tiny_cpu.sh NODES=...);" >&2
    echo "on GPUs, start your cluster with ray start and set RAY_ADDRESS" >&2
    exit 2
  fi
  RAY_TMP="$(mktemp -d --tmpdir diva_ray_XXXXXX)"  # in $TMPDIR (else /tmp), as Ray's own temp folder
  # Ray >= 2.5x turns on token authentication for new local clusters: give this head its own random token
  # (never written to disk or logs); `ray job submit` and the job's processes read it from the environment.
  export RAY_AUTH_MODE=token
  RAY_AUTH_TOKEN="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
  export RAY_AUTH_TOKEN
  # Keep the head on this machine. `ray start` replaces --node-ip-address=127.0.0.1 by the machine's external address
  # (ray/_private/services.py resolve_ip_for_localhost) unless multi-node clusters are off, and every Ray server
  # (GCS, raylet, object manager, agents, client server, workers) binds the node address: with this, all of them
  # bind 127.0.0.1 and the job's driver connects there. The cost: no other machine can join this head. Every process
  # that talks to the GCS by 127.0.0.1 needs it too; the job's processes inherit it from the head.
  export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  # The metrics servers of the dashboard and the autoscaler have fixed default ports (44227, 44217) that a second
  # head on the machine would find taken; vLLM's own sockets use the machine's address unless VLLM_HOST_IP is set.
  DASHBOARD_METRIC_PORT="$(free_port)"
  AUTOSCALER_METRIC_PORT="$(free_port)"
  export DASHBOARD_METRIC_PORT AUTOSCALER_METRIC_PORT VLLM_HOST_IP=127.0.0.1
  echo "[diva] starting a local Ray head on 127.0.0.1 (gcs :$GCS_PORT, dashboard :$DASH_PORT)"
  # --block keeps `ray start` in the foreground of this background job: killing it stops this head only.
  ray start --head --block --node-ip-address=127.0.0.1 --node-name=head --port="$GCS_PORT" \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASH_PORT" --include-dashboard=true \
    --ray-client-server-port="$CLIENT_PORT" --dashboard-agent-listen-port="$AGENT_PORT" \
    "${CPU_ARGS[@]}" --temp-dir="$RAY_TMP" --disable-usage-stats >"$RAY_TMP/head.log" 2>&1 &
  HEAD_PID=$!
  export RAY_ADDRESS="http://127.0.0.1:$DASH_PORT"
  deadline=$((SECONDS + 120))
  until ray job list --address "$RAY_ADDRESS" >"$RAY_TMP/probe.log" 2>&1; do
    if ! kill -0 "$HEAD_PID" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: the local Ray head did not come up; see $RAY_TMP/head.log and $RAY_TMP/probe.log" >&2
      tail -n 5 "$RAY_TMP/probe.log" >&2 || true
      exit 1
    fi
    sleep 1
  done
  # The further nodes of the CPU cluster (LOCAL_NODES > 1): Ray's own `ray start --address`, each node its own
  # raylet, object store and logical GPUs, on 127.0.0.1 like the head (verl_ext/cluster/local_node.py says which Ray
  # refusal it lifts for that). Its agents' ports are drawn like the head's, and it has its own temp folder, as a
  # node of a real cluster has its own disk (in the head's, both nodes' log monitors would send each line twice).
  # LOCAL_NODE_PRIVATE_DIR=<folder> (tests of the storage check): the further nodes get a disk of their own there,
  # an empty tmpfs over the folder in a mount namespace of theirs, as a cluster node whose CKPT_DIR is local storage.
  PRIVATE=()
  if [ -n "${LOCAL_NODE_PRIVATE_DIR:-}" ]; then
    PRIVATE=(unshare --mount --propagation private sh -c 'mount -t tmpfs none "$0" && exec "$@"'
      "$LOCAL_NODE_PRIVATE_DIR")
  fi
  start_local_node() {
    local index=$1
    "${PRIVATE[@]}" python -m verl_ext.cluster.local_node --address="127.0.0.1:$GCS_PORT" --block \
      --node-ip-address=127.0.0.1 \
      --node-name="node-$index" "${NODE_ARGS[@]}" --dashboard-agent-listen-port="$(free_port)" \
      --dashboard-agent-grpc-port="$(free_port)" --metrics-export-port="$(free_port)" \
      --runtime-env-agent-port="$(free_port)" --temp-dir="$RAY_TMP/node-$index" --disable-usage-stats \
      >>"$RAY_TMP/node-$index.log" 2>&1 &
    NODE_PIDS[index]=$!
  }
  wait_for_local_nodes() {
    python -m verl_ext.cluster.nodes wait --address "$RAY_ADDRESS" --count "$LOCAL_NODES" --exact --timeout 180 || {
      echo "error: the local cluster's nodes did not come up; see $RAY_TMP/node-*.log" >&2
      exit 1
    }
  }
  if [ "$LOCAL_NODES" -gt 1 ]; then
    for ((i = 1; i < LOCAL_NODES; i++)); do start_local_node "$i"; done
    wait_for_local_nodes
  fi
fi

# Before a resubmission, the launcher acts as a cluster manager for the nodes it started: one that died (its
# processes killed from outside, by anything) is started again, so the job finds the cluster it was sized for.
ensure_local_nodes() {
  local i restarted=0
  for ((i = 1; i < ${#NODE_PIDS[@]} + 1; i++)); do
    [ -n "${NODE_PIDS[i]:-}" ] || continue
    if ! kill -0 "${NODE_PIDS[i]}" 2>/dev/null; then
      wait "${NODE_PIDS[i]}" 2>/dev/null || true
      if [ "$LOCAL_NODE_RESTART" = 0 ]; then
        echo "[diva] node-$i of the local cluster died (pid ${NODE_PIDS[i]}); not starting it again (LOCAL_NODE_RESTART=0)"
        NODE_PIDS[i]=""
        continue
      fi
      echo "[diva] node-$i of the local cluster died (pid ${NODE_PIDS[i]}); starting it again before the resubmission"
      start_local_node "$i"
      restarted=1
    fi
  done
  if [ "$restarted" = 1 ]; then wait_for_local_nodes; fi
}

# After a failed attempt: the nodes the job has, waited for up to NODE_RETURN_S; fewer than it was sized for give the
# overrides that plan it on the survivors (kept for every later attempt), or a refusal naming the setting.
RESIZE_ARGS=()
plan_on_alive_nodes() {
  local planned
  planned="$(python -m verl_ext.cluster.resize --address "$RAY_ADDRESS" --wait "$NODE_RETURN_S" -- \
    "$@" "${RESIZE_ARGS[@]}")" || {
    echo "error: not resubmitting: the job cannot go on with the nodes it has (above)" >&2
    exit 2
  }
  if [ -n "$planned" ]; then mapfile -t -O "${#RESIZE_ARGS[@]}" RESIZE_ARGS <<<"$planned"; fi
}

JOB_ARGS=("$@")
attempt=1
while :; do
  if [ "$attempt" -gt 1 ]; then
    ensure_local_nodes
    plan_on_alive_nodes "$@"
    JOB_ARGS=("$@" "trainer.resume_mode=auto" "${RESIZE_ARGS[@]}")
  fi
  echo "[diva] submitting (attempt $attempt of at most $((MAX_RESTARTS + 1))) to $RAY_ADDRESS: python -m recipe.diva_grpo.main_diva ${JOB_ARGS[*]}"
  status=0
  python -m recipe.diva_grpo.submit --address "$RAY_ADDRESS" \
    --runtime-env "${DIVA_RUNTIME_ENV:-recipe/diva_grpo/runtime_env.yaml}" \
    -- python -m recipe.diva_grpo.main_diva "${JOB_ARGS[@]}" "launch.attempt=$attempt" || status=$?
  if [ "$status" -eq 0 ]; then
    [ "$attempt" -gt 1 ] && echo "[diva] attempt $attempt finished the job after $((attempt - 1)) restart(s)"
    break
  fi
  if [ "$status" -eq 2 ]; then  # submit.py refused before submitting (an unreachable cluster): nothing to retry
    echo "error: the job was not submitted (above)" >&2
    exit 2
  fi
  if [ "$attempt" -gt "$MAX_RESTARTS" ] || [ "${DRY_RUN:-0}" = "1" ]; then
    echo "error: the job failed at $(date -u +%FT%TZ) (exit $status) on attempt $attempt; MAX_RESTARTS=$MAX_RESTARTS" >&2
    exit "$status"
  fi
  echo "[diva] attempt $attempt failed at $(date -u +%FT%TZ) (exit $status); resubmitting with trainer.resume_mode=auto (restart $attempt of $MAX_RESTARTS)"
  attempt=$((attempt + 1))
done
