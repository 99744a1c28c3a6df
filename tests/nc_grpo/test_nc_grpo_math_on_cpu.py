"""NC-GRPO's pure parts against slow obvious references: the displacement, the noise vector, the seeded choice of
the noisy responses, the trainer's flag check and per-half metrics, the advantage (verl's GRPO, halves pooled), the
start-up checks and the agent loop's flags and sampling params."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.algos.noise_contrastive_grpo import check_group_flags, half_metrics
from verl_ext.nc_grpo.noise import (
    FLAG_FIELD,
    NOISE_KEY,
    SEED_FIELD,
    noise_seed,
    noise_vector,
    noisy_count,
    noisy_responses,
    perturb,
    request_noise,
)
from verl_ext.rollout.seeds import prompt_uid, stable_seed


def _slow_perturb(h: list[float], xi: list[float], c: float) -> list[float]:
    norm = math.sqrt(sum(v * v for v in h))
    return [hv + c * norm / math.sqrt(len(h)) * x for hv, x in zip(h, xi, strict=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("c", [0.0, 0.1, 1.0])
def test_perturb_is_h_plus_c_norm_over_sqrt_d_xi(dtype, c):
    rng = torch.Generator().manual_seed(3)
    h = (torch.randn(37, generator=rng) * 4).to(dtype)
    xi = torch.randn(37, generator=rng)
    got = perturb(h, xi, c)
    assert got.dtype == dtype and got.shape == h.shape
    want = torch.tensor(_slow_perturb(h.double().tolist(), xi.double().tolist(), c), dtype=torch.float64)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(got.double(), want, rtol=tol, atol=tol)
    if c == 0:
        assert torch.equal(got, h)


def test_displacement_norm_is_c_times_norm_h_up_to_the_norm_of_xi_over_sqrt_d():
    # ||h~ - h|| = c ||h|| ||xi|| / sqrt(d), and ||xi|| / sqrt(d) -> 1 as d grows: measured against c ||h||.
    d, c = 3584, 0.1  # Qwen2.5-VL-7B's hidden size
    h = torch.randn(d, generator=torch.Generator().manual_seed(0)) * 7
    xi = noise_vector(12345, d)
    ratio = float((perturb(h, xi, c) - h).norm() / (c * h.norm()))
    assert ratio == pytest.approx(float(xi.norm()) / math.sqrt(d), rel=1e-5)
    assert abs(ratio - 1) < 4 / math.sqrt(2 * d)  # chi_d / sqrt(d): std ~ 1 / sqrt(2d)


def test_noise_vector_is_a_seeded_standard_normal_on_the_cpu():
    a, b, other = noise_vector(7, 4096), noise_vector(7, 4096), noise_vector(8, 4096)
    assert a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a, b) and not torch.equal(a, other)
    # The same numbers as torch's own seeded generator (the reference both backends rely on).
    assert torch.equal(a, torch.randn(4096, generator=torch.Generator().manual_seed(7)))
    assert abs(float(a.mean())) < 0.06 and abs(float(a.std()) - 1) < 0.05


def test_noisy_count_refuses_a_fraction_that_is_not_whole_naming_the_keys():
    assert noisy_count(8, 0.5) == 4 and noisy_count(6, 0.5) == 3 and noisy_count(8, 0.25) == 2
    assert noisy_count(8, 0) == 0 and noisy_count(8, 1) == 8
    for n, fraction in ((5, 0.5), (8, 0.3), (8, 1.5), (8, -0.5)):
        with pytest.raises(ValueError, match=r"noise_contrastive_grpo\.noisy_fraction.*rollout\.n"):
            noisy_count(n, fraction)


def _slow_noisy(seed, step, uid, n, fraction):
    keyed = [(stable_seed("nc_grpo_half", seed, step, uid, i), i) for i in range(n)]
    keyed.sort()
    return {i for _, i in keyed[: int(round(n * fraction))]}


def test_noisy_responses_are_exactly_the_fraction_seeded_per_prompt_and_step():
    seen = set()
    for row in range(40):
        uid = prompt_uid(0, 1, 0, row)
        for n, fraction in ((8, 0.5), (6, 0.5), (8, 0.25)):
            picked = noisy_responses(0, 1, uid, n, fraction)
            assert len(picked) == n * fraction and picked <= set(range(n))
            assert picked == noisy_responses(0, 1, uid, n, fraction) == _slow_noisy(0, 1, uid, n, fraction)
        seen.add(noisy_responses(0, 1, uid, 8, 0.5))
    assert len(seen) > 10  # a seeded half, not always the same (nor always the first) indices
    uid = prompt_uid(0, 1, 0, 0)
    others = {noisy_responses(seed, step, uid, 8, 0.5) for seed in range(6) for step in range(6)}
    assert len(others) > 5


def test_noise_seeds_differ_per_response_and_repeat_per_place():
    seeds = {noise_seed(0, 2, "u", i) for i in range(8)}
    assert len(seeds) == 8 and noise_seed(0, 2, "u", 3) == noise_seed(0, 2, "u", 3)
    assert noise_seed(1, 2, "u", 3) != noise_seed(0, 2, "u", 3) != noise_seed(0, 3, "u", 3)


def test_request_noise_reads_the_extra_args_entry():
    assert request_noise({"temperature": 1.0}) is None and request_noise({"extra_args": {}}) is None
    entry = {"extra_args": {NOISE_KEY: {"seed": 5, "scale": 0.2, "layer": "final"}}}
    assert request_noise(entry) == {"seed": 5, "scale": 0.2, "layer": "final"}
    with pytest.raises(ValueError, match="layer"):
        request_noise({"extra_args": {NOISE_KEY: {"seed": 5, "scale": 0.2, "layer": "input"}}})


def _groups(n_groups=3, n=8, seed=0):
    rng = random.Random(seed)
    index = np.array([f"p{g}" for g in range(n_groups) for _ in range(n)], dtype=object)
    flags = []
    for _ in range(n_groups):
        picked = set(rng.sample(range(n), n // 2))
        flags += [i in picked for i in range(n)]
    return index, flags


def test_group_flag_check_wants_exactly_the_fraction_in_every_group():
    index, flags = _groups()
    check_group_flags(flags, index, 0.5)
    bad = list(flags)
    bad[bad.index(False)] = True
    with pytest.raises(ValueError, match=r"prompt p0 has 5 noisy responses of 8, expected 4"):
        check_group_flags(bad, index, 0.5)


def test_half_metrics_against_a_slow_reference():
    index, flags = _groups()
    rng = random.Random(1)
    scores = [rng.choice([0.0, 1.0, 0.5]) for _ in flags]
    acc = [float(s == 1.0) for s in scores]
    got = half_metrics(scores, flags, acc)
    noisy = [i for i, f in enumerate(flags) if f]
    clean = [i for i, f in enumerate(flags) if not f]
    assert got["noisy_fraction"] == len(noisy) / len(flags)
    assert got["score/noisy"] == pytest.approx(sum(scores[i] for i in noisy) / len(noisy))
    assert got["score/clean"] == pytest.approx(sum(scores[i] for i in clean) / len(clean))
    assert got["accuracy/noisy"] == pytest.approx(sum(acc[i] for i in noisy) / len(noisy))
    assert got["accuracy/clean"] == pytest.approx(sum(acc[i] for i in clean) / len(clean))
    assert "accuracy/noisy" not in half_metrics(scores, flags)
    assert set(half_metrics([1.0, 0.0], [False, False])) == {"noisy_fraction", "score/clean"}


def _inputs(flags, index, scores, with_fields=True):
    from verl_ext.methods import AdvantageInputs

    T = 4
    mask = torch.ones(len(flags), T, dtype=torch.int64)
    mask[::3, 2:] = 0
    rewards = torch.zeros(len(flags), T)
    lengths = mask.sum(-1)
    rewards[torch.arange(len(flags)), lengths - 1] = torch.tensor(scores)
    fields = [{FLAG_FIELD: int(f), SEED_FIELD: 1 if f else -1, "turn_scores": []} for f in flags]
    old = -torch.rand(len(flags), T, generator=torch.Generator().manual_seed(4))
    rollout = old + 1e-3
    rollout[torch.as_tensor(flags), 0] += 0.25  # the noisy first tokens' distribution moved
    return AdvantageInputs(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout},
        token_level_rewards=rewards,
        token_level_scores=rewards.clone(),
        response_mask=mask,
        index=index,
        reward_extra_info=[{"acc": float(s > 0.5)} for s in scores],
        rollout_fields=fields if with_fields else None,
    )


def test_method_advantage_is_verls_grpo_over_both_halves_pooled():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    config = method.config_from(None)
    assert (config.noise_scale, config.noisy_fraction, config.layer) == (0.1, 0.5, "final")
    index, flags = _groups()
    rng = random.Random(2)
    scores = [float(rng.random() < 0.5) for _ in flags]
    inputs = _inputs(flags, index, scores)
    result = method.compute(inputs, config)
    want, _ = compute_grpo_outcome_advantage(inputs.token_level_rewards, inputs.response_mask, index)
    assert torch.equal(result.advantages, want)
    # Pooled, by hand: one group's mean and std over all its 8 responses, noisy and clean alike.
    g0 = torch.tensor(scores[:8])
    by_hand = (g0 - g0.mean()) / (g0.std() + 1e-6)
    assert torch.allclose(result.advantages[:8, 0], by_hand, atol=1e-6)
    metrics = result.metrics
    assert metrics["noise_contrastive_grpo/noisy_fraction"] == 0.5
    for key in ("accuracy/noisy", "accuracy/clean", "score/noisy", "collapse_rate", "advantage/zero_fraction"):
        assert f"noise_contrastive_grpo/{key}" in metrics
    assert metrics["noise_contrastive_grpo/rollout_logprob_gap/noisy_first_token"] == pytest.approx(0.251, abs=1e-6)
    assert metrics["noise_contrastive_grpo/rollout_logprob_gap/other_tokens"] == pytest.approx(1e-3, abs=1e-6)
    zero = (want * inputs.response_mask).sum(-1) == 0
    assert metrics["noise_contrastive_grpo/advantage/zero_fraction"] == pytest.approx(float(zero.double().mean()))


def test_method_refuses_trajectories_without_the_flag():
    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    index, flags = _groups(1)
    inputs = _inputs(flags, index, [1.0] * 8)
    inputs.rollout_fields[3] = {"turn_scores": []}
    with pytest.raises(KeyError, match="noise_contrastive_agent"):
        method.compute(inputs, method.config_from(None))
    inputs.rollout_fields[3] = {FLAG_FIELD: int(not flags[3])}
    with pytest.raises(ValueError, match="expected 4"):
        method.compute(inputs, method.config_from(None))


def _config(**rollout):
    base = {
        "n": 8,
        "name": "vllm",
        "enable_prefix_caching": False,
        "agent": {"default_agent_loop": "noise_contrastive_agent"},
        "engine_kwargs": {"vllm": {"worker_extension_cls": "verl_ext.nc_grpo.vllm_noise.NoiseWorkerExtension"}},
    }
    base.update(rollout)
    return OmegaConf.create({"algorithm": {"norm_adv_by_std_in_grpo": True}, "actor_rollout_ref": {"rollout": base}})


def test_start_up_checks_name_the_key_to_fix():
    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    knobs = method.config_from(None)
    method.check_config(_config(), knobs)
    method.check_config(_config(name="hf_cpu", engine_kwargs={}), knobs)
    cases = [
        (_config(n=5), r"noisy_fraction=0.5 with actor_rollout_ref.rollout.n=5"),
        (_config(agent={"default_agent_loop": "seeded_single_turn_agent"}), "default_agent_loop"),
        (_config(engine_kwargs={}), "worker_extension_cls"),
        (_config(enable_prefix_caching=True), "enable_prefix_caching=false"),
        (_config(name="sglang"), "vllm and hf_cpu"),
    ]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            method.check_config(config, knobs)
    with pytest.raises(ValueError, match="layer"):
        method.check_config(_config(), method.config_from({"noise_contrastive_grpo": {"layer": "input"}}))
    with pytest.raises(ValueError, match="noise_scale"):
        method.check_config(_config(), method.config_from({"noise_contrastive_grpo": {"noise_scale": -1.0}}))


def _loop(n=8, seed=0, **knobs):
    from verl_ext.methods.noise_contrastive_grpo import NoiseContrastiveConfig
    from verl_ext.nc_grpo.agent_loop import NoiseContrastiveAgentLoop

    loop = object.__new__(NoiseContrastiveAgentLoop)  # no server: only the request's params are built here
    loop.rollout_config = SimpleNamespace(seed=seed, n=n)
    loop.nc_grpo = NoiseContrastiveConfig(**knobs)
    return loop


def test_agent_loop_flags_exactly_the_fraction_and_only_training_prompts():
    from verl_ext.nc_grpo.agent_loop import trajectory_fields
    from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop

    loop = _loop(noise_scale=0.3)
    seeded = object.__new__(SeededSingleTurnAgentLoop)
    seeded.rollout_config = loop.rollout_config
    base = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    for step, row in ((1, 0), (1, 1), (4, 2)):
        uid = prompt_uid(0, step, 0, row)
        noisy = noisy_responses(0, step, uid, 8, 0.5)
        flagged = []
        for i in range(8):
            kwargs = {"uid": uid, "global_steps": step, "session_id": i}
            params = loop.request_sampling_params(dict(base), kwargs)
            clean = seeded.request_sampling_params(dict(base), kwargs)
            fields = trajectory_fields(loop.rollout_config, loop.nc_grpo, kwargs)
            if i in noisy:
                entry = params.pop("extra_args")[NOISE_KEY]
                assert entry == {"seed": noise_seed(0, step, uid, i), "scale": 0.3, "layer": "final"}
                assert fields == {FLAG_FIELD: 1, SEED_FIELD: entry["seed"]}
                flagged.append(i)
            else:
                assert fields == {FLAG_FIELD: 0, SEED_FIELD: -1}
            # A clean request's params are the seeded loop's, and a flagged one's differ only by the noise entry.
            assert params == clean
        assert len(flagged) == 4
    # Validation prompts (verl's uuid4) are never noised.
    val = {"uid": "0b6f1f0e-8d1c-4a57-9a53-2d6f1c1f5d2e", "global_steps": 1, "session_id": 0, "raw_prompt": "q"}
    for i in range(8):
        val["session_id"] = i
        assert "extra_args" not in loop.request_sampling_params(dict(base), val)


def test_rollout_gaps_against_a_slow_reference():
    from verl_ext.algos.noise_contrastive_grpo import rollout_gaps

    rng = torch.Generator().manual_seed(9)
    R, T = 6, 5
    rollout, old = torch.randn(R, T, generator=rng), torch.randn(R, T, generator=rng)
    mask = torch.ones(R, T, dtype=torch.int64)
    mask[1, 3:] = 0
    mask[4, :] = 0  # an empty noisy response has no first token
    flags = [True, True, False, False, True, False]
    first, other = [], []
    for r in range(R):
        for t in range(T):
            if not mask[r, t]:
                continue
            gap = abs(float(rollout[r, t]) - float(old[r, t]))
            (first if flags[r] and t == 0 else other).append(gap)
    got = rollout_gaps(rollout, old, mask, flags)
    assert got["noisy_first_token"] == pytest.approx(sum(first) / len(first))
    assert got["other_tokens"] == pytest.approx(sum(other) / len(other))
    assert set(rollout_gaps(rollout, old, mask, [False] * R)) == {"other_tokens"}


def test_exact_logprob_check_leaves_out_the_noisy_first_tokens_and_only_those(monkeypatch):
    from verl_ext.cpu import logprob_check

    # Recomputed log-probs (actor's, rollout-normalised) of 3 responses of 4 tokens; the rollout's equal them but
    # for the first token of the noisy response 1, which the noise moved by 0.3.
    recomputed = {i: (torch.full((4,), -1.0 - i), torch.full((4,), -2.0 - i)) for i in range(3)}
    monkeypatch.setattr(logprob_check, "recomputed_logprobs", lambda *args: recomputed)
    rollout = torch.stack([recomputed[i][1] for i in range(3)])
    rollout[1, 0] += 0.3
    record = {
        "step": 1,
        "input_ids": [None] * 3,
        "rollout_log_probs": rollout,
        "old_log_probs": torch.stack([recomputed[i][0] for i in range(3)]),
        "extra_fields": [{FLAG_FIELD: 0}, {FLAG_FIELD: 1}, {}],
    }
    gap = logprob_check.step_gap(record, "w", None, None, 1.0)
    assert gap.tokens == 11 and gap.rollout_max == 0.0 and gap.actor_max == 0.0
    assert gap.noisy_first_tokens == 1 and gap.noisy_first_gap_mean == pytest.approx(0.3)
    # A moved token anywhere else (a clean response, or the noisy one's second token) is still caught.
    for row, col in ((0, 0), (1, 1)):
        moved = dict(record, rollout_log_probs=rollout.clone())
        moved["rollout_log_probs"][row, col] += 0.3
        assert logprob_check.step_gap(moved, "w", None, None, 1.0).rollout_max == pytest.approx(0.3)
