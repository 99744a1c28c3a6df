"""compute_codapo_advantage against a slow, obvious loop reference and verl's GRPO."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import compute_codapo_advantage

# ---------------------------------------------------------------------------------------------------------------
# The reference: issue 10's CoDaPO (the authors' weighting) one response at a time, in Python floats.
# ---------------------------------------------------------------------------------------------------------------


def reference_codapo(rewards, mask, log_probs, index, correct, weight_offset, epsilon):
    """Returns (advantages as nested lists, weights as a list)."""
    batch = len(index)
    scores = [sum(float(x) for x in row) for row in rewards]
    if correct is None:
        correct = [1.0 if s == 1.0 else 0.0 for s in scores]
    token_mean = []
    for i in range(batch):
        tokens = [float(log_probs[i][t]) for t in range(len(mask[i])) if mask[i][t]]
        token_mean.append(sum(tokens) / len(tokens) if tokens else 0.0)
    advantage, weight = [], []
    for i in range(batch):
        members = [j for j in range(batch) if index[j] == index[i]]
        group = [scores[j] for j in members]
        if len(group) == 1:
            z = scores[i] / (1.0 + epsilon)
        elif max(group) == min(group):
            z = 0.0
        else:
            z = (scores[i] - statistics.fmean(group)) / (statistics.stdev(group) + epsilon)
        difficulty = 1.0 - statistics.fmean(float(correct[j]) for j in members)
        value_d = 1.0 - 4.0 * (difficulty - 0.5) ** 2
        confidence = math.exp(statistics.fmean(token_mean[j] for j in members))
        w = confidence * value_d + weight_offset
        weight.append(w)
        advantage.append(w * z)
    return [[advantage[i] * float(mask[i][t]) for t in range(len(mask[i]))] for i in range(batch)], weight


# ---------------------------------------------------------------------------------------------------------------
# Random batches: groups of one, all-correct / all-wrong groups, mixed groups, empty responses.
# ---------------------------------------------------------------------------------------------------------------


def random_batch(rng, dtype, tokens=7, graded=False):
    """Scores in {0, 1}, or 0.9 * correct + 0.1 * format with ``graded``, on one token (so float32 row sums are
    exact); old log-probs in [-3, 0]."""
    index, correct = [], []
    for p in range(int(rng.integers(1, 10))):
        size = int(rng.choice([1, 2, 4, 5, 8]))
        p_correct = float(rng.choice([0.0, 1.0, rng.uniform()]))
        index += [f"p{p}"] * size
        correct += (rng.random(size) < p_correct).astype(float).tolist()
    batch = len(index)
    correct = np.array(correct)
    scores = 0.9 * correct + 0.1 * (rng.random(batch) < 0.7) if graded else correct
    rewards = np.zeros((batch, tokens))
    lengths = rng.integers(0, tokens + 1, size=batch)  # 0: an empty response (token mean 0)
    rewards[np.arange(batch), np.maximum(lengths - 1, 0)] = scores
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int64)
    log_probs = -3.0 * rng.random((batch, tokens))
    shuffle = rng.permutation(batch)
    return (
        torch.tensor(rewards[shuffle], dtype=dtype),
        torch.tensor(mask[shuffle]),
        torch.tensor(log_probs[shuffle], dtype=dtype),
        np.array(index, dtype=object)[shuffle],
        correct[shuffle],
    )


@pytest.mark.parametrize("graded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_on_random_batches(dtype, graded):
    rng = np.random.default_rng(77)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    kinds = set()
    for _ in range(50):
        rewards, mask, log_probs, index, correct = random_batch(rng, dtype, graded=graded)
        weight_offset = float(rng.choice([0.1, 0.0, 0.5]))
        # None: correct means s == 1.0, so with graded scores a correct but unformatted 0.9 counts as wrong.
        for given in (None, correct, list(correct), torch.tensor(correct, dtype=torch.bool)):
            advantages, returns, weights = compute_codapo_advantage(
                rewards, mask, log_probs, index, given, weight_offset=weight_offset
            )
            expected, expected_w = reference_codapo(
                rewards.tolist(), mask.tolist(), log_probs.tolist(), list(index),
                None if given is None else list(correct), weight_offset, 1e-6,
            )  # fmt: skip
            assert advantages.dtype == dtype and weights.dtype == dtype and returns is advantages
            assert weights.shape == (len(index),)
            torch.testing.assert_close(advantages, torch.tensor(expected, dtype=dtype), **tolerance)
            torch.testing.assert_close(weights, torch.tensor(expected_w, dtype=dtype), **tolerance)
        for key in set(index):
            rows = index == key
            kinds.add("one" if rows.sum() == 1 else ("equal" if len(set(correct[rows])) == 1 else "mixed"))
    assert kinds == {"one", "equal", "mixed"}


def test_weight_follows_the_formula_on_a_worked_example():
    """Half correct (V_d = 1), token means -0.2 and -0.4: w = exp(-0.3) + 0.1; all correct: w = 0.1."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    log_probs = torch.tensor([[-0.1, -0.3], [-0.6, -0.2], [-0.5, -9.0], [-0.1, -0.1]])
    _, _, weights = compute_codapo_advantage(rewards, mask, log_probs, ["a", "a", "b", "b"])
    w_a = math.exp(-0.3) + 0.1
    torch.testing.assert_close(weights, torch.tensor([w_a, w_a, 0.1, 0.1]))


