"""NC-GRPO's pure parts against slow obvious references: the displacement (one vector and per row), the noise draws,
the layer index, the seeded choice of the noisy responses, the trainer's flag check and per-half metrics, the branch
metrics against a by-hand count, the displaced tokens and their log-prob gaps, the advantage (verl's GRPO, halves
pooled), the start-up checks, the agent loop's flags, sampling params and clean-twin probe, and the exact log-prob
check's treatment of noisy samples."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.algos.noise_contrastive_grpo import check_group_flags, half_metrics
from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD, NOT_PROBED
from verl_ext.nc_grpo.noise import (
    FLAG_FIELD,
    NOISE_KEY,
    SEED_FIELD,
    applied_record,
    displacement,
    noise_rows,
    noise_seed,
    noise_vector,
    noisy_count,
    noisy_responses,
    perturb,
    request_noise,
    resolve_layer,
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


def test_perturb_displaces_each_row_by_its_own_norm():
    rng = torch.Generator().manual_seed(5)
    h = torch.randn(7, 33, generator=rng) * torch.arange(1, 8)[:, None]  # rows of different norms
    xi = torch.randn(7, 33, generator=rng)
    got = perturb(h, xi, 0.2)
    for row in range(7):
        want = _slow_perturb(h[row].double().tolist(), xi[row].double().tolist(), 0.2)
        assert torch.allclose(got[row].double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(displacement(h, xi, 0.2), got - h, atol=1e-5)


def test_noise_rows_are_the_rows_of_one_prompt_sized_draw():
    full = torch.randn(40, 12, generator=torch.Generator().manual_seed(99))
    assert torch.equal(noise_rows(99, 40, 0, 40, 12), full)
    # Any chunking gives the rows of the same draw (a shorter draw is not a prefix of a longer one in torch).
    assert torch.equal(torch.cat([noise_rows(99, 40, 0, 13, 12), noise_rows(99, 40, 13, 40, 12)]), full)
    # Why the whole matrix is drawn: a draw of 39 rows is not the first 39 rows of a draw of 40 (torch's CPU sampler
    # redoes the last 16 numbers of a tensor), so the rows of a prompt's tail would depend on the chunk's end.
    assert not torch.equal(torch.randn(39, 12, generator=torch.Generator().manual_seed(99))[38], full[38])
    assert not torch.equal(noise_rows(98, 40, 0, 40, 12), full)
    with pytest.raises(ValueError, match="outside a prompt"):
        noise_rows(99, 40, 30, 41, 12)


def test_resolve_layer_counts_negative_indices_from_the_end_and_names_the_key():
    assert [resolve_layer(i, 4) for i in (0, 3, -1, -4)] == [0, 3, 3, 0]
    for bad in (4, -5):
        with pytest.raises(ValueError, match=r"noise_contrastive_grpo\.layer=.*4 decoder layers"):
            resolve_layer(bad, 4)


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
    entry = {"seed": 5, "scale": 0.2, "target": "layer_input", "layer": -1}
    assert request_noise({"extra_args": {NOISE_KEY: entry}}) == entry
    final = {"seed": 5, "scale": 0.2, "target": "final_hidden", "layer": 3}
    assert request_noise({"extra_args": {NOISE_KEY: final}}) == final
    with pytest.raises(ValueError, match="target"):
        request_noise({"extra_args": {NOISE_KEY: {"seed": 5, "scale": 0.2, "layer": "final"}}})
    with pytest.raises(ValueError, match="layer"):
        request_noise({"extra_args": {NOISE_KEY: {**entry, "layer": "final"}}})


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
    # Noisy responses' first differences with their clean twins: 0, 2, -1 (no branch), 0, ...
    diffs = iter([0, 2, -1] * len(flags))
    fields = [
        {FLAG_FIELD: int(f), SEED_FIELD: 1 if f else -1, FIRST_DIFFERENCE_FIELD: next(diffs) if f else NOT_PROBED}
        for f in flags
    ]
    old = -torch.rand(len(flags), T, generator=torch.Generator().manual_seed(4))
    rollout = old + 1e-3
    rollout[torch.as_tensor(flags), 0] += 0.25  # the noisy responses' distributions moved: by 0.25 on the first
    rollout[torch.as_tensor(flags), 1:] += 0.05  # token, by 0.05 on the others
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
    assert (config.noisy_fraction, config.target, config.layer, config.branch_probe_tokens) == (
        0.5,
        "layer_input",
        -1,
        32,
    )
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
    # layer_input: every token of a noisy response is displaced; the clean responses' tokens agree to 1e-3.
    mask = inputs.response_mask.bool()
    noisy_rows = torch.as_tensor(flags)
    first = (mask & noisy_rows[:, None])[:, 0].sum()
    later = (mask & noisy_rows[:, None])[:, 1:].sum()
    want_gap = float((first * 0.251 + later * 0.051) / (first + later))
    assert metrics["noise_contrastive_grpo/rollout_logprob_gap/displaced_tokens"] == pytest.approx(want_gap, abs=1e-6)
    assert metrics["noise_contrastive_grpo/rollout_logprob_gap/other_tokens"] == pytest.approx(1e-3, abs=1e-6)
    zero = (want * inputs.response_mask).sum(-1) == 0
    assert metrics["noise_contrastive_grpo/advantage/zero_fraction"] == pytest.approx(float(zero.double().mean()))
    # Branch metrics, by hand: the noisy responses' first differences cycle 0, 2, -1 in row order.
    cycle = [[0, 2, -1][k % 3] for k in range(sum(flags))]
    assert metrics["noise_contrastive_grpo/branch/probed"] == len(cycle)
    assert metrics["noise_contrastive_grpo/branch/first_token"] == pytest.approx(cycle.count(0) / len(cycle))
    assert metrics["noise_contrastive_grpo/branch/rate"] == pytest.approx(sum(d >= 0 for d in cycle) / len(cycle))
    branched = [d for d in cycle if d >= 0]
    assert metrics["noise_contrastive_grpo/branch/first_difference_mean"] == pytest.approx(
        sum(branched) / len(branched)
    )
    # final_hidden: only the noisy first tokens are displaced; the later ones count with the others.
    final = method.compute(inputs, method.config_from({"noise_contrastive_grpo": {"target": "final_hidden"}})).metrics
    assert final["noise_contrastive_grpo/rollout_logprob_gap/displaced_tokens"] == pytest.approx(0.251, abs=1e-6)
    others = (mask.sum() - first) * 1e-3 + later * 0.05
    assert final["noise_contrastive_grpo/rollout_logprob_gap/other_tokens"] == pytest.approx(
        float(others / (mask.sum() - first)), abs=1e-6
    )


def test_a_step_whose_noise_branched_nothing_says_so_on_the_console(capsys):
    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    index, flags = _groups(2)
    inputs = _inputs(flags, index, [1.0, 0.0] * 8)
    for fields in inputs.rollout_fields:
        if fields[FLAG_FIELD]:
            fields[FIRST_DIFFERENCE_FIELD] = -1
    inputs.global_step = 7
    metrics = method.compute(inputs, method.config_from(None)).metrics
    assert metrics["noise_contrastive_grpo/branch/rate"] == 0.0
    line = capsys.readouterr().out
    assert "[nc_grpo] warning: step 7: 0 of 8 noisy rollouts differ" in line and "noise_scale" in line
    inputs.rollout_fields[flags.index(True)][FIRST_DIFFERENCE_FIELD] = 5
    method.compute(inputs, method.config_from(None))
    assert capsys.readouterr().out == ""  # 1 of 8 branched: no warning
    for fields in inputs.rollout_fields:
        fields[FIRST_DIFFERENCE_FIELD] = NOT_PROBED  # probe off (or the preflight's simulated rollouts)
    metrics = method.compute(inputs, method.config_from(None)).metrics
    assert not any("/branch/" in key for key in metrics) and capsys.readouterr().out == ""


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


def _config(model_path: str = "", **rollout):
    base = {
        "n": 8,
        "name": "vllm",
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "agent": {"default_agent_loop": "noise_contrastive_agent"},
        "engine_kwargs": {"vllm": {"worker_extension_cls": "verl_ext.nc_grpo.vllm_noise.NoiseWorkerExtension"}},
    }
    base.update(rollout)
    return OmegaConf.create(
        {
            "algorithm": {"norm_adv_by_std_in_grpo": True},
            "actor_rollout_ref": {"rollout": base, "model": {"path": model_path}},
        }
    )


def test_start_up_checks_name_the_key_to_fix(tmp_path):
    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    knobs = method.config_from(None)

    def knob(**values):
        return method.config_from({"noise_contrastive_grpo": values})

    method.check_config(_config(), knobs)
    method.check_config(_config(name="hf_cpu", engine_kwargs={}, enforce_eager=False), knobs)
    # The first-token reading runs outside vLLM's compiled model: no eager model needed.
    method.check_config(_config(enforce_eager=False), knob(target="final_hidden"))
    cases = [
        (_config(n=5), knobs, r"noisy_fraction=0.5 with actor_rollout_ref.rollout.n=5"),
        (_config(agent={"default_agent_loop": "seeded_single_turn_agent"}), knobs, "default_agent_loop"),
        (_config(engine_kwargs={}), knobs, "worker_extension_cls"),
        (_config(enable_prefix_caching=True), knobs, "enable_prefix_caching=false"),
        (
            _config(enforce_eager=False),
            knobs,
            r"target=layer_input on vLLM: set actor_rollout_ref\.rollout\.enforce_eager",
        ),
        (_config(name="sglang"), knobs, "vllm and hf_cpu"),
        (_config(), knob(target="final"), r"target='final'.*the former layer: final is target: final_hidden"),
        (_config(), knob(layer="final"), r"layer='final'.*target: final_hidden"),
        (_config(), knob(noise_scale=-1.0), "noise_scale"),
        (_config(), knob(branch_probe_tokens=-1), "branch_probe_tokens"),
    ]
    for config, values, message in cases:
        with pytest.raises(ValueError, match=message):
            method.check_config(config, values)
    # A layer outside a local model is refused at start-up (its config.json: 2 decoder layers in the text config).
    (tmp_path / "config.json").write_text('{"text_config": {"num_hidden_layers": 2}}')
    method.check_config(_config(str(tmp_path)), knob(layer=-2))
    with pytest.raises(ValueError, match=r"noise_contrastive_grpo\.layer=2: the model has 2 decoder layers"):
        method.check_config(_config(str(tmp_path)), knob(layer=2))


def _loop(n=8, seed=0, **knobs):
    from verl_ext.methods.noise_contrastive_grpo import NoiseContrastiveConfig
    from verl_ext.nc_grpo.agent_loop import NoiseContrastiveAgentLoop

    loop = object.__new__(NoiseContrastiveAgentLoop)  # no server: only the request's params are built here
    loop.rollout_config = SimpleNamespace(seed=seed, n=n, response_length=16)
    loop.nc_grpo = NoiseContrastiveConfig(**knobs)
    return loop


def test_agent_loop_flags_exactly_the_fraction_and_only_training_prompts():
    from verl_ext.nc_grpo.agent_loop import trajectory_fields
    from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop

    loop = _loop(noise_scale=0.3, layer=-2)
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
                seed = noise_seed(0, step, uid, i)
                assert entry == {"seed": seed, "scale": 0.3, "target": "layer_input", "layer": -2}
                assert fields == {FLAG_FIELD: 1, SEED_FIELD: seed, FIRST_DIFFERENCE_FIELD: NOT_PROBED}
                flagged.append(i)
            else:
                assert fields == {FLAG_FIELD: 0, SEED_FIELD: -1, FIRST_DIFFERENCE_FIELD: NOT_PROBED}
            # A clean request's params are the seeded loop's, and a flagged one's differ only by the noise entry.
            assert params == clean
        assert len(flagged) == 4
    # Validation prompts (verl's uuid4) are never noised.
    val = {"uid": "0b6f1f0e-8d1c-4a57-9a53-2d6f1c1f5d2e", "global_steps": 1, "session_id": 0, "raw_prompt": "q"}
    for i in range(8):
        val["session_id"] = i
        assert "extra_args" not in loop.request_sampling_params(dict(base), val)


def _slow_first_difference(a, b, limit):
    a, b = list(a)[:limit], list(b)[:limit]
    for k in range(max(len(a), len(b))):
        if k >= len(a) or k >= len(b) or a[k] != b[k]:
            return k
    return -1


def test_first_difference_and_branch_metrics_against_a_by_hand_count():
    from verl_ext.nc_grpo.branching import branch_metrics, branch_warning, first_difference

    rng = random.Random(3)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        b = list(a) if rng.random() < 0.4 else [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        limit = rng.randrange(1, 9)
        assert first_difference(a, b, limit) == _slow_first_difference(a, b, limit), (a, b, limit)
    assert first_difference([1, 2, 3], [1, 2], 2) == -1 and first_difference([1, 2, 3], [1, 2], 3) == 2
    assert first_difference([1], [2], 0) == NOT_PROBED

    # 10 responses: 6 noisy (4 probed), 4 clean (never counted, whatever their field says).
    flags = [True, True, False, True, True, False, True, False, True, False]
    diffs = [0, -1, 3, 4, NOT_PROBED, 0, 0, -1, NOT_PROBED, 7]
    got = branch_metrics(diffs, flags)
    # By hand: probed noisy rows 0, 1, 3, 6 -> 0, -1, 4, 0: 3 branched, 2 at the first token, first at 0, 4, 0.
    assert got == {
        "branch/probed": 4.0,
        "branch/first_token": 0.5,
        "branch/rate": 0.75,
        "branch/first_difference_mean": pytest.approx(4 / 3),
    }
    assert branch_metrics([NOT_PROBED, 2], [True, False]) == {}
    assert branch_warning(got, 32, "step 1", "layer_input") is None
    quiet = branch_metrics([-1] * 150, [True] * 150)
    assert "first_difference_mean" not in quiet
    final = branch_warning(quiet, 32, "step 2", "final_hidden")
    assert final.startswith("[nc_grpo] warning: step 2: 0 of 150") and "target=layer_input" in final
    assert "target=layer_input" not in branch_warning(quiet, 32, "step 2", "layer_input")
    # One branch in 150 is below the 1% line: still a warning; two are not.
    assert branch_warning(branch_metrics([0] + [-1] * 149, [True] * 150), 32, "s", "layer_input")
    assert branch_warning(branch_metrics([0, 5] + [-1] * 148, [True] * 150), 32, "s", "layer_input") is None


class _Servers:
    """A stand-in server manager: each request's tokens from a function of its params; calls are recorded."""

    def __init__(self, tokens_for):
        self.tokens_for, self.calls = tokens_for, []

    async def generate(self, *, request_id, sampling_params, **kwargs):
        self.calls.append((request_id, dict(sampling_params), kwargs))
        return SimpleNamespace(token_ids=self.tokens_for(sampling_params), extra_fields={})


