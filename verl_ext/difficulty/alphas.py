"""Per-question success rate ``alpha`` from per-response outcomes.

``alpha_q = mean_{i : q(i) = q} v_i`` over every response to question q in the step: the responses to its
original prompt and to all its variants. ``v_i`` is 1/0 correctness (``alpha_source="accuracy"``, the
paper) or the response's total reward (``alpha_source="reward"``, the released code: 0.9 acc + 0.1 format).
Either way every ``v_i`` must lie in [0, 1].
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def check_unit_interval(values, name: str) -> np.ndarray:
    """``values`` as a float64 array of shape ``(N,)``; ``ValueError`` naming ``name`` if any is NaN, inf or
    outside [0, 1] (the first offending position and value are given)."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numbers in [0, 1]: {err}") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    bad = ~np.isfinite(array) | (array < 0.0) | (array > 1.0)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}[{pos}] = {array[pos]!r}: every value must be finite and in [0, 1] "
            f"({int(bad.sum())} bad value(s) of {array.size})"
        )
    return array


def question_alphas(
    question_ids_per_response: Sequence[Hashable], values_per_response: Sequence[float]
) -> tuple[list[Hashable], np.ndarray]:
    """Average per-response outcomes over each question (original + variants).

    Args:
        question_ids_per_response: stable question id of each response, length ``B`` (from ``extra_info``).
        values_per_response: correctness (0/1) or total reward of each response, length ``B``, in [0, 1].

    Returns:
        ``(question_ids, alphas)``: the distinct ids in first-seen order (length ``Q``) and a float64 array of
        shape ``(Q,)`` with each question's mean value.
    """
    ids = list(question_ids_per_response)
    values = check_unit_interval(values_per_response, "values_per_response")
    if len(ids) != values.size:
        raise ValueError(
            f"question_ids_per_response has {len(ids)} entries but values_per_response has {values.size}; "
            "give one value per response"
        )
    order: dict[Hashable, int] = {}
    group = np.empty(len(ids), dtype=np.int64)
    for i, qid in enumerate(ids):
        group[i] = order.setdefault(qid, len(order))
    sums = np.bincount(group, weights=values, minlength=len(order))
    counts = np.bincount(group, minlength=len(order))
    return list(order), sums / np.maximum(counts, 1)


def per_response_values(accuracy: Sequence[float], reward: Sequence[float], alpha_source: str) -> np.ndarray:
    """The per-response values that ``diva.difficulty.alpha_source`` selects, shape ``(B,)``.

    ``"accuracy"`` (paper): the 0/1 correctness the reward function reports as ``acc``; ``"reward"`` (released
    code): the total score (0.9 acc + 0.1 format). Feed the result to :func:`question_alphas`.
    """
    if alpha_source == "accuracy":
        return check_unit_interval(accuracy, "accuracy")
    if alpha_source == "reward":
        return check_unit_interval(reward, "reward")
    raise ValueError(f"alpha_source must be 'accuracy' or 'reward', got {alpha_source!r}")
