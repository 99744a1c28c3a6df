"""PGPO: token-level advantages from visual dependency (paper arXiv 2604.01840, Eqs. 1-8; docs/algo/pgpo.md).

Each response's GRPO advantage is spread over its tokens by how much each token depends on the image. For
response ``i`` with response tokens ``t`` (``response_mask[i, t] == 1``, ``n_i`` of them)::

    d_t  = blind_log_probs[i, t] - log_probs[i, t]              log-ratio pi_blind(x_t) / pi_sighted(x_t)
    S_t  = clamp((exp(d_t) - 1) - d_t, 0, kl_max)                k3 estimate of KL(pi_sighted || pi_blind) at x_t
    S~_t = log(1 + S_t)                                          compression
    I_t  = (S~_t - min_i S~) / (max_i S~ - min_i S~ + epsilon)   min-max over the response's own tokens
    w(I) = I / (tau + epsilon)                      if I < tau
           1 + beta * (I - tau) / (1 - tau + epsilon)  otherwise
    w~_t = w(I_t) * n_i / sum_j w(I_j)                           mass conservation: sum_t w~_t = n_i
    A~_{i,t} = A_i * w~_t                                        A_i: verl's GRPO z-score of the response's score

Conventions (issue 11):

* masked positions get weight (and advantage) exactly 0;
* a response whose ``sum_j w(I_j)`` is 0 (its ``S~`` is constant, so every ``I_t`` is 0 and ``tau > 0``) gets
  weights 1, as does a constant ``S~`` with ``tau == 0`` by the formula itself;
* never NaN: ``d`` is clamped to ``[-(kl_max + 2), kl_max + 2]`` before the exponential (beyond that ``S`` already
  exceeds ``kl_max``, so the clamp changes nothing after the ``kl_max`` clamp), and two equal infinite log-probs
  give ``d = 0``; a huge log-ratio gives ``S_t = kl_max``;
* ``tau = 0, beta = 0`` gives weights 1 on every response token, so :func:`compute_pgpo_advantage` equals verl's
  GRPO (``compute_grpo_outcome_advantage`` with ``norm_adv_by_std_in_grpo=True``), except that a group of equal
  scores gets exactly 0 (see :func:`verl_ext.algos.group_stats.group_zscore`).

``log_probs`` and ``blind_log_probs`` are the old policy's log-probs of the sampled tokens with and without the
visual tokens (the blind pass, :mod:`verl_ext.pgpo`). Shapes: all ``(B, T)``, ``T`` the longest response. The
``(B, T)`` math runs in the promoted dtype of the two log-prob tensors (float32 or float64); the O(B) group math in
float64. No Python loop over responses or groups.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verl_ext.algos.checks import (
    STAT_DTYPE,
    broadcast_over_mask,
    check_finite,
    check_rewards_and_mask,
    describe,
)
from verl_ext.algos.group_stats import dense_group_ids, group_range, group_zscore

PGPO_DEFAULTS = {"tau": 0.4, "beta": 2.0, "kl_max": 10.0, "epsilon": 1e-6}


@torch.no_grad()
def pgpo_token_weights(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau: float = 0.4,
    beta: float = 2.0,
    kl_max: float = 10.0,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """PGPO's per-token weights ``w~`` (module docstring), ``(B, T)``.

    Args:
        log_probs: ``(B, T)`` float32/float64 old-policy log-probs of the sampled tokens, image visible.
        blind_log_probs: ``(B, T)`` float32/float64, the same with every visual token hidden.
        response_mask: ``(B, T)`` 0/1 (bool, integer or float) mask of the response tokens.
        tau: gate threshold on the normalised dependency ``I`` (paper 0.4); in ``[0, 1)``.
        beta: extra weight of the most visual token over ``tau`` (paper 2.0); ``>= 0``.
        kl_max: clamp of the per-token dependency ``S`` (issue 11: 10); ``> 0``.
        epsilon: added to the min-max range and to the gate's denominators (``>= 0``).

    Returns:
        ``(B, T)`` weights in the promoted dtype of the log-probs: each response's weights sum to its token count
        (to float rounding), masked positions are exactly 0, a response with constant ``S~`` gets 1 everywhere.

    Raises:
        ValueError: naming the argument for a non-tensor, non-float, wrong-shape or NaN input, a mask that is not
            0/1, or a knob out of range.
    """
    _check_weight_inputs(log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon)
    return _token_weights(log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon)


@torch.no_grad()
def compute_pgpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    *,
    tau: float = 0.4,
    beta: float = 2.0,
    kl_max: float = 10.0,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PGPO advantages ``A_i * w~_t`` and returns (the same tensor, as verl's GRPO returns).

    Args:
        token_level_rewards: ``(B, T)`` float tensor; its dtype is the output dtype. ``s_i`` is its row sum.
        response_mask: ``(B, T)`` 0/1 mask of the response tokens.
        index: ``B`` hashable group ids (verl's ``uid``): ``A_i`` is the GRPO z-score of ``s_i`` in its group.
        log_probs, blind_log_probs: ``(B, T)`` old-policy log-probs, sighted and blind
            (:func:`pgpo_token_weights`).
        tau, beta, kl_max: the gate and the clamp (:func:`pgpo_token_weights`).
        epsilon: verl's GRPO std epsilon, and the weights' epsilon.

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` in ``token_level_rewards.dtype``; masked positions are 0.

    Raises:
        ValueError: naming the argument, for mismatched shapes or lengths, NaN or non-finite row sums, a mask that
            is not 0/1, missing ids, or a knob out of range.
    """
    check_rewards_and_mask(token_level_rewards, response_mask)
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    scores = token_level_rewards.sum(dim=-1).to(STAT_DTYPE)
    check_finite(scores, "token_level_rewards: every row sum must be finite")
    group_of, num_groups = dense_group_ids(index, "index", batch_size, device)
    spread = group_range(scores, group_of, num_groups)
    per_response = group_zscore(scores, group_of, num_groups, spread, epsilon)

    _check_weight_inputs(log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon)
    # A_i rides on the mass-conservation multiply: the same pass writes the masked advantages.
    advantages = _token_weights(
        log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon, row_scale=per_response
    )
    advantages = advantages.to(token_level_rewards.dtype)
    return advantages, advantages


