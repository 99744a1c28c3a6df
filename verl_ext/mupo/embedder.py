"""What MUPO needs from an embeddings backend, and the one place the config picks it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from verl_ext.mupo.config import EmbeddingConfig

BACKENDS = ("openai", "sentence_transformers")


class Embedder(Protocol):
    """``embed(texts) -> (len(texts), D)`` float array, row ``i`` for ``texts[i]``; raises
    :class:`verl_ext.mupo.errors.EmbeddingError` when it cannot. ``stats`` counts requests (and retries)."""

    stats: dict

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


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
    raise ValueError(f"mupo.embedding.backend must be one of {BACKENDS}, got {config.backend!r}")
