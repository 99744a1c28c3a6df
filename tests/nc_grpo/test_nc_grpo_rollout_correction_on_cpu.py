"""NC-GRPO under verl 0.9.1's rollout correction (issue 44), against slow references:

* the weights the actor gets (``rollout_is_weights``, computed by the toolkit trainer with verl's
  ``compute_rollout_correction_and_add_to_batch``) are verl's formula by hand, token by token: token level
  ``min(exp(old - rollout), threshold)``, sequence level ``min(exp(sum over the response of (old - rollout)),
  threshold)`` on every token of the response, 0 on padding; the clean half's (rollout = actor) are 1;
* the toolkit trainer hands them to the method when the correction computed them, and only then;
* the method's ``rollout_is_weight/*`` metrics are those weights' mean and min over the displaced tokens and over the
  others, counted in plain Python;
* the ``hf_cpu`` server's log-probs of a noisy request (what verl's correction reads as ``rollout_log_probs``) are the
  displaced model's: each token's equals a fresh forward, without a KV cache, of the displaced model over the prompt
  and the tokens before it; they differ from the clean model's.
"""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest
import torch

from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD
from verl_ext.nc_grpo.noise import FLAG_FIELD, NOISE_KEY, SEED_FIELD, noise_seed


def _batch(seed: int = 0, rows: int = 8, width: int = 6):
    """Old and rollout log-probs of ``rows`` responses, the odd rows noisy (rollout log-probs moved by up to 1.5
    nats either way), the others clean (equal up to 1e-6); the rows padded after a random length."""
    rng = random.Random(seed)
    flags = [bool(i % 2) for i in range(rows)]
    old = [[-rng.uniform(0.01, 3.0) for _ in range(width)] for _ in range(rows)]
    rollout = [
        [o + (rng.uniform(-1.5, 1.5) if flags[i] else rng.uniform(-1e-6, 1e-6)) for o in old[i]] for i in range(rows)
    ]
    lengths = [rng.randint(1, width) for _ in range(rows)]
    mask = [[1 if t < lengths[i] else 0 for t in range(width)] for i in range(rows)]
    return flags, old, rollout, mask


def _by_hand(old, rollout, mask, level: str, threshold: float) -> list[list[float]]:
    out = []
    for o_row, r_row, m_row in zip(old, rollout, mask, strict=True):
        if level == "token":
            out.append([min(math.exp(o - r), threshold) * m for o, r, m in zip(o_row, r_row, m_row, strict=True)])
        else:
            total = sum((o - r) for o, r, m in zip(o_row, r_row, m_row, strict=True) if m)
            out.append([min(math.exp(total), threshold) * m for m in m_row])
    return out


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [2.0, 1.2])
def test_verls_weights_for_a_noisy_batch_are_its_formula_by_hand(level, threshold):
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    flags, old, rollout, mask = _batch(seed=3)
    data = DataProto.from_dict(
        tensors={
            "old_log_probs": torch.tensor(old, dtype=torch.float64),
            "rollout_log_probs": torch.tensor(rollout, dtype=torch.float64),
            "response_mask": torch.tensor(mask, dtype=torch.int64),
        }
    )
    config = {"rollout_is": level, "rollout_is_threshold": threshold, "rollout_rs": None}
    data, metrics = compute_rollout_correction_and_add_to_batch(data, config)
    got = data.batch["rollout_is_weights"].tolist()
    want = _by_hand(old, rollout, mask, level, threshold)
    for i in range(len(flags)):
        assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-12), (i, level)
        if not flags[i]:  # the clean half: sampled by the policy that is trained
            assert all(abs(w - m) < 1e-4 for w, m in zip(got[i], mask[i], strict=True))
    noisy_tokens = [w for i in range(len(flags)) if flags[i] for w, m in zip(got[i], mask[i], strict=True) if m]
    assert min(noisy_tokens) < 0.5  # the batch has noisy tokens the clean policy would rarely draw
    assert data.batch["response_mask"].tolist() == mask  # no rejection sampling asked
    assert "rollout_corr/rollout_is_mean" in metrics


