"""PGPO's token weights and advantages against a slow, obvious loop reference, and verl's GRPO."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import compute_pgpo_advantage, pgpo, pgpo_metrics, pgpo_token_weights, visual_dependency

# ---------------------------------------------------------------------------------------------------------------
# The reference: issue 11's formulas, one response and one token at a time, in Python floats.
# ---------------------------------------------------------------------------------------------------------------


def reference_dependency(lp: float, blind: float, kl_max: float) -> float:
    """S_t = clamp((r - 1) - log r, 0, kl_max), r = exp(blind - lp); the same infinity in both views is r = 1."""
    if lp == blind:
        return 0.0
    d = blind - lp
    if d > 700 or d < -700:  # exp overflows, or (r - 1) - log r ~ -d: far beyond any kl_max of these tests
        return kl_max
    return min(max(math.expm1(d) - d, 0.0), kl_max)


def reference_weights(log_probs, blind, mask, tau, beta, kl_max, epsilon):
    """Nested lists of w~ (masked positions 0) and of I (None off the response)."""
    weights, normalised = [], []
    for lp_row, b_row, m_row in zip(log_probs, blind, mask, strict=True):
        on = [t for t in range(len(m_row)) if m_row[t]]
        row_w = [0.0] * len(m_row)
        row_i = [None] * len(m_row)
        if on:
            s_tilde = {t: math.log1p(reference_dependency(float(lp_row[t]), float(b_row[t]), kl_max)) for t in on}
            low, high = min(s_tilde.values()), max(s_tilde.values())
            gate = {}
            for t in on:
                # Issue 11: a constant S~ has every I_t = 0 (also when epsilon is 0).
                i = 0.0 if high == low else (s_tilde[t] - low) / (high - low + epsilon)
                row_i[t] = i
                gate[t] = i / (tau + epsilon) if i < tau else 1.0 + beta * (i - tau) / (1.0 - tau + epsilon)
            total = sum(gate.values())
            for t in on:
                row_w[t] = 1.0 if total == 0 else gate[t] * len(on) / total
        weights.append(row_w)
        normalised.append(row_i)
    return weights, normalised


def reference_grpo(scores, index, epsilon):
    """verl's GRPO z-score per response (unbiased std; a group of one: mean 0, std 1; equal scores: 0)."""
    out = []
    for i in range(len(scores)):
        group = [scores[j] for j in range(len(scores)) if index[j] == index[i]]
        if len(group) == 1:
            out.append(scores[i] / (1.0 + epsilon))
        elif max(group) == min(group):
            out.append(0.0)
        else:
            out.append((scores[i] - statistics.fmean(group)) / (statistics.stdev(group) + epsilon))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Random batches: ordinary rows, single-token responses, constant dependency, fully masked rows, holes in the
# mask, extreme and infinite log-ratios.
# ---------------------------------------------------------------------------------------------------------------


def random_batch(rng, dtype, tokens=9):
    rows = int(rng.integers(1, 12))
    log_probs = -rng.uniform(0.0, 4.0, size=(rows, tokens))
    blind = log_probs + rng.normal(0.0, rng.choice([0.01, 0.5, 3.0]), size=(rows, tokens))
    mask = np.zeros((rows, tokens), dtype=np.int64)
    for r in range(rows):
        kind = rng.choice(["prefix", "single", "constant", "empty", "holes", "extreme"])
        length = int(rng.integers(1, tokens + 1))
        if kind == "prefix":
            mask[r, :length] = 1
        elif kind == "single":
            mask[r, int(rng.integers(0, tokens))] = 1
        elif kind == "constant":
            # Dyadic values: blind - lp is the same exact number on every token in float32 and float64.
            mask[r, :length] = 1
            log_probs[r] = -rng.integers(0, 32, size=tokens) / 8.0
            blind[r] = log_probs[r] - rng.choice([0.0, 0.5, 2.0])
        elif kind == "holes":
            mask[r] = rng.integers(0, 2, size=tokens)
        elif kind == "extreme":
            mask[r, :length] = 1
            picks = rng.integers(0, tokens, size=3)
            blind[r, picks[0]] = log_probs[r, picks[0]] - 1e4
            blind[r, picks[1]] = log_probs[r, picks[1]] + 60.0
            log_probs[r, picks[2]] = -np.inf
        # "empty": the row stays fully masked
    return (
        torch.tensor(log_probs, dtype=dtype),
        torch.tensor(blind, dtype=dtype),
        torch.tensor(mask),
    )


