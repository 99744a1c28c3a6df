"""Advantage collapse: groups whose rewards are all equal (AVSPO's diagnostic, see ``seeds/``).

A group of equal rewards has a GRPO z-score of 0 (and an RRB range of 0), so it teaches nothing.
The DIVA trainer logs this rate for the prompt groups (local stream) and the question groups
(global stream); variants exist to lower the latter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl_ext.algos.group_stats import dense_group_ids, group_range


def _checked_scores(scores: Any) -> torch.Tensor:
    if isinstance(scores, torch.Tensor):
        values = scores.detach().to(dtype=torch.float64)
    else:
        try:
            values = torch.as_tensor(np.asarray(scores, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise ValueError(f"scores must be numbers, one per response: {err}") from err
    if values.dim() != 1:
        raise ValueError(f"scores must be 1-D (one reward per response), got shape {tuple(values.shape)}")
    if values.numel() == 0:
        raise ValueError("scores is empty: the collapse rate of no groups is undefined")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("scores must be finite")
    return values


def _group_spread(scores: Any, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G,)`` max - min of the checked ``scores`` per group of ``index``, and each response's ``(B,)`` group."""
    values = _checked_scores(scores)
    group_of, num_groups = dense_group_ids(index, "index", values.numel(), values.device)
    return group_range(values, group_of, num_groups), group_of


def advantage_collapse_rate(scores: Any, index: Any) -> float:
    """Fraction of groups whose scores are all equal.

    Args:
        scores: ``(B,)`` per-response sequence rewards (tensor, array or list), e.g.
            ``token_level_rewards.sum(-1)``.
        index: ``B`` hashable group ids (verl's ``uid`` for prompt groups, question ids for question groups).

    Returns:
        ``#{g : max_g(s) == min_g(s)} / #groups``. A group of one counts as collapsed: it has no
        spread to learn from (its RRB range is 0).
    """
    spread, _ = _group_spread(scores, index)
    return float((spread == 0).to(torch.float64).mean())


def in_collapsed_group(scores: Any, index: Any) -> torch.Tensor:
    """``(B,)`` bool: response ``i``'s group (``index``) has all scores equal, so its z-score is 0 in exact arithmetic.

    verl's GRPO computes ``(s - mean) / (std + eps)`` in float32: a group of eight equal scores of 0.1 (a well-formed
    wrong answer) gets a mean one rounding step off 0.1 and a std of about 0, so every response gets -0.0074, not
    0: rounding divided by ``eps``, not a learning signal. Counting such responses as zero needs the scores."""
    spread, group_of = _group_spread(scores, index)
    return spread[group_of] == 0
