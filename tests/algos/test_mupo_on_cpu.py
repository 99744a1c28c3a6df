"""MUPO's math (verl_ext.algos.mupo) against slow, obvious loop references, and against verl's own GRPO."""

from __future__ import annotations

import logging
import math
import statistics

import numpy as np
import pytest
import torch
from k_means_constrained import KMeansConstrained
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import (
    add_diversity_reward,
    compute_mupo_advantage,
    mupo_diversity,
    mupo_lambda,
    mupo_metrics,
    mupo_partition,
)

# ---------------------------------------------------------------------------------------------------------------
# Loop references: the formulas of the module docstring, one response at a time, in Python floats.
# ---------------------------------------------------------------------------------------------------------------


def _cos(a, b):
    dot = math.fsum(float(x) * float(y) for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(math.fsum(float(x) ** 2 for x in a)) * math.sqrt(math.fsum(float(y) ** 2 for y in b)))


def reference_diversity(embeddings, prompts, partition):
    out = []
    for i in range(len(prompts)):
        others = [
            j for j in range(len(prompts)) if prompts[j] == prompts[i] and partition[j] != partition[i]
        ]  # same prompt, another group
        out.append(statistics.fmean(1.0 - _cos(embeddings[i], embeddings[j]) for j in others) if others else 0.0)
    return out


def reference_partition(embeddings, prompts, k, min_size, seed):
    """Call the library on each prompt's unit embeddings, relabel by first appearance, one prompt at a time."""
    out = [0] * len(prompts)
    for p in dict.fromkeys(prompts):
        rows = [i for i in range(len(prompts)) if prompts[i] == p]
        if k == 1 or len(rows) < k * min_size:
            continue
        unit = np.array([np.asarray(embeddings[i], dtype=np.float64) for i in rows])
        unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
        labels = KMeansConstrained(n_clusters=k, size_min=min_size, random_state=seed).fit_predict(unit)
        renumber = {}
        for row, label in zip(rows, labels, strict=True):
            out[row] = renumber.setdefault(label, len(renumber))
    return out


def _zscore_within(i, scores, keys, epsilon):
    members = [scores[j] for j in range(len(scores)) if keys[j] == keys[i]]
    if len(members) == 1:
        return scores[i] / (1.0 + epsilon)
    if max(members) == min(members):
        return 0.0  # equal rewards: no signal (verl leaves rounding noise here)
    return (scores[i] - statistics.fmean(members)) / (statistics.stdev(members) + epsilon)


def reference_advantage(rewards, mask, prompts, partition, balance_beta, epsilon):
    batch = len(prompts)
    scores = [math.fsum(float(r) for r in rewards[i]) for i in range(batch)]
    pairs = [(prompts[i], partition[i]) for i in range(batch)]
    out = []
    for i in range(batch):
        n_p = sum(1 for j in range(batch) if prompts[j] == prompts[i])
        k_p = len({pairs[j] for j in range(batch) if prompts[j] == prompts[i]})
        size = sum(1 for j in range(batch) if pairs[j] == pairs[i])
        weight = (n_p / (k_p * size)) ** balance_beta
        a = _zscore_within(i, scores, pairs, epsilon) * weight
        out.append([a * float(m) for m in mask[i]])
    return out


def reference_lambda(step, total, lambda_max, lambda_min, schedule, decay_rate):
    if schedule == "exponential":
        return lambda_max * math.exp(-decay_rate * step)
    progress = (step - 1) / (total - 1) if total > 1 else 0.0
    return lambda_min + (lambda_max - lambda_min) * (1 + math.cos(math.pi * progress)) / 2


# ---------------------------------------------------------------------------------------------------------------
# Random batches.
# ---------------------------------------------------------------------------------------------------------------


def random_prompts(rng, num_prompts, sizes):
    """``uid``-like object array: prompt p repeated sizes[p] times, the rows shuffled (verl keeps them adjacent,
    nothing here may rely on it)."""
    prompts = np.array([f"uid-{p}" for p in range(num_prompts) for _ in range(sizes[p])], dtype=object)
    return prompts[rng.permutation(len(prompts))]


