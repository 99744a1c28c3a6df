"""compute_avspo_advantage and avspo_collapse_rates against a slow, obvious loop reference and verl's GRPO."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import avspo_collapse_rates, compute_avspo_advantage

# ---------------------------------------------------------------------------------------------------------------
# The reference: issue 10's AVSPO written out one group at a time, in Python floats.
# ---------------------------------------------------------------------------------------------------------------


def _groups(index):
    members = {}
    for i, key in enumerate(index):
        members.setdefault(key, []).append(i)
    return members


def _virtual_scores(real, acr, mode, alpha, reward_max, anchor):
    g = len(real)
    r = sum(real) / g
    correct = r >= reward_max / 2
    if mode == "released":
        return [0.0 if correct else reward_max]
    k = max(1, min(g, math.ceil(g * acr**alpha)))
    if correct:
        return [r * (1 - j / (k + 1)) for j in range(1, k + 1)]
    return [min(reward_max, r + anchor * reward_max)] * k


def reference_avspo(rewards, mask, index, mode, alpha, reward_max, anchor, collapse_tol, epsilon):
    """Returns (advantages as nested lists, acr_before, acr_after, total virtual count)."""
    scores = [sum(float(x) for x in row) for row in rewards]
    groups = _groups(index)
    multi = [m for m in groups.values() if len(m) >= 2]
    collapsed = [m for m in multi if max(scores[i] for i in m) - min(scores[i] for i in m) <= collapse_tol]
    acr = len(collapsed) / len(multi) if multi else 0.0
    advantage = [0.0] * len(scores)
    still, virtual_total = 0, 0
    for members in groups.values():
        real = [scores[i] for i in members]
        if len(members) == 1:
            advantage[members[0]] = real[0] / (1.0 + epsilon)
            continue
        if members in collapsed:
            virtual = _virtual_scores(real, acr, mode, alpha, reward_max, anchor)
            virtual_total += len(virtual)
            pool = real + virtual
            if max(pool) - min(pool) <= collapse_tol:
                still += 1
                continue  # advantages stay 0
        elif max(real) == min(real):
            continue
        else:
            pool = real
        mean, std = statistics.fmean(pool), statistics.stdev(pool)
        for i in members:
            advantage[i] = (scores[i] - mean) / (std + epsilon)
    out = [[advantage[i] * float(mask[i][t]) for t in range(len(mask[i]))] for i in range(len(scores))]
    return out, acr, (still / len(multi) if multi else 0.0), virtual_total


# ---------------------------------------------------------------------------------------------------------------
# Random batches: groups of one, all-correct and all-wrong collapsed groups, mixed groups, masked rows.
# ---------------------------------------------------------------------------------------------------------------


def random_batch(rng, dtype, tokens=6, reward_max=1.0, near_ties=False):
    """Rewards are multiples of reward_max/16 on one or two tokens, so float32 row sums are exact. With
    ``near_ties`` (float64 only) some collapsed groups get scores that differ by less than 1e-6."""
    index, row_scores = [], []
    for p in range(int(rng.integers(1, 12))):
        size = int(rng.choice([1, 2, 3, 5, 8]))
        kind = rng.choice(["correct", "wrong", "mixed", "mixed"])
        if kind == "correct":
            values = np.full(size, float(rng.choice([16, 14, 9])))
        elif kind == "wrong":
            values = np.full(size, float(rng.choice([0, 2, 7])))
        else:
            values = rng.integers(0, 17, size=size).astype(float)
        values = values * reward_max / 16
        if near_ties and kind != "mixed":
            values = values + rng.uniform(0, 5e-7, size=size)
        index += [f"p{p}"] * size
        row_scores += values.tolist()
    batch = len(index)
    rewards = np.zeros((batch, tokens))
    split = rng.integers(1, 3, size=batch)
    for i in range(batch):
        rewards[i, -1] = row_scores[i] / split[i]
        rewards[i, 0] += row_scores[i] - rewards[i, -1]
    lengths = rng.integers(0, tokens + 1, size=batch)  # 0: a fully masked row (its score still counts)
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int64)
    shuffle = rng.permutation(batch)  # groups are not contiguous in verl's batches either
    return (
        torch.tensor(rewards[shuffle], dtype=dtype),
        torch.tensor(mask[shuffle]),
        np.array(index, dtype=object)[shuffle],
    )


KNOBS = [
    dict(mode="paper", alpha=0.5, anchor=0.1),
    dict(mode="paper", alpha=0.0, anchor=0.1),  # K = G
    dict(mode="paper", alpha=1.0, anchor=0.3),
    dict(mode="paper", alpha=2.0, anchor=0.0),  # anchor 0: all-wrong groups stay collapsed
    dict(mode="released", alpha=0.5, anchor=0.1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_on_random_batches(dtype):
    rng = np.random.default_rng(2026)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    seen = {"collapsed": 0, "single": 0, "still": 0}
    for trial in range(50):
        reward_max = float(rng.choice([1.0, 2.0]))
        near_ties = dtype == torch.float64 and trial % 3 == 0
        rewards, mask, index = random_batch(rng, dtype, reward_max=reward_max, near_ties=near_ties)
        for knobs in KNOBS:
            knobs = knobs | dict(reward_max=reward_max, collapse_tol=1e-6)
            advantages, returns = compute_avspo_advantage(rewards, mask, index, **knobs)
            expected, acr, acr_after, virtual = reference_avspo(
                rewards.tolist(), mask.tolist(), list(index), epsilon=1e-6, **knobs
            )
            assert advantages.dtype == dtype and advantages.shape == rewards.shape and returns is advantages
            torch.testing.assert_close(
                advantages, torch.tensor(expected, dtype=dtype), msg=lambda m, k=knobs: f"{k}: {m}", **tolerance
            )
            rates = avspo_collapse_rates(rewards, index, **knobs)
            assert rates["acr_before"] == pytest.approx(acr, abs=1e-12)
            assert rates["acr_after"] == pytest.approx(acr_after, abs=1e-12)
            assert rates["virtual_samples"] == virtual
            seen["collapsed"] += rates["collapsed"]
            seen["still"] += rates["acr_after"] > 0
        seen["single"] += sum(1 for key in set(index) if list(index).count(key) == 1)
    assert all(count > 0 for count in seen.values()), seen  # the batches exercised every branch


def test_paper_mode_worked_example():
    """ACR 1/2, G=4: K = ceil(4 * sqrt(0.5)) = 3, virtual 0.75, 0.5, 0.25 below the all-correct group's 1."""
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])[:, None]
    index = list("aaaabbbb")
    advantages, _ = compute_avspo_advantage(rewards, torch.ones(8, 1, dtype=torch.int64), index)
    pool = [1.0] * 4 + [0.75, 0.5, 0.25]
    expected = (1.0 - statistics.fmean(pool)) / (statistics.stdev(pool) + 1e-6)
    torch.testing.assert_close(advantages[:4, 0], torch.full((4,), expected))
    verl, _ = compute_grpo_outcome_advantage(rewards[4:], torch.ones(4, 1), np.array(index[4:], dtype=object))
    torch.testing.assert_close(advantages[4:], verl)  # the mixed group is plain GRPO
    rates = avspo_collapse_rates(rewards, index)
    assert rates == {
        "acr_before": 0.5, "acr_after": 0.0, "groups": 2, "collapsed": 1, "virtual_samples": 3,
        "virtual_per_collapsed": 3.0,
    }  # fmt: skip