def test_weight_metrics_are_the_weights_over_each_set_counted_by_hand():
    from verl_ext.algos.noise_contrastive_grpo import displaced_tokens, is_weight_metrics

    flags, old, rollout, mask = _batch(seed=6)
    weights = _by_hand(old, rollout, mask, "token", 2.0)
    displaced = displaced_tokens(torch.tensor(mask), flags, "layer_input")
    got = is_weight_metrics(torch.tensor(weights, dtype=torch.float64), torch.tensor(mask), displaced)
    sets = {"displaced_tokens": [], "other_tokens": []}
    for i in range(len(flags)):
        for w, m in zip(weights[i], mask[i], strict=True):
            if m:
                sets["displaced_tokens" if flags[i] else "other_tokens"].append(w)
    for name, values in sets.items():
        assert got[f"mean/{name}"] == pytest.approx(sum(values) / len(values), rel=1e-12)
        assert got[f"min/{name}"] == pytest.approx(min(values), rel=1e-12)
    below = sum(w < 0.5 for w in sets["displaced_tokens"]) / len(sets["displaced_tokens"])
    assert got["below_half/displaced_tokens"] == pytest.approx(below)
    assert 0 < below < 1
    # final_hidden: only the noisy first tokens are displaced.
    first = displaced_tokens(torch.tensor(mask), flags, "final_hidden")
    got = is_weight_metrics(torch.tensor(weights, dtype=torch.float64), torch.tensor(mask), first)
    firsts = [weights[i][0] for i in range(len(flags)) if flags[i]]
    assert got["mean/displaced_tokens"] == pytest.approx(sum(firsts) / len(firsts), rel=1e-12)
    # No displaced token at all: only the other tokens' figures.
    none = is_weight_metrics(
        torch.tensor(weights, dtype=torch.float64), torch.tensor(mask), torch.zeros(len(flags), 6, dtype=torch.bool)
    )
    assert set(none) == {"mean/other_tokens", "min/other_tokens"}


def _groups(groups: int = 2, n: int = 4):
    index = np.array([f"u{g}" for g in range(groups) for _ in range(n)], dtype=object)
    flags = [i % n >= n // 2 for i in range(groups * n)]
    return index, flags


def _inputs(weights: torch.Tensor | None):
    from verl_ext.methods import AdvantageInputs

    index, flags = _groups()
    rows, width = len(flags), 6
    _, old, rollout, mask = _batch(seed=9, rows=rows, width=width)
    mask_t = torch.tensor(mask)
    scores = [float(i % 3 == 0) for i in range(rows)]
    rewards = torch.zeros(rows, width)
    rewards[torch.arange(rows), mask_t.sum(-1) - 1] = torch.tensor(scores)
    tensors = {"old_log_probs": torch.tensor(old), "rollout_log_probs": torch.tensor(rollout)}
    if weights is not None:
        tensors["rollout_is_weights"] = weights
    fields = [{FLAG_FIELD: int(f), SEED_FIELD: 1 if f else -1, FIRST_DIFFERENCE_FIELD: 0 if f else -2} for f in flags]
    inputs = AdvantageInputs(
        tensors=tensors,
        token_level_rewards=rewards,
        token_level_scores=rewards.clone(),
        response_mask=mask_t,
        index=index,
        reward_extra_info=[{"acc": s} for s in scores],
        rollout_fields=fields,
    )
    return inputs, flags, mask


def test_the_method_logs_the_weights_the_actor_gets_and_nothing_without_the_correction():
    from verl_ext.methods import get_method

    method = get_method("noise_contrastive_grpo")
    config = method.config_from(None)
    plain, flags, mask = _inputs(None)
    without = method.compute(plain, config)
    assert not any("rollout_is_weight" in key for key in without.metrics)
    weights = torch.rand(len(flags), 6, generator=torch.Generator().manual_seed(1)) * torch.tensor(mask)
    corrected, _, _ = _inputs(weights)
    result = method.compute(corrected, config)
    noisy = [float(weights[i, t]) for i in range(len(flags)) if flags[i] for t in range(6) if mask[i][t]]
    clean = [float(weights[i, t]) for i in range(len(flags)) if not flags[i] for t in range(6) if mask[i][t]]
    m = result.metrics
    assert m["noise_contrastive_grpo/rollout_is_weight/mean/displaced_tokens"] == pytest.approx(sum(noisy) / len(noisy))
    assert m["noise_contrastive_grpo/rollout_is_weight/min/other_tokens"] == pytest.approx(min(clean))
    # The advantage is not where the correction acts (the actor's loss multiplies the weights in): unchanged.
    assert torch.equal(result.advantages, without.advantages)


def test_the_toolkit_trainer_hands_the_method_the_weights_when_the_correction_computed_them():
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer

    flags, old, rollout, mask = _batch(seed=11)
    tensors = {
        "old_log_probs": torch.tensor(old),
        "rollout_log_probs": torch.tensor(rollout),
        "response_mask": torch.tensor(mask),
    }
    trainer = object.__new__(ToolkitTrainer)
    idx = torch.tensor([3, 0, 5, 1])
    needs = frozenset({"old_log_probs", "rollout_log_probs"})
    off, _ = compute_rollout_correction_and_add_to_batch(
        DataProto.from_dict(tensors=dict(tensors)), {"rollout_is": None}
    )
    assert set(trainer._method_tensors(off, needs, idx)) == {"old_log_probs", "rollout_log_probs"}
    data, _ = compute_rollout_correction_and_add_to_batch(
        DataProto.from_dict(tensors=dict(tensors)), {"rollout_is": "sequence", "rollout_is_threshold": 2.0}
    )
    got = trainer._method_tensors(data, needs, idx)
    want = _by_hand(old, rollout, mask, "sequence", 2.0)
    for row, i in zip(got["rollout_is_weights"].tolist(), idx.tolist(), strict=True):
        assert row == pytest.approx(want[i], rel=1e-5)


@pytest.mark.gpu_stack
def test_hf_cpu_serves_a_noisy_requests_log_probs_from_the_displaced_model(tmp_path):
    pytest.importorskip("torchvision")
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from verl_ext.cpu.rollout import HFCpuServer
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl
    from verl_ext.nc_grpo.hf_hook import prefill_noise

    model_dir = build_tiny_qwen2_vl(str(tmp_path / "model"))
    rollout = RolloutConfig(name="hf_cpu", prompt_length=256, response_length=10, calculate_log_probs=True)
    server = HFCpuServer.__ray_actor_class__(rollout, HFModelConfig(path=model_dir), 0, RolloutMode.HYBRID)
    messages = [{"role": "user", "content": "Which colour is the square? Answer in one word."}]
    text = server.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = list(server.tokenizer(text)["input_ids"])
    temperature = 0.7
    noise = {"seed": noise_seed(0, 1, "u", 5), "scale": 2.0, "target": "layer_input", "layer": -1}
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": 17}
    out = asyncio.run(
        server.generate(
            prompt_ids=prompt_ids, sampling_params={**params, "extra_args": {NOISE_KEY: noise}}, request_id="n"
        )
    )
    assert len(out.token_ids) >= 3

    @torch.no_grad()
    def reference(noise_entry) -> list[float]:
        """Each token's log-prob from a fresh forward (no cache) over the prompt and the tokens before it."""
        values = []
        for t, token in enumerate(out.token_ids):
            ids = torch.tensor([prompt_ids + out.token_ids[:t]])
            with prefill_noise(server.model, noise_entry, len(prompt_ids), total_len=ids.shape[1]):
                logits = server.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].double()
            values.append(float(torch.log_softmax(logits / temperature, -1)[token]))
        return values

    displaced, clean = reference(noise), reference(None)
    assert out.log_probs == pytest.approx(displaced, abs=2e-5)
    # What the rollout correction reads is the displaced policy's, not the clean one's: they differ.
    assert max(abs(a - b) for a, b in zip(out.log_probs, clean, strict=True)) > 1e-3