@torch.no_grad()
def visual_dependency(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_max: float = 10.0,
) -> torch.Tensor:
    """``(B, T)`` clamped k3 dependency ``S_t`` (module docstring) on the response tokens, 0 elsewhere."""
    _check_weight_inputs(log_probs, blind_log_probs, response_mask, 0.0, 0.0, kl_max, 0.0)
    on = _float_mask(response_mask, torch.promote_types(log_probs.dtype, blind_log_probs.dtype))
    return _dependency(log_probs, blind_log_probs, kl_max, on.dtype).mul_(on)


@torch.no_grad()
def pgpo_metrics(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    tau: float = 0.4,
    beta: float = 2.0,
    kl_max: float = 10.0,
    epsilon: float = 1e-6,
) -> dict[str, float]:
    """Scalar statistics of one batch's PGPO weights, over its response tokens (issue 11's metrics).

    Returns ``pgpo/share_above_tau`` (share of response tokens with ``I_t >= tau``, the gate's amplifying branch),
    ``pgpo/weight_mean`` and ``pgpo/weight_max`` (of ``w~``), ``pgpo/visual_dependency_mean`` and
    ``pgpo/visual_dependency_max`` (of ``S_t``). ``weights``: the output of :func:`pgpo_token_weights` for the same
    inputs, if already computed (else it is recomputed). A batch without response tokens gives 0 for each.
    """
    _check_weight_inputs(log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon)
    on = _float_mask(response_mask, torch.promote_types(log_probs.dtype, blind_log_probs.dtype))
    if weights is None:
        weights = pgpo_token_weights(
            log_probs, blind_log_probs, response_mask, tau=tau, beta=beta, kl_max=kl_max, epsilon=epsilon
        )
    elif not isinstance(weights, torch.Tensor) or weights.shape != log_probs.shape:
        raise ValueError(f"weights must be a (B, T) tensor like log_probs {tuple(log_probs.shape)}")
    dependency = _dependency(log_probs, blind_log_probs, kl_max, on.dtype)
    normalised = _normalise_(torch.log1p(dependency), on, kl_max, epsilon, torch.empty_like(dependency))
    response = on.bool()
    count = int(response.sum())
    if count == 0:
        return {f"pgpo/{name}": 0.0 for name in _METRIC_NAMES}
    dependency = dependency[response]
    weights = weights[response]
    return {
        "pgpo/share_above_tau": float((normalised[response] >= tau).sum()) / count,
        "pgpo/weight_mean": float(weights.to(STAT_DTYPE).mean()),
        "pgpo/weight_max": float(weights.max()),
        "pgpo/visual_dependency_mean": float(dependency.to(STAT_DTYPE).mean()),
        "pgpo/visual_dependency_max": float(dependency.max()),
    }