def test_the_correct_argument_overrides_the_score():
    """Scores 0.9 / 0.1 are never == 1.0; with the reward's acc the group is half correct."""
    rewards = torch.tensor([[0.9], [0.1], [0.9], [0.1]])
    args = (rewards, torch.ones(4, 1), torch.zeros(4, 1), ["a"] * 4)
    _, _, from_scores = compute_codapo_advantage(*args)
    _, _, from_acc = compute_codapo_advantage(*args, correct=[1, 0, 1, 0])
    torch.testing.assert_close(from_scores, torch.full((4,), 0.1))  # acc 0: V_d = 0
    torch.testing.assert_close(from_acc, torch.full((4,), 1.1))  # acc 0.5, c = exp(0) = 1


# ---------------------------------------------------------------------------------------------------------------
# Against verl's own GRPO: A = w * z.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_advantage_is_the_weight_times_verls_grpo(dtype):
    rng = np.random.default_rng(13)
    for _ in range(30):
        rewards, mask, log_probs, index, correct = random_batch(rng, dtype)
        rewards = rewards + torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)  # no exactly equal groups
        ours, _, weights = compute_codapo_advantage(rewards, mask, log_probs, index, correct)
        verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index=index)
        torch.testing.assert_close(ours, weights[:, None] * verl_adv.to(dtype), rtol=1e-5, atol=1e-5)


def test_offset_one_without_a_difficulty_signal_is_verls_grpo():
    rng = np.random.default_rng(14)
    rewards, mask, log_probs, index, correct = random_batch(rng, torch.float64)
    rewards = rewards + torch.tensor(rng.normal(size=rewards.shape), dtype=torch.float64)
    # Every response correct: d = 0, V_d = 0, so w = weight_offset = 1 and A is verl's z-score.
    ours, _, weights = compute_codapo_advantage(rewards, mask, log_probs, index, np.ones(len(index)), weight_offset=1.0)
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index=index)
    torch.testing.assert_close(weights, torch.ones(len(index), dtype=torch.float64))
    torch.testing.assert_close(ours, verl_adv, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Masks, dtypes, log-prob padding.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_tokens_are_exactly_zero(dtype, mask_dtype):
    rng = np.random.default_rng(5)
    rewards, mask, log_probs, index, correct = random_batch(rng, dtype, tokens=9)
    rewards = rewards + 3.0 * torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)
    mask = mask.to(mask_dtype)
    advantages, _, _ = compute_codapo_advantage(rewards, mask, log_probs, index, correct)
    assert advantages.dtype == dtype
    assert torch.all(advantages[mask == 0] == 0)
    per_response = advantages.sum(-1) / mask.to(dtype).sum(-1).clamp_min(1)
    torch.testing.assert_close(advantages, per_response[:, None] * mask.to(dtype), rtol=1e-6, atol=1e-6)


