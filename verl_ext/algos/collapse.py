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
    group_of, num_groups = dense_group_ids(index, "index", values.numel(), values.device)
    spread = group_range(values, group_of, num_groups)
    return float((spread == 0).to(torch.float64).mean())
