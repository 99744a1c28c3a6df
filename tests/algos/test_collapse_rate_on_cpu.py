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


def test_in_collapsed_group_marks_equal_score_groups_which_verl_grpo_leaves_a_rounding_residue():
    import numpy as np
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from verl_ext.algos.collapse import in_collapsed_group
    from verl_ext.methods.base import AdvantageInputs, get_method

    # Group a: eight well-formed wrong answers (0.1 each); group b: one right answer among seven wrong.
    scores = torch.tensor([0.1] * 8 + [1.0] + [0.1] * 7)
    index = np.array(["a"] * 8 + ["b"] * 8)
    rewards = torch.zeros(16, 3)
    rewards[:, -1] = scores
    mask = torch.ones(16, 3)
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    # verl's float32 z-score: group a's mean is a rounding step off 0.1 and its std about 0, so every response of it
    # gets the same small non-zero advantage (the fact the metric corrects for; if verl's arithmetic changes, so be it)
    residue = verl_adv[:8, 0]
    assert torch.all(residue == residue[0]) and 0 < abs(float(residue[0])) < 0.05
    marked = in_collapsed_group(scores, index)
    assert marked.tolist() == [True] * 8 + [False] * 8
    # A slow, obvious reference: a response is marked when every score of its group equals its own.
    by_hand = [all(float(scores[j]) == float(scores[i]) for j in range(16) if index[j] == index[i]) for i in range(16)]
    assert marked.tolist() == by_hand
    # The grpo baseline counts group a as zero-advantage (an exact == 0 would count none of it).
    result = get_method("grpo").compute(AdvantageInputs(rewards, rewards, mask.long(), index), None)
    assert torch.equal(result.advantages, verl_adv)
    assert result.metrics["grpo/advantage/zero_fraction"] == 0.5
