"""Entry point: ``python -m recipe.diva_grpo.main_diva [hydra overrides]``.

The same as verl's ``verl.trainer.main_ppo`` except that the task runner registers the DIVA trainer
in its own process before verl looks the trainer up, and that ``diva.dry_run=true`` runs the CPU
preflight (:mod:`recipe.diva_grpo.preflight`) instead of training.

CPU mode (``VERL_PLATFORM=cpu`` in every process, see :mod:`verl_ext.cpu` and ``run_scripts/tiny_cpu.sh``):
real training on the CPU with verl's trainer, workers and the ``hf_cpu`` rollout; the GPU check is skipped.
When ``DIVA_CPU_PROBE_DIR`` is set, the task runner records what the actor consumed (:mod:`verl_ext.checks.probe`).
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

from verl_ext.checks.probe import PROBE_ENV, install_probe
from verl_ext.checks.session import format_summary, pop_cpu_run_block, train_then_resume, write_summary
from verl_ext.cluster.batch_arithmetic import check_batch_arithmetic
from verl_ext.cluster.storage import check_resume, check_shared_folder
from verl_ext.cpu import cpu_mode_requested
from verl_ext.metrics_log import keep_previous_log, metrics_log_path


@ray.remote(num_cpus=1)
class DivaTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's V1 task runner, with the toolkit's trainers (``trainer_mode=diva_grpo`` and ``toolkit``) registered in
    the runner's process."""

    def run(self, config: DictConfig):
        import recipe.diva_grpo.trainer  # noqa: F401  (registers "diva_grpo" with verl's trainer registry)
        from verl_ext.plugin import check_registered

        check_registered()
        # verl's file logger opens VERL_FILE_LOGGER_PATH without creating its folder; on a cluster node the
        # launcher's pre-launch check (which creates it on the submitting machine) may not have run.
        metrics_log = os.environ.get("VERL_FILE_LOGGER_PATH")
        if metrics_log:
            os.makedirs(os.path.dirname(os.path.abspath(metrics_log)), exist_ok=True)
        # A restarted job (MAX_RESTARTS) logs to the same file, which verl's logger truncates: keep the earlier part.
        if "file" in (config.trainer.get("logger") or []):
            kept = keep_previous_log(metrics_log_path(config.trainer.project_name, config.trainer.experiment_name))
            if kept:
                print(f"[diva] the earlier metrics log of this experiment is kept as {kept}", flush=True)
        probe_dir = os.environ.get(PROBE_ENV)
        if probe_dir:
            install_probe(config.trainer.v1.trainer_mode, probe_dir)
        check_checkpoint_folder(config)
        return super().run(config)


def check_checkpoint_folder(config: DictConfig) -> None:
    """A run that saves or resumes: its checkpoint folder is one folder on every node, and a resume that was asked
    for finds what this run saved (:mod:`verl_ext.cluster.storage`); prints what the run starts from."""
    trainer = config.trainer
    if trainer.get("save_freq", -1) <= 0 and trainer.get("resume_mode", "auto") == "disable":
        return
    folder = os.path.abspath(trainer.default_local_dir)
    nodes = check_shared_folder(folder)
    print(f"[diva] checkpoint folder {folder}: the same on all {len(nodes)} node(s)", flush=True)
    attempt = int((config.get("launch") or {}).get("attempt", 1))
    start = check_resume(
        folder,
        str(trainer.get("resume_mode", "auto")),
        str(trainer.experiment_name),
        restart=attempt > 1,
        resume_path=trainer.get("resume_from_path"),
    )
    print(f"[diva] {start}", flush=True)


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


def train(config: DictConfig) -> None:
    """Validate ``config`` as verl's ``main_ppo`` does, and each rank's batch arithmetic before any model loads
    (:mod:`verl_ext.cluster.batch_arithmetic`), then run it with the DIVA task runner."""
    auto_set_device(config)
    for line in check_batch_arithmetic(config).lines():
        print(f"[diva] batch: {line}", flush=True)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=DivaTaskRunner)


@hydra.main(config_path="config", config_name="diva_grpo", version_base=None)
def main(config: DictConfig) -> None:
    if config.diva.get("dry_run", False):
        from recipe.diva_grpo.preflight import run_preflight

        run_preflight(config)
        return
    # `cpu_run` (run_scripts/tiny_cpu.sh): train, resume from the checkpoint, check and print a summary.
    cpu_run = pop_cpu_run_block(config)
    # Explicit CPU mode only (VERL_PLATFORM=cpu): a GPU job never skips the check by accident.
    if not cpu_mode_requested():
        if cpu_run:
            raise SystemExit("cpu_run needs the CPU mode: VERL_PLATFORM=cpu in every process (run_scripts/tiny_cpu.sh)")
        require_gpus()
    if cpu_run.get("resume_steps"):
        summary = train_then_resume(config, train, int(cpu_run["resume_steps"]))
        summary_path = cpu_run.get("summary_path")
        if summary_path:
            write_summary(summary, summary_path)
        print(format_summary(summary, summary_path), flush=True)
        print("[cpu] PASSED: real rollouts, rewards, actor updates, weight sync, checkpoint and resume", flush=True)
        return
    train(config)


if __name__ == "__main__":
    main()