@pytest.mark.parametrize("size", [2, 5, 8])
@pytest.mark.parametrize("value", [0.0, 1.0])
def test_released_mode_gives_one_over_sqrt_g_plus_one(size, value):
    """One virtual sample of the opposite outcome, unbiased std over G+1: |A| = 1/sqrt(G+1) (docs/algo/avspo.md)."""
    rewards = torch.full((size, 3), 0.0, dtype=torch.float64)
    rewards[:, -1] = value
    advantages, _ = compute_avspo_advantage(rewards, torch.ones(size, 3), ["g"] * size, mode="released", epsilon=0.0)
    sign = 1.0 if value == 1.0 else -1.0
    torch.testing.assert_close(advantages, torch.full_like(rewards, sign / math.sqrt(size + 1)))


def test_virtual_count_rounds_up_exactly():
    """ACR 1/4 with alpha 1/2 gives G * 0.5 exactly: K = G/2, no spurious ceil to G/2 + 1."""
    rewards = torch.tensor([[1.0]] * 8 + [[0.0], [1.0]] * 12)
    index = ["c"] * 8 + [f"m{i // 8}" for i in range(24)]
    rates = avspo_collapse_rates(rewards, index)
    assert rates["acr_before"] == 0.25 and rates["virtual_samples"] == 4