def random_embeddings(rng, batch, dim, mode):
    if mode == "normal":
        return rng.normal(size=(batch, dim))
    if mode == "ties":  # a few distinct directions, many exact repeats, some scaled copies (same cosine)
        base = rng.normal(size=(3, dim))
        return base[rng.integers(0, 3, size=batch)] * rng.choice([1.0, 2.5], size=(batch, 1))
    if mode == "identical":
        return np.tile(rng.normal(size=(1, dim)), (batch, 1))
    raise AssertionError(mode)


# ---------------------------------------------------------------------------------------------------------------
# Partition.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["normal", "ties", "identical"])
@pytest.mark.parametrize("seed", [0, 1])
def test_partition_matches_the_per_prompt_library_calls_and_keeps_the_constraints(mode, seed):
    rng = np.random.default_rng(100 + seed)
    sizes = [15, 9, 8, 12, 3, 1, 10]  # 8, 3 and 1 are below k * min_size = 9: one group each
    prompts = random_prompts(rng, len(sizes), sizes)
    embeddings = random_embeddings(rng, len(prompts), 6, mode)
    k, min_size = 3, 3
    partition = mupo_partition(embeddings, prompts, k=k, min_size=min_size, seed=seed)
    assert partition.dtype == np.int64 and partition.shape == (len(prompts),)
    assert partition.tolist() == reference_partition(embeddings, prompts.tolist(), k, min_size, seed)
    for p, size in enumerate(sizes):
        ids = partition[prompts == f"uid-{p}"]
        if size < k * min_size:
            assert set(ids.tolist()) == {0}
        else:
            counts = np.bincount(ids)
            assert len(counts) == k and counts.min() >= min_size, (p, counts)
            assert ids[0] == 0  # numbered by first appearance
            first = [int(np.flatnonzero(ids == g)[0]) for g in range(k)]
            assert first == sorted(first)


def test_partition_is_deterministic_and_per_prompt():
    """Same inputs and seed: same ids; a prompt's ids do not depend on the other prompts in the batch."""
    rng = np.random.default_rng(7)
    prompts = random_prompts(rng, 5, [15] * 5)
    embeddings = rng.normal(size=(len(prompts), 12))
    first = mupo_partition(embeddings, prompts, seed=3)
    assert np.array_equal(first, mupo_partition(torch.from_numpy(embeddings), prompts, seed=3))
    keep = np.isin(prompts, ["uid-1", "uid-4"])
    alone = mupo_partition(embeddings[keep], prompts[keep], seed=3)
    assert np.array_equal(alone, first[keep])
    scaled = mupo_partition(embeddings * rng.uniform(0.5, 3.0, size=(len(prompts), 1)), prompts, seed=3)
    assert np.array_equal(scaled, first)  # clustered as unit vectors: row scale is irrelevant


def test_partition_recovers_well_separated_reasoning_modes():
    rng = np.random.default_rng(11)
    centres = np.eye(3, 32) * 10.0
    modes = np.repeat(np.arange(3), 5)
    embeddings = centres[modes] + 0.1 * rng.normal(size=(15, 32))
    partition = mupo_partition(embeddings, ["q"] * 15)
    # Same grouping up to the names of the groups.
    assert len({(int(m), int(g)) for m, g in zip(modes, partition, strict=True)}) == 3


def test_prompts_too_small_to_split_stay_one_group_and_are_logged(caplog):
    rng = np.random.default_rng(2)
    prompts = random_prompts(rng, 3, [4, 8, 9])
    embeddings = rng.normal(size=(len(prompts), 5))
    with caplog.at_level(logging.WARNING, logger="verl_ext.algos.mupo"):
        partition = mupo_partition(embeddings, prompts, k=3, min_size=3)
    assert "2 of 3 prompts" in caplog.text
    assert set(partition[prompts != "uid-2"].tolist()) == {0}
    assert len(set(partition[prompts == "uid-2"].tolist())) == 3
    assert mupo_partition(embeddings, prompts, k=1).tolist() == [0] * len(prompts)


