"""A CPU platform for verl's platform registry (``verl.plugin.platform``): ``VERL_PLATFORM=cpu``.

verl 0.9.1 knows CUDA, ROCm and NPU only; with no accelerator its detection falls back to NVIDIA and the
process group asks for NCCL. This platform answers as a CPU: device ``cpu``, collective backend ``gloo``,
``torch.cpu``-like device module. It still names Ray's ``GPU`` resource, so that the logical GPU of a CPU
Ray head (``ray start --num-gpus=1`` / ``ray.init(num_gpus=1)``) places verl's workers as usual.

It is never auto-detected (:meth:`PlatformCPU.is_platform_available` is ``False``): verl's detection probes
every registered platform, and a CPU-only driver of a GPU cluster must still fall back to NVIDIA. It is
selected only explicitly, by ``VERL_PLATFORM=cpu`` in every process of the job (:func:`verl_ext.cpu.cpu_env`).
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls verl makes on its device module (memory statistics, caches,
    RNG): they have no meaning on a CPU, so they answer zero or do nothing. ``current_device()`` is the string
    ``"cpu"``: verl uses it as a device (``tensor.to(get_device_id())``), and an integer would mean ``cuda:N``."""
    module = types.ModuleType("verl_ext_cpu_device")
    for name in ("Stream", "Event", "current_stream", "stream", "synchronize", "is_available", "device_count"):
        setattr(module, name, getattr(torch.cpu, name))

    def _zero(*args, **kwargs) -> int:
        return 0

    def _none(*args, **kwargs) -> None:
        return None

    module.current_device = lambda: "cpu"
    module.set_device = _none
    module.is_initialized = lambda: True
    module.empty_cache = _none
    module.reset_peak_memory_stats = _none
    module.memory_allocated = _zero
    module.memory_reserved = _zero
    module.max_memory_allocated = _zero
    module.max_memory_reserved = _zero
    module.mem_get_info = lambda *a, **k: (0, 0)
    module.memory_stats = lambda *a, **k: {}
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    module.get_device_name = lambda *a, **k: "cpu"
    module.get_device_properties = lambda *a, **k: types.SimpleNamespace(name="cpu", total_memory=0)
    return module


_DEVICE_MODULE = _cpu_device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered by the host CPU (gloo collectives, no profiler, no IPC)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never chosen by detection: only VERL_PLATFORM=cpu selects it (see the module docstring).
        return False

    def current_device(self) -> str:  # verl annotates int; "cpu" is what its call sites need (see above)
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray still sets it for the logical GPU; nothing reads it on a CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
