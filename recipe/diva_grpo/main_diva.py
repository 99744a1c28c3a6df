"""Entry point: ``python -m recipe.diva_grpo.main_diva [hydra overrides]``.

The same as verl's ``verl.trainer.main_ppo`` except that the task runner registers the DIVA trainer
in its own process before verl looks the trainer up, and that ``diva.dry_run=true`` runs the CPU
preflight (:mod:`recipe.diva_grpo.preflight`) instead of training.
"""

from __future__ import annotations

import os

import hydra
import ray
from omegaconf import DictConfig
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device


@ray.remote(num_cpus=1)
class DivaTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 task runner, with ``trainer_mode=diva_grpo`` registered in the runner's process."""

    def run(self, config: DictConfig):
        import recipe.diva_grpo.trainer  # noqa: F401  (registers "diva_grpo" with verl's trainer registry)
        from verl_ext.plugin import check_registered

        check_registered()
        return super().run(config)


def require_gpus() -> None:
    """Fail in seconds, not after minutes of Ray start-up, when no GPU can serve the rollout.

    Inside a Ray job (``RAY_ADDRESS`` is set) the GPUs may sit on other nodes than this driver's, and verl's
    resource-pool check speaks for the cluster; run by hand on a machine with no CUDA device, refuse at once.
    """
    import torch

    if not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):
        raise SystemExit(
            "DIVA-GRPO training needs GPUs (verl's rollout runs on vLLM/SGLang), and this machine has none. "
            "Submit to a GPU cluster (RAY_ADDRESS=... bash run_scripts/qwen25vl7b_diva.sh), or run the CPU "
            "preflight: DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh"
        )


@hydra.main(config_path="config", config_name="diva_grpo", version_base=None)
def main(config: DictConfig) -> None:
    if config.diva.get("dry_run", False):
        from recipe.diva_grpo.preflight import run_preflight

        run_preflight(config)
        return
    require_gpus()
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=DivaTaskRunner)


if __name__ == "__main__":
    main()
