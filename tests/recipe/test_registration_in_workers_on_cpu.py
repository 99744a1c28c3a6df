"""diva_grpo is registered in Ray worker processes: through the verl.plugins entry point of the installed package,
and through runtime_env.yaml's VERL_USE_EXTERNAL_MODULES where the package is not installed."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
import yaml

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, namespace="test_registration", log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
def registered_in_this_worker() -> dict:
    import sys

    import verl  # noqa: F401  (loads plugins)
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    # Read before anything of ours is imported by hand: only verl's own loading can have registered it.
    estimator = "diva_grpo" in ADV_ESTIMATOR_REGISTRY and "recipe.diva_grpo.trainer" not in sys.modules

    from verl.trainer.ppo.v1 import get_trainer_cls

    import recipe.diva_grpo.trainer  # noqa: F401  (what DivaTaskRunner.run imports first)

    return {"estimator": estimator, "trainer": get_trainer_cls("diva_grpo").__name__}


def test_entry_point_registers_in_a_worker(local_ray):
    assert ray.get(registered_in_this_worker.remote()) == {"estimator": True, "trainer": "DivaTrainer"}


def test_runtime_env_registers_without_the_entry_point(local_ray):
    env_vars = yaml.safe_load((ROOT / "recipe/diva_grpo/runtime_env.yaml").read_text())["env_vars"]
    # Entry points off: only the runtime environment's VERL_USE_EXTERNAL_MODULES can register the estimator.
    runtime_env = {"env_vars": {**env_vars, "VERL_USE_EXTERNAL_PLUGINS": "none"}}
    result = ray.get(registered_in_this_worker.options(runtime_env=runtime_env).remote())
    assert result == {"estimator": True, "trainer": "DivaTrainer"}


def test_task_runner_is_verls_with_the_trainer_registered_first():
    from verl.trainer.main_ppo import TaskRunnerV1

    from recipe.diva_grpo.main_diva import DivaTaskRunner

    assert issubclass(DivaTaskRunner.__ray_actor_class__, TaskRunnerV1.__ray_actor_class__)
    assert "run" in vars(DivaTaskRunner.__ray_actor_class__)
