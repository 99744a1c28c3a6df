"""The name diva_grpo as verl sees it: registered in every process, and refusing verl's plain dispatcher."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.plugin  # noqa: F401  (registration happens in this process through the entry point, too)

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack


def test_a_fresh_process_sees_the_registration_after_import_verl():
    script = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn\n"
        "fn = get_adv_estimator_fn('diva_grpo')\n"
        "assert ADV_ESTIMATOR_REGISTRY['diva_grpo'] is fn\n"
        "print('registered', fn.__module__)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "VERL_USE_EXTERNAL_PLUGINS"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "registered verl_ext.plugin" in result.stdout


def test_verls_dispatcher_refuses_and_points_to_the_diva_trainer():
    estimator = get_adv_estimator_fn("diva_grpo")
    rewards, mask = torch.zeros(4, 3), torch.ones(4, 3)
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    # The keyword call verl's compute_advantage makes for a registered estimator.
    with pytest.raises(RuntimeError, match="DIVA trainer") as raised:
        estimator(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
    assert "compute_diva_advantage" in str(raised.value)