KNOBS = [
    dict(tau=0.4, beta=2.0, kl_max=10.0, epsilon=1e-6),  # the paper's defaults
    dict(tau=0.0, beta=1.0, kl_max=10.0, epsilon=1e-6),
    dict(tau=0.8, beta=0.5, kl_max=2.0, epsilon=1e-4),
    dict(tau=0.4, beta=2.0, kl_max=10.0, epsilon=0.0),
    dict(tau=0.0, beta=2.0, kl_max=10.0, epsilon=0.0),
]


@pytest.fixture(params=["one block", "blocks of 1-2 rows"])
def blocks(request, monkeypatch):
    """The weights are computed block by block of rows; small blocks put the row boundaries everywhere."""
    if request.param != "one block":
        monkeypatch.setattr(pgpo, "_BLOCK_TOKENS", 16)
    return request.param


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_weights_match_the_loop_reference_on_random_batches(knobs, dtype, blocks):
    rng = np.random.default_rng(11)
    for _ in range(25):
        log_probs, blind, mask = random_batch(rng, dtype)
        weights = pgpo_token_weights(log_probs, blind, mask, **knobs)
        assert weights.dtype == dtype and weights.shape == log_probs.shape
        assert torch.isfinite(weights).all()
        expected, _ = reference_weights(log_probs.tolist(), blind.tolist(), mask.tolist(), **knobs)
        tol = 1e-9 if dtype == torch.float64 else 2e-4
        torch.testing.assert_close(weights, torch.tensor(expected, dtype=dtype), rtol=tol, atol=tol)
        # Masked positions are exactly 0; each response's weights sum to its token count.
        assert (weights[mask == 0] == 0).all()
        torch.testing.assert_close(weights.sum(-1), mask.sum(-1).to(dtype), rtol=tol, atol=tol)