def test_branch_probe_sends_the_clean_twin_with_the_same_draw():
    import asyncio

    from verl_ext.nc_grpo.agent_loop import BranchProbe, clean_twin_params

    noise = {"seed": 3, "scale": 0.1, "target": "layer_input", "layer": -1}
    params = {"temperature": 1.0, "seed": 42, "logprobs": True, "extra_args": {NOISE_KEY: noise, "other": 1}}
    assert clean_twin_params(params, 5) == {
        "temperature": 1.0,
        "seed": 42,
        "logprobs": True,
        "extra_args": {"other": 1},
        "max_tokens": 5,
    }
    alone = {"temperature": 1.0, "seed": 42, "extra_args": {NOISE_KEY: noise}}
    assert clean_twin_params(alone, 5) == {"temperature": 1.0, "seed": 42, "max_tokens": 5}

    servers = _Servers(
        lambda p: (
            [1, 2, 9, 9] if "extra_args" in p and NOISE_KEY in p["extra_args"] else [1, 2, 3][: p.get("max_tokens", 9)]
        )
    )
    probe = BranchProbe(servers, 3)
    out = asyncio.run(probe.generate(request_id="r", sampling_params=params, prompt_ids=[7, 8], image_data=None))
    assert out.token_ids == [1, 2, 9, 9] and probe.first_difference == 2
    (main_id, main_params, main_kw), (twin_id, twin_params, twin_kw) = servers.calls
    assert main_id == "r" and main_params == params and twin_id != "r"
    assert twin_params == clean_twin_params(params, 3) and main_kw == twin_kw == {
        "prompt_ids": [7, 8],
        "image_data": None,
    }
    assert probe.tokens_for is servers.tokens_for  # anything else is the server manager's