def test_a_group_of_one_is_verls_grpo_and_does_not_count():
    rewards = torch.tensor([[0.0, 0.7], [1.0, 0.0], [1.0, 0.0]])
    index = ["solo", "pair", "pair"]
    advantages, _ = compute_avspo_advantage(rewards, torch.ones(3, 2), index)
    torch.testing.assert_close(advantages[0], torch.full((2,), 0.7 / (1 + 1e-6)))
    assert avspo_collapse_rates(rewards, index)["acr_before"] == 1.0  # one group of two or more, collapsed
    assert avspo_collapse_rates(rewards[:1], index[:1]) == {
        "acr_before": 0.0, "acr_after": 0.0, "groups": 0, "collapsed": 0, "virtual_samples": 0,
        "virtual_per_collapsed": 0.0,
    }  # fmt: skip


def test_collapsed_groups_get_a_signal_and_keep_their_sign():
    """All-correct groups move up, all-wrong ones down (the virtual scores sit on the other side)."""
    rng = np.random.default_rng(3)
    for mode in ("paper", "released"):
        rewards, mask, index = random_batch(rng, torch.float64)
        scores = rewards.sum(-1)
        advantages, _ = compute_avspo_advantage(rewards, torch.ones_like(mask), index, mode=mode)
        per_response = advantages[:, 0]
        for key in set(index):
            rows = np.flatnonzero(index == key)
            if len(rows) >= 2 and scores[rows].max() == scores[rows].min():
                expected_sign = 1.0 if scores[rows[0]] >= 0.5 else -1.0
                assert torch.all(torch.sign(per_response[rows]) == expected_sign), (mode, key)


# ---------------------------------------------------------------------------------------------------------------
# Against verl's own GRPO.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["paper", "released"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_without_collapsed_groups_it_is_verls_grpo(dtype, mode):
    rng = np.random.default_rng(11)
    for _ in range(40):
        rewards, mask, index = random_batch(rng, dtype)
        rewards = rewards + torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)  # no two scores equal
        assert avspo_collapse_rates(rewards, index)["collapsed"] == 0
        ours, _ = compute_avspo_advantage(rewards, mask, index, mode=mode)
        verl_adv, verl_ret = compute_grpo_outcome_advantage(rewards, mask, index=index)
        torch.testing.assert_close(ours, verl_adv.to(dtype), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, verl_ret.to(dtype), rtol=1e-5, atol=1e-5)


def test_only_collapsed_groups_differ_from_verls_grpo():
    rng = np.random.default_rng(12)
    rewards, mask, index = random_batch(rng, torch.float32)
    while avspo_collapse_rates(rewards, index)["collapsed"] == 0:
        rewards, mask, index = random_batch(rng, torch.float32)
    ours, _ = compute_avspo_advantage(rewards, mask, index)
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index=index)
    scores = rewards.sum(-1)
    for key in set(index):
        rows = np.flatnonzero(index == key)
        collapsed = len(rows) >= 2 and scores[rows].max() == scores[rows].min()
        if not collapsed:
            torch.testing.assert_close(ours[rows], verl_adv[rows], rtol=1e-5, atol=1e-5)
        elif mask[rows].sum() > 0:
            assert not torch.allclose(ours[rows], verl_adv[rows])


