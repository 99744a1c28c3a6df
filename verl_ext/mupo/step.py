"""MUPO's part of one training step, for the trainer's advantage step (all of a prompt's responses are needed).

Per step, on the driver, for the ``B`` responses of the batch::

    texts  = decode_responses(responses, response_mask, tokenizer)       token ids -> text
    scores', partition, metrics = mupo_step(texts, scores, acc, uid, step, total_steps, config, embedder)
        spans      = <think>...</think> of each text (whole text if none)
        embeddings = embedder.embed(spans)                                  (B, D), timed
        partition  = mupo_partition(embeddings, uid, k, min_size, seed)
        diversity  = mupo_diversity(embeddings, uid, partition)
        scores'    = scores + lambda_t * acc * diversity
    rewards' = add_sequence_bonus(token_level_rewards, response_mask, scores' - scores)
    advantages, returns = compute_mupo_advantage(rewards', response_mask, uid, partition, balance_beta=...)

An embeddings failure raises :class:`verl_ext.mupo.errors.EmbeddingError`: the step fails, never falls back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verl_ext.algos.mupo import (
    add_diversity_reward,
    mupo_diversity,
    mupo_lambda,
    mupo_metrics,
    mupo_partition,
)
from verl_ext.mupo.config import MupoConfig, mupo_config_from
from verl_ext.mupo.embedder import Embedder
from verl_ext.mupo.errors import EmbeddingError
from verl_ext.mupo.think import THINK_SPAN, extract_think_span


def mupo_step(
    response_texts: Sequence[str],
    scores: Any,
    acc: Any,
    index: Any,
    step: int,
    total_steps: int,
    config: MupoConfig | Any,
    embedder: Embedder,
) -> tuple[torch.Tensor, np.ndarray, dict[str, float]]:
    """Embed, partition, diversity and the diversity reward of one step's ``B`` responses.

    Args:
        response_texts: ``B`` decoded responses (:func:`decode_responses`).
        scores: ``(B,)`` sequence scores before the diversity reward (``token_level_rewards.sum(-1)``).
        acc: ``(B,)`` accuracy in [0, 1] (the reward function's ``acc`` extra).
        index: ``B`` prompt ids (verl's ``uid``).
        step, total_steps: verl's 1-based ``global_steps`` and ``total_training_steps`` (for ``lambda_t``).
        config: the ``mupo:`` block (:class:`MupoConfig`, or a mapping / ``DictConfig`` of it).
        embedder: a backend from :func:`verl_ext.mupo.embedder.build_embedder`.

    Returns:
        ``(scores_with_diversity, partition, metrics)``: ``(B,)`` scores (``scores``' dtype when a float tensor,
        else float64), ``(B,) int64`` partition ids local to each prompt, and the ``mupo/*`` metrics, including
        ``embed/latency_s`` (the wall time of the embedding call) and ``partition/latency_s``.
    """
    config = mupo_config_from(config)
    texts = list(response_texts)
    spans = [extract_think_span(text) for text in texts]
    requests_before = embedder.stats.get("requests", 0)
    retries_before = embedder.stats.get("retries", 0)
    start = time.perf_counter()
    embeddings = np.asarray(embedder.embed(spans))
    embed_s = time.perf_counter() - start
    if embeddings.ndim != 2 or embeddings.shape[0] != len(texts):
        raise EmbeddingError(
            f"the {embedder.describe()} returned an array of shape {embeddings.shape} for {len(texts)} texts"
        )
    start = time.perf_counter()
    partition = mupo_partition(embeddings, index, k=config.k, min_size=config.min_size, seed=config.seed)
    diversity = mupo_diversity(embeddings, index, partition)
    partition_s = time.perf_counter() - start
    lambda_t = mupo_lambda(
        step,
        total_steps,
        lambda_max=config.lambda_max,
        lambda_min=config.lambda_min,
        schedule=config.lambda_schedule,
        decay_rate=config.decay_rate,
    )
    scores_with_diversity = add_diversity_reward(scores, acc, diversity, lambda_t)
    metrics = mupo_metrics(index, partition, diversity, acc, lambda_t, scores=scores_with_diversity)
    metrics.update(
        {
            "mupo/embed/latency_s": embed_s,
            "mupo/embed/requests": float(embedder.stats.get("requests", 0) - requests_before),
            "mupo/embed/retries": float(embedder.stats.get("retries", 0) - retries_before),
            "mupo/partition/latency_s": partition_s,
            "mupo/think_span_rate": float(np.mean([THINK_SPAN.search(t) is not None for t in texts])),
        }
    )
    return scores_with_diversity, partition, metrics


def decode_responses(responses: torch.Tensor, response_mask: torch.Tensor, tokenizer: Any) -> list[str]:
    """The ``B`` response texts: each row's masked-in token ids, decoded without special tokens."""
    if responses.shape != response_mask.shape:
        raise ValueError(
            f"responses has shape {tuple(responses.shape)} but response_mask has {tuple(response_mask.shape)}"
        )
    keep = response_mask.bool().cpu()
    ids = responses.cpu()
    return tokenizer.batch_decode([row[m].tolist() for row, m in zip(ids, keep, strict=True)], skip_special_tokens=True)


def add_sequence_bonus(token_level: torch.Tensor, response_mask: torch.Tensor, bonus: Any) -> torch.Tensor:
    """``token_level`` with ``bonus[i]`` added at row ``i``'s last response token (where verl puts the score).

    A row without response tokens must have a bonus of 0 (it has nowhere to go). Returns a new tensor in
    ``token_level.dtype``; the sequence score ``sum_t`` grows by exactly the bonus (up to that dtype's rounding).
    """
    if token_level.dim() != 2 or response_mask.shape != token_level.shape:
        raise ValueError(
            f"token_level must be (B, T) and response_mask the same shape, got {tuple(token_level.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    bonus_t = torch.as_tensor(np.asarray(bonus, dtype=np.float64) if not isinstance(bonus, torch.Tensor) else bonus)
    if bonus_t.shape != (token_level.shape[0],):
        raise ValueError(f"bonus must have shape ({token_level.shape[0]},), got {tuple(bonus_t.shape)}")
    mask = response_mask.bool()
    has_tokens = mask.any(dim=-1)
    empty_with_bonus = ~has_tokens & (bonus_t.to(has_tokens.device) != 0)
    if bool(empty_with_bonus.any()):
        row = int(empty_with_bonus.nonzero()[0, 0])
        raise ValueError(f"response {row} has no response tokens but a bonus of {bonus_t[row].item()}")
    positions = torch.arange(token_level.shape[1], device=token_level.device)
    last = torch.where(mask, positions, -1).amax(dim=-1).clamp_min(0)
    out = token_level.clone()
    rows = torch.arange(token_level.shape[0], device=token_level.device)
    out[rows, last] += bonus_t.to(device=token_level.device, dtype=token_level.dtype)
    return out