def test_agent_loop_probes_only_flagged_requests_and_records_the_first_difference(monkeypatch):
    import asyncio

    from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop

    async def single_turn(self, sampling_params, **kwargs):  # verl's loop: one generate call with these params
        params = self.request_sampling_params(sampling_params, kwargs)
        output = await self.server_manager.generate(request_id="x", sampling_params=params, prompt_ids=[1])
        return SimpleNamespace(token_ids=output.token_ids, extra_fields={"turn_scores": []})

    monkeypatch.setattr(SeededSingleTurnAgentLoop, "run", single_turn)
    uid = prompt_uid(0, 1, 0, 0)
    noisy = noisy_responses(0, 1, uid, 8, 0.5)
    for probe_tokens in (4, 0):
        for i in range(8):
            loop = _loop(branch_probe_tokens=probe_tokens)
            servers = _Servers(lambda p: [5, 6, 7] if NOISE_KEY in (p.get("extra_args") or {}) else [5, 6, 0])
            loop.server_manager = servers
            out = asyncio.run(loop.run({"temperature": 1.0}, uid=uid, global_steps=1, session_id=i))
            probed = i in noisy and probe_tokens > 0
            assert len(servers.calls) == 1 + probed
            assert out.extra_fields[FLAG_FIELD] == int(i in noisy)
            assert out.extra_fields[FIRST_DIFFERENCE_FIELD] == (2 if probed else NOT_PROBED)
            if probed:
                assert servers.calls[1][1]["max_tokens"] == 4 and "extra_args" not in servers.calls[1][1]


