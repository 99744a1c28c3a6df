"""Embeddings from a local sentence-transformers model on the trainer's node (the option to an endpoint).

``sentence-transformers`` is optional: it is imported only when this backend is built, and its absence is a
clear :class:`EmbeddingError`. The model runs in the trainer's driver process, so it suits small models and
small runs; the paper's setup serves Qwen3-Embedding-0.6B with vLLM (``backend: openai``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from verl_ext.mupo.backend import checked_texts
from verl_ext.mupo.errors import EmbeddingError


class SentenceTransformerEmbedder:
    """``embed(texts) -> (B, D) float32`` with a local ``SentenceTransformer`` (a path or a cached name)."""

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 64):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"mupo.embedding.batch_size must be a positive integer, got {batch_size!r}")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise EmbeddingError(
                "mupo.embedding.backend=sentence_transformers needs the sentence-transformers package "
                "(pip install sentence-transformers), or use backend=openai with an embeddings endpoint"
            ) from err
        try:
            self._model = SentenceTransformer(model, device=device)
        except Exception as err:  # a missing path or an unreadable model: say which
            raise EmbeddingError(f"cannot load the local embedding model {model!r}: {err}") from err
        self.model = model
        self.batch_size = batch_size
        self.stats: Counter[str] = Counter()

    def describe(self) -> str:
        return f"local sentence-transformers model {self.model} on {self._model.device}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = checked_texts(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = self._model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
        self.stats["requests"] += 1
        self.stats["texts"] += len(texts)
        return np.asarray(vectors, dtype=np.float32)

    def close(self) -> None:
        return None
