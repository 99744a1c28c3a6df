"""MUPO's embeddings and step logic around the pure math of :mod:`verl_ext.algos.mupo`.

- :mod:`~verl_ext.mupo.think`: the text embedded (a response's ``<think>`` span);
- :mod:`~verl_ext.mupo.embeddings_client`: any OpenAI-compatible ``/v1/embeddings`` endpoint (default);
- :mod:`~verl_ext.mupo.local_embedder`: a local sentence-transformers model (optional package);
- :mod:`~verl_ext.mupo.embedder`: the backend protocol and :func:`build_embedder` (``mupo.embedding.backend``);
- :mod:`~verl_ext.mupo.config`: the ``mupo:`` block; :mod:`~verl_ext.mupo.step`: what the trainer calls per step.
"""

from verl_ext.mupo.config import EmbeddingConfig, MupoConfig, check_rollout_n, mupo_config_from
from verl_ext.mupo.embedder import Embedder, build_embedder, check_embedder, shared_embedder
from verl_ext.mupo.errors import EmbeddingEndpointRefused, EmbeddingError
from verl_ext.mupo.step import add_sequence_bonus, decode_responses, mupo_step
from verl_ext.mupo.think import extract_think_span

__all__ = [
    "EmbeddingConfig",
    "EmbeddingEndpointRefused",
    "EmbeddingError",
    "Embedder",
    "MupoConfig",
    "add_sequence_bonus",
    "build_embedder",
    "check_embedder",
    "check_rollout_n",
    "decode_responses",
    "extract_think_span",
    "mupo_config_from",
    "mupo_step",
    "shared_embedder",
]