# ---------------------------------------------------------------------------------------------------------------
# Diversity.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["normal", "ties", "identical"])
def test_diversity_matches_the_loop_reference(mode):
    for trial in range(12):
        rng = np.random.default_rng(1000 * trial + len(mode))
        sizes = rng.integers(1, 9, size=int(rng.integers(1, 6)))
        prompts = random_prompts(rng, len(sizes), sizes)
        embeddings = random_embeddings(rng, len(prompts), int(rng.integers(1, 7)), mode)
        # Arbitrary group ids, shared across prompts (ids are local to a prompt), mixed types.
        partition = np.array([[0, 1, 2, "g"][c] for c in rng.integers(0, 4, size=len(prompts))], dtype=object)
        ours = mupo_diversity(embeddings, prompts, partition)
        assert ours.dtype == torch.float64 and ours.shape == (len(prompts),)
        expected = torch.tensor(
            reference_diversity(embeddings, prompts.tolist(), partition.tolist()), dtype=torch.float64
        )
        torch.testing.assert_close(ours, expected.clamp(0, 2), rtol=0, atol=1e-12)
        assert bool((ours >= 0).all()) and bool((ours <= 2).all())


def test_diversity_is_zero_for_one_group_and_for_identical_reasoning():
    rng = np.random.default_rng(3)
    prompts = random_prompts(rng, 4, [6, 6, 6, 6])
    embeddings = rng.normal(size=(24, 8))
    assert mupo_diversity(embeddings, prompts, np.zeros(24, dtype=int)).abs().max().item() == 0.0
    same = np.tile(embeddings[:1], (24, 1))
    assert mupo_diversity(same, prompts, rng.integers(0, 3, size=24)).abs().max().item() <= 1e-12
    # Opposite reasoning is the farthest: distance 2.
    opposite = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert mupo_diversity(opposite, ["p", "p"], [0, 1]).tolist() == [2.0, 2.0]


# ---------------------------------------------------------------------------------------------------------------
# Advantage.
# ---------------------------------------------------------------------------------------------------------------


def random_rewards(rng, batch, tokens, dtype=torch.float64):
    """Rewards on a few discrete levels (many ties and all-equal groups) at the last token, right-padded masks."""
    lengths = rng.integers(1, tokens + 1, size=batch)
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int64)
    rewards = np.zeros((batch, tokens))
    rewards[np.arange(batch), lengths - 1] = rng.choice([0.0, 0.1, 0.9, 1.0, 1.23], size=batch)
    return torch.tensor(rewards, dtype=dtype), torch.from_numpy(mask)


