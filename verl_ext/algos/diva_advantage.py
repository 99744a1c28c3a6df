"""The DIVA-GRPO advantage (docs/algo/diva_grpo.md; paper arXiv 2603.01106, section 3.3).

For response ``i`` answering prompt ``p(i)``, the original or a variant of question ``q(i)``::

    s_i      = sum_t token_level_rewards[i, t]
    local_i  = (s_i - mean_{p(i)}(s)) / (std_{p(i)}(s) + eps)        GRPO z-score over the prompt group
    global_i = (s_i - mean_{q(i)}(s)) / (std_{q(i)}(s) + eps)        same over the question group
    if batch_norm:  x <- (x - mean_B(x)) / std_B(x)                   each stream, over the B responses
    global_i *= exp(k * (d_i - dbar_{q(i)}) * sign(global_i))          dbar_q = mean of d over q's responses
    if rrb:     local_i  *= (max_{p(i)} s - min_{p(i)} s) / reward_max
                global_i *= (max_{q(i)} s - min_{q(i)} s) / reward_max
    A_i = local_coef * local_i + global_coef * global_i
    advantages[i, t] = returns[i, t] = A_i * response_mask[i, t]

Order of operations: z-score, then batch normalisation, then difficulty weighting, then RRB. This
is the paper's reading and what the authors' released code does for the weighting ("after
normalisation", docs/algo/diva_grpo.md, fidelity): batch normalisation must come before the weighting (the sign
it tests is the sign of the normalised advantage) and before RRB (normalising afterwards would undo
the rescaling). Weighting and RRB are both positive factors, so their relative order does not matter.

Group z-scores follow verl's ``compute_grpo_outcome_advantage`` (unbiased std; a group of one has
mean 0, std 1). Batch normalisation uses the unbiased std over the B responses (one value per
response, not per token; the released code's per-token version scales with response length); a
stream that is constant over the batch becomes 0. A group of several equal rewards gets a z-score of
exactly 0 (verl leaves rounding noise there), so batch normalisation cannot amplify that noise.
With RRB on, a group of one (range 0) contributes 0 to its stream. The O(B) statistics run in float64
(scores are summed in the input dtype, as verl does); the output has ``token_level_rewards.dtype``.

With ``k=0, global_coef=0, batch_norm=False, rrb=False`` this is verl's GRPO with ``index=prompt_index``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl_ext.algos.checks import (
    STAT_DTYPE,
    broadcast_over_mask,
    check_finite,
    check_rewards_and_mask,
    per_response_tensor,
    sequence_scores,
)
from verl_ext.algos.group_stats import (
    batch_standardize,
    dense_group_ids,
    group_count,
    group_mean,
    group_range,
    group_zscore,
)


@torch.no_grad()
def compute_diva_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    prompt_index: Any,
    question_index: Any,
    difficulty: Any,
    *,
    k: float = 0.1,
    local_coef: float = 1.0,
    global_coef: float = 1.0,
    batch_norm: bool = True,
    rrb: bool = True,
    reward_max: float = 1.0,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DIVA-GRPO advantages and returns (see the module docstring for the formula).

    Args:
        token_level_rewards: ``(B, T)`` float tensor; its dtype is the output dtype.
        response_mask: ``(B, T)`` tensor of 0/1: bool, integer (verl's trainers pass int64) or float. Checked
            exactly; a float mask costs two more reads for that check than an integer or bool one.
        prompt_index: ``B`` hashable ids of the prompt each response answers (verl's ``uid``).
        question_index: ``B`` hashable ids of the question behind that prompt (original and variants
            share it). Every prompt group must lie inside one question group.
        difficulty: ``(B,)`` tensor, array or list: difficulty of the prompt each response answered.
        k: difficulty-weighting strength of the global stream (0 turns weighting off).
        local_coef, global_coef: weights of the prompt-group and question-group streams.
        batch_norm: standardise each stream over the B responses before weighting.
        rrb: reward-range rescaling, each stream times its group's reward range over ``reward_max``.
        reward_max: largest possible sequence reward (RRB's denominator).
        epsilon: added to the group std, as in verl's GRPO.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in ``token_level_rewards.dtype`` and the same tensor
        (as verl's GRPO returns). Masked positions are exactly 0.

    Raises:
        ValueError: naming the argument, for mismatched shapes or lengths, non-finite rewards or
            difficulties, a mask that is not 0/1, a prompt spread over two questions, bad knobs.
    """
    check_rewards_and_mask(token_level_rewards, response_mask)
    if not reward_max > 0 or not np.isfinite(reward_max):
        raise ValueError(f"reward_max must be a positive finite number, got {reward_max}")
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device

    scores = sequence_scores(token_level_rewards)
    d = per_response_tensor(difficulty, "difficulty", batch_size, device)

    prompt_of, num_prompts = dense_group_ids(prompt_index, "prompt_index", batch_size, device)
    question_of, num_questions = dense_group_ids(question_index, "question_index", batch_size, device)
    _check_prompts_nest_in_questions(prompt_of, question_of, num_prompts)

    per_response = torch.zeros(batch_size, dtype=STAT_DTYPE, device=device)
    if local_coef != 0:
        spread = group_range(scores, prompt_of, num_prompts)
        local = group_zscore(scores, prompt_of, num_prompts, spread, epsilon)
        if batch_norm:
            local = batch_standardize(local)
        if rrb:
            local = local * (spread[prompt_of] / reward_max)
        per_response += local_coef * local
    if global_coef != 0:
        spread = group_range(scores, question_of, num_questions)
        global_ = group_zscore(scores, question_of, num_questions, spread, epsilon)
        if batch_norm:
            global_ = batch_standardize(global_)
        if k != 0:
            count = group_count(question_of, num_questions, STAT_DTYPE)
            d_offset = d - group_mean(d, question_of, count)[question_of]
            global_ = global_ * torch.exp(k * d_offset * torch.sign(global_))
        if rrb:
            global_ = global_ * (spread[question_of] / reward_max)
        per_response += global_coef * global_
    check_finite(per_response, f"advantages overflowed (k={k}, local_coef={local_coef}, global_coef={global_coef})")

    advantages = broadcast_over_mask(per_response.to(token_level_rewards.dtype), response_mask)
    return advantages, advantages


def _check_prompts_nest_in_questions(prompt_of: torch.Tensor, question_of: torch.Tensor, num_prompts: int) -> None:
    """Every prompt (original or variant) belongs to one question; a prompt id shared by two questions
    would merge unrelated groups silently."""
    if num_prompts == 0:
        return
    empty = torch.zeros(num_prompts, dtype=question_of.dtype, device=question_of.device)
    first = empty.scatter_reduce(0, prompt_of, question_of, reduce="amin", include_self=False)
    last = empty.scatter_reduce(0, prompt_of, question_of, reduce="amax", include_self=False)
    split = (first != last)[prompt_of]
    if bool(split.any()):
        row = int(split.nonzero()[0, 0])
        raise ValueError(
            f"prompt_index groups must each lie in one question_index group; the prompt of response {row} "
            "appears under several question ids"
        )