_METRIC_NAMES = ("share_above_tau", "weight_mean", "weight_max", "visual_dependency_mean", "visual_dependency_max")


# ---------------------------------------------------------------------------------------------------- internals
#
# The (B, T) passes dominate (2,560 x 4,096 is 10M tokens). The weights are computed block by block of rows
# (about 2^18 tokens per thread, 1 MiB of float32): every row statistic (min, max, sums) is local to its row, so a
# block is a complete, vectorised problem, and its ~20 elementwise passes run on three small buffers that stay in
# cache instead of streaming ~40 MB each through memory; fresh (B, T) temporaries would also cost a page fault per
# 4 KiB. The loop runs over ~B*T/2^18 blocks (40 for a DIVA step), never over responses. Mixed-dtype ops and
# ``torch.where`` on (B, T) tensors are avoided (several times slower than plain float arithmetic on CPU).
# NaN is not tested up front: it propagates through every step into the row totals, which are checked (O(B)).

_BLOCK_TOKENS = 1 << 18


def _block_rows(tokens: int) -> int:
    return max(1, (_BLOCK_TOKENS * torch.get_num_threads()) // max(tokens, 1))


def _token_weights(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    tau: float,
    beta: float,
    kl_max: float,
    epsilon: float,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, T)`` weights (times ``row_scale[:, None]`` when given) in the promoted log-prob dtype."""
    dtype = torch.promote_types(log_probs.dtype, blind_log_probs.dtype)
    batch, tokens = log_probs.shape
    out = torch.empty((batch, tokens), dtype=dtype, device=log_probs.device)
    rows = _block_rows(tokens)
    buffers = [torch.empty((min(rows, batch), tokens), dtype=dtype, device=log_probs.device) for _ in range(3)]

    def run(infinite: bool) -> str:
        for start in range(0, batch, rows):
            stop = min(start + rows, batch)
            status = _weights_block(
                log_probs[start:stop],
                blind_log_probs[start:stop],
                response_mask[start:stop],
                out[start:stop],
                *(buffer[: stop - start] for buffer in buffers),
                tau=tau,
                beta=beta,
                kl_max=kl_max,
                epsilon=epsilon,
                row_scale=None if row_scale is None else row_scale[start:stop],
                infinite=infinite,
            )
            if status != "ok":
                return status
        return "ok"

    status = run(infinite=False)
    if status == "nan":
        # Slow path: a NaN input is an error; otherwise the NaN came from an infinite log-ratio, which the
        # clamped path handles.
        _raise_on_nan(log_probs, "log_probs")
        _raise_on_nan(blind_log_probs, "blind_log_probs")
        status = run(infinite=True)
    if status == "mask":
        _float_mask(response_mask, dtype)  # raises the shared helper's error, naming the row
    if status != "ok":
        raise AssertionError(f"PGPO weights: unexpected block status {status!r}")  # pragma: no cover
    return out


def _weights_block(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    mask: torch.Tensor,
    out: torch.Tensor,
    on: torch.Tensor,
    scratch: torch.Tensor,
    spare: torch.Tensor,
    *,
    tau: float,
    beta: float,
    kl_max: float,
    epsilon: float,
    row_scale: torch.Tensor | None,
    infinite: bool,
) -> str:
    """The weights of a block of rows into ``out`` (module docstring), with three scratch buffers of its shape.

    Returns ``"ok"``, ``"mask"`` (the mask is not 0/1) or ``"nan"`` (a row total is not finite).
    """
    on.copy_(mask)
    if not _is_zero_one(on, mask.dtype):
        return "mask"
    count = on.sum(dim=-1, keepdim=True)
    s_tilde = _dependency_into(log_probs, blind_log_probs, scratch, out, kl_max, infinite=infinite).log1p_()
    normalised = _normalise_(s_tilde, on, kl_max, epsilon, scratch)
    # The branch is chosen by the exact test I < tau, as a float 0/1 weight of lerp(high, low, below), which
    # returns either end exactly.
    below = torch.lt(normalised, tau, out=scratch)
    # tau = epsilon = 0: the low branch is never taken on a response token (I >= 0); 0 keeps it finite elsewhere.
    low = torch.mul(normalised, 1.0 / (tau + epsilon) if tau + epsilon > 0 else 0.0, out=spare)
    slope = beta / (1.0 - tau + epsilon)
    high = normalised.mul_(slope).add_(1.0 - slope * tau)  # 1 + beta * (I - tau) / (1 - tau + eps)
    weights = torch.lerp(high, low, below, out=high).mul_(on)
    total = weights.sum(dim=-1, keepdim=True)
    if not bool(torch.isfinite(total).all()):
        return "nan"
    # Mass conservation; a row whose total is 0 (constant S~, every I = 0 below a positive tau) has no mass to
    # conserve and gets weights 1 (rows without response tokens have count 0 and stay 0).
    constant = (total <= 0).squeeze(-1)
    scale = count / torch.where(total > 0, total, 1.0)
    if row_scale is not None:
        row_scale = row_scale.to(scale.dtype).unsqueeze(-1)
        scale.mul_(row_scale)
    weights.mul_(scale)
    if bool(constant.any()):
        rows = constant.nonzero().squeeze(-1)
        fill = on.index_select(0, rows)
        if row_scale is not None:
            fill.mul_(row_scale.index_select(0, rows))
        weights.index_copy_(0, rows, fill)
    return "ok"


def _dependency_into(
    log_probs: torch.Tensor,
    blind_log_probs: torch.Tensor,
    d: torch.Tensor,
    s: torch.Tensor,
    kl_max: float,
    infinite: bool = False,
) -> torch.Tensor:
    """``s <- S = clamp(expm1(d) - d, 0, kl_max)`` with ``d <- blind - sighted`` (both buffers written); returns ``s``.

    ``expm1(d) - d`` is finite or ``+inf`` for every finite ``d`` (``expm1`` overflows to ``inf`` for a large
    ``d``; a very negative ``d`` gives ``-1 - d``), and the ``kl_max`` clamp takes both to ``kl_max``. Only an
    infinite ``d`` gives NaN (``inf - inf``): the ``infinite`` path (taken by the callers after checking that no
    input is NaN) first maps the same infinite log-prob in both views to ``d = 0`` (no difference) and clamps ``d``
    to ``+-(kl_max + 2)``, beyond which ``S(d) > kl_max + 1`` on either side, so the clamp changes no clamped ``S``.
    ``expm1`` rather than ``exp(d) - 1``: the latter would carry exp's rounding (~1e-7 in float32) into an ``S`` of
    order ``d^2 / 2``, which the per-response min-max normalisation amplifies when a whole response depends little
    on the image.
    """
    torch.sub(blind_log_probs, log_probs, out=d)
    if infinite:
        d.nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
        bound = kl_max + 2.0
        d.clamp_(-bound, bound)
    torch.expm1(d, out=s)
    return s.sub_(d).clamp_(0.0, kl_max)


def _dependency(log_probs: torch.Tensor, blind_log_probs: torch.Tensor, kl_max: float, dtype) -> torch.Tensor:
    """``(B, T)`` ``S`` (:func:`_dependency_into`) on every position, as a new tensor; NaN inputs raise."""
    d = torch.empty(log_probs.shape, dtype=dtype, device=log_probs.device)
    s = _dependency_into(log_probs, blind_log_probs, d, torch.empty_like(d), kl_max)
    if not bool(torch.isfinite(s.sum())):
        _raise_on_nan(log_probs, "log_probs")
        _raise_on_nan(blind_log_probs, "blind_log_probs")
        s = _dependency_into(log_probs, blind_log_probs, d, s, kl_max, infinite=True)
    return s


def _normalise_(s_tilde: torch.Tensor, on: torch.Tensor, kl_max: float, epsilon: float, scratch: torch.Tensor):
    """``S~ <- I = (S~ - min) / (max - min + epsilon)`` per row over the response tokens, in place.

    ``S~`` lies in ``[0, log1p(kl_max)]``: the row max of ``S~ * mask`` is the max over the response (masked zeros
    never exceed it) and the row min of ``S~ + big * (1 - mask)`` the min over it (both exact). Off the response
    ``I`` is garbage (callers mask). A row without response tokens gets ``max = 0``, ``min = big``: finite, masked.
    A constant ``S~`` with ``epsilon = 0`` would be ``0 / 0``: its ``I`` is 0, as with a positive ``epsilon``.
    """
    high = torch.mul(s_tilde, on, out=scratch).amax(dim=-1, keepdim=True)
    big = math.log1p(kl_max) + 1.0
    lifted = torch.mul(on, -big, out=scratch).add_(big).add_(s_tilde)  # exact: S~ + 0 or S~ + big
    low = lifted.amin(dim=-1, keepdim=True)
    spread = high.sub_(low).add_(epsilon)
    spread.masked_fill_(spread == 0, 1.0)
    return s_tilde.sub_(low).div_(spread)


def _float_mask(response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The checked ``(B, T)`` mask in ``dtype`` (the shared helper's check and error message)."""
    ones = torch.ones(response_mask.shape[0], dtype=dtype, device=response_mask.device)
    return broadcast_over_mask(ones, response_mask)


def _is_zero_one(on: torch.Tensor, mask_dtype: torch.dtype) -> bool:
    """Whether the float copy ``on`` of a mask of ``mask_dtype`` holds only 0 and 1 (the rule of
    :func:`verl_ext.algos.checks.broadcast_over_mask`, which raises the error message)."""
    if mask_dtype == torch.bool or on.numel() == 0:
        return True
    low, high = torch.aminmax(on)  # NaN makes both comparisons false
    if not (bool(low >= 0) and bool(high <= 1)):
        return False
    if not mask_dtype.is_floating_point:
        return True  # an integer in [0, 1] is 0 or 1
    return bool(torch.count_nonzero(on) == torch.count_nonzero(on.eq(1)))


def _check_weight_inputs(log_probs, blind_log_probs, response_mask, tau, beta, kl_max, epsilon) -> None:
    for name, value in (("log_probs", log_probs), ("blind_log_probs", blind_log_probs)):
        if not isinstance(value, torch.Tensor) or value.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} must be a float32 or float64 torch.Tensor, got {describe(value)}")
        if value.dim() != 2:
            raise ValueError(f"{name} must be (B, T), got shape {tuple(value.shape)}")
    if blind_log_probs.shape != log_probs.shape:
        raise ValueError(
            f"blind_log_probs has shape {tuple(blind_log_probs.shape)} but log_probs has {tuple(log_probs.shape)}; "
            "they must match (both response-aligned, as verl's old_log_probs)"
        )
    if blind_log_probs.device != log_probs.device:
        raise ValueError(f"blind_log_probs is on {blind_log_probs.device} but log_probs on {log_probs.device}")
    if not isinstance(response_mask, torch.Tensor):
        raise ValueError(f"response_mask must be a torch.Tensor, got {describe(response_mask)}")
    if response_mask.shape != log_probs.shape:
        raise ValueError(
            f"response_mask has shape {tuple(response_mask.shape)} but log_probs has {tuple(log_probs.shape)}; "
            "they must match"
        )
    if response_mask.device != log_probs.device:
        raise ValueError(f"response_mask is on {response_mask.device} but log_probs on {log_probs.device}")
    if not 0.0 <= tau < 1.0:
        raise ValueError(f"tau must be in [0, 1), got {tau}")
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if not (kl_max > 0.0 and kl_max < float("inf")):
        raise ValueError(f"kl_max must be a positive finite number, got {kl_max}")
    if not epsilon >= 0.0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")


def _raise_on_nan(values: torch.Tensor, name: str) -> None:
    bad = torch.isnan(values)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} holds NaN (response {row}, token {col}); every log-prob must be a number")
