"""What MUPO needs from an embeddings backend: the :class:`Embedder` protocol and the input check of the model
backends. A leaf of the package: the backends import it, and :mod:`verl_ext.mupo.embedder` imports the backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    """``embed(texts) -> (len(texts), D)`` float array, row ``i`` for ``texts[i]``; raises
    :class:`verl_ext.mupo.errors.EmbeddingError` when it cannot. ``stats`` counts requests (and retries)."""

    stats: dict

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def checked_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, the model backends' input check: ``ValueError`` naming the first that is not a str."""
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return texts
