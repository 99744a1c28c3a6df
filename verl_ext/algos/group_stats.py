"""Vectorised per-group statistics over a batch of B responses.

Groups are given as a dense id per response, ``group_of: (B,) int64 tensor`` with values ``0..G-1``
(:func:`dense_group_ids` builds it from verl-style id arrays). Every function here is O(B) work done
by a handful of ``pandas.factorize`` / ``bincount`` / ``index_add_`` / ``scatter_reduce_`` calls: no
Python loop over responses or groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch


def dense_group_ids(
    ids: Any, name: str, batch_size: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, int]:
    """Map hashable ids (verl's ``uid`` object array, a list, an int array) to dense group ids.

    Returns ``(group_of, G)``: ``group_of`` is ``(B,) int64`` on ``device`` with values ``0..G-1``, numbered by
    first appearance. Ids group by
    Python equality, as verl's GRPO groups them in a dict (``1 == 1.0``, ``"1" != 1``); hashing, not
    sorting, so mixed id types are fine. ``name`` is the argument name used in error messages.
    """
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    ids = ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=object)
    if ids.ndim != 1 or ids.shape[0] != batch_size:
        raise ValueError(
            f"{name} must be a 1-D sequence with one id per response ({batch_size}), got shape {ids.shape}"
        )
    codes, uniques = pd.factorize(ids)
    if batch_size and codes.min() < 0:
        row = int(np.flatnonzero(codes < 0)[0])
        raise ValueError(f"{name} is missing for response {row} ({ids[row]!r}); every response needs an id")
    return torch.from_numpy(codes.astype(np.int64, copy=False)).to(device), len(uniques)


def group_count(group_of: torch.Tensor, num_groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``(G,)`` number of responses per group, as ``dtype``."""
    return torch.bincount(group_of, minlength=num_groups).to(dtype)


def group_mean(values: torch.Tensor, group_of: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``(G,)`` mean of ``values: (B,)`` over each group; ``count`` from :func:`group_count`."""
    total = torch.zeros_like(count).index_add_(0, group_of, values)
    return total / count


def group_range(values: torch.Tensor, group_of: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``(G,)`` ``max - min`` of ``values: (B,)`` over each group (0 for a group of one)."""
    empty = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    high = empty.scatter_reduce(0, group_of, values, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, group_of, values, reduce="amin", include_self=False)
    return high - low


def group_zscore(
    scores: torch.Tensor, group_of: torch.Tensor, num_groups: int, spread: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """GRPO z-score of ``scores: (B,)`` within each group, as verl's ``compute_grpo_outcome_advantage``.

    ``z_i = (s_i - mean_g) / (std_g + epsilon)`` with the unbiased std; a group of one takes
    ``mean = 0, std = 1`` (so ``z = s / (1 + epsilon)``). ``spread: (G,)`` is the group's ``max - min``
    (:func:`group_range`): a group of several equal scores gets exactly 0, where the float mean
    would leave rounding noise of order 1e-10 that a later batch normalisation could blow up to O(1).
    """
    count = group_count(group_of, num_groups, scores.dtype)
    mean = group_mean(scores, group_of, count)
    centered = scores - mean[group_of]
    sum_sq = torch.zeros_like(count).index_add_(0, group_of, centered * centered)
    single = count == 1
    std = torch.where(single, 1.0, sum_sq / (count - 1).clamp_min(1)).sqrt()
    mean = torch.where(single, 0.0, mean)
    z = (scores - mean[group_of]) / (std[group_of] + epsilon)
    all_equal = (spread == 0) & ~single
    return torch.where(all_equal[group_of], 0.0, z)


def batch_standardize(values: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / std`` over the whole ``(B,)`` batch, unbiased std.

    A batch whose values are all equal (std 0), or of one response, gets std 1 and exactly 0.
    """
    if values.numel() < 2 or bool(values.max() == values.min()):
        return torch.zeros_like(values)
    centered = values - values.mean()
    return centered / centered.square().sum().div(values.numel() - 1).sqrt()
