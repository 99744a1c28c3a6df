#!/usr/bin/env bash
# MUPO (several groups of similar reasoning per prompt and a diversity reward; docs/algo/mupo.md) on
# Qwen2.5-VL-7B-Instruct with the paper's settings: 15 rollouts, k 3 groups of at least 3, lambda 0.4 -> 0.1.
# The responses' reasoning is embedded by an OpenAI-compatible endpoint, e.g. on the embedding host:
#   vllm serve Qwen/Qwen3-Embedding-0.6B --task embed --port 8000
#   MUPO_EMBEDDING_BASE_URL=http://embed-host:8000/v1 bash run_scripts/qwen25vl7b_mupo.sh   # train
#   DRY_RUN=1 bash run_scripts/qwen25vl7b_mupo.sh     # CPU preflight (uses the endpoint when one is set)
# The key, if the endpoint needs one, is read from $OPENAI_API_KEY (mupo.embedding.api_key_env) in the job.
# Knobs: the mupo: block of recipe/diva_grpo/config/diva_grpo.yaml.
set -euo pipefail
export DIVA_LAUNCHER="${DIVA_LAUNCHER:-$0}"
export ROLLOUT_N="${ROLLOUT_N:-15}"
EMBED_ARGS=(mupo.embedding.model="${MUPO_EMBEDDING_MODEL:-Qwen/Qwen3-Embedding-0.6B}")
if [ -n "${MUPO_EMBEDDING_BASE_URL:-}" ]; then
  EMBED_ARGS+=(mupo.embedding.base_url="$MUPO_EMBEDDING_BASE_URL")
fi
exec bash "$(dirname "${BASH_SOURCE[0]}")/_toolkit.sh" mupo mupo.k="${MUPO_K:-3}" "${EMBED_ARGS[@]}" "$@"
