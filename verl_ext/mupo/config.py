"""Typed view of the recipe's ``mupo:`` config block (knobs, defaults and one-line reasons in docs/algo/mupo.md).

Plain :class:`verl.base_config.BaseConfig` dataclasses, so the toolkit's ``verl_ext.config.config_block`` builds
them from a ``DictConfig`` or dict (unknown keys refused); :func:`mupo_config_from` is that call for ``mupo:``.
:func:`check_rollout_n` is the start-up check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig

from verl_ext.config import config_block


@dataclass
class EmbeddingConfig(BaseConfig):
    """Where the responses' reasoning is embedded (``mupo.embedding``)."""

    # "openai": any OpenAI-compatible /v1/embeddings endpoint (vLLM, SGLang, TEI, OpenAI); "sentence_transformers":
    # a local model on the trainer's node (optional package, imported only then); "hashing": hashed character
    # trigrams, no model (CPU runs and the preflight only: it knows nothing of meaning).
    backend: str = "openai"
    # Endpoint base URL, e.g. http://embed-host:8000/v1; None reads the MUPO_EMBEDDING_BASE_URL environment variable.
    base_url: str | None = None
    # Served model name (openai backend) or local path / name (sentence_transformers backend); the paper's choice.
    model: str = "Qwen/Qwen3-Embedding-0.6B"
    # Name of the environment variable holding the API key (never the key itself); unset: a placeholder key.
    api_key_env: str = "OPENAI_API_KEY"
    # Requests in flight at once.
    concurrency: int = 8
    # Texts per request (one request per prompt in the released code; larger batches mean fewer round trips).
    batch_size: int = 64
    # Seconds before one request counts as timed out (then retried).
    timeout: float = 60.0
    # Retries of one request after 429 / 5xx / timeout / dropped connection, with exponential backoff.
    max_retries: int = 6
    # First backoff in seconds (doubled each retry, jittered, or the server's Retry-After when longer).
    base_delay: float = 1.0
    # Longest backoff in seconds.
    max_delay: float = 60.0
    # Local backend only: torch device ("cpu", "cuda:0"); None lets sentence-transformers choose.
    device: str | None = None


@dataclass
class MupoConfig(BaseConfig):
    """All MUPO knobs, as found under the recipe's top-level ``mupo:`` key (paper defaults)."""

    # Groups per prompt (paper Table 4: K=3 best).
    k: int = 3
    # Fewest responses per group; a prompt with fewer than k * min_size responses stays one group.
    min_size: int = 3
    # random_state of every prompt's k-means (deterministic partition).
    seed: int = 0
    # Exponent of the load-balance weight (N_p / (K_p |G|)) ** balance_beta.
    balance_beta: float = 1.0
    # Added to each group's std in the z-score (verl's GRPO epsilon).
    epsilon: float = 1e-6
    # Diversity-reward weight at the first step.
    lambda_max: float = 0.4
    # Diversity-reward weight at the last step (cosine schedule).
    lambda_min: float = 0.1
    # "cosine" (paper) or "exponential" (released code: lambda_max * exp(-decay_rate * step)).
    lambda_schedule: str = "cosine"
    # Exponential schedule only: decay per step (released 7B script 9e-3; its config default 1e-2).
    decay_rate: float = 9e-3
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)


def check_rollout_n(rollout_n: int, config: MupoConfig) -> None:
    """Start-up check: every prompt must be splittable, ``actor_rollout_ref.rollout.n >= k * min_size``."""
    if rollout_n < config.k * config.min_size:
        raise ValueError(
            f"actor_rollout_ref.rollout.n={rollout_n} is below mupo.k * mupo.min_size = {config.k} * "
            f"{config.min_size} = {config.k * config.min_size}: no prompt could be split into groups. Raise "
            "rollout.n (paper: 15) or lower mupo.k / mupo.min_size."
        )


def mupo_config_from(values: Any = None) -> MupoConfig:
    """A :class:`MupoConfig` from the ``mupo:`` block (``DictConfig``, dict, ``MupoConfig`` or ``None`` for the
    defaults), built as the toolkit trainer builds it (:func:`verl_ext.config.config_block`); an unknown key
    raises ``ValueError`` naming it with its path (``mupo.embedding.url``)."""
    return config_block(MupoConfig, values, "mupo")
