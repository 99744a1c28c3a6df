"""compute_durian_advantage against a slow, obvious per-response reference and against verl's own GRPO."""

from __future__ import annotations

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from verl_ext.algos import compute_durian_advantage, durian_metrics
from verl_ext.algos.durian import exact_rank_quantiles, perceptual_buckets, reasoning_buckets

# ---------------------------------------------------------------------------------------------------------------
# The reference: docs/algo/durian.md / issue 10 written out one response at a time, in Python floats and exact
# fractions for the quantiles.
# ---------------------------------------------------------------------------------------------------------------


def _quantile(values, q: Fraction) -> Fraction:
    """Linear-interpolation quantile, exactly: rank q * (n - 1) between the two order statistics around it."""
    ordered = sorted(Fraction(v) for v in values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _perceptual_bucket(h, entropies):
    q25, q75 = _quantile(entropies, Fraction(1, 4)), _quantile(entropies, Fraction(3, 4))
    if h <= q25:
        return 0
    if q25 < h < q75:
        return 1
    assert h >= q75
    return 2


def _reasoning_bucket(c, confidences, b):
    edges = [_quantile(confidences, Fraction(u, b)) for u in range(b + 1)]
    for k in range(b):
        if edges[k] <= c < edges[k + 1] or (k == b - 1 and edges[k] <= c <= edges[k + 1]):
            return k
    raise AssertionError("every value falls in a bucket")


def reference_durian(rewards, mask, log_probs, prompts, entropy, alpha_ori, alpha_percep, alpha_reason, b, epsilon):
    batch = len(prompts)
    scores = [sum(float(r) for r in rewards[i]) for i in range(batch)]
    names = list(dict.fromkeys(prompts))
    members = {p: [i for i in range(batch) if prompts[i] == p] for p in names}

    def prompt_mean(p):
        return statistics.fmean(scores[j] for j in members[p])

    def grpo(i):
        group = [scores[j] for j in members[prompts[i]]]
        if len(group) == 1:
            return scores[i] / (1.0 + epsilon)
        if max(group) == min(group):
            return 0.0
        return (scores[i] - statistics.fmean(group)) / (statistics.stdev(group) + epsilon)

    def numerator(i):
        group = [scores[j] for j in members[prompts[i]]]
        return 0.0 if max(group) == min(group) else scores[i] - prompt_mean(prompts[i])

    def bucket_term(i, bucket_of_prompt):
        pooled = [scores[j] for j in range(batch) if bucket_of_prompt[prompts[j]] == bucket_of_prompt[prompts[i]]]
        if max(pooled) == min(pooled):
            return 0.0
        return numerator(i) / (statistics.stdev(pooled) + epsilon)

    h = {p: float(entropy[members[p][0]]) for p in names}
    percep = {p: _perceptual_bucket(h[p], list(h.values())) for p in names}

    def confidence(i):
        tokens = [float(log_probs[i][t]) for t in range(len(mask[i])) if mask[i][t]]
        return statistics.fmean(tokens) if tokens else 0.0

    conf = {p: statistics.fmean(confidence(i) for i in members[p]) for p in names}
    reason = {p: _reasoning_bucket(conf[p], list(conf.values()), b) for p in names}

    advantage = [
        alpha_ori * grpo(i) + alpha_percep * bucket_term(i, percep) + alpha_reason * bucket_term(i, reason)
        for i in range(batch)
    ]
    return [[advantage[i] * float(mask[i][t]) for t in range(len(mask[i]))] for i in range(batch)]


# ---------------------------------------------------------------------------------------------------------------
# Random batches with the awkward cases in them.
# ---------------------------------------------------------------------------------------------------------------


def random_batch(rng: np.random.Generator, dtype: torch.dtype, tokens: int = 6):
    """Prompts of 1-8 responses; rewards multiples of 1/16 (row sums exact in float32); entropies and confidences
    either continuous or drawn from a few dyadic values, so that many prompts tie and the quantiles land on them
    (q25 == q75 included). Tied log-probs are constant along a row and dyadic, so every prompt's L(p) is exact
    whatever the summation order; some rows are fully masked; padding holds garbage log-probs."""
    prompts, entropy_of, level_of = [], {}, {}
    entropy_levels = int(rng.choice([0, 1, 2, 3]))  # 0: continuous
    confidence_levels = int(rng.choice([0, 1, 2, 4]))
    for p in range(int(rng.integers(1, 16))):
        name = f"p{p}"
        entropy_of[name] = float(rng.integers(0, entropy_levels) / 4 + 2) if entropy_levels else float(rng.random())
        level_of[name] = int(rng.integers(0, confidence_levels)) if confidence_levels else None
        prompts += [name] * int(rng.choice([1, 2, 3, 5, 8]))
    batch = len(prompts)
    reward_levels = int(rng.choice([1, 2, 3, 17]))  # 1: every group and bucket collapses
    row_rewards = rng.integers(0, reward_levels, size=batch) / 16.0
    rewards = np.zeros((batch, tokens))
    rewards[:, -1] = row_rewards
    lengths = rng.integers(0, tokens + 1, size=batch)  # 0: a fully masked row (L_i = 0)
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int64)
    log_probs = np.where(mask == 1, -rng.random((batch, tokens)) * 3, 7.0)
    for i, name in enumerate(prompts):
        if level_of[name] is not None:
            log_probs[i] = np.where(mask[i] == 1, -level_of[name] / 8.0, 123.0)
    entropy = np.array([entropy_of[name] for name in prompts])
    shuffle = rng.permutation(batch)  # groups are not contiguous in verl's batches either
    return (
        torch.tensor(rewards[shuffle], dtype=dtype),
        torch.tensor(mask[shuffle]),
        torch.tensor(log_probs[shuffle], dtype=dtype),
        np.array(prompts, dtype=object)[shuffle],
        entropy[shuffle],
    )


