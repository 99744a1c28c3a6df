"""Durian: difficulty-aware group normalisation (J. Li et al., arXiv 2602.21743, section 3; docs/algo/durian.md).

For response ``i`` of prompt ``p(i)`` (the prompts are verl's ``uid`` groups of this batch)::

    s_i       = sum_t token_level_rewards[i, t]
    A^GRPO_i  = (s_i - mean_{p(i)} s) / (std_{p(i)} s + eps)                  verl's GRPO z-score
    A^X_i     = (s_i - mean_{p(i)} s) / (std(R_{X(p(i))}) + eps)             X = percep, reason
    A_i       = alpha_ori * A^GRPO_i + alpha_percep * A^percep_i + alpha_reason * A^reason_i
    advantages[i, t] = returns[i, t] = A_i * response_mask[i, t]

Each bucket term keeps the prompt's own mean in the numerator and shares the denominator among the prompts of one
bucket: ``R_k`` is every score of every response of the bucket's prompts, its std unbiased (``1/(|R_k| - 1)``).

* Perceptual buckets (Eq. 10), by the prompt's visual entropy ``H`` (one value per prompt, repeated on its
  responses; ``diva-prep entropy`` computes it offline): with the batch quantiles ``q25, q75`` of ``H`` over the
  prompts (linear interpolation), bucket 0 is ``H <= q25``, 1 is ``q25 < H < q75``, 2 is ``H >= q75``; a value
  meeting two conditions (``q25 == q75``) goes to the first.
* Reasoning buckets (Eq. 16), by confidence: ``L_i`` = token-mean of ``old_log_probs[i]`` over its response tokens
  (0 for a response without tokens, as verl's ``masked_mean``), ``L(p)`` = mean of ``L_i`` over the prompt's
  responses. ``b = reason_buckets`` equal-frequency buckets of prompts with edges ``e_u`` = quantile ``u / b`` of
  ``L(p)`` over the prompts (linear interpolation, ``u = 0..b``): bucket ``k`` is ``e_k <= L < e_{k+1}``, the last
  one ``e_{b-1} <= L <= e_b``. Repeated edges leave empty buckets; those are simply unused.

Guards (the project's conventions): a prompt of one response has numerator 0, and a prompt of equal scores exactly
0 (no float rounding noise), so both contribute 0 to the bucket terms (the GRPO term gives a single response
``s / (1 + eps)``, as verl). A bucket whose scores are all equal (a bucket of one response included) contributes 0.
Its prompts' scores still sit in ``R_k``: pooling is over every response of the bucket, as the paper's Eq. 12.

Quantiles are computed from the sorted values with the rank ``q * (n - 1)`` in integer arithmetic, so a quantile
that falls on a value is exactly that value (ties at bucket edges are decided exactly as the rules above say).
All per-response math runs in float64; the output has ``token_level_rewards.dtype``. Vectorised: bucket statistics
are ``bincount`` / ``index_add_`` / ``scatter_reduce_`` over bucket ids, with no Python loop over responses,
prompts or buckets. With ``alpha_ori=1, alpha_percep=alpha_reason=0`` this is verl's ``compute_grpo_outcome_advantage``.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, NamedTuple

import numpy as np
import torch

from verl_ext.algos.checks import (
    STAT_DTYPE,
    broadcast_over_mask,
    check_finite,
    check_log_probs,
    check_rewards_and_mask,
    sequence_scores,
)
from verl_ext.algos.collapse import advantage_collapse_rate
from verl_ext.algos.group_stats import dense_group_ids, group_count, group_mean, group_range, group_zscore

PERCEPTUAL_BUCKETS = 3


@torch.no_grad()
def compute_durian_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    index: Any,
    visual_entropy: Any,
    *,
    alpha_ori: float = 0.1,
    alpha_percep: float = 0.2,
    alpha_reason: float = 0.7,
    reason_buckets: int = 12,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Durian advantages and returns (the module docstring has the formula and the bucket rules).

    Args:
        token_level_rewards: ``(B, T)`` float tensor; its dtype is the output dtype.
        response_mask: ``(B, T)`` 0/1 tensor: bool, integer (verl passes int64) or float, checked exactly.
        old_log_probs: ``(B, T)`` float tensor, the rollout policy's token log-probs (verl's ``old_log_probs``);
            only response tokens are read. Needed when ``alpha_reason != 0`` (may be ``None`` otherwise).
        index: ``B`` hashable prompt ids (verl's ``uid``), grouping the responses of one prompt.
        visual_entropy: ``(B,)`` tensor, array or list: the visual entropy of each response's prompt, the same
            value on every response of a prompt (the trainer passes ``extra_info["visual_entropy"]``). Needed when
            ``alpha_percep != 0`` (may be ``None`` otherwise).
        alpha_ori, alpha_percep, alpha_reason: weights of the GRPO, perceptual and reasoning terms (Eq. 20). The
            paper does not state its main run's; the defaults are its best ablation row (Table 3).
        reason_buckets: number ``b`` of equal-frequency confidence buckets (default 12: Table 2's best).
        epsilon: added to every std, as in verl's GRPO.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in ``token_level_rewards.dtype`` and the same tensor (as verl's
        GRPO returns). Masked positions are exactly 0.

    Raises:
        ValueError: naming the argument, for mismatched shapes or lengths, NaN/inf rewards, log-probs (at response
            tokens) or entropies, a mask that is not 0/1, a missing ``visual_entropy`` or ``old_log_probs``, a
            visual entropy that differs between responses of one prompt, and bad knobs.
    """
    _check_knobs(alpha_ori, alpha_percep, alpha_reason, reason_buckets, epsilon)
    check_rewards_and_mask(token_level_rewards, response_mask)
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    out_dtype = token_level_rewards.dtype

    scores = sequence_scores(token_level_rewards)
    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size, device)
    entropy = _prompt_entropy(visual_entropy, index, prompt_of, num_prompts) if alpha_percep != 0 else None

    float_mask = None
    confidence = None
    if alpha_reason != 0:
        lp = _check_log_probs(old_log_probs, token_level_rewards)
        # The mask as a checked 0/1 float copy: it feeds the confidence's masked sums here and, scaled in place,
        # becomes the output (the one (B, T) write), so the int64 mask is converted only once.
        float_mask = broadcast_over_mask(torch.ones(batch_size, dtype=out_dtype, device=device), response_mask)
        confidence = response_confidence(lp, float_mask)

    per_response = torch.zeros(batch_size, dtype=STAT_DTYPE, device=device)
    if batch_size:
        spread = group_range(scores, prompt_of, num_prompts)
        if alpha_ori != 0:
            per_response += alpha_ori * group_zscore(scores, prompt_of, num_prompts, spread, epsilon)
        numerator = _centered_scores(scores, prompt_of, num_prompts, spread)
        if entropy is not None:
            bucket_of = perceptual_buckets(entropy)[prompt_of]
            per_response += alpha_percep * _bucket_term(scores, numerator, bucket_of, PERCEPTUAL_BUCKETS, epsilon)
        if confidence is not None:
            count = group_count(prompt_of, num_prompts, STAT_DTYPE)
            bucket_of = reasoning_buckets(group_mean(confidence, prompt_of, count), reason_buckets)[prompt_of]
            per_response += alpha_reason * _bucket_term(scores, numerator, bucket_of, reason_buckets, epsilon)
    check_finite(per_response, "advantages overflowed (check the alpha_* weights and epsilon)")

    per_response = per_response.to(out_dtype)
    if float_mask is None:
        advantages = broadcast_over_mask(per_response, response_mask)
    else:
        advantages = float_mask.mul_(per_response.unsqueeze(-1))
    return advantages, advantages