def _launcher_config(script: str, **env):
    import os
    import subprocess
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    root = Path(__file__).resolve().parents[2]
    run_env = {**os.environ, "DIVA_PRINT_ONLY": "1", **env}
    out = subprocess.run(["bash", script], cwd=root, env=run_env, capture_output=True, text=True, check=True)
    overrides = [line for line in out.stdout.splitlines() if line]
    with initialize_config_dir(config_dir=str(root / "recipe" / "diva_grpo" / "config"), version_base=None):
        return compose("diva_grpo", overrides=overrides)


def test_the_methods_launchers_set_its_rollout_correction_and_only_its_own():
    from verl_ext.cpu.overrides import _nc_grpo_overrides
    from verl_ext.methods.noise_contrastive_grpo import ROLLOUT_IS, ROLLOUT_IS_THRESHOLD

    nc = _launcher_config("run_scripts/qwen25vl7b_noise_contrastive_grpo.sh")
    assert nc.algorithm.rollout_correction.rollout_is == ROLLOUT_IS == "sequence"
    assert nc.algorithm.rollout_correction.rollout_is_threshold == ROLLOUT_IS_THRESHOLD == 2.0
    off = _launcher_config("run_scripts/qwen25vl7b_noise_contrastive_grpo.sh", ROLLOUT_IS="null")
    assert off.algorithm.rollout_correction.rollout_is is None
    token = _launcher_config("run_scripts/qwen25vl7b_noise_contrastive_grpo.sh", ROLLOUT_IS="token")
    assert token.algorithm.rollout_correction.rollout_is == "token"
    # The recipe's shared algorithm block leaves every other method uncorrected (GRPO's launcher among them).
    grpo = _launcher_config("run_scripts/qwen25vl7b_grpo.sh")
    assert grpo.algorithm.rollout_correction.rollout_is is None
    # The CPU runs (compare_tiny.sh, the sweep) get the same from the CPU launcher's overrides.
    cpu = _nc_grpo_overrides("noise_contrastive_grpo")
    assert f"algorithm.rollout_correction.rollout_is={ROLLOUT_IS}" in cpu
    assert f"algorithm.rollout_correction.rollout_is_threshold={ROLLOUT_IS_THRESHOLD}" in cpu
    assert _nc_grpo_overrides("grpo") == []
