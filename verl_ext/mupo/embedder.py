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


def shared_embedder(config: EmbeddingConfig) -> Embedder:
    """The process's backend for ``config``, built on first use (what the trainer calls every step)."""
    key = tuple(sorted((name, value) for name, value in config.items() if not name.startswith("_")))
    if key not in _SHARED:
        _SHARED[key] = build_embedder(config)
    return _SHARED[key]
