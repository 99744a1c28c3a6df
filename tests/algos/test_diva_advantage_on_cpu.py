"""compute_diva_advantage against a slow, obvious per-response reference and against verl's own GRPO."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage

from verl_ext.algos import compute_diva_advantage

# ---------------------------------------------------------------------------------------------------------------
# The reference: docs/algo/diva_grpo.md written out one response at a time, in Python floats.
# ---------------------------------------------------------------------------------------------------------------


def _zscore_of(i, scores, groups, epsilon):
    members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
    if len(members) == 1:
        mean, std = 0.0, 1.0
    else:
        if max(members) == min(members):
            return 0.0  # equal rewards: no signal (verl leaves ~1e-10 rounding noise here)
        mean, std = statistics.fmean(members), statistics.stdev(members)
    return (scores[i] - mean) / (std + epsilon)


def _batch_normalised(values):
    if len(values) < 2 or max(values) == min(values):
        return [0.0] * len(values)
    mean, std = statistics.fmean(values), statistics.stdev(values)
    return [(v - mean) / std for v in values]


def _range_of(i, scores, groups):
    members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
    return max(members) - min(members)


def _sign(x):
    return (x > 0) - (x < 0)


def reference_diva_advantage(
    rewards, mask, prompts, questions, difficulty, k, local_coef, global_coef, batch_norm, rrb, reward_max, epsilon
):
    batch = len(prompts)
    scores = [sum(float(r) for r in rewards[i]) for i in range(batch)]
    local = [_zscore_of(i, scores, prompts, epsilon) for i in range(batch)]
    global_ = [_zscore_of(i, scores, questions, epsilon) for i in range(batch)]
    if batch_norm:
        local, global_ = _batch_normalised(local), _batch_normalised(global_)
    advantage = []
    for i in range(batch):
        same_question = [float(difficulty[j]) for j in range(batch) if questions[j] == questions[i]]
        d_bar = sum(same_question) / len(same_question)
        g = global_[i] * math.exp(k * (float(difficulty[i]) - d_bar) * _sign(global_[i]))
        loc = local[i]
        if rrb:
            loc *= _range_of(i, scores, prompts) / reward_max
            g *= _range_of(i, scores, questions) / reward_max
        advantage.append(local_coef * loc + global_coef * g)
    return [[advantage[i] * float(mask[i][t]) for t in range(len(mask[i]))] for i in range(batch)]


# ---------------------------------------------------------------------------------------------------------------
# Random batches with the awkward cases in them.
# ---------------------------------------------------------------------------------------------------------------


def random_batch(rng: np.random.Generator, dtype: torch.dtype, tokens: int = 6):
    """Questions with 1-3 prompts (original + variants), prompts with 1-6 rollouts, some all-equal groups,
    some fully masked rows. Rewards are multiples of 1/16 spread over a few tokens, so row sums are exact in
    float32 and the reference sees the same scores as the code under test."""
    prompts, questions, difficulty = [], [], []
    for q in range(int(rng.integers(1, 7))):
        for p in range(int(rng.integers(1, 4))):
            d = float(rng.uniform(1, 9))
            for _ in range(int(rng.integers(1, 7))):
                prompts.append(f"q{q}-p{p}")
                questions.append(f"q{q}")
                difficulty.append(d)
    batch = len(prompts)
    levels = int(rng.choice([1, 2, 3, 17]))  # 1 level: every group collapses; 17: rarely
    row_rewards = rng.integers(0, levels, size=batch) / 16.0
    rewards = np.zeros((batch, tokens))
    split = rng.integers(1, 3, size=batch)  # the reward lands on one or two tokens
    for i in range(batch):
        rewards[i, -1] = row_rewards[i] / split[i]
        rewards[i, 0] += row_rewards[i] - rewards[i, -1]
    lengths = rng.integers(0, tokens + 1, size=batch)  # 0: a fully masked row
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int64)
    shuffle = rng.permutation(batch)  # groups are not contiguous in verl's batches either
    return (
        torch.tensor(rewards[shuffle], dtype=dtype),
        torch.tensor(mask[shuffle]),
        np.array(prompts, dtype=object)[shuffle],
        np.array(questions, dtype=object)[shuffle],
        torch.tensor(difficulty, dtype=torch.float64)[shuffle],
    )


KNOBS = [
    dict(k=k, local_coef=lc, global_coef=gc, batch_norm=bn, rrb=rrb)
    for k, (lc, gc), bn, rrb in itertools.product(
        [0.0, 0.1, 0.7], [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.3, 2.0)], [True, False], [True, False]
    )
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_on_random_batches(dtype):
    rng = np.random.default_rng(1234)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for trial in range(60):
        rewards, mask, prompts, questions, difficulty = random_batch(rng, dtype)
        reward_max = float(rng.choice([1.0, 0.5]))
        for knobs in KNOBS[trial % 4 :: 4]:
            advantages, returns = compute_diva_advantage(
                rewards, mask, prompts, questions, difficulty, reward_max=reward_max, **knobs
            )
            expected = reference_diva_advantage(
                rewards.tolist(), mask.tolist(), list(prompts), list(questions), difficulty.tolist(),
                reward_max=reward_max, epsilon=1e-6, **knobs,
            )  # fmt: skip
            assert advantages.dtype == dtype and advantages.shape == rewards.shape
            assert returns is advantages
            torch.testing.assert_close(
                advantages, torch.tensor(expected, dtype=dtype), msg=lambda m, knobs=knobs: f"{knobs}: {m}", **tolerance
            )


def test_every_knob_changes_the_result():
    """Guards the reference comparison against knobs that silently do nothing."""
    rng = np.random.default_rng(7)
    while True:
        rewards, mask, prompts, questions, difficulty = random_batch(rng, torch.float64)
        if len(set(prompts)) > 3 and len(set(questions)) > 1 and mask.sum(-1).gt(0).all():
            break
    rewards[:, 0] = torch.arange(len(prompts), dtype=torch.float64) % 5 / 10  # spread within every group
    base = dict(k=0.3, local_coef=1.0, global_coef=1.0, batch_norm=True, rrb=True, reward_max=1.0)
    reference, _ = compute_diva_advantage(rewards, mask, prompts, questions, difficulty, **base)
    for name, other in [("k", 0.0), ("local_coef", 0.5), ("global_coef", 0.5), ("batch_norm", False),
                        ("rrb", False), ("reward_max", 2.0)]:  # fmt: skip
        changed, _ = compute_diva_advantage(rewards, mask, prompts, questions, difficulty, **(base | {name: other}))
        assert not torch.allclose(changed, reference), name


def test_difficulty_weighting_follows_the_paper():
    """A harder-than-average variant: correct answers gain, wrong ones lose; the easier original the reverse."""
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    mask = torch.ones(4, 1)
    prompts = ["orig", "orig", "var", "var"]
    questions = ["q", "q", "q", "q"]
    plain, _ = compute_diva_advantage(
        rewards, mask, prompts, questions, [3.0, 3.0, 7.0, 7.0], k=0.0, local_coef=0.0, batch_norm=False
    )
    weighted, _ = compute_diva_advantage(
        rewards, mask, prompts, questions, [3.0, 3.0, 7.0, 7.0], k=0.1, local_coef=0.0, batch_norm=False
    )
    factor = (weighted / plain).squeeze(-1)
    torch.testing.assert_close(factor, torch.tensor([math.exp(-0.2), math.exp(0.2), math.exp(0.2), math.exp(-0.2)]))


# ---------------------------------------------------------------------------------------------------------------
# Against verl's own GRPO.
# ---------------------------------------------------------------------------------------------------------------

PLAIN = dict(k=0.0, global_coef=0.0, batch_norm=False, rrb=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_setting_is_verls_grpo(dtype):
    rng = np.random.default_rng(99)
    for _ in range(40):
        rewards, mask, prompts, questions, difficulty = random_batch(rng, dtype)
        rewards = rewards + torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)  # continuous rewards too
        ours, _ = compute_diva_advantage(rewards, mask, prompts, questions, difficulty, **PLAIN)
        verl_adv, verl_ret = compute_grpo_outcome_advantage(rewards, mask, index=prompts)
        torch.testing.assert_close(ours, verl_adv.to(dtype), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours, verl_ret.to(dtype), rtol=1e-5, atol=1e-5)
        vectorized, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, index=prompts)
        torch.testing.assert_close(ours, vectorized.to(dtype), rtol=1e-4, atol=1e-4)  # verl computes it in float32


def test_ids_group_as_verls_dict_does():
    """Mixed id types are fine; 1 and 1.0 are one group, "1" another (verl groups with a dict)."""
    rewards = torch.tensor([[0.0], [1.0], [0.5], [0.2], [0.9]])
    prompts = np.array([1, 1.0, "1", "1", "x"], dtype=object)
    ours, _ = compute_diva_advantage(rewards, torch.ones(5, 1), prompts, ["q"] * 5, [5.0] * 5, **PLAIN)
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, torch.ones(5, 1), index=prompts)
    torch.testing.assert_close(ours, verl_adv)


def test_plain_setting_with_integer_ids_and_lists():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.5], [0.2, 0.0], [1.0, 0.0], [0.0, 0.3]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [0, 1]])
    prompts = [7, 7, 3, 3, 11]  # a list of ints; 11 is a group of one
    ours, _ = compute_diva_advantage(rewards, mask, prompts, [0, 0, 0, 0, 1], [5.0] * 5, **PLAIN)
    verl_adv, _ = compute_grpo_outcome_advantage(rewards, mask, index=np.array(prompts))
    torch.testing.assert_close(ours, verl_adv)


# ---------------------------------------------------------------------------------------------------------------
# Masks, dtypes, shapes.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_tokens_are_exactly_zero(dtype, mask_dtype):
    rng = np.random.default_rng(5)
    rewards, mask, prompts, questions, difficulty = random_batch(rng, dtype, tokens=9)
    rewards = rewards + 3.0 * torch.tensor(rng.normal(size=rewards.shape), dtype=dtype)  # rewards under the mask
    mask = mask.to(mask_dtype)
    advantages, _ = compute_diva_advantage(rewards, mask, prompts, questions, difficulty)
    assert advantages.dtype == dtype
    assert torch.all(advantages[mask == 0] == 0)
    assert torch.all(advantages[mask.sum(-1) == 0] == 0)  # fully masked rows
    # Unmasked tokens all carry their response's one value.
    per_response = advantages.sum(-1) / mask.to(dtype).sum(-1).clamp_min(1)
    torch.testing.assert_close(advantages, per_response[:, None] * mask.to(dtype), rtol=1e-6, atol=1e-6)


def test_a_one_response_batch_and_an_all_collapsed_batch():
    advantages, _ = compute_diva_advantage(torch.tensor([[0.4, 0.5]]), torch.ones(1, 2), ["p"], ["q"], [5.0])
    assert torch.all(advantages == 0)  # batch normalisation of one value, RRB of a group of one
    # Every group collapsed, at values whose float64 group mean is off by one ulp (0.1 * 3 / 3 != 0.1).
    equal = torch.tensor([0.1] * 9 + [0.7] * 3 + [0.9] * 7, dtype=torch.float64)[:, None]
    prompts = ["a"] * 3 + ["b"] * 6 + ["c"] * 3 + ["d"] * 7
    questions = ["x"] * 9 + ["y"] * 3 + ["z"] * 7
    for batch_norm, rrb in itertools.product([True, False], [True, False]):
        advantages, _ = compute_diva_advantage(
            equal, torch.ones(19, 1), prompts, questions, torch.arange(19.0), batch_norm=batch_norm, rrb=rrb
        )
        assert torch.all(advantages == 0), (batch_norm, rrb)  # exact: no amplified rounding noise


def test_mask_of_another_float_dtype_keeps_the_reward_dtype():
    rewards, mask = torch.rand(4, 3, dtype=torch.float32), torch.ones(4, 3, dtype=torch.float64)
    advantages, _ = compute_diva_advantage(rewards, mask, list("aabb"), list("qqqq"), [1.0, 1.0, 2.0, 2.0])
    assert advantages.dtype == torch.float32


# ---------------------------------------------------------------------------------------------------------------
# Input validation: a ValueError that names the argument.
# ---------------------------------------------------------------------------------------------------------------


def _good_inputs():
    return dict(
        token_level_rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.5]]),
        response_mask=torch.ones(4, 2, dtype=torch.int64),
        prompt_index=np.array(["a", "a", "b", "b"], dtype=object),
        question_index=np.array(["q", "q", "q", "q"], dtype=object),
        difficulty=torch.tensor([4.0, 4.0, 6.0, 6.0]),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(token_level_rewards=torch.zeros(4, 3)), "response_mask"),
        (dict(token_level_rewards=torch.zeros(4)), "token_level_rewards"),
        (dict(token_level_rewards=torch.zeros(4, 2, dtype=torch.int64)), "token_level_rewards"),
        (dict(token_level_rewards=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])), "token_level_rewards"),
        (dict(token_level_rewards=torch.tensor([[0.0, float("inf")], [0, 0], [0, 0], [0, 0]])), "token_level_rewards"),
        (dict(response_mask=torch.ones(4, 3)), "response_mask"),
        (dict(response_mask=torch.tensor([[1, 2], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1, -1], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, 0.5], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, 1 - 2**-24], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, 1e-30], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=torch.tensor([[1.0, float("nan")], [1, 1], [1, 1], [1, 1]])), "response_mask"),
        (dict(response_mask=[[1, 1]] * 4), "response_mask"),
        (dict(prompt_index=np.array(["a", "a", "b"], dtype=object)), "prompt_index"),
        (dict(prompt_index=np.array(["a", None, "b", "b"], dtype=object)), "prompt_index is missing"),
        (dict(question_index=[np.nan, "q", "q", "q"]), "question_index is missing"),
        (dict(prompt_index=np.array([["a", "a", "b", "b"]], dtype=object)), "prompt_index"),
        (dict(question_index=["q", "q", "q"]), "question_index"),
        (dict(question_index=["q", "r", "q", "q"]), "prompt_index groups must each lie in one question_index"),
        (dict(difficulty=torch.tensor([4.0, 4.0, 6.0])), "difficulty"),
        (dict(difficulty=torch.tensor([4.0, float("nan"), 6.0, 6.0])), "difficulty"),
        (dict(difficulty=[4.0, float("inf"), 6.0, 6.0]), "difficulty"),
        (dict(difficulty=["easy", "easy", "hard", "hard"]), "difficulty"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        compute_diva_advantage(**(_good_inputs() | change))


def test_bad_knobs_raise():
    with pytest.raises(ValueError, match="reward_max"):
        compute_diva_advantage(**_good_inputs(), reward_max=0.0)
    with pytest.raises(ValueError, match="overflowed"):
        compute_diva_advantage(**_good_inputs(), k=1e4, batch_norm=False)


def test_negative_zero_in_a_float_mask_is_zero():
    inputs = _good_inputs() | dict(response_mask=torch.tensor([[1.0, -0.0], [1, 1], [1, 1], [1, 1]]))
    advantages, _ = compute_diva_advantage(**inputs)
    assert advantages[0, 1] == 0
