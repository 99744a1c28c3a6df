"""Every toolkit method as verl sees it: registered in a fresh process whatever is imported first, AVSPO usable
through verl's plain dispatcher, the others refusing it with a message naming the toolkit trainer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from verl_ext.algos import compute_avspo_advantage
from verl_ext.plugin import TOOLKIT_METHODS

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

# verl registers grpo itself; the toolkit adds its view of it (the baseline on the toolkit trainer).
NAMES = ["diva_grpo", "grpo", *TOOLKIT_METHODS]


def test_the_plugins_list_is_the_toolkits_methods():
    # A fresh process: other tests (and users) may register their own methods in this one.
    script = "import verl_ext.methods as m; print(' '.join(sorted(m.METHODS)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == sorted(NAMES)


@pytest.mark.parametrize("first_import", ["verl", "verl_ext.config", "verl_ext.methods", "data_prep.cli"])
def test_a_fresh_process_registers_every_method_whatever_it_imports_first(first_import):
    script = (
        f"import {first_import}\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY\n"
        f"missing = [n for n in {NAMES!r} if n not in ADV_ESTIMATOR_REGISTRY]\n"
        "assert not missing, missing\n"
        "print('all registered')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all registered" in result.stdout


def verl_call(name, rewards, mask, uid):
    # The keyword call verl's compute_advantage makes for a registered estimator.
    return get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)


def test_avspo_runs_in_verls_plain_dispatcher_with_its_paper_defaults():
    rewards = torch.zeros(6, 3)
    rewards[[0, 3], -1] = 1.0
    mask = torch.ones(6, 3, dtype=torch.int64)
    uid = np.array(["a", "a", "a", "b", "c", "c"], dtype=object)
    advantages, returns = verl_call("avspo", rewards, mask, uid)
    expected, _ = compute_avspo_advantage(rewards, mask, uid)
    torch.testing.assert_close(advantages, expected)
    assert advantages[4:].abs().sum() > 0, "the collapsed group c got virtual samples"


@pytest.mark.parametrize("name", [n for n in TOOLKIT_METHODS if n != "avspo"])
def test_methods_needing_more_than_uid_refuse_verls_dispatcher(name):
    with pytest.raises(RuntimeError, match="trainer.v1.trainer_mode=toolkit") as raised:
        verl_call(name, torch.zeros(2, 3), torch.ones(2, 3), np.array(["a", "a"], dtype=object))
    assert f"qwen25vl7b_{name}.sh" in str(raised.value)


def test_the_toolkits_grpo_leaves_verls_estimator_in_place_and_computes_it():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from verl_ext.methods import AdvantageInputs, get_method

    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    rewards = torch.zeros(5, 3)
    rewards[[0, 3], -1] = 1.0
    mask = torch.ones(5, 3, dtype=torch.int64)
    mask[1, 2] = 0
    uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
    result = get_method("grpo").compute(AdvantageInputs(rewards, rewards, mask, uid), None)
    expected, _ = compute_grpo_outcome_advantage(rewards, mask, uid)
    torch.testing.assert_close(result.advantages, expected)
    # b is split (0, 1), a is split (1, 0), c is a group of one: one of three groups collapsed.
    assert result.metrics["grpo/collapse_rate"] == pytest.approx(1 / 3)