def _slow_displaced(mask, flags, target):
    out = torch.zeros_like(mask, dtype=torch.bool)
    for r in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            out[r, t] = bool(mask[r, t]) and flags[r] and (target == "layer_input" or t == 0)
    return out


def test_displaced_tokens_and_rollout_gaps_against_a_slow_reference():
    from verl_ext.algos.noise_contrastive_grpo import displaced_tokens, rollout_gaps

    rng = torch.Generator().manual_seed(9)
    R, T = 6, 5
    rollout, old = torch.randn(R, T, generator=rng), torch.randn(R, T, generator=rng)
    mask = torch.ones(R, T, dtype=torch.int64)
    mask[1, 3:] = 0
    mask[4, :] = 0  # an empty noisy response has no token
    flags = [True, True, False, False, True, False]
    for target in ("layer_input", "final_hidden"):
        displaced = displaced_tokens(mask, flags, target)
        assert torch.equal(displaced, _slow_displaced(mask, flags, target))
        moved, other = [], []
        for r in range(R):
            for t in range(T):
                if mask[r, t]:
                    gap = abs(float(rollout[r, t]) - float(old[r, t]))
                    (moved if displaced[r, t] else other).append(gap)
        got = rollout_gaps(rollout, old, mask, displaced)
        assert got["displaced_tokens"] == pytest.approx(sum(moved) / len(moved))
        assert got["other_tokens"] == pytest.approx(sum(other) / len(other))
    assert set(rollout_gaps(rollout, old, mask, displaced_tokens(mask, [False] * R, "layer_input"))) == {"other_tokens"}
    with pytest.raises(ValueError, match="target"):
        displaced_tokens(mask, flags, "final")