# ------------------------------------------------------------------------------------------------ bucket rules
def perceptual_buckets(entropy: torch.Tensor) -> torch.Tensor:
    """``(P,) int64`` perceptual bucket (0, 1, 2) of each prompt from its visual entropy ``entropy: (P,)``.

    ``H <= q25 -> 0``, ``q25 < H < q75 -> 1``, ``H >= q75 -> 2`` with ``q25, q75`` the linear-interpolation
    quantiles of ``entropy``; tested in this order, so with ``q25 == q75`` a value equal to both goes to bucket 0.
    """
    q25, q75 = exact_rank_quantiles(entropy, torch.tensor([1, 3]), 4)
    middle_or_high = torch.where(entropy < q75, 1, 2)
    return torch.where(entropy <= q25, 0, middle_or_high).to(torch.int64)


def reasoning_buckets(confidence: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """``(P,) int64`` equal-frequency bucket ``0..num_buckets-1`` of each prompt's confidence ``L(p): (P,)``.

    Edges ``e_u`` = quantile ``u / b`` (linear interpolation); bucket ``k`` holds ``e_k <= L < e_{k+1}``, the last
    one also ``L = e_b``. That is the number of interior edges ``e_1..e_{b-1}`` at most ``L``: one ``searchsorted``.
    """
    if num_buckets == 1 or confidence.numel() == 0:
        return torch.zeros(confidence.shape, dtype=torch.int64, device=confidence.device)
    interior = exact_rank_quantiles(confidence, torch.arange(1, num_buckets), num_buckets)
    return torch.searchsorted(interior, confidence, right=True)


def exact_rank_quantiles(values: torch.Tensor, numerators: torch.Tensor, denominator: int) -> torch.Tensor:
    """Quantiles ``numerators / denominator`` of ``values: (n,)``, linear interpolation (numpy's default method).

    The rank ``q * (n - 1)`` is split into its integer part and remainder in integer arithmetic, so a quantile at
    a whole rank is exactly that order statistic (a float rank could land an ulp off and move a tied value across
    a bucket edge). Between two order statistics ``a <= b`` the value is ``a + (b - a) * remainder / denominator``.
    """
    ordered = torch.sort(values).values
    n = ordered.numel()
    rank = numerators.to(device=values.device, dtype=torch.int64) * (n - 1)
    lower = torch.div(rank, denominator, rounding_mode="floor")
    remainder = rank - lower * denominator
    a = ordered[lower]
    b = ordered[torch.clamp(lower + 1, max=n - 1)]
    weight = remainder.to(values.dtype) / denominator
    return torch.where(remainder == 0, a, a + (b - a) * weight)


# ----------------------------------------------------------------------------------------- per-response pieces
def response_confidence(old_log_probs: torch.Tensor, float_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64 ``L_i``: mean of ``old_log_probs[i, t]`` over the response tokens (``float_mask`` 1).

    A response without tokens gets 0 (verl's ``masked_mean``). Non-finite log-probs at masked positions are
    ignored; at a response token they raise ``ValueError`` naming ``old_log_probs`` and the response.
    """
    lp = old_log_probs if old_log_probs.dtype == float_mask.dtype else old_log_probs.to(float_mask.dtype)
    # A batched dot product: one read of each (B, T) tensor and no (B, T) temporary (lp * mask would allocate one).
    total = torch.einsum("bt,bt->b", lp, float_mask).to(STAT_DTYPE)
    bad = ~torch.isfinite(total)
    if bool(bad.any()):
        # Rare: padding may hold garbage (0 * inf is NaN). Redo only those rows, reading response tokens only.
        rows = bad.nonzero().squeeze(-1)
        total[rows] = torch.where(float_mask[rows] != 0, lp[rows], 0).sum(dim=-1).to(STAT_DTYPE)
        check_finite(total, "old_log_probs must be finite at response tokens")
    tokens = float_mask.sum(dim=-1).to(STAT_DTYPE)
    return total / tokens.clamp_min(1)


def _centered_scores(
    scores: torch.Tensor, prompt_of: torch.Tensor, num_prompts: int, spread: torch.Tensor
) -> torch.Tensor:
    """``s_i - mean_{p(i)} s``, exactly 0 for a prompt whose scores are all equal (one response included)."""
    mean = group_mean(scores, prompt_of, group_count(prompt_of, num_prompts, scores.dtype))
    return torch.where(spread[prompt_of] == 0, 0.0, scores - mean[prompt_of])


class BucketStats(NamedTuple):
    """Per-bucket statistics of the scores pooled in each bucket, every tensor ``(K,)``."""

    responses: torch.Tensor  # number of responses (float64)
    std: torch.Tensor  # unbiased std of the bucket's scores (0 for an empty bucket or one of one response)
    dead: torch.Tensor  # bool: every score equal (a bucket of one or none included): the bucket contributes 0


def bucket_stats(scores: torch.Tensor, bucket_of: torch.Tensor, num_buckets: int) -> BucketStats:
    """:class:`BucketStats` of ``scores: (B,)`` pooled by ``bucket_of: (B,) int64`` in ``0..num_buckets-1``."""
    count = group_count(bucket_of, num_buckets, scores.dtype)
    mean = group_mean(scores, bucket_of, count.clamp_min(1))
    centered = scores - mean[bucket_of]
    sum_sq = torch.zeros_like(count).index_add_(0, bucket_of, centered * centered)
    std = (sum_sq / (count - 1).clamp_min(1)).sqrt()
    dead = group_range(scores, bucket_of, num_buckets) == 0
    return BucketStats(count, std, dead)


def _bucket_term(
    scores: torch.Tensor, numerator: torch.Tensor, bucket_of: torch.Tensor, num_buckets: int, epsilon: float
) -> torch.Tensor:
    """``numerator_i / (std(R_{k(i)}) + eps)``, 0 in a bucket of equal scores."""
    stats = bucket_stats(scores, bucket_of, num_buckets)
    term = numerator / (stats.std[bucket_of] + epsilon)
    return torch.where(stats.dead[bucket_of], 0.0, term)


# --------------------------------------------------------------------------------------------------- metrics
@torch.no_grad()
def durian_metrics(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    index: Any,
    visual_entropy: Any,
    *,
    reason_buckets: int = 12,
    epsilon: float = 1e-6,
) -> dict[str, float]:
    """Diagnostics of one batch's Durian buckets, for the trainer's logs (keys without a prefix).

    Same inputs as :func:`compute_durian_advantage` (its return value is not touched). A ``None``
    ``visual_entropy`` / ``old_log_probs`` leaves out the ``perceptual/*`` / ``reasoning/*`` keys.

    * ``collapse_rate/prompts``: prompt groups whose scores are all equal (:func:`advantage_collapse_rate`; a
      prompt of one response counts as collapsed), i.e. whose GRPO and bucket numerators are 0.
    * ``<kind>/buckets``, ``<kind>/occupied``, ``<kind>/occupancy`` (occupied / buckets): bucket counts.
    * ``<kind>/prompts_per_bucket/{min,mean,max}``: prompts in each occupied bucket.
    * ``<kind>/collapse_rate``: occupied buckets whose scores are all equal (they contribute 0).
    * ``<kind>/std/{min,mean,max}``: pooled std of the live (not collapsed) buckets.
    * ``<kind>/weight/{min,mean,max}``: Durian's own weight on a prompt, ``w_p = (std_p + eps) / (std_k + eps)``,
      so that ``A^kind_i = w_{p(i)} * A^GRPO_i``; over the prompts with a nonzero numerator in live buckets.
      Above 1 the shared std amplifies the prompt's signal, below 1 it damps it (an "extreme" prompt).
    * ``perceptual/q25``, ``perceptual/q75``; ``reasoning/confidence/{min,mean,max}`` (``L(p)`` over prompts).

    Statistics of an empty set are NaN.
    """
    _check_buckets_and_epsilon(reason_buckets, epsilon)
    check_rewards_and_mask(token_level_rewards, response_mask)
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    scores = sequence_scores(token_level_rewards)
    prompt_of, num_prompts = dense_group_ids(index, "index", batch_size, device)
    metrics: dict[str, float] = {}
    if batch_size == 0:
        return metrics
    metrics["collapse_rate/prompts"] = advantage_collapse_rate(scores, index)

    count = group_count(prompt_of, num_prompts, STAT_DTYPE)
    mean = group_mean(scores, prompt_of, count)
    sum_sq = torch.zeros_like(count).index_add_(0, prompt_of, (scores - mean[prompt_of]).square())
    prompt_std = (sum_sq / (count - 1).clamp_min(1)).sqrt()
    live_prompt = group_range(scores, prompt_of, num_prompts) != 0

    groupings = []
    if visual_entropy is not None:
        entropy = _prompt_entropy(visual_entropy, index, prompt_of, num_prompts)
        q25, q75 = exact_rank_quantiles(entropy, torch.tensor([1, 3]), 4)
        metrics["perceptual/q25"], metrics["perceptual/q75"] = float(q25), float(q75)
        groupings.append(("perceptual", perceptual_buckets(entropy), PERCEPTUAL_BUCKETS))
    if old_log_probs is not None:
        lp = _check_log_probs(old_log_probs, token_level_rewards)
        float_mask = broadcast_over_mask(torch.ones(batch_size, dtype=lp.dtype, device=device), response_mask)
        confidence = group_mean(response_confidence(lp, float_mask), prompt_of, count)
        metrics |= _summary("reasoning/confidence", confidence)
        groupings.append(("reasoning", reasoning_buckets(confidence, reason_buckets), reason_buckets))

    for kind, bucket_of_prompt, num_buckets in groupings:
        stats = bucket_stats(scores, bucket_of_prompt[prompt_of], num_buckets)
        prompts = torch.bincount(bucket_of_prompt, minlength=num_buckets).to(STAT_DTYPE)
        occupied = prompts > 0
        metrics[f"{kind}/buckets"] = float(num_buckets)
        metrics[f"{kind}/occupied"] = float(occupied.sum())
        metrics[f"{kind}/occupancy"] = float(occupied.sum()) / num_buckets
        metrics |= _summary(f"{kind}/prompts_per_bucket", prompts[occupied])
        metrics[f"{kind}/collapse_rate"] = float(stats.dead[occupied].to(STAT_DTYPE).mean())
        live_bucket = occupied & ~stats.dead
        metrics |= _summary(f"{kind}/std", stats.std[live_bucket])
        weighted = live_prompt & live_bucket[bucket_of_prompt]
        weight = (prompt_std + epsilon) / (stats.std[bucket_of_prompt] + epsilon)
        metrics |= _summary(f"{kind}/weight", weight[weighted])
    return metrics


def _summary(name: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {f"{name}/min": float("nan"), f"{name}/mean": float("nan"), f"{name}/max": float("nan")}
    return {
        f"{name}/min": float(values.min()),
        f"{name}/mean": float(values.to(STAT_DTYPE).mean()),
        f"{name}/max": float(values.max()),
    }


# ---------------------------------------------------------------------------------------------------- inputs
def _check_knobs(alpha_ori, alpha_percep, alpha_reason, reason_buckets, epsilon) -> None:
    for name, value in (("alpha_ori", alpha_ori), ("alpha_percep", alpha_percep), ("alpha_reason", alpha_reason)):
        if isinstance(value, bool) or not isinstance(value, Real) or not np.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    _check_buckets_and_epsilon(reason_buckets, epsilon)


def _check_buckets_and_epsilon(reason_buckets, epsilon) -> None:
    if isinstance(reason_buckets, bool) or not isinstance(reason_buckets, int | np.integer) or reason_buckets < 1:
        raise ValueError(f"reason_buckets must be an integer >= 1, got {reason_buckets!r}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not (np.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")


def _check_log_probs(old_log_probs: Any, token_level_rewards: torch.Tensor) -> torch.Tensor:
    if isinstance(old_log_probs, np.ndarray):
        old_log_probs = torch.from_numpy(old_log_probs)
    check_log_probs(
        old_log_probs,
        token_level_rewards,
        " (alpha_reason != 0): Durian's confidence buckets read the rollout policy's "
        "token log-probs; the trainer must request 'old_log_probs' from TransferQueue",
        same_device=False,
    )
    return old_log_probs.to(token_level_rewards.device)


def _prompt_entropy(values: Any, index: Any, prompt_of: torch.Tensor, num_prompts: int) -> torch.Tensor:
    """``(P,)`` float64 visual entropy per prompt from the ``(B,)`` per-response values, checked."""
    batch_size = prompt_of.shape[0]
    hint = "compute the column with `diva-prep entropy` (it reaches the trainer as extra_info.visual_entropy)"
    if values is None:
        raise ValueError(f"visual_entropy is required (alpha_percep != 0): one value per response; {hint}")
    if isinstance(values, torch.Tensor):
        entropy = values.detach().to(device=prompt_of.device, dtype=STAT_DTYPE)
    else:
        array = np.asarray(values, dtype=object if not isinstance(values, np.ndarray) else None)
        missing = np.array([v is None for v in array.ravel()], dtype=bool) if array.dtype == object else None
        if missing is not None and missing.any():
            row = int(np.flatnonzero(missing)[0])
            raise ValueError(f"visual_entropy is missing (None) for response {row}; {hint}")
        try:
            entropy = torch.as_tensor(array.astype(np.float64), device=prompt_of.device)
        except (TypeError, ValueError) as err:
            raise ValueError(f"visual_entropy must be numbers, one per response: {err}") from err
    if entropy.dim() != 1 or entropy.shape[0] != batch_size:
        raise ValueError(
            f"visual_entropy must have shape ({batch_size},), one value per response, got {tuple(entropy.shape)}"
        )
    check_finite(entropy, f"visual_entropy must be finite (a NaN is a missing value: {hint})")
    if batch_size == 0:
        return entropy
    varies = (group_range(entropy, prompt_of, num_prompts) != 0)[prompt_of]
    if bool(varies.any()):
        row = int(varies.nonzero()[0, 0])
        others = entropy[prompt_of == prompt_of[row]].unique().tolist()
        prompt_id = (index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index))[row]
        raise ValueError(
            f"visual_entropy must be one value per prompt, repeated on its responses; prompt {prompt_id!r} (response "
            f"{row}) has {len(others)} different values {others[:4]}"
        )
    empty = torch.zeros(num_prompts, dtype=STAT_DTYPE, device=prompt_of.device)
    return empty.scatter_reduce(0, prompt_of, entropy, reduce="amax", include_self=False)
