"""The AVSPO advantage: virtual samples for collapsed groups (He et al., arXiv 2605.21125; docs/algo/avspo.md).

For response ``i`` of group ``g = index[i]``, ``s_i = sum_t token_level_rewards[i, t]``::

    collapsed(g)   = |g| >= 2 and max_g(s) - min_g(s) <= collapse_tol
    ACR            = #collapsed groups / #groups with |g| >= 2           (this batch; 0 when there are none)
    not collapsed: A_i = (s_i - mean_g) / (std_g + eps)                  verl's GRPO z-score (unbiased std,
                                                                         a group of one: mean 0, std 1)
    collapsed:     r = mean_g(s), G = |g|, K virtual scores v_1..v_K:
        mode="paper":    K = max(1, min(G, ceil(G * ACR**alpha)))
                         r >= reward_max / 2 (all correct): v_j = r * (1 - j / (K + 1)),  j = 1..K
                         otherwise (all wrong):             v_j = min(reward_max, r + anchor * reward_max)
        mode="released": K = 1, v = 0 if r >= reward_max / 2 else reward_max
        A_i = (s_i - mean') / (std' + eps)   mean', std' (unbiased) over the G + K scores {s_i} U {v_j}
        A_i = 0 exactly when the G + K scores are still within collapse_tol of each other
    advantages[i, t] = returns[i, t] = A_i * response_mask[i, t]

The virtual scores only enter the statistics: they are not responses and get no advantage. In a collapsed
group of G equal scores, K virtual scores of one value give every real response ``|A| = sqrt(K / G)`` under
the population std (times ``sqrt((G + K - 1) / (G + K))`` with the unbiased std used here); spread-out values
(the stratified all-correct rule) give less. A group of several exactly equal scores that is not collapsed
cannot exist (its range is 0 <= collapse_tol), so a group of two or more has all its advantages 0 only by
the last rule.

There is no ACR gate (the ``tau_adapt`` threshold of one summary of the paper): every collapsed group gets
virtual samples. :func:`avspo_collapse_rates` gives the batch ACR (the figure of the paper's tables) before
and after the virtual samples. The O(B) statistics run in float64 (scores summed in the input dtype, as
verl does); the output has ``token_level_rewards.dtype``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl_ext.algos.checks import STAT_DTYPE, broadcast_over_mask, check_finite, check_rewards_and_mask, sequence_scores
from verl_ext.algos.group_stats import dense_group_ids, group_count, group_mean, group_range, group_zscore

MODES = ("paper", "released")


@torch.no_grad()
def compute_avspo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    *,
    mode: str = "paper",
    alpha: float = 0.5,
    reward_max: float = 1.0,
    anchor: float = 0.1,
    collapse_tol: float = 1e-6,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AVSPO advantages and returns (see the module docstring for the formula).

    Args:
        token_level_rewards: ``(B, T)`` float tensor; its dtype is the output dtype.
        response_mask: ``(B, T)`` tensor of 0/1: bool, integer (verl passes int64) or float. Checked exactly.
        index: ``B`` hashable group ids (verl's ``uid``), a numpy array, list or tensor.
        mode: ``"paper"`` (K from the ACR, stratified / anchored virtual scores) or ``"released"`` (the
            authors' shipped rule: one virtual score of the opposite outcome).
        alpha: exponent of the ACR in the paper's virtual-sample count ``K``.
        reward_max: the largest sequence reward (``r >= reward_max / 2`` means all correct).
        anchor: all-wrong groups' virtual score, above ``r``, as a fraction of ``reward_max`` (paper mode).
        collapse_tol: a group of two or more responses whose ``max - min`` score is at most this is collapsed.
        epsilon: added to the std, as in verl's GRPO.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in ``token_level_rewards.dtype`` and the same tensor (as
        verl's GRPO returns). Masked positions are exactly 0.

    Raises:
        ValueError: naming the argument, for mismatched shapes or lengths, non-finite rewards, a mask that is
            not 0/1, a missing id, or a bad knob.
    """
    check_rewards_and_mask(token_level_rewards, response_mask)
    scores, group_of, num_groups = _scores_and_groups(token_level_rewards, index)
    plan = _plan_virtual(scores, group_of, num_groups, mode, alpha, reward_max, anchor, collapse_tol)

    per_response = group_zscore(scores, group_of, num_groups, plan.spread, epsilon)
    if plan.num_collapsed:
        augmented = _augmented_zscore(scores, group_of, plan, epsilon)
        per_response = torch.where(plan.collapsed[group_of], augmented, per_response)
    check_finite(per_response, f"advantages overflowed (epsilon={epsilon})")

    advantages = broadcast_over_mask(per_response.to(token_level_rewards.dtype), response_mask)
    return advantages, advantages


