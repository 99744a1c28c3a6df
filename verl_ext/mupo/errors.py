"""Errors of the MUPO embeddings backends. Each one stops the training step: MUPO never falls back to GRPO."""

from __future__ import annotations


class EmbeddingError(RuntimeError):
    """The backend could not embed the batch (endpoint unreachable, retries exhausted, a malformed answer)."""


class EmbeddingEndpointRefused(EmbeddingError):
    """The endpoint refuses every request (401/403/404: key, permission, unknown model); retrying cannot help."""