def test_log_probs_under_the_mask_are_ignored_even_nan_and_inf():
    rng = np.random.default_rng(6)
    rewards, mask, log_probs, index, correct = random_batch(rng, torch.float32)
    clean = compute_codapo_advantage(rewards, mask, log_probs, index, correct)
    padded = log_probs.clone()
    padded[mask == 0] = torch.tensor([float("nan"), float("-inf"), 1e30])[torch.arange(int((mask == 0).sum())) % 3]
    dirty = compute_codapo_advantage(rewards, mask, padded, index, correct)
    torch.testing.assert_close(dirty[0], clean[0])
    torch.testing.assert_close(dirty[2], clean[2])


@pytest.mark.parametrize("log_prob_dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_log_probs_of_another_dtype(log_prob_dtype):
    """Float32 rewards with float64 or bfloat16 log-probs: outputs in the rewards' dtype, token means unaffected."""
    rng = np.random.default_rng(10)
    rewards, mask, log_probs, index, correct = random_batch(rng, torch.float32, tokens=300)
    log_probs = log_probs.to(log_prob_dtype)
    advantages, _, weights = compute_codapo_advantage(rewards, mask, log_probs, index, correct)
    expected, expected_w = reference_codapo(
        rewards.tolist(), mask.tolist(), log_probs.float().tolist(), list(index), list(correct), 0.1, 1e-6
    )
    assert advantages.dtype == torch.float32 and weights.dtype == torch.float32
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights, torch.tensor(expected_w, dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_ids_as_lists_arrays_and_tensors_agree():
    rng = np.random.default_rng(8)
    rewards, mask, log_probs, index, correct = random_batch(rng, torch.float64)
    codes = {key: n for n, key in enumerate(dict.fromkeys(index))}
    as_ints = [codes[key] for key in index]
    reference = compute_codapo_advantage(rewards, mask, log_probs, index, correct)
    for ids in (list(index), np.array(as_ints), torch.tensor(as_ints)):
        result = compute_codapo_advantage(rewards, mask, log_probs, ids, correct)
        torch.testing.assert_close(result[0], reference[0])
        torch.testing.assert_close(result[2], reference[2])


# ---------------------------------------------------------------------------------------------------------------
# Input validation: a ValueError that names the argument.
# ---------------------------------------------------------------------------------------------------------------


def _good_inputs():
    return dict(
        token_level_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.5]]),
        response_mask=torch.ones(4, 2, dtype=torch.int64),
        old_log_probs=torch.full((4, 2), -0.5),
        index=np.array(["a", "a", "b", "b"], dtype=object),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(old_log_probs=None), "old_log_probs is required"),
        (dict(old_log_probs=torch.zeros(4, 3)), "old_log_probs"),
        (dict(old_log_probs=np.zeros((4, 2))), "old_log_probs"),
        (dict(old_log_probs=torch.zeros(4, 2, dtype=torch.int64)), "old_log_probs"),
        (dict(old_log_probs=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])), "old_log_probs"),
        (dict(old_log_probs=torch.tensor([[0.0, 0.0], [float("-inf"), 0], [0, 0], [0, 0]])), "old_log_probs"),
        (dict(old_log_probs=torch.full((4, 2), 800.0, dtype=torch.float64)), "old_log_probs"),
        (dict(token_level_rewards=torch.zeros(4, 3)), "response_mask"),
        (dict(token_level_rewards=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])), "token_level_rewards"),
        (dict(response_mask=torch.tensor([[1, 2], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, 0.5], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(index=["a", "a", "b"]), "index"),
        (dict(index=["a", None, "b", "b"]), "index is missing"),
        (dict(correct=[1, 0, 1]), "correct"),
        (dict(correct=[1, 0, 0.5, 1]), "correct must be 0 or 1"),
        (dict(correct=[1, float("nan"), 0, 1]), "correct"),
        (dict(correct=["yes", "no", "no", "yes"]), "correct"),
        (dict(weight_offset=float("nan")), "weight_offset"),
        (dict(epsilon=float("inf")), "epsilon"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        compute_codapo_advantage(**(_good_inputs() | change))