@torch.no_grad()
def avspo_collapse_rates(
    token_level_rewards: torch.Tensor,
    index: Any,
    *,
    mode: str = "paper",
    alpha: float = 0.5,
    reward_max: float = 1.0,
    anchor: float = 0.1,
    collapse_tol: float = 1e-6,
) -> dict[str, float]:
    """The batch's advantage collapse rates before and after AVSPO's virtual samples (for the trainer's log).

    Takes the same rewards, ids and knobs as :func:`compute_avspo_advantage` (``(B, T)`` or already summed
    ``(B,)`` rewards) and returns, over the groups of two or more responses (groups of one do not count):

    - ``acr_before``: fraction of those groups that are collapsed (``max - min <= collapse_tol``), i.e. whose
      GRPO advantages are all 0. This is the paper's ACR.
    - ``acr_after``: fraction of those groups whose advantages from :func:`compute_avspo_advantage` are still
      all exactly 0: the collapsed groups whose ``G + K`` real and virtual scores are still within
      ``collapse_tol`` of each other. A virtual score lies at least ``reward_max / (2 (K + 1))`` (all correct,
      paper mode), ``min(anchor, 1/2) * reward_max`` (all wrong, paper mode) or ``reward_max / 2`` (released
      mode) from ``r``, so with the default knobs this is 0; it is above 0 for e.g. ``anchor=0``.
    - ``groups``: the number of groups of two or more; ``collapsed``: how many of them are collapsed;
      ``virtual_samples``: the total ``K`` over the collapsed groups; ``virtual_per_collapsed``: its mean
      (0 with no collapsed group).

    Both rates are 0 for a batch without a group of two or more.
    """
    if not isinstance(token_level_rewards, torch.Tensor) or not token_level_rewards.is_floating_point():
        raise ValueError("token_level_rewards must be a floating-point torch.Tensor of shape (B, T) or (B,)")
    if token_level_rewards.dim() not in (1, 2):
        raise ValueError(f"token_level_rewards must be (B, T) or (B,), got shape {tuple(token_level_rewards.shape)}")
    rewards = token_level_rewards if token_level_rewards.dim() == 2 else token_level_rewards.unsqueeze(-1)
    scores, group_of, num_groups = _scores_and_groups(rewards, index)
    plan = _plan_virtual(scores, group_of, num_groups, mode, alpha, reward_max, anchor, collapse_tol)
    still = 0
    if plan.num_collapsed:
        all_scores, all_groups = _with_virtual(scores, group_of, plan)
        still = int((plan.collapsed & (group_range(all_scores, all_groups, num_groups) <= collapse_tol)).sum())
    multi = plan.num_multi
    virtual = int(plan.k.sum())
    return {
        "acr_before": plan.acr,
        "acr_after": still / multi if multi else 0.0,
        "groups": multi,
        "collapsed": plan.num_collapsed,
        "virtual_samples": virtual,
        "virtual_per_collapsed": virtual / plan.num_collapsed if plan.num_collapsed else 0.0,
    }


@dataclass(frozen=True)
class _VirtualPlan:
    """Per-group decisions, all ``(G,)``: which groups are collapsed, their ``K`` and real mean ``r``."""

    spread: torch.Tensor  # max - min of the real scores
    collapsed: torch.Tensor  # bool
    k: torch.Tensor  # int64, 0 for groups that are not collapsed
    mean: torch.Tensor  # r, the real scores' mean
    acr: float
    num_multi: int
    num_collapsed: int
    mode: str
    reward_max: float
    anchor: float
    collapse_tol: float


