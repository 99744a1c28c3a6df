"""Real verl training on a CPU: a CPU platform, a transformers rollout backend, a tiny local VLM.

Nothing here changes a GPU run. :func:`register` (called by ``verl_ext.plugin`` in every process) only adds
names to verl's registries: the platform ``cpu`` (never auto-detected) and the rollout ``hf_cpu``. The CPU
mode is switched on explicitly, by ``VERL_PLATFORM=cpu`` in every process of the job (:data:`CPU_ENV`); then
:func:`activate` applies the named patches of :mod:`verl_ext.cpu.patches`.

Modules: :mod:`.platform` (the platform), :mod:`.rollout` (server, replica, adapter), :mod:`.patches`,
:mod:`.tiny_model` (model, tokenizer and processor built locally), :mod:`.reward` (a reward that separates a
random model's responses), :mod:`.overrides` and :mod:`.vllm_launcher` (the Hydra overrides of a CPU run, on each
rollout), :mod:`.runtime_env` (its Ray runtime env), :mod:`.launch` (its launch). This is the backend: the checks
that prove a run right (:mod:`verl_ext.checks`) and the experiments (:mod:`verl_ext.lab`) import it, never the
other way round.
"""

from __future__ import annotations

import os

from verl_ext.cpu.names import ROLLOUT_NAME

# Environment of every process of a CPU job (Ray runtime_env env_vars). VERL_ENGINE_DEVICE makes verl's
# engine registry hand out its FSDP engine, registered for cuda/npu only, on the CPU platform.
CPU_ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}


def cpu_mode_requested() -> bool:
    """True when this process was asked to run verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


# vLLM's worker extension for its CPU build (verl's, plus keep_cpu_linear_weights and warm_up_in_inference_mode):
# vLLM imports it in its worker process (rollout.engine_kwargs.vllm.worker_extension_cls).
VLLM_WORKER_EXTENSION = "verl_ext.cpu.vllm_worker.CpuWorkerExtension"


def _load_hf_cpu_replica():
    from verl_ext.cpu.rollout import HFCpuReplica

    return HFCpuReplica


def register() -> None:
    """Register the ``cpu`` platform and the ``hf_cpu`` rollout with verl (names only; no side effect).

    The rollout classes are named lazily (a module path, a loader), as verl registers its own backends, so
    nothing of :mod:`verl_ext.cpu.rollout` is imported until a config asks for ``rollout.name=hf_cpu``.
    """
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_ext.cpu import platform  # noqa: F401  (registers PlatformCPU as "cpu")

    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "verl_ext.cpu.rollout.HFCpuServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_hf_cpu_replica)


def activate() -> list[str]:
    """In CPU mode, apply the CPU patches in this process; returns their names (empty outside CPU mode)."""
    if not cpu_mode_requested():
        return []
    from verl_ext.cpu.patches import apply_cpu_patches

    return apply_cpu_patches()
