"""The one place the config picks MUPO's embeddings backend (what a backend is: :mod:`verl_ext.mupo.backend`)."""

from __future__ import annotations

import os

from verl_ext.mupo.backend import Embedder
from verl_ext.mupo.config import EmbeddingConfig

BACKENDS = ("openai", "sentence_transformers", "hashing")


# One backend per distinct embedding config in this process: the endpoint client keeps its connection pool and
# the local model stays loaded across steps.
_SHARED: dict[tuple, Embedder] = {}


def build_embedder(config: EmbeddingConfig) -> Embedder:
    """The backend ``config.backend`` names, built from the ``mupo.embedding`` block."""
    if config.backend == "openai":
        from data_prep.llm_client import RetryPolicy
        from verl_ext.mupo.embeddings_client import BASE_URL_ENV, OpenAIEmbedder

        return OpenAIEmbedder(
            config.base_url or os.environ.get(BASE_URL_ENV, ""),
            config.model,
            api_key_env=config.api_key_env,
            concurrency=config.concurrency,
            batch_size=config.batch_size,
            timeout=config.timeout,
            retry=RetryPolicy(config.max_retries, config.base_delay, config.max_delay),
        )
    if config.backend == "sentence_transformers":
        from verl_ext.mupo.local_embedder import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(config.model, device=config.device, batch_size=config.batch_size)
    if config.backend == "hashing":
        from verl_ext.mupo.hashing_embedder import HashingEmbedder

        return HashingEmbedder()
    raise ValueError(f"mupo.embedding.backend must be one of {BACKENDS}, got {config.backend!r}")


STARTUP_TEXT = "MUPO start-up check: one short text embedded before the first rollout"


def check_embedder(config: EmbeddingConfig) -> None:
    """Fail before the first rollout, not at the first advantage step after it: build the process's backend for
    ``config`` and embed one text with it (the ``openai`` backend: the endpoint answers, the model is served, the
    key is accepted). Raises ``ValueError`` naming the ``mupo.embedding`` keys and the variables to set."""
    from verl_ext.mupo.embeddings_client import BASE_URL_ENV
    from verl_ext.mupo.errors import EmbeddingError

    if config.backend == "hashing":
        return
    fix = (
        f"set mupo.embedding.base_url (or the {BASE_URL_ENV} environment variable) to a served OpenAI-compatible "
        f"/v1/embeddings endpoint, mupo.embedding.model to its model, and the {config.api_key_env} environment "
        "variable (named by mupo.embedding.api_key_env) when it needs a key; or mupo.embedding.backend="
        "sentence_transformers for a local model"
        if config.backend == "openai"
        else "set mupo.embedding.model to a local sentence-transformers model (path or name) and mupo.embedding.device"
    )
    try:
        embedder = shared_embedder(config)
        rows = embedder.embed([STARTUP_TEXT])
    except (ValueError, EmbeddingError, OSError, ImportError) as error:
        raise ValueError(
            f"mupo.embedding (backend {config.backend}): the start-up check failed: {error}. To fix: {fix}"
        ) from error
    if rows.shape[0] != 1 or rows.shape[1] == 0:
        raise ValueError(f"mupo.embedding: {embedder.describe()} returned {rows.shape} for one text. To fix: {fix}")


def shared_embedder(config: EmbeddingConfig) -> Embedder:
    """The process's backend for ``config``, built on first use (what the trainer calls every step)."""
    key = tuple(sorted((name, value) for name, value in config.items() if not name.startswith("_")))
    if key not in _SHARED:
        _SHARED[key] = build_embedder(config)
    return _SHARED[key]