def test_exact_logprob_check_holds_noisy_samples_to_their_displaced_recomputation(monkeypatch):
    from verl_ext.checks import logprob_check

    # 3 responses of 4 tokens; 1 is noisy. The clean model's log-probs (actor's, rollout-normalised), and the displaced
    # recomputation of sample 1, whose every token moved (layer_input: 0.3 on the first, 0.1 on the others).
    clean = {i: (torch.full((4,), -1.0 - i), torch.full((4,), -2.0 - i)) for i in range(3)}
    shift = torch.tensor([0.3, 0.1, 0.1, 0.1])
    displaced = {1: (clean[1][0] + shift, clean[1][1] + shift)}
    seen = []

    def recompute(record, weights, processor, tokenizer, temperature, noises=None):
        seen.append(noises)
        return clean if noises is None else {i: displaced[i] for i in noises}

    monkeypatch.setattr(logprob_check, "recomputed_logprobs", recompute)
    rollout = torch.stack([clean[0][1], displaced[1][1], clean[2][1]])
    record = {
        "step": 1,
        "input_ids": [None] * 3,
        "is_padding": [False] * 3,
        "rollout_log_probs": rollout,
        "old_log_probs": torch.stack([clean[i][0] for i in range(3)]),  # the clean actor's, every sample
        "extra_fields": [{FLAG_FIELD: 0}, {FLAG_FIELD: 1, SEED_FIELD: 77}, {}],
    }
    knobs = {"scale": 0.2, "target": "layer_input", "layer": -1}
    gap = logprob_check.step_gap(record, "w", None, None, 1.0, knobs)
    assert seen[-1] == {1: {"seed": 77, **knobs}}  # the noisy sample, with its own seed and the run's knobs
    assert gap.tokens == 12 and gap.rollout_max == 0.0 and gap.actor_max == 0.0
    assert gap.displaced_tokens == 4 and gap.displaced_gap_mean == pytest.approx(float(shift.mean()))
    final = logprob_check.step_gap(record, "w", None, None, 1.0, {**knobs, "target": "final_hidden"})
    assert final.displaced_tokens == 1 and final.displaced_gap_mean == pytest.approx(0.3)
    # A token that is neither policy's, anywhere (a clean sample, the noisy one's first or later token), is caught.
    for row, col in ((0, 0), (1, 0), (1, 2)):
        moved = dict(record, rollout_log_probs=rollout.clone())
        moved["rollout_log_probs"][row, col] += 0.3
        assert logprob_check.step_gap(moved, "w", None, None, 1.0, knobs).rollout_max == pytest.approx(0.3)
    # A noisy sample held to the clean model (what the old check did for all but its first token) fails.
    as_clean = dict(record, rollout_log_probs=torch.stack([clean[i][1] for i in range(3)]))
    assert logprob_check.step_gap(as_clean, "w", None, None, 1.0, knobs).rollout_max == pytest.approx(0.3)
    with pytest.raises(logprob_check.LogprobCheckError, match="noise knobs"):
        logprob_check.step_gap(record, "w", None, None, 1.0)