# ---------------------------------------------------------------------------------------------------------------
# Masks, dtypes, ids.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_tokens_are_exactly_zero(dtype, mask_dtype):
    rng = np.random.default_rng(5)
    rewards, mask, index = random_batch(rng, dtype, tokens=9)
    rewards = rewards + 3.0 * torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)  # rewards under the mask
    mask = mask.to(mask_dtype)
    advantages, _ = compute_avspo_advantage(rewards, mask, index)
    assert advantages.dtype == dtype
    assert torch.all(advantages[mask == 0] == 0)
    per_response = advantages.sum(-1) / mask.to(dtype).sum(-1).clamp_min(1)
    torch.testing.assert_close(advantages, per_response[:, None] * mask.to(dtype), rtol=1e-6, atol=1e-6)


def test_ids_as_lists_arrays_and_tensors_agree():
    rng = np.random.default_rng(8)
    rewards, mask, index = random_batch(rng, torch.float64)
    codes = {key: n for n, key in enumerate(dict.fromkeys(index))}
    as_ints = [codes[key] for key in index]
    reference, _ = compute_avspo_advantage(rewards, mask, index)
    for ids in (list(index), np.array(as_ints), torch.tensor(as_ints), as_ints):
        torch.testing.assert_close(compute_avspo_advantage(rewards, mask, ids)[0], reference)


def test_the_rates_accept_summed_scores():
    rng = np.random.default_rng(9)
    rewards, _, index = random_batch(rng, torch.float64)
    assert avspo_collapse_rates(rewards.sum(-1), index) == avspo_collapse_rates(rewards, index)


# ---------------------------------------------------------------------------------------------------------------
# Input validation: a ValueError that names the argument.
# ---------------------------------------------------------------------------------------------------------------


def _good_inputs():
    return dict(
        token_level_rewards=torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
        response_mask=torch.ones(4, 2, dtype=torch.int64),
        index=np.array(["a", "a", "b", "b"], dtype=object),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(token_level_rewards=torch.zeros(4, 3)), "response_mask"),
        (dict(token_level_rewards=torch.zeros(4, 2, dtype=torch.int64)), "token_level_rewards"),
        (dict(token_level_rewards=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])), "token_level_rewards"),
        (dict(response_mask=torch.tensor([[1, 2], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, 0.5], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, float("nan")], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(index=np.array(["a", "a", "b"], dtype=object)), "index"),
        (dict(index=["a", None, "b", "b"]), "index is missing"),
        (dict(mode="adaptive"), "mode"),
        (dict(alpha=-0.5), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(anchor=-0.1), "anchor"),
        (dict(reward_max=0.0), "reward_max"),
        (dict(collapse_tol=-1e-6), "collapse_tol"),
        (dict(collapse_tol=float("inf")), "collapse_tol"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        compute_avspo_advantage(**(_good_inputs() | change))


def test_bad_input_to_the_rates_raises():
    with pytest.raises(ValueError, match="token_level_rewards"):
        avspo_collapse_rates(torch.zeros(2, 2, 2), ["a", "a"])
    with pytest.raises(ValueError, match="token_level_rewards"):
        avspo_collapse_rates(torch.tensor([0.0, float("nan")]), ["a", "a"])
    with pytest.raises(ValueError, match="index"):
        avspo_collapse_rates(torch.zeros(3), ["a", "a"])
    with pytest.raises(ValueError, match="mode"):
        avspo_collapse_rates(torch.zeros(2), ["a", "a"], mode="x")