def _scores_and_groups(token_level_rewards: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    scores = sequence_scores(token_level_rewards)
    group_of, num_groups = dense_group_ids(index, "index", scores.shape[0], scores.device)
    return scores, group_of, num_groups


def _check_knobs(mode: str, alpha: float, reward_max: float, anchor: float, collapse_tol: float) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    for name, value in (("alpha", alpha), ("anchor", anchor)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not isinstance(reward_max, (int, float)) or not math.isfinite(reward_max) or reward_max <= 0:
        raise ValueError(f"reward_max must be a positive finite number, got {reward_max!r}")
    if not isinstance(collapse_tol, (int, float)) or not math.isfinite(collapse_tol) or collapse_tol < 0:
        raise ValueError(f"collapse_tol must be a finite number >= 0, got {collapse_tol!r}")


def _plan_virtual(
    scores: torch.Tensor,
    group_of: torch.Tensor,
    num_groups: int,
    mode: str,
    alpha: float,
    reward_max: float,
    anchor: float,
    collapse_tol: float,
) -> _VirtualPlan:
    _check_knobs(mode, alpha, reward_max, anchor, collapse_tol)
    count = group_count(group_of, num_groups, STAT_DTYPE)
    spread = group_range(scores, group_of, num_groups)
    multi = count >= 2
    collapsed = multi & (spread <= collapse_tol)
    num_multi, num_collapsed = int(multi.sum()), int(collapsed.sum())
    acr = num_collapsed / num_multi if num_multi else 0.0
    if mode == "paper":
        # ceil(G * ACR**alpha) in float64, the same IEEE operations as Python's (ACR**alpha is one number).
        k = torch.ceil(count * (acr**alpha)).clamp(min=1.0)
        k = torch.minimum(k, count)
    else:
        k = torch.ones_like(count)
    k = torch.where(collapsed, k, 0.0).to(torch.int64)
    return _VirtualPlan(
        spread=spread,
        collapsed=collapsed,
        k=k,
        mean=group_mean(scores, group_of, count),
        acr=acr,
        num_multi=num_multi,
        num_collapsed=num_collapsed,
        mode=mode,
        reward_max=float(reward_max),
        anchor=float(anchor),
        collapse_tol=float(collapse_tol),
    )


def _with_virtual(
    scores: torch.Tensor, group_of: torch.Tensor, plan: _VirtualPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real scores followed by every collapsed group's ``K`` virtual scores, and the group of each.

    At most ``B`` virtual scores (``K <= G``), built with one ``repeat``: ``j`` (1..K) is each virtual score's
    position inside its group's run.
    """
    num_groups = plan.k.shape[0]
    # numpy's repeat: torch.repeat_interleave, multi-threaded even for a few ids, measured 17 ms for 21 ids with
    # two threads on a busy machine (8 us with one); these are O(G) ids either way.
    repeated = np.repeat(np.arange(num_groups, dtype=np.int64), plan.k.cpu().numpy())
    virtual_group = torch.from_numpy(repeated).to(scores.device)
    r = plan.mean[virtual_group]
    correct = r >= plan.reward_max / 2
    if plan.mode == "paper":
        run_start = torch.cumsum(plan.k, 0) - plan.k
        j = (torch.arange(virtual_group.shape[0], device=scores.device) - run_start[virtual_group] + 1).to(STAT_DTYPE)
        k = plan.k[virtual_group].to(STAT_DTYPE)
        stratified = r * (1 - j / (k + 1))
        anchored = torch.clamp(r + plan.anchor * plan.reward_max, max=plan.reward_max)
        virtual = torch.where(correct, stratified, anchored)
    else:
        virtual = torch.where(correct, 0.0, plan.reward_max).to(STAT_DTYPE)
    return torch.cat([scores, virtual]), torch.cat([group_of, virtual_group])


def _augmented_zscore(scores: torch.Tensor, group_of: torch.Tensor, plan: _VirtualPlan, epsilon: float) -> torch.Tensor:
    """``(B,)`` ``(s_i - mean') / (std' + eps)`` over each group's real and virtual scores (only the collapsed
    groups' values are used by the caller); 0 where the ``G + K`` scores are still within ``collapse_tol``."""
    num_groups = plan.k.shape[0]
    all_scores, all_groups = _with_virtual(scores, group_of, plan)
    count = group_count(all_groups, num_groups, STAT_DTYPE)
    mean = group_mean(all_scores, all_groups, count)
    centered = all_scores - mean[all_groups]
    sum_sq = torch.zeros_like(count).index_add_(0, all_groups, centered * centered)
    std = (sum_sq / (count - 1).clamp_min(1)).sqrt()
    z = (scores - mean[group_of]) / (std[group_of] + epsilon)
    still = group_range(all_scores, all_groups, num_groups) <= plan.collapse_tol
    return torch.where(still[group_of], 0.0, z)


__all__ = ["compute_avspo_advantage", "avspo_collapse_rates"]
