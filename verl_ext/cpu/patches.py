"""The few patches of verl that CPU training needs, each named and applied only under ``VERL_PLATFORM=cpu``.

Everything else the CPU path needs goes through verl's registries (platform, rollout) or its config
(``attn_implementation=sdpa``, ``VERL_ENGINE_DEVICE=cuda``). What is left are assumptions
written into verl's code; each patch below says which one it lifts. :data:`PATCHES` lists them for the tests
(docs/verl_integration.md, "Patches of verl", describes each); :func:`apply_cpu_patches` applies them once per
process, from ``verl_ext.plugin`` (loaded on ``import verl``, before any verl worker module binds the patched
names).
"""

from __future__ import annotations

import functools

_APPLIED: list[str] = []


def _single_gloo_backend() -> None:
    """Assumption lifted: the device is not the CPU.

    ``verl.utils.distributed.initialize_global_process_group_ray`` builds its default backend string as
    ``f"cpu:gloo,{device}:{backend}"``, which on the CPU platform is ``"cpu:gloo,cpu:gloo"``: torch refuses a
    device named twice. The patched function defaults to ``"cpu:gloo"``; an explicit ``backend`` is kept.
    ``verl.workers.engine_workers`` imports the function by name, so this runs before that module is imported.
    """
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_verl_ext_cpu", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._verl_ext_cpu = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


def _varlen_attention_on_cpu() -> None:
    """Assumption lifted: flash-attn is installed.

    With ``use_remove_padding=true`` verl's Qwen2-VL / Qwen2.5-VL attention (``verl.models.transformers.qwen2_vl``)
    calls ``flash_attn_varlen_func`` on the packed sequences, names that module defines only when flash-attn (a CUDA
    kernel) imports. :func:`verl_ext.cpu.varlen_attention.install` gives it an exact torch stand-in, so the packed
    path of a GPU run runs on the CPU through verl's own code; the stand-in refuses CUDA tensors.
    """
    from verl_ext.cpu import varlen_attention

    varlen_attention.install()


PATCHES = {
    "single_gloo_backend": _single_gloo_backend,
    "varlen_attention_on_cpu": _varlen_attention_on_cpu,
}


def apply_cpu_patches() -> list[str]:
    """Apply every patch of :data:`PATCHES` (idempotent); returns the names applied in this process."""
    for name, patch in PATCHES.items():
        if name not in _APPLIED:
            patch()
            _APPLIED.append(name)
    return list(_APPLIED)
