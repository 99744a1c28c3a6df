"""MUPO (Tian et al., CVPR 2026, arXiv 2604.00479): several GRPO groups per prompt and a diversity reward.

For the ``N_p`` responses of prompt ``p``, with unit embeddings ``u_i = e_i / |e_i|`` (``(B, D)``)::

    partition   g(i) in {0..K_p-1}: size-constrained k-means of p's u_i into k groups of >= min_size
                (one group, K_p = 1, when N_p < k * min_size)
    diversity   div_i = mean_{j in p, g(j) != g(i)} (1 - cos(e_i, e_j))        (0 when no such j)
    reward      s'_i  = s_i + lambda_t * acc_i * div_i                          (before the advantage)
    advantage   A_i   = z_i * (N_p / (K_p * |G_(p,g(i))|)) ** balance_beta
                z_i   = verl's GRPO z-score of s' within the pair (p, g(i))
    lambda_t    cosine:       lambda_min + (lambda_max - lambda_min) * (1 + cos(pi * (t-1) / (T-1))) / 2
                exponential:  lambda_max * exp(-decay_rate * t)                  (the authors' released code)

with ``t`` verl's 1-based ``global_steps`` and ``T`` the run's total steps. Partition ids are local to a
prompt: the same id under two prompts is two pairs. With every partition id equal (``K_p = 1``) the weight is
exactly 1 and the advantage is verl's GRPO. Everything is vectorised over responses except the partition,
which calls the k-means library once per prompt (it clusters one point set at a time).

Diversity in O(B * D), without the (B, B) cosine matrix: with ``S_p = sum_{j in p} u_j`` and
``S_(p,g) = sum_{j in (p,g)} u_j``, the sum of cosines to the other groups is ``u_i . (S_p - S_(p,g(i)))``
over ``N_p - |G_(p,g(i))|`` responses.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from verl_ext.algos.checks import (
    STAT_DTYPE,
    broadcast_over_mask,
    check_finite,
    check_rewards_and_mask,
    describe,
    per_response_tensor,
    sequence_scores,
)
from verl_ext.algos.collapse import advantage_collapse_rate
from verl_ext.algos.group_stats import dense_group_ids, group_range, group_zscore

logger = logging.getLogger(__name__)

LAMBDA_SCHEDULES = ("cosine", "exponential")


# ---------------------------------------------------------------------------------------------------------------
# Partition and diversity
# ---------------------------------------------------------------------------------------------------------------


def mupo_partition(embeddings: Any, index: Any, *, k: int = 3, min_size: int = 3, seed: int = 0) -> np.ndarray:
    """Split each prompt's responses into ``k`` groups of similar reasoning (size-constrained k-means).

    Args:
        embeddings: ``(B, D)`` finite, nonzero embeddings (tensor, array or nested list) of the responses'
            reasoning. Clustered as unit vectors, the geometry of the cosine diversity (a served
            Qwen3-Embedding already returns unit vectors, so for the authors' setup this changes nothing).
        index: ``B`` hashable prompt ids (verl's ``uid``).
        k: groups per prompt (``k = 1``: every prompt is one group, plain GRPO).
        min_size: the fewest responses a group may have.
        seed: ``random_state`` of every prompt's k-means; the same inputs and seed give the same partition.

    Returns:
        ``(B,) int64`` numpy array of partition ids local to each prompt, ``0..K_p-1`` numbered by first
        appearance within the prompt. A prompt with fewer than ``k * min_size`` responses is one group (id 0);
        their number is logged (and :func:`mupo_metrics` reports the rate of one-group prompts).
    """
    _check_positive_int(k, "k")
    _check_positive_int(min_size, "min_size")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    unit = _unit_embeddings(embeddings, "embeddings").numpy()
    batch_size = unit.shape[0]
    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size)
    partition = np.zeros(batch_size, dtype=np.int64)
    if k == 1 or batch_size == 0:
        return partition

    from k_means_constrained import KMeansConstrained  # imported here: only MUPO needs it (and ortools)

    prompt_np = prompt_of.numpy()
    order = np.argsort(prompt_np, kind="stable")
    counts = np.bincount(prompt_np, minlength=num_prompts)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    too_small = 0
    for p in range(num_prompts):  # the library clusters one point set per call: one call per prompt
        rows = order[bounds[p] : bounds[p + 1]]
        if rows.size < k * min_size:
            too_small += 1
            continue
        labels = KMeansConstrained(n_clusters=k, size_min=min_size, random_state=int(seed)).fit_predict(unit[rows])
        partition[rows] = _numbered_by_first_appearance(labels)
    if too_small:
        logger.warning(
            "MUPO partition: %d of %d prompts have fewer than k * min_size = %d responses and stay one group",
            too_small,
            num_prompts,
            k * min_size,
        )
    return partition


def mupo_diversity(embeddings: Any, index: Any, partition: Any) -> torch.Tensor:
    """``(B,) float64`` mean cosine distance of each response to its prompt's responses in the other groups.

    ``div_i = mean_{j in p(i), g(j) != g(i)} (1 - cos(e_i, e_j))``, 0 when the prompt has one group. No factor 2
    (the released reward doubles it, "approximately [0, 1]"); values lie in [0, 2]. O(B * D), see the module
    docstring.

    Args:
        embeddings: ``(B, D)`` finite, nonzero embeddings.
        index: ``B`` hashable prompt ids (verl's ``uid``).
        partition: ``B`` group ids local to each prompt (:func:`mupo_partition`).
    """
    unit = _unit_embeddings(embeddings, "embeddings")
    batch_size = unit.shape[0]
    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size)
    pair_of, pair_prompt, num_pairs = _pairs(prompt_of, partition, batch_size)
    if batch_size == 0:
        return torch.zeros(0, dtype=STAT_DTYPE)
    dim = unit.shape[1]
    prompt_sum = torch.zeros(num_prompts, dim, dtype=STAT_DTYPE).index_add_(0, prompt_of, unit)
    pair_sum = torch.zeros(num_pairs, dim, dtype=STAT_DTYPE).index_add_(0, pair_of, unit)
    prompt_count = torch.bincount(prompt_of, minlength=num_prompts).to(STAT_DTYPE)
    pair_count = torch.bincount(pair_of, minlength=num_pairs).to(STAT_DTYPE)
    others = (prompt_count[pair_prompt] - pair_count)[pair_of]
    cos_sum = (unit * (prompt_sum[prompt_of] - pair_sum[pair_of])).sum(dim=-1)
    # 1 - mean cos; rounding can leave identical vectors a hair outside [0, 2].
    diversity = (1.0 - cos_sum / others.clamp_min(1)).clamp_(0.0, 2.0)
    return torch.where(others > 0, diversity, 0.0)


# ---------------------------------------------------------------------------------------------------------------
# Advantage
# ---------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def compute_mupo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    partition: Any,
    *,
    balance_beta: float = 1.0,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MUPO advantages and returns: GRPO within each (prompt, group) pair, times the load-balance weight.

    ``A_i = z_i * (N_p / (K_p * |G|)) ** balance_beta``, ``z_i`` verl's GRPO z-score of the sequence score
    ``s_i = sum_t token_level_rewards[i, t]`` within its pair (unbiased std; a pair of one has mean 0, std 1;
    a pair of equal scores gets exactly 0). ``N_p``: the prompt's responses, ``K_p``: its groups, ``|G|``: the
    pair's responses. Every partition id equal: verl's ``compute_grpo_outcome_advantage``.

    Args:
        token_level_rewards: ``(B, T)`` float tensor (the diversity reward already added); its dtype is the
            output dtype.
        response_mask: ``(B, T)`` 0/1 tensor (bool, integer or float).
        index: ``B`` hashable prompt ids (verl's ``uid``).
        partition: ``B`` group ids, local to each prompt.
        balance_beta: exponent of the load-balance weight (0: unweighted).
        epsilon: added to the pair's std, as in verl's GRPO.

    Returns:
        ``(advantages, returns)``: the same ``(B, T)`` tensor twice, as verl's GRPO; masked positions are 0.
    """
    check_rewards_and_mask(token_level_rewards, response_mask)
    _check_finite_number(balance_beta, "balance_beta")
    _check_finite_number(epsilon, "epsilon", minimum=0.0)
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    scores = sequence_scores(token_level_rewards)

    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size, device)
    pair_of, pair_prompt, num_pairs = _pairs(prompt_of, partition, batch_size)
    spread = group_range(scores, pair_of, num_pairs)
    z = group_zscore(scores, pair_of, num_pairs, spread, epsilon)

    prompt_count = torch.bincount(prompt_of, minlength=num_prompts).to(STAT_DTYPE)
    groups_per_prompt = torch.bincount(pair_prompt, minlength=num_prompts).to(STAT_DTYPE)
    pair_count = torch.bincount(pair_of, minlength=num_pairs).to(STAT_DTYPE)
    # One group: N_p / (1 * N_p) is exactly 1 in floating point, so this is verl's GRPO bit for bit.
    weight = (prompt_count[pair_prompt] / (groups_per_prompt[pair_prompt] * pair_count)) ** balance_beta
    per_response = z * weight[pair_of]
    check_finite(per_response, f"advantages overflowed (balance_beta={balance_beta})")
    advantages = broadcast_over_mask(per_response.to(token_level_rewards.dtype), response_mask)
    return advantages, advantages


# ---------------------------------------------------------------------------------------------------------------
# Diversity reward and its weight
# ---------------------------------------------------------------------------------------------------------------


def mupo_lambda(
    step: Any,
    total_steps: int,
    *,
    lambda_max: float = 0.4,
    lambda_min: float = 0.1,
    schedule: str = "cosine",
    decay_rate: float = 9e-3,
) -> float | np.ndarray:
    """Weight ``lambda_t`` of the diversity reward at training step ``step`` (verl's 1-based ``global_steps``).

    ``schedule="cosine"`` (paper): ``lambda_max`` at step 1, ``lambda_min`` at step ``total_steps``, half-cosine
    in between (``lambda_max`` throughout when ``total_steps == 1``). ``schedule="exponential"`` (the authors'
    released code): ``lambda_max * exp(-decay_rate * step)``, with their step count (EasyR1's, 1 at the first
    step), unfloored: ``lambda_min`` is not used. ``step`` may be an int or an array of ints (same shape back).
    """
    if isinstance(total_steps, bool) or not isinstance(total_steps, (int, np.integer)) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
    if schedule not in LAMBDA_SCHEDULES:
        raise ValueError(f"schedule must be one of {LAMBDA_SCHEDULES}, got {schedule!r}")
    _check_finite_number(lambda_max, "lambda_max", minimum=0.0)
    _check_finite_number(lambda_min, "lambda_min", minimum=0.0)
    _check_finite_number(decay_rate, "decay_rate", minimum=0.0)
    if lambda_min > lambda_max:
        raise ValueError(f"lambda_min ({lambda_min}) must not exceed lambda_max ({lambda_max})")
    steps = np.asarray(step)
    if steps.dtype == bool or not np.issubdtype(steps.dtype, np.integer):
        raise ValueError(f"step must be an integer (verl's global_steps), got {step!r}")
    if steps.size and (steps.min() < 1 or steps.max() > total_steps):
        raise ValueError(f"step must lie in [1, total_steps={total_steps}], got {step!r}")
    if schedule == "exponential":
        values = lambda_max * np.exp(-decay_rate * steps.astype(np.float64))
    else:
        progress = (steps - 1) / (total_steps - 1) if total_steps > 1 else np.zeros(steps.shape)
        values = lambda_min + (lambda_max - lambda_min) * 0.5 * (1.0 + np.cos(math.pi * progress))
    return float(values) if values.ndim == 0 else values


def add_diversity_reward(scores: Any, acc: Any, diversity: Any, lambda_t: float) -> torch.Tensor:
    """``(B,)`` sequence scores plus the diversity reward: ``s_i + lambda_t * acc_i * div_i``.

    ``acc`` in [0, 1] (the recipe's 0/1 accuracy: the paper's indicator ``1[R_acc = 1]``). The output has the
    dtype of ``scores`` when it is a floating tensor, else float64.
    """
    base = scores.detach() if isinstance(scores, torch.Tensor) and scores.is_floating_point() else None
    base = _vector(scores, "scores") if base is None else base
    if base.dim() != 1:
        raise ValueError(f"scores must have shape (B,), one per response, got {tuple(base.shape)}")
    check_finite(base, "scores: every value must be finite")
    batch_size = base.shape[0]
    acc_t = per_response_tensor(acc, "acc", batch_size)
    if batch_size and (bool(acc_t.min() < 0) or bool(acc_t.max() > 1)):
        row = int(((acc_t < 0) | (acc_t > 1)).nonzero()[0, 0])
        raise ValueError(f"acc must lie in [0, 1]; response {row} has {acc_t[row].item()}")
    div_t = per_response_tensor(diversity, "diversity", batch_size)
    _check_finite_number(lambda_t, "lambda_t", minimum=0.0)
    bonus = lambda_t * acc_t * div_t
    return base + bonus.to(device=base.device, dtype=base.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------


def mupo_metrics(
    index: Any, partition: Any, diversity: Any, acc: Any, lambda_t: float, scores: Any = None
) -> dict[str, float]:
    """``mupo/*`` step metrics (all floats).

    - ``lambda``; ``groups_per_prompt/{mean,min,max}``; ``group_size/{mean,min,max}`` (over the pairs);
    - ``one_group_rate``: prompts left as one group (too small to split, or ``k = 1``);
    - ``diversity/mean`` over all responses, ``diversity/correct_mean`` over responses with ``acc > 0``
      (0 when none), ``correct_rate``;
    - with ``scores`` (the ``(B,)`` scores the advantage sees): ``collapse_rate/partition`` (pairs whose
      scores are all equal, GRPO signal 0) and ``collapse_rate/prompt`` (the same over whole prompts).
    """
    div = _vector(diversity, "diversity")
    batch_size = div.shape[0]
    acc_t = per_response_tensor(acc, "acc", batch_size)
    if batch_size == 0:
        raise ValueError("diversity is empty: the metrics of no responses are undefined")
    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size)
    pair_of, pair_prompt, num_pairs = _pairs(prompt_of, partition, batch_size)
    groups = torch.bincount(pair_prompt, minlength=num_prompts).to(STAT_DTYPE)
    sizes = torch.bincount(pair_of, minlength=num_pairs).to(STAT_DTYPE)
    correct = acc_t > 0
    metrics = {
        "mupo/lambda": float(lambda_t),
        "mupo/groups_per_prompt/mean": groups.mean().item(),
        "mupo/groups_per_prompt/min": groups.min().item(),
        "mupo/groups_per_prompt/max": groups.max().item(),
        "mupo/group_size/mean": sizes.mean().item(),
        "mupo/group_size/min": sizes.min().item(),
        "mupo/group_size/max": sizes.max().item(),
        "mupo/one_group_rate": (groups == 1).to(STAT_DTYPE).mean().item(),
        "mupo/diversity/mean": div.mean().item(),
        "mupo/diversity/correct_mean": div[correct].mean().item() if bool(correct.any()) else 0.0,
        "mupo/correct_rate": correct.to(STAT_DTYPE).mean().item(),
    }
    if scores is not None:
        metrics["mupo/collapse_rate/partition"] = advantage_collapse_rate(scores, pair_of.numpy())
        metrics["mupo/collapse_rate/prompt"] = advantage_collapse_rate(scores, prompt_of.numpy())
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def _pairs(prompt_of: torch.Tensor, partition: Any, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Dense ids of the (prompt, group) pairs: ``(pair_of (B,), pair_prompt (G,), G)``.

    ``pair_prompt[g]`` is the dense prompt id of pair ``g``. The same partition id under two prompts is two pairs.
    """
    part_of, num_parts = dense_group_ids(partition, "partition", batch_size, prompt_of.device)
    key = prompt_of * max(num_parts, 1) + part_of
    unique_keys, pair_of = torch.unique(key, return_inverse=True)
    return pair_of, unique_keys // max(num_parts, 1), int(unique_keys.numel())


def _vector(values: Any, name: str) -> torch.Tensor:
    """``(B,) float64`` tensor of finite numbers from a tensor, array or list; ``ValueError`` naming ``name``."""
    if isinstance(values, torch.Tensor):
        out = values.detach().to(STAT_DTYPE)
    else:
        try:
            out = torch.as_tensor(np.asarray(values, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be numbers, one per response: {err}") from err
    if out.dim() != 1:
        raise ValueError(f"{name} must have shape (B,), one per response, got {tuple(out.shape)}")
    check_finite(out, f"{name}: every value must be finite")
    return out


def _unit_embeddings(embeddings: Any, name: str) -> torch.Tensor:
    """``(B, D) float64`` CPU tensor of unit rows; ``ValueError`` naming ``name`` for a bad shape, NaN/inf or a
    zero row (its cosine is undefined; an embedding model never returns one)."""
    if isinstance(embeddings, torch.Tensor):
        values = embeddings.detach().to(device="cpu", dtype=STAT_DTYPE)
    else:
        try:
            values = torch.as_tensor(np.asarray(embeddings, dtype=np.float64))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be a (B, D) array of numbers, got {describe(embeddings)}: {err}") from err
    if values.dim() != 2 or (values.shape[0] > 0 and values.shape[1] == 0):
        raise ValueError(f"{name} must have shape (B, D) with D >= 1, one row per response, got {tuple(values.shape)}")
    finite = torch.isfinite(values).all(dim=-1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise ValueError(f"{name}: every value must be finite; response {row} has a NaN or inf")
    norm = values.norm(dim=-1, keepdim=True)
    zero = norm.squeeze(-1) == 0
    if bool(zero.any()):
        row = int(zero.nonzero()[0, 0])
        raise ValueError(f"{name}: response {row} has an all-zero embedding, whose cosine is undefined")
    return values / norm


def _numbered_by_first_appearance(labels: np.ndarray) -> np.ndarray:
    """Relabel arbitrary cluster labels as ``0..K-1`` in order of first appearance (stable ids for tests/logs)."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse]


def _check_positive_int(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_finite_number(value: Any, name: str, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