class _DeviceCopies(torch.overrides.TorchFunctionMode):
    """Counts the calls that copy a tensor off its device (``Tensor.cpu``, ``Tensor.to``, ``Tensor.numpy``)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("cpu", "to", "numpy"):
            self.copies += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_applied_record_leaves_the_rows_on_their_device_unless_a_check_keeps_them(dtype):
    """A served noisy request records only the displacement's relative size (one scalar); the displaced rows are
    copied off the device only when a check asked for them (``nc_grpo_keep_tensors``)."""
    generator = torch.Generator().manual_seed(0)
    before = torch.randn(5, 8, generator=generator).to(dtype)
    after = (before.float() + 0.5 * torch.randn(5, 8, generator=generator)).to(dtype)
    noise = {"seed": 3, "scale": 2.0, "target": "layer_input", "layer": 1}
    with _DeviceCopies() as light:
        record = applied_record("r", noise, 0, 5, before, after, keep_tensors=False, layer=1)
    with _DeviceCopies() as kept_mode:
        kept = applied_record("r", noise, 0, 5, before, after, keep_tensors=True, layer=1)
    assert light.copies == 0 and "hidden" not in record and "displacement" not in record
    assert kept_mode.copies >= 2
    moved = after.float() - before.float()
    assert record["relative_norm"] == pytest.approx(float(moved.norm() / before.float().norm()), rel=1e-6)
    assert kept["relative_norm"] == record["relative_norm"]
    torch.testing.assert_close(kept["displacement"], moved)
    torch.testing.assert_close(kept["hidden"], before.float())
    before.zero_()  # the caller overwrites its batch afterwards: the kept rows are copies
    assert kept["hidden"].abs().sum() > 0