def test_special_rows_single_token_constant_masked_and_extreme(blocks):
    log_probs = torch.tensor(
        [
            [-1.0, -2.0, -0.5, -3.0],  # single response token: its weight is 1
            [-1.0, -2.0, -0.5, -3.0],  # constant dependency (blind = lp - 0.5 exactly): weights 1
            [-1.0, -2.0, -0.5, -3.0],  # fully masked: zeros
            [-1.0, -2.0, -0.5, -float("inf")],  # extreme: a huge drop, a huge rise, -inf sighted, equal -inf
        ],
        dtype=torch.float64,
    )
    blind = log_probs.clone()
    blind[1] -= 0.5
    blind[3] = torch.tensor([-1.0 - 1e6, -2.0 + 500.0, -0.5, -float("inf")], dtype=torch.float64)
    log_probs[3, 2] = -float("inf")
    mask = torch.tensor([[0, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    weights = pgpo_token_weights(log_probs, blind, mask)
    assert weights[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert weights[1].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert weights[2].tolist() == [0.0] * 4
    dependency = visual_dependency(log_probs, blind, mask)
    # Huge drop, huge rise and an infinite sighted log-prob all clamp to kl_max; equal infinities are no difference.
    assert dependency[3].tolist() == [10.0, 10.0, 10.0, 0.0]
    expected, _ = reference_weights(log_probs.tolist(), blind.tolist(), mask.tolist(), 0.4, 2.0, 10.0, 1e-6)
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert abs(float(weights[3].sum()) - 4.0) < 1e-12


def test_weights_amplify_the_most_visual_tokens():
    """The token that depends most on the image gets the largest weight, a text-like token the smallest."""
    log_probs = torch.full((1, 5), -1.0)
    blind = torch.tensor([[-1.0, -1.2, -2.0, -4.0, -1.0]])
    weights = pgpo_token_weights(log_probs, blind, torch.ones(1, 5, dtype=torch.int64))[0]
    assert weights.argmax() == 3 and weights[0] == weights[4] == 0.0
    assert weights[1] < weights[2] < weights[3]


# ---------------------------------------------------------------------------------------------------------------
# Advantages: the reference, and verl's GRPO when tau = beta = 0.
# ---------------------------------------------------------------------------------------------------------------


def random_rewarded_batch(rng, dtype):
    log_probs, blind, mask = random_batch(rng, dtype)
    rows, tokens = mask.shape
    index = []
    while len(index) < rows:
        index += [f"p{len(index)}"] * int(rng.choice([1, 2, 4, 5]))
    index = np.array(index[:rows], dtype=object)
    rewards = torch.zeros((rows, tokens), dtype=dtype)
    last = torch.clamp(mask.sum(-1) - 1, min=0)
    rewards[torch.arange(rows), last] = torch.tensor(rng.choice([0.0, 1.0, 0.5], size=rows), dtype=dtype)
    return rewards, mask, index, log_probs, blind


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_advantages_are_grpo_times_the_weights(dtype, blocks):
    rng = np.random.default_rng(5)
    for _ in range(40):
        rewards, mask, index, log_probs, blind = random_rewarded_batch(rng, dtype)
        advantages, returns = compute_pgpo_advantage(rewards, mask, index, log_probs, blind)
        assert advantages is returns and advantages.dtype == dtype
        grpo = reference_grpo(rewards.sum(-1).tolist(), list(index), 1e-6)
        weights, _ = reference_weights(log_probs.tolist(), blind.tolist(), mask.tolist(), 0.4, 2.0, 10.0, 1e-6)
        expected = torch.tensor([[a * w for w in row] for a, row in zip(grpo, weights, strict=True)], dtype=dtype)
        tol = 1e-9 if dtype == torch.float64 else 2e-4
        torch.testing.assert_close(advantages, expected, rtol=tol, atol=tol)
        assert (advantages[mask == 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tau_and_beta_zero_is_verls_grpo(dtype):
    rng = np.random.default_rng(7)
    for _ in range(30):
        rewards, mask, index, log_probs, blind = random_rewarded_batch(rng, dtype)
        weights = pgpo_token_weights(log_probs, blind, mask, tau=0.0, beta=0.0)
        assert torch.equal(weights, mask.to(dtype))
        ours, _ = compute_pgpo_advantage(rewards, mask, index, log_probs, blind, tau=0.0, beta=0.0)
        verl, _ = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-6)
        torch.testing.assert_close(ours, verl.to(dtype), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------


def test_metrics_match_the_reference():
    rng = np.random.default_rng(3)
    for _ in range(20):
        log_probs, blind, mask = random_batch(rng, torch.float64)
        metrics = pgpo_metrics(log_probs, blind, mask)
        weights, normalised = reference_weights(log_probs.tolist(), blind.tolist(), mask.tolist(), 0.4, 2.0, 10.0, 1e-6)
        on = [(r, t) for r in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[r, t]]
        if not on:
            assert all(value == 0.0 for value in metrics.values())
            continue
        deps = [reference_dependency(float(log_probs[r, t]), float(blind[r, t]), 10.0) for r, t in on]
        assert metrics["pgpo/share_above_tau"] == pytest.approx(
            sum(normalised[r][t] >= 0.4 for r, t in on) / len(on), abs=1e-12
        )
        assert metrics["pgpo/weight_mean"] == pytest.approx(statistics.fmean(weights[r][t] for r, t in on), abs=1e-9)
        assert metrics["pgpo/weight_max"] == pytest.approx(max(weights[r][t] for r, t in on), abs=1e-9)
        assert metrics["pgpo/visual_dependency_mean"] == pytest.approx(statistics.fmean(deps), abs=1e-9)
        assert metrics["pgpo/visual_dependency_max"] == pytest.approx(max(deps), abs=1e-9)
    given = pgpo_token_weights(log_probs, blind, mask)
    assert pgpo_metrics(log_probs, blind, mask, weights=given) == pgpo_metrics(log_probs, blind, mask)


# ---------------------------------------------------------------------------------------------------------------
# Bad input names the argument.
# ---------------------------------------------------------------------------------------------------------------


def _inputs():
    log_probs = -torch.rand(3, 4)
    return {
        "token_level_rewards": torch.zeros(3, 4),
        "response_mask": torch.ones(3, 4, dtype=torch.int64),
        "index": ["a", "a", "b"],
        "log_probs": log_probs,
        "blind_log_probs": log_probs - 0.1,
    }


def _set(name, row, col, value):
    def change(args):
        args[name] = args[name].clone()
        args[name][row, col] = value

    return change


def _replace(name, make):
    def change(args):
        args[name] = make(args[name])

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (_set("log_probs", 1, 2, float("nan")), r"log_probs holds NaN \(response 1, token 2\)"),
        (_set("blind_log_probs", 2, 0, float("nan")), r"blind_log_probs holds NaN \(response 2, token 0\)"),
        (_replace("blind_log_probs", lambda t: t[:, :3]), "blind_log_probs has shape"),
        (_replace("log_probs", lambda t: t.to(torch.int64)), "log_probs must be a float32 or float64"),
        (_replace("log_probs", lambda t: t.numpy()), "log_probs must be a float32 or float64"),
        (_set("response_mask", 1, 1, 2), "response_mask must hold only 0 and 1; row 1"),
        (_replace("response_mask", lambda t: t[:2]), "response_mask has shape"),
        (_replace("index", lambda ids: ids[:2]), "index must be a 1-D sequence"),
        (_set("token_level_rewards", 0, 0, float("nan")), "token_level_rewards: every row sum must be finite"),
    ],
)
def test_bad_input_names_the_argument(change, message, blocks):
    args = _inputs()
    change(args)
    with pytest.raises(ValueError, match=message):
        compute_pgpo_advantage(**args)


@pytest.mark.parametrize("knob, value", [("tau", 1.0), ("tau", -0.1), ("beta", -1.0), ("kl_max", 0.0), ("epsilon", -1)])
def test_knobs_out_of_range_are_refused(knob, value):
    args = _inputs()
    with pytest.raises(ValueError, match=knob):
        pgpo_token_weights(args["log_probs"], args["blind_log_probs"], args["response_mask"], **{knob: value})


def test_nan_on_a_masked_position_is_still_an_error(blocks):
    args = _inputs()
    mask = args["response_mask"]
    mask[0, 3] = 0
    _set("blind_log_probs", 0, 3, float("nan"))(args)
    with pytest.raises(ValueError, match=r"blind_log_probs holds NaN \(response 0, token 3\)"):
        pgpo_token_weights(args["log_probs"], args["blind_log_probs"], mask)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.float32, torch.float64])
def test_every_mask_dtype_gives_the_same_weights_and_a_bad_float_mask_names_its_row(mask_dtype, blocks):
    rng = np.random.default_rng(2)
    log_probs, blind, mask = random_batch(rng, torch.float32, tokens=6)
    expected = pgpo_token_weights(log_probs, blind, mask)
    assert torch.equal(pgpo_token_weights(log_probs, blind, mask.to(mask_dtype)), expected)
    if mask_dtype.is_floating_point:
        bad = mask.to(mask_dtype)
        bad[-1, 0] = 0.5
        with pytest.raises(ValueError, match=f"response_mask must hold only 0 and 1; row {mask.shape[0] - 1}"):
            pgpo_token_weights(log_probs, blind, bad)
