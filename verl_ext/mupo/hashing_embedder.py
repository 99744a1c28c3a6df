"""A model-free embeddings backend: hashed character n-grams (``mupo.embedding.backend=hashing``).

For CPU runs and the preflight, where no embedding model is served: two texts are close when they share character
trigrams, which is enough to exercise MUPO's partition, diversity and reward end to end. It knows nothing of
meaning; real runs use an embedding model (the ``openai`` or ``sentence_transformers`` backend).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

NGRAM = 3


class HashingEmbedder:
    """``embed(texts) -> (len(texts), dim)`` float32: counts of each text's character trigrams hashed (crc32) into
    ``dim`` buckets; a text shorter than a trigram counts itself once. Deterministic across processes."""

    def __init__(self, dim: int = 256):
        if dim < 1:
            raise ValueError(f"mupo.embedding hashing dim must be positive, got {dim}")
        self.dim = int(dim)
        self.stats = {"requests": 0, "retries": 0}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            grams = [text[i : i + NGRAM] for i in range(max(1, len(text) - NGRAM + 1))]
            buckets = [zlib.crc32(gram.encode("utf-8")) % self.dim for gram in grams]
            np.add.at(out[row], buckets, 1.0)
        self.stats["requests"] += 1
        return out

    def describe(self) -> str:
        return f"hashed character {NGRAM}-grams ({self.dim} dims, no model)"

    def close(self) -> None:
        return None
