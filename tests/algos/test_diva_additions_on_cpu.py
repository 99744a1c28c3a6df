"""DIVA-GRPO's additions, one at a time, on its advantage (verl_ext.algos.diva_advantage): with every addition off it
is a per-prompt z-score written out the slow, obvious way (GRPO), and each addition turned on alone moves only what
it should (docs/algo/diva_grpo.md, "GRPO inside DIVA"; the variants addition, which changes the data:
tests/data/test_diva_original_prompts_on_cpu.py)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from verl_ext.algos import compute_diva_advantage

EPS = 1e-6
ALL_OFF = {"k": 0.0, "global_coef": 0.0, "batch_norm": False, "rrb": False, "epsilon": EPS}


def slow_zscore(scores: list[float], groups: list) -> list[float]:
    """GRPO, one response at a time: ``(s - mean) / (std + eps)`` over the response's group, unbiased std; a group of
    one has mean 0 and std 1; a group of equal scores gives 0."""
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
        if len(members) == 1:
            out.append((s - 0.0) / (1.0 + EPS))
        elif max(members) == min(members):
            out.append(0.0)
        else:
            out.append((s - statistics.fmean(members)) / (statistics.stdev(members) + EPS))
    return out


def batch(seed: int):
    """Questions of 1-3 prompts (original + variants) with 1-6 responses each, per-prompt difficulties, scores of
    the project's reward (0.9 acc + 0.1 format, in tenths) on one of 1-5 tokens; one prompt group with equal scores
    and one question whose every response scores alike, whatever the draw."""
    rng = np.random.default_rng(seed)
    prompts, questions, difficulty, scores = [], [], [], []
    for q in range(int(rng.integers(4, 8))):
        for p in range(int(rng.integers(1, 4))):
            d = float(rng.integers(1, 10))
            n = int(rng.integers(1, 7))
            if q == 0 and p == 0:
                drawn = [0.1] * max(n, 2)  # a collapsed prompt group
            elif q == 1:
                drawn = [1.0] * max(n, 2)  # a collapsed question
            else:
                drawn = [float(x) / 10 for x in rng.choice([0, 1, 9, 10], size=n)]
            for s in drawn:
                prompts.append(f"q{q}p{p}")
                questions.append(f"q{q}")
                difficulty.append(d)
                scores.append(s)
    tokens = 5
    lengths = rng.integers(1, tokens + 1, size=len(scores))
    mask = torch.tensor([[1.0] * int(n) + [0.0] * (tokens - int(n)) for n in lengths], dtype=torch.float64)
    rewards = torch.zeros(len(scores), tokens, dtype=torch.float64)
    for i, n in enumerate(lengths):
        rewards[i, int(n) - 1] = scores[i]
    return rewards, mask, prompts, questions, difficulty, scores


def advantage(data, **knobs) -> torch.Tensor:
    """The per-response advantage (every token of a response carries it); checks that it is broadcast as such."""
    rewards, mask, prompts, questions, difficulty, _ = data
    out, returns = compute_diva_advantage(rewards, mask, prompts, questions, difficulty, **{**ALL_OFF, **knobs})
    assert out is returns
    per_response = out[:, 0]  # every response has its first token
    assert torch.equal(out, per_response.unsqueeze(1) * mask)
    return per_response


SEEDS = range(8)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_addition_off_is_the_per_prompt_zscore(seed):
    data = batch(seed)
    _, _, prompts, _, _, scores = data
    expected = torch.tensor(slow_zscore(scores, prompts), dtype=torch.float64)
    torch.testing.assert_close(advantage(data), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_global_stream_alone_adds_the_question_group_zscore(seed, coef):
    data = batch(seed)
    _, _, prompts, questions, _, scores = data
    added = advantage(data, global_coef=coef) - advantage(data)
    expected = coef * torch.tensor(slow_zscore(scores, questions), dtype=torch.float64)
    torch.testing.assert_close(added, expected, rtol=0, atol=1e-12)
    assert added.abs().max() > 0.1  # the term is real
    # The collapsed question adds nothing; the collapsed prompt inside a live question does get the question's term.
    assert all(added[i] == 0 for i, q in enumerate(questions) if q == "q1")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", [0.1, 1.0])
def test_weighting_without_the_global_stream_changes_nothing(seed, k):
    """Difficulty weighting scales the global stream only: with that stream off it has nothing to scale."""
    data = batch(seed)
    assert torch.equal(advantage(data, k=k), advantage(data))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("k", [0.1, 1.0])
def test_weighting_with_the_global_stream_changes_only_its_magnitudes(seed, k):
    """With the global stream on, turning weighting on leaves the local stream as it was and multiplies each global
    value by ``exp(k (d_i - dbar_q) sign)``: a positive factor (signs kept), 1 where a question's prompts share one
    difficulty; harder-than-average prompts' right answers gain, their wrong answers lose."""
    data = batch(seed)
    _, _, prompts, questions, difficulty, _ = data
    local = advantage(data)
    unweighted = advantage(data, global_coef=1.0) - local
    weighted = advantage(data, global_coef=1.0, k=k) - local
    # The local stream alone is the same with or without weighting.
    torch.testing.assert_close(advantage(data, global_coef=1.0, k=k, local_coef=0.0), weighted, rtol=0, atol=1e-12)
    assert torch.equal(torch.sign(weighted), torch.sign(unweighted))
    moved = 0
    for i in range(len(prompts)):
        same = [difficulty[j] for j in range(len(prompts)) if questions[j] == questions[i]]
        offset = difficulty[i] - sum(same) / len(same)
        value = float(unweighted[i])
        sign = (value > 0) - (value < 0)
        assert float(weighted[i]) == pytest.approx(value * math.exp(k * offset * sign), rel=1e-12)
        moved += abs(offset) > 1e-12 and value != 0
    assert moved > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_batch_norm_alone_standardises_the_per_prompt_stream_over_the_batch(seed):
    """One value per response: minus the mean over the batch's responses, over their unbiased std. An affine map
    with a positive slope, so every response keeps its rank."""
    data = batch(seed)
    base = [float(x) for x in advantage(data)]
    got = advantage(data, batch_norm=True)
    mean, std = statistics.fmean(base), statistics.stdev(base)
    torch.testing.assert_close(
        got, torch.tensor([(x - mean) / std for x in base], dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert float(got.mean()) == pytest.approx(0.0, abs=1e-12) and float(got.std()) == pytest.approx(1.0)
    order = np.argsort(base, kind="stable")
    assert np.all(np.diff(got.numpy()[order]) >= -1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("reward_max", [1.0, 2.0])
def test_rrb_alone_scales_each_response_by_its_prompt_groups_reward_range(seed, reward_max):
    data = batch(seed)
    _, _, prompts, _, _, scores = data
    base = advantage(data)
    got = advantage(data, rrb=True, reward_max=reward_max)
    ranges = []
    for i in range(len(prompts)):
        members = [scores[j] for j in range(len(scores)) if prompts[j] == prompts[i]]
        ranges.append((max(members) - min(members)) / reward_max)
    torch.testing.assert_close(got, base * torch.tensor(ranges, dtype=torch.float64), rtol=0, atol=1e-12)
    # A group of one (range 0) gives nothing; signs are kept everywhere else.
    assert all(got[i] == 0 for i, p in enumerate(prompts) if prompts.count(p) == 1)
    assert torch.all(torch.sign(got) * torch.sign(base) >= 0)
    assert not torch.equal(got, base)


def test_all_off_is_verls_grpo_on_the_same_batch():
    """The identity's other side: verl's own estimator, to its float32 rounding (the end-to-end tolerance's origin:
    docs/algo/diva_grpo.md, "GRPO inside DIVA")."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards, mask, prompts, questions, difficulty, _ = batch(0)
    rewards, mask = rewards.float(), mask.long()  # what verl's trainers pass
    ours, _ = compute_diva_advantage(rewards, mask, prompts, questions, difficulty, **ALL_OFF)
    theirs, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(prompts, dtype=object), epsilon=EPS)
    assert ours.dtype == theirs.dtype == torch.float32
    assert 0 < float((ours - theirs).abs().max()) < 1e-6
