"""advantage_collapse_rate against a per-group loop, and its agreement with zero GRPO advantages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import advantage_collapse_rate


def reference_collapse_rate(scores, index):
    groups = {}
    for score, group in zip(scores, index, strict=True):
        groups.setdefault(group, []).append(float(score))
    return sum(max(values) == min(values) for values in groups.values()) / len(groups)


def test_matches_a_per_group_loop():
    rng = np.random.default_rng(3)
    for _ in range(50):
        batch = int(rng.integers(1, 40))
        index = np.array([f"uid-{g}" for g in rng.integers(0, 8, size=batch)], dtype=object)
        scores = rng.integers(0, int(rng.integers(1, 4)), size=batch) * 0.45
        expected = reference_collapse_rate(scores, index)
        assert advantage_collapse_rate(torch.tensor(scores), index) == pytest.approx(expected)
        assert advantage_collapse_rate(scores.tolist(), list(index)) == pytest.approx(expected)


def test_known_values():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.9])
    index = ["a", "a", "b", "b", "c", "c", "d"]  # a and c collapse, b does not, d is a group of one
    assert advantage_collapse_rate(scores, index) == pytest.approx(3 / 4)
    assert advantage_collapse_rate(scores, [0, 0, 0, 0, 0, 0, 0]) == 0.0
    assert advantage_collapse_rate(torch.zeros(4), [1, 1, 2, 2]) == 1.0


def test_collapsed_groups_are_those_with_zero_grpo_advantage():
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    index = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(scores[:, None], torch.ones(8, 1), index=index)
    zero_groups = {g for g in set(index) if advantages[index == g].abs().max() < 1e-6}
    assert advantage_collapse_rate(scores, index) == len(zero_groups) / 4 == 0.5


@pytest.mark.parametrize(
    "scores, index, message",
    [
        (torch.zeros(3), ["a", "b"], "index"),
        (torch.zeros(2, 2), ["a", "b"], "scores"),
        (torch.tensor([]), [], "empty"),
        (torch.tensor([0.0, float("nan")]), ["a", "a"], "finite"),
        (["x", "y"], ["a", "a"], "scores"),
    ],
)
def test_bad_input(scores, index, message):
    with pytest.raises(ValueError, match=message):
        advantage_collapse_rate(scores, index)
