"""The CoDaPO advantage: confidence- and difficulty-weighted GRPO (Zhou et al., arXiv 2606.07950;
docs/algo/codapo.md), as the authors' code computes it (``tmlr-group/CoDaPO``, ``core_algos.compute_codapo_advantage``).

For response ``i`` of group ``g = index[i]`` (a prompt's rollouts), ``s_i = sum_t token_level_rewards[i, t]``::

    z_i    = (s_i - mean_g) / (std_g + eps)          verl's GRPO z-score (unbiased std; a group of one: mean 0,
                                                     std 1; a group of several equal scores: exactly 0)
    acc_g  = mean_{i in g} correct_i                 correct_i = the reward's acc, or s_i == 1.0 when not given
    d_g    = 1 - acc_g                               difficulty
    V_d    = 1 - 4 (d_g - 0.5)^2                     in [0, 1]: 0 for all-correct / all-wrong, 1 at d = 0.5
    L_i    = sum_t old_log_probs[i, t] m[i, t] / sum_t m[i, t]    token-mean log-prob (0 for an empty response)
    c_g    = exp(mean_{i in g} L_i)                  the policy's confidence on the prompt, in (0, 1]
    w_g    = c_g * V_d + weight_offset               in [weight_offset, 1 + weight_offset]
    A_i    = w_g * z_i
    advantages[i, t] = returns[i, t] = A_i * m[i, t],   weights[i] = w_{g(i)}

The weights also pick the questions of CoDaPO's resampled pass (:mod:`verl_ext.data.codapo_resampler`).
Masked positions of ``old_log_probs`` are ignored, even when they hold NaN or inf. The O(B) statistics run
in float64; the outputs have ``token_level_rewards.dtype``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verl_ext.algos.checks import (
    STAT_DTYPE,
    broadcast_over_mask,
    check_finite,
    check_log_probs,
    check_rewards_and_mask,
    per_response_tensor,
    sequence_scores,
)
from verl_ext.algos.group_stats import dense_group_ids, group_count, group_mean, group_range, group_zscore


@torch.no_grad()
def compute_codapo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    index: Any,
    correct: Any = None,
    *,
    weight_offset: float = 0.1,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CoDaPO advantages, returns and per-response weights (see the module docstring for the formula).

    Args:
        token_level_rewards: ``(B, T)`` float tensor; its dtype is the output dtype.
        response_mask: ``(B, T)`` tensor of 0/1: bool, integer (verl passes int64) or float. Checked exactly.
        old_log_probs: ``(B, T)`` float tensor, the rollout policy's log-probs (verl's ``old_log_probs``).
        index: ``B`` hashable group ids (verl's ``uid``), a numpy array, list or tensor.
        correct: ``(B,)`` 0/1 per response (tensor, array or list; the trainer passes the reward's ``acc``),
            or ``None`` for ``s_i == 1.0``.
        weight_offset: the floor added to ``c * V_d``, so that every group keeps some signal.
        epsilon: added to the group std, as in verl's GRPO.

    Returns:
        ``(advantages, returns, weights)``: ``advantages`` and ``returns`` are ``(B, T)`` and the same tensor
        (as verl's GRPO returns), exactly 0 at masked positions; ``weights`` is ``(B,)``, each response's
        group weight ``w_g``. All in ``token_level_rewards.dtype``.

    Raises:
        ValueError: naming the argument, for missing or misshapen old log-probs, mismatched shapes or lengths,
            non-finite rewards or log-probs (on response tokens), a mask that is not 0/1, ``correct`` not 0/1,
            a missing id, or a bad knob.
    """
    check_rewards_and_mask(token_level_rewards, response_mask)
    check_log_probs(
        old_log_probs,
        token_level_rewards,
        ": the (B, T) log-probs of the rollout policy (verl's old_log_probs); "
        "run the method through the toolkit trainer, which reads them from TransferQueue",
    )
    for name, value in (("weight_offset", weight_offset), ("epsilon", epsilon)):
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    out_dtype = token_level_rewards.dtype

    scores = sequence_scores(token_level_rewards)
    group_of, num_groups = dense_group_ids(index, "index", batch_size, device)
    if correct is None:
        correct_values = (scores == 1.0).to(STAT_DTYPE)
    else:
        correct_values = per_response_tensor(correct, "correct", batch_size, device)
        _check_zero_one(correct_values)

    if old_log_probs.dtype not in (torch.float32, torch.float64):
        old_log_probs = old_log_probs.float()  # half precision cannot count 4,096 tokens or sum their log-probs
    # The mask as a float copy in the log-probs' dtype (checked 0/1 by the shared broadcast): it gives the token
    # means by one batched dot product per row (no (B, T) temporary), then becomes the output buffer.
    mask_copy = broadcast_over_mask(torch.ones(batch_size, dtype=old_log_probs.dtype, device=device), response_mask)
    token_mean = _token_mean_log_probs(old_log_probs, response_mask, mask_copy)

    count = group_count(group_of, num_groups, STAT_DTYPE)
    difficulty = 1.0 - group_mean(correct_values, group_of, count)
    value_d = 1.0 - 4.0 * (difficulty - 0.5) ** 2
    confidence = torch.exp(group_mean(token_mean, group_of, count))
    weight = confidence * value_d + weight_offset
    check_finite(weight[group_of], "old_log_probs: the confidence weight overflowed (token means too large)")

    spread = group_range(scores, group_of, num_groups)
    per_response = weight[group_of] * group_zscore(scores, group_of, num_groups, spread, epsilon)
    check_finite(per_response, f"advantages overflowed (epsilon={epsilon})")

    per_response = per_response.to(out_dtype)
    if mask_copy.dtype == out_dtype:
        advantages = mask_copy.mul_(per_response.unsqueeze(-1))
    else:
        advantages = broadcast_over_mask(per_response, response_mask)
    return advantages, advantages, weight[group_of].to(out_dtype)


def _check_zero_one(correct: torch.Tensor) -> None:
    bad = (correct != 0) & (correct != 1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"correct must be 0 or 1 per response; response {row} has {correct[row].item()}")


def _token_mean_log_probs(
    old_log_probs: torch.Tensor, response_mask: torch.Tensor, mask_copy: torch.Tensor
) -> torch.Tensor:
    """``(B,)`` float64 mean of ``old_log_probs`` over each response's tokens; 0 for a response without any.

    ``mask_copy`` is the 0/1 mask in ``old_log_probs.dtype``. The row sums are batched dot products; a row whose
    dot product is not finite (NaN or inf at a masked position times 0) is summed again over its tokens only.
    """
    batch_size = old_log_probs.shape[0]
    sums = torch.bmm(old_log_probs.unsqueeze(1), mask_copy.unsqueeze(2)).view(batch_size).to(STAT_DTYPE)
    bad = ~torch.isfinite(sums)
    if bool(bad.any()):
        rows = bad.nonzero()[:, 0]
        kept = torch.where(response_mask[rows] != 0, old_log_probs[rows].to(STAT_DTYPE), 0.0)
        sums[rows] = kept.sum(dim=-1)
        check_finite(sums, "old_log_probs: every value on a response token must be finite")
    # Counted in the mask's dtype (exact up to 2**24 tokens); a dtype= argument would cast the (B, T) copy first.
    lengths = mask_copy.sum(dim=-1).to(STAT_DTYPE)
    return sums / lengths.clamp_min(1)  # an empty response: 0 / 1


__all__ = ["compute_codapo_advantage"]