@pytest.mark.parametrize("balance_beta", [1.0, 0.0, 0.5, 2.0])
def test_advantage_matches_the_loop_reference(balance_beta):
    for trial in range(15):
        rng = np.random.default_rng(50 * trial + int(10 * balance_beta))
        sizes = rng.integers(1, 10, size=int(rng.integers(1, 6)))
        prompts = random_prompts(rng, len(sizes), sizes)
        rewards, mask = random_rewards(rng, len(prompts), 5)
        partition = rng.integers(0, 3, size=len(prompts))  # groups of one and empty ids included
        ours, returns = compute_mupo_advantage(rewards, mask, prompts, partition, balance_beta=balance_beta)
        assert ours is returns
        expected = torch.tensor(
            reference_advantage(
                rewards.tolist(), mask.tolist(), prompts.tolist(), partition.tolist(), balance_beta, 1e-6
            ),
            dtype=torch.float64,
        )
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
        assert bool((ours[mask == 0] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_group_per_prompt_is_verls_grpo(dtype):
    for trial in range(10):
        rng = np.random.default_rng(trial)
        sizes = rng.integers(1, 16, size=int(rng.integers(1, 8)))
        prompts = random_prompts(rng, len(sizes), sizes)
        rewards, mask = random_rewards(rng, len(prompts), 7, dtype)
        verl_adv, _ = compute_grpo_outcome_advantage(rewards.clone(), mask, index=prompts)
        for partition in (np.zeros(len(prompts), dtype=int), prompts.copy(), ["same"] * len(prompts)):
            ours, _ = compute_mupo_advantage(rewards, mask, prompts, partition)
            assert ours.dtype == dtype
            torch.testing.assert_close(ours, verl_adv)


def test_load_balance_weight_by_hand():
    """One prompt of 6: groups of 1, 2, 3 -> weights 6/(3*1)=2, 6/(3*2)=1, 6/(3*3)=2/3."""
    rewards = torch.tensor([[0.5], [0.0], [1.0], [0.0], [0.5], [1.0]], dtype=torch.float64)
    partition = ["a", "b", "b", "c", "c", "c"]
    ours, _ = compute_mupo_advantage(rewards, torch.ones(6, 1), ["p"] * 6, partition)
    z_pair = (1.0 - 0.5) / (math.sqrt(0.5) + 1e-6)
    z_triple = 0.5 / (0.5 + 1e-6)  # scores 0, 0.5, 1: mean 0.5, unbiased std 0.5
    expected = [0.5 / (1 + 1e-6) * 2.0, -z_pair, z_pair, -z_triple * 2 / 3, 0.0, z_triple * 2 / 3]
    torch.testing.assert_close(ours[:, 0], torch.tensor(expected, dtype=torch.float64))


def test_partition_ids_are_local_to_a_prompt():
    """Group id 0 under prompt a and under prompt b are two pairs, not one."""
    rewards = torch.tensor([[0.0], [1.0], [1.0], [1.0]], dtype=torch.float64)
    ours, _ = compute_mupo_advantage(rewards, torch.ones(4, 1), ["a", "a", "b", "b"], [0, 0, 0, 0])
    verl_adv, _ = compute_grpo_outcome_advantage(
        rewards.clone(), torch.ones(4, 1), index=np.array(["a", "a", "b", "b"])
    )
    torch.testing.assert_close(ours, verl_adv)
    assert ours[2:].abs().max().item() == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Diversity reward, lambda schedule, metrics.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["cosine", "exponential"])
@pytest.mark.parametrize("total", [1, 2, 7, 100])
def test_lambda_schedule_against_the_reference(schedule, total):
    steps = np.arange(1, total + 1)
    ours = mupo_lambda(steps, total, schedule=schedule)
    assert isinstance(ours, np.ndarray) and ours.shape == (total,)
    expected = [reference_lambda(int(t), total, 0.4, 0.1, schedule, 9e-3) for t in steps]
    np.testing.assert_allclose(ours, expected, rtol=1e-14, atol=0)
    assert all(isinstance(mupo_lambda(int(t), total, schedule=schedule), float) for t in steps[:3])
    assert bool(np.all(np.diff(ours) <= 0))  # non-increasing
    assert mupo_lambda(steps.reshape(1, -1), total, schedule=schedule).shape == (1, total)


def test_cosine_schedule_endpoints_and_shape():
    total = 201
    assert mupo_lambda(1, total) == 0.4
    assert mupo_lambda(total, total) == pytest.approx(0.1, abs=1e-15)
    assert mupo_lambda(101, total) == pytest.approx(0.25, abs=1e-15)  # half way: the mean
    steps = np.arange(1, total + 1)
    values = mupo_lambda(steps, total)
    # Half-cosine: symmetric about the midpoint, flat at both ends, steepest in the middle.
    np.testing.assert_allclose(values + values[::-1], 0.5, atol=1e-15)
    slopes = -np.diff(values)
    assert slopes[0] < slopes[total // 2] and slopes[-1] < slopes[total // 2]
    assert mupo_lambda(1, 1) == 0.4
    assert mupo_lambda(5, 9, lambda_max=0.2, lambda_min=0.2) == pytest.approx(0.2)
    assert mupo_lambda(np.int64(3), 9) == mupo_lambda(3, 9)


def test_exponential_schedule_is_the_released_decay():
    assert mupo_lambda(1, 500, schedule="exponential") == pytest.approx(0.4 * math.exp(-9e-3))
    assert mupo_lambda(500, 500, schedule="exponential", decay_rate=1e-2) == pytest.approx(0.4 * math.exp(-5.0))


def test_diversity_reward_and_metrics_against_loops():
    rng = np.random.default_rng(9)
    prompts = random_prompts(rng, 4, [6, 6, 5, 3])
    batch = len(prompts)
    scores = torch.tensor(rng.choice([0.0, 0.1, 1.0], size=batch), dtype=torch.float32)
    acc = rng.integers(0, 2, size=batch).astype(float)
    diversity = torch.tensor(rng.uniform(0, 1.5, size=batch))
    partition = np.where(prompts == "uid-3", 0, rng.integers(0, 2, size=batch))
    new = add_diversity_reward(scores, acc, diversity, 0.3)
    assert new.dtype == torch.float32
    torch.testing.assert_close(
        new,
        torch.tensor(
            [float(s) + 0.3 * a * float(d) for s, a, d in zip(scores, acc, diversity, strict=True)], dtype=torch.float32
        ),
    )
    as_lists = add_diversity_reward(scores.tolist(), acc.tolist(), diversity.tolist(), 0.0)
    assert as_lists.dtype == torch.float64 and as_lists.tolist() == pytest.approx(scores.tolist())

    metrics = mupo_metrics(prompts, partition, diversity, acc, 0.3, scores=new)
    pairs = {(p, g) for p, g in zip(prompts, partition, strict=True)}
    sizes = [sum(1 for p, g in zip(prompts, partition, strict=True) if (p, g) == pair) for pair in pairs]
    groups = [len({g for p, g in zip(prompts, partition, strict=True) if p == q}) for q in set(prompts)]
    correct = [float(d) for d, a in zip(diversity, acc, strict=True) if a > 0]
    collapsed = [
        len({float(s) for s, p, g in zip(new, prompts, partition, strict=True) if (p, g) == pair}) == 1
        for pair in pairs
    ]
    assert metrics["mupo/lambda"] == 0.3
    assert metrics["mupo/group_size/mean"] == pytest.approx(statistics.fmean(sizes))
    assert metrics["mupo/group_size/min"] == min(sizes) and metrics["mupo/group_size/max"] == max(sizes)
    assert metrics["mupo/groups_per_prompt/mean"] == pytest.approx(statistics.fmean(groups))
    assert metrics["mupo/one_group_rate"] == pytest.approx(sum(g == 1 for g in groups) / len(groups))
    assert metrics["mupo/diversity/mean"] == pytest.approx(float(diversity.mean()))
    assert metrics["mupo/diversity/correct_mean"] == pytest.approx(statistics.fmean(correct))
    assert metrics["mupo/correct_rate"] == pytest.approx(len(correct) / batch)
    assert metrics["mupo/collapse_rate/partition"] == pytest.approx(sum(collapsed) / len(pairs))
    assert "mupo/collapse_rate/prompt" in metrics
    no_correct = mupo_metrics(prompts, partition, diversity, np.zeros(batch), 0.3)
    assert no_correct["mupo/diversity/correct_mean"] == 0.0 and "mupo/collapse_rate/partition" not in no_correct


# ---------------------------------------------------------------------------------------------------------------
# Bad input names the argument.
# ---------------------------------------------------------------------------------------------------------------


def test_bad_embeddings_name_the_argument():
    good = np.ones((4, 3))
    prompts = ["a"] * 4
    nan = good.copy()
    nan[2, 1] = np.nan
    zero = good.copy()
    zero[1] = 0.0
    for fn in (lambda e: mupo_partition(e, prompts), lambda e: mupo_diversity(e, prompts, [0, 0, 1, 1])):
        with pytest.raises(ValueError, match=r"embeddings: every value must be finite; response 2"):
            fn(nan)
        with pytest.raises(ValueError, match=r"embeddings: response 1 has an all-zero embedding"):
            fn(zero)
        with pytest.raises(ValueError, match=r"embeddings must have shape \(B, D\)"):
            fn(np.ones(4))
        with pytest.raises(ValueError, match=r"embeddings must have shape \(B, D\)"):
            fn(np.ones((4, 3, 2)))
        with pytest.raises(ValueError, match=r"embeddings must be a \(B, D\) array of numbers"):
            fn([["x", "y"]] * 4)
        with pytest.raises(ValueError, match=r"index must be a 1-D sequence with one id per response \(5\)"):
            fn(np.ones((5, 3)))
    with pytest.raises(ValueError, match=r"partition must be a 1-D sequence with one id per response \(4\)"):
        mupo_diversity(good, prompts, [0, 1])


def test_bad_knobs_and_rewards_name_the_argument():
    emb = np.random.default_rng(0).normal(size=(9, 3))
    for kwargs, name in (({"k": 0}, "k"), ({"k": True}, "k"), ({"min_size": 1.5}, "min_size"), ({"seed": -1}, "seed")):
        with pytest.raises(ValueError, match=name):
            mupo_partition(emb, ["a"] * 9, **kwargs)
    rewards, mask = torch.ones(3, 2), torch.ones(3, 2)
    bad = rewards.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="token_level_rewards: every row sum must be finite; response 1"):
        compute_mupo_advantage(bad, mask, ["a"] * 3, [0] * 3)
    with pytest.raises(ValueError, match="partition must be a 1-D sequence"):
        compute_mupo_advantage(rewards, mask, ["a"] * 3, [0] * 2)
    with pytest.raises(ValueError, match="response_mask has shape"):
        compute_mupo_advantage(rewards, torch.ones(3, 1), ["a"] * 3, [0] * 3)
    with pytest.raises(ValueError, match="balance_beta must be a finite number"):
        compute_mupo_advantage(rewards, mask, ["a"] * 3, [0] * 3, balance_beta=float("nan"))
    with pytest.raises(ValueError, match="acc must lie in \\[0, 1\\]; response 2 has 2.0"):
        add_diversity_reward([0.0, 1.0, 1.0], [0, 1, 2], [0.1, 0.2, 0.3], 0.4)
    with pytest.raises(ValueError, match=r"diversity must have shape \(3,\)"):
        add_diversity_reward([0.0, 1.0, 1.0], [0, 1, 1], [0.1, 0.2], 0.4)
    with pytest.raises(ValueError, match="scores: every value must be finite"):
        add_diversity_reward([0.0, float("inf"), 1.0], [0, 1, 1], [0.1, 0.2, 0.3], 0.4)
    with pytest.raises(ValueError, match="lambda_t must be a finite number >= 0.0"):
        add_diversity_reward([0.0], [1], [0.1], -0.1)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((0, 10), {}, "step must lie in"),
        ((11, 10), {}, "step must lie in"),
        ((1.5, 10), {}, "step must be an integer"),
        ((True, 10), {}, "step must be an integer"),
        ((1, 0), {}, "total_steps must be a positive integer"),
        ((1, 10), {"schedule": "linear"}, "schedule must be one of"),
        ((1, 10), {"lambda_min": 0.5}, r"lambda_min \(0.5\) must not exceed lambda_max \(0.4\)"),
        ((1, 10), {"lambda_max": float("inf")}, "lambda_max must be a finite number"),
        ((1, 10), {"decay_rate": -1.0}, "decay_rate must be a finite number >= 0.0"),
    ],
)
def test_bad_lambda_arguments_name_the_argument(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        mupo_lambda(*args, **kwargs)