ALPHAS = [(0.1, 0.2, 0.7), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.6, 0.2, 0.2), (0.5, -1.0, 2.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference_on_random_batches(dtype):
    rng = np.random.default_rng(2602)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for trial in range(150):
        rewards, mask, log_probs, prompts, entropy = random_batch(rng, dtype)
        alphas = ALPHAS[trial % len(ALPHAS)]
        b = int(rng.choice([1, 2, 3, 4, 12, 48]))
        advantages, returns = compute_durian_advantage(
            rewards, mask, log_probs, prompts, entropy,
            alpha_ori=alphas[0], alpha_percep=alphas[1], alpha_reason=alphas[2], reason_buckets=b,
        )  # fmt: skip
        expected = reference_durian(
            rewards.tolist(), mask.tolist(), log_probs.tolist(), list(prompts), entropy, *alphas, b, 1e-6
        )
        assert advantages.dtype == dtype and advantages.shape == rewards.shape
        assert advantages is returns
        torch.testing.assert_close(advantages, torch.tensor(expected, dtype=dtype), **tolerance, msg=f"trial {trial}")


def test_random_batches_cover_the_awkward_cases():
    """The generator really produces what the reference test claims to cover."""
    rng = np.random.default_rng(2602)
    seen = set()
    for _ in range(150):
        rewards, mask, log_probs, prompts, entropy = random_batch(rng, torch.float64)
        names = list(dict.fromkeys(prompts))
        sizes = [int((prompts == p).sum()) for p in names]
        per_prompt = sorted(entropy[prompts == p][0] for p in names)
        q25, q75 = np.quantile(per_prompt, [0.25, 0.75])
        seen |= {"group of one"} if 1 in sizes else set()
        seen |= {"q25 == q75"} if q25 == q75 and len(names) > 1 else set()
        seen |= {"entropy tie at q25"} if sum(h == q25 for h in per_prompt) > 1 else set()
        seen |= {"constant batch"} if float(rewards.sum(-1).max()) == float(rewards.sum(-1).min()) else set()
        seen |= {"empty row"} if bool((mask.sum(-1) == 0).any()) else set()
        seen |= {"fewer prompts than buckets"} if len(names) < 12 else set()
    assert seen == {
        "group of one", "q25 == q75", "entropy tie at q25", "constant batch", "empty row", "fewer prompts than buckets"
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# The bucket rules on hand-made values.
# ---------------------------------------------------------------------------------------------------------------


def test_perceptual_buckets_ties_go_to_the_first_condition():
    # q25 = q75 = 2: the three 2s meet "H <= q25" and "H >= q75" and go to bucket 0.
    values = torch.tensor([2.0, 1.0, 2.0, 3.0, 2.0], dtype=torch.float64)
    assert perceptual_buckets(values).tolist() == [0, 0, 0, 2, 0]
    # q25 = 1.75, q75 = 3.25 (interpolated): strict middle.
    values = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert perceptual_buckets(values).tolist() == [0, 1, 1, 2]
    # q25 lands on a value (rank 1 of 0..4): the value is in the low bucket, the next one in the middle.
    values = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert perceptual_buckets(values).tolist() == [0, 0, 1, 2, 2]


def test_reasoning_buckets_are_closed_on_the_left_and_the_last_on_both_sides():
    values = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    assert reasoning_buckets(values, 2).tolist() == [0, 0, 1, 1]  # edges 0, 1.5, 3
    assert reasoning_buckets(values, 3).tolist() == [0, 1, 2, 2]  # edges 0, 1, 2, 3: 3 is in the last one
    # Edges 0, 0, 0, 0.25, 1: buckets 0 and 1 are [0, 0), empty; the zeros go to [0, 0.25).
    values = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert reasoning_buckets(values, 4).tolist() == [2, 2, 2, 3]
    assert reasoning_buckets(values, 1).tolist() == [0, 0, 0, 0]
    # More buckets than prompts: each prompt alone, most buckets empty.
    assert reasoning_buckets(torch.tensor([5.0, -1.0, 2.0], dtype=torch.float64), 12).tolist() == [11, 0, 6]


def test_quantiles_match_numpy_and_are_exact_at_whole_ranks():
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 7, 10, 101):
        values = torch.from_numpy(rng.normal(size=n))
        for b in (1, 2, 3, 4, 12, 48):
            got = exact_rank_quantiles(values, torch.arange(b + 1), b)
            np.testing.assert_allclose(got.numpy(), np.quantile(values.numpy(), np.arange(b + 1) / b), rtol=1e-12)
            whole = [u for u in range(b + 1) if u * (n - 1) % b == 0]
            ordered = np.sort(values.numpy())
            assert all(got[u].item() == ordered[u * (n - 1) // b] for u in whole)


# ---------------------------------------------------------------------------------------------------------------
# Plain cases, masking, input forms.
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_alpha_ori_alone_is_verls_grpo(dtype):
    rng = np.random.default_rng(5)
    for _ in range(30):
        rewards, mask, log_probs, prompts, entropy = random_batch(rng, dtype)
        ours, _ = compute_durian_advantage(
            rewards, mask, log_probs, prompts, entropy, alpha_ori=1.0, alpha_percep=0.0, alpha_reason=0.0
        )
        verl, _ = compute_grpo_outcome_advantage(rewards, mask, prompts)
        # verl leaves rounding noise (~1e-8 after the division by eps) on groups of equal rewards; we give exactly 0.
        torch.testing.assert_close(ours, verl.to(dtype), rtol=1e-5, atol=1e-6)
        without_extras, _ = compute_durian_advantage(
            rewards, mask, None, prompts, None, alpha_ori=1.0, alpha_percep=0.0, alpha_reason=0.0
        )
        assert torch.equal(ours, without_extras)  # the unused inputs may be None


def test_masked_tokens_are_exactly_zero_and_inputs_may_be_tensors_arrays_or_lists():
    rng = np.random.default_rng(11)
    for mask_dtype in (torch.int64, torch.bool, torch.float32):
        rewards, mask, log_probs, prompts, entropy = random_batch(rng, torch.float32)
        mask = mask.to(mask_dtype)
        forms = [entropy, entropy.tolist(), torch.tensor(entropy, dtype=torch.float32), torch.from_numpy(entropy)]
        results = [compute_durian_advantage(rewards, mask, log_probs, list(prompts), h)[0] for h in forms]
        for result in results[1:]:
            assert torch.equal(result, results[0])
        assert bool((results[0][~mask.bool()] == 0).all())


def test_prompts_of_equal_scores_get_exactly_zero_everywhere():
    # Prompt a: all equal (1, 1, 1); prompt b: (0, 1); c: one response. Every term of a and c is exactly 0 except
    # the GRPO term of the single response.
    rewards = torch.tensor([[0.1], [0.1], [0.1], [0.0], [1.0], [0.7]], dtype=torch.float32)
    mask = torch.ones(6, 1, dtype=torch.int64)
    log_probs = -torch.rand(6, 1)
    prompts = ["a", "a", "a", "b", "b", "c"]
    entropy = [1.0, 1.0, 1.0, 2.0, 2.0, 3.0]
    advantages, _ = compute_durian_advantage(rewards, mask, log_probs, prompts, entropy, alpha_ori=0.0)
    assert advantages[[0, 1, 2, 5], 0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert advantages[3, 0] < 0 < advantages[4, 0]


def test_garbage_log_probs_in_padding_are_ignored():
    rewards, mask, log_probs, prompts, entropy = random_batch(np.random.default_rng(3), torch.float64)
    mask[0] = 0
    mask[0, 0] = 1
    clean, _ = compute_durian_advantage(rewards, mask, log_probs, prompts, entropy)
    log_probs[0, 1:] = float("nan")
    log_probs[1, :] = torch.where(mask[1].bool(), log_probs[1], torch.tensor(float("-inf"), dtype=torch.float64))
    dirty, _ = compute_durian_advantage(rewards, mask, log_probs, prompts, entropy)
    assert torch.equal(clean, dirty)


def test_metrics_report_buckets_and_the_weight_identity():
    """weight = (std_p + eps) / (std_k + eps) is what turns the GRPO term into the bucket term."""
    rng = np.random.default_rng(17)
    for _ in range(20):
        rewards, mask, log_probs, prompts, entropy = random_batch(rng, torch.float64)
        metrics = durian_metrics(rewards, mask, log_probs, prompts, entropy, reason_buckets=4)
        grpo, _ = compute_durian_advantage(
            rewards, mask, log_probs, prompts, entropy, alpha_ori=1, alpha_percep=0, alpha_reason=0
        )
        for kind, alphas in (("perceptual", (0, 1, 0)), ("reasoning", (0, 0, 1))):
            term, _ = compute_durian_advantage(
                rewards, mask, log_probs, prompts, entropy,
                alpha_ori=alphas[0], alpha_percep=alphas[1], alpha_reason=alphas[2], reason_buckets=4,
            )  # fmt: skip
            live = (grpo[:, 0] != 0) & (term[:, 0] != 0) & (mask[:, 0] == 1)
            ratios = (term[live, 0] / grpo[live, 0]).tolist()
            if ratios:
                assert metrics[f"{kind}/weight/min"] == pytest.approx(min(ratios), rel=1e-9)
                assert metrics[f"{kind}/weight/max"] == pytest.approx(max(ratios), rel=1e-9)
            else:
                assert math.isnan(metrics[f"{kind}/weight/mean"])
            assert 0 < metrics[f"{kind}/occupancy"] <= 1
            assert metrics[f"{kind}/occupied"] == round(metrics[f"{kind}/occupancy"] * metrics[f"{kind}/buckets"])
        names = list(dict.fromkeys(prompts))
        per_prompt = [entropy[prompts == p][0] for p in names]
        sizes = np.bincount(perceptual_buckets(torch.tensor(per_prompt)).numpy(), minlength=3)
        assert metrics["perceptual/prompts_per_bucket/max"] == sizes.max()
        assert metrics["perceptual/occupied"] == (sizes > 0).sum()
    assert metrics["reasoning/buckets"] == 4 and metrics["perceptual/buckets"] == 3


# ---------------------------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the argument.
# ---------------------------------------------------------------------------------------------------------------


def _good():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    mask = torch.ones(4, 2, dtype=torch.int64)
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        old_log_probs=-torch.ones(4, 2),
        index=np.array(["a", "a", "b", "b"], dtype=object),
        visual_entropy=[0.5, 0.5, 1.5, 1.5],
    )


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(visual_entropy=None), "visual_entropy is required"),
        (dict(visual_entropy=[0.5, 0.5, None, 1.5]), "visual_entropy is missing .* response 2"),
        (dict(visual_entropy=[0.5, 0.5, float("nan"), 1.5]), "visual_entropy must be finite"),
        (dict(visual_entropy=[0.5, 0.5, 1.5]), r"visual_entropy must have shape \(4,\)"),
        (dict(visual_entropy=["x", 0.5, 1.5, 1.5]), "visual_entropy must be numbers"),
        (dict(visual_entropy=[0.5, 0.6, 1.5, 1.5]), "visual_entropy must be one value per prompt.*'a'"),
        (dict(old_log_probs=None), "old_log_probs is required"),
        (dict(old_log_probs=-torch.ones(4, 3)), "old_log_probs has shape"),
        (dict(old_log_probs=[[0.0]]), "old_log_probs must be a floating-point torch.Tensor"),
        (
            dict(old_log_probs=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])),
            "old_log_probs must be finite",
        ),
        (dict(index=["a", "a", "b"]), "index must be a 1-D sequence"),
        (dict(token_level_rewards=torch.tensor([[0.0, float("nan")], [0, 0], [0, 0], [0, 0]])), "token_level_rewards"),
        (dict(response_mask=torch.tensor([[1, 2], [1, 1], [1, 1], [1, 1]])), "response_mask must hold only 0 and 1"),
        (dict(response_mask=torch.full((4, 2), 0.5)), "response_mask must hold only 0 and 1"),
        (dict(response_mask=torch.ones(4, 3, dtype=torch.int64)), "response_mask has shape"),
        (dict(reason_buckets=0), "reason_buckets must be an integer >= 1"),
        (dict(reason_buckets=2.5), "reason_buckets must be an integer >= 1"),
        (dict(alpha_percep=float("nan")), "alpha_percep must be a finite number"),
        (dict(alpha_ori="1"), "alpha_ori must be a finite number"),
        (dict(epsilon=-1.0), "epsilon must be a finite number >= 0"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_argument(change, match):
    args = _good() | change
    knobs = {k: args.pop(k) for k in ("reason_buckets", "alpha_percep", "alpha_ori", "epsilon") if k in args}
    with pytest.raises(ValueError, match=match):
        compute_durian_advantage(**args, **knobs)


def test_good_input_of_the_bad_input_test_passes():
    advantages, _ = compute_durian_advantage(**_good())
    assert torch.isfinite(advantages).all() and advantages.abs().sum() > 0
