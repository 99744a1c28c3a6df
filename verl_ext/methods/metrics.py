"""Metric helpers shared by the methods' ``compute`` functions: summaries of per-response values."""

from __future__ import annotations

import torch


def summary(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean``, ``/std``, ``/min``, ``/max`` of ``(N,)`` values (empty: nothing; one value: std 0)."""
    values = values.detach().to(torch.float64).flatten()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/std": values.std().item() if values.numel() > 1 else 0.0,
        f"{prefix}/min": values.min().item(),
        f"{prefix}/max": values.max().item(),
    }


def per_response_advantage(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(R,)`` token-mean of ``(R, T)`` advantages over each response's tokens (0 for an empty response)."""
    mask = response_mask.to(advantages.dtype)
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def advantage_summary(
    prefix: str, advantages: torch.Tensor, response_mask: torch.Tensor, zero: torch.Tensor | None = None
) -> dict[str, float]:
    """:func:`summary` of the per-response advantages plus the fraction of responses whose advantage is 0.

    ``zero``: ``(R,)`` bool, the responses whose advantage is 0 when the float result cannot say so (verl's GRPO:
    :func:`verl_ext.algos.collapse.in_collapsed_group`); by default those whose advantage is exactly 0."""
    per_response = per_response_advantage(advantages, response_mask)
    out = summary(prefix, per_response)
    if per_response.numel():
        zero = per_response == 0 if zero is None else zero
        out[f"{prefix}/zero_fraction"] = zero.to(torch.float64).mean().item()
    return out
