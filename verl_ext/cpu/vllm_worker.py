"""verl's vLLM worker extension, for vLLM's CPU build: linear layers keep their weight so verl can sync into them, and
the warm-up runs without autograd, as on a GPU.

verl's vLLM server names its worker extension (``vLLMColocateWorkerExtension``: weight sync, LoRA, logits patch)
in vLLM's ``worker_extension_cls``; ``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls`` replaces
it (verl spreads ``engine_kwargs`` after its own arguments). The CPU run names :class:`CpuWorkerExtension`, which
is verl's class plus two named patches, applied in vLLM's worker process when vLLM builds its worker (before the model
is loaded), so they depend on no import order:

``keep_cpu_linear_weights`` lifts vLLM's CPU assumption "weights are loaded once". After loading, vLLM's CPU
backend hands every 2-D linear weight to ``dispatch_cpu_unquantized_gemm`` (``vllm/model_executor/layers/utils.py``),
which packs it for oneDNN (or sgl-kernel) and, for linear layers (``remove_weight=True``), replaces ``layer.weight``
by an empty tensor; the LM head keeps its weight but computes with the packed copy. verl's weight sync then fails
("Attempted to load weight (torch.Size([128, 256])) into parameter (torch.Size([0]))"), and a sync into the LM head
would be ignored. The patch keeps each weight and computes ``F.linear(x, layer.weight, bias)`` with the live tensor,
so reloaded weights are the weights used. Non-2-D weights (convolutions) and layers on the meta device go to vLLM's
code unchanged.

``warm_up_in_inference_mode`` lifts vLLM's CPU assumption "the warm-up needs no inference mode". vLLM's GPU worker
profiles the model under ``torch.inference_mode()`` (``Worker.determine_available_memory``); its CPU worker overrides
that method without it, and ``CPUModelRunner.warming_up_model`` runs the dummy multimodal encoder pass with autograd
on. At tensor parallel 1 nothing notices; at 2 the vision attention all-gathers over gloo into views of its output,
and autograd refuses the in-place write ("A view was created in no_grad mode and is being modified inplace with grad
mode enabled"): the engine does not start. The patch runs ``warming_up_model`` in inference mode, as the GPU worker
runs its profile.

Used only on vLLM's CPU platform: the patches refuse any other (a GPU run never names this extension; the CPU
launcher does, :func:`verl_ext.cpu.vllm_launcher.vllm_cpu_overrides`).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

logger = logging.getLogger(__name__)

PATCH_NAME = "keep_cpu_linear_weights"


def _live_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # vLLM's cpu_unquantized_gemm passes layer.weight as it is now: after a sync, the synced tensor.
    return F.linear(x, weight, bias)


def _require_cpu_platform(patch: str) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise RuntimeError(
            f"{patch} is for vLLM's CPU build only; this process runs vLLM's {type(current_platform).__name__}. "
            "Do not set rollout.engine_kwargs.vllm.worker_extension_cls to the CPU extension on a GPU machine"
        )


def keep_cpu_linear_weights() -> bool:
    """Apply the patch in this process (idempotent); returns True when it was applied now."""
    from vllm.model_executor.layers import utils

    _require_cpu_platform(PATCH_NAME)
    if getattr(utils.dispatch_cpu_unquantized_gemm, "_diva_patch", None) == PATCH_NAME:
        return False
    packing_dispatch = utils.dispatch_cpu_unquantized_gemm

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = layer.weight
        if weight.is_meta or weight.ndim != 2:
            return packing_dispatch(layer, remove_weight)
        layer.cpu_linear = _live_linear

    dispatch_keeping_weight._diva_patch = PATCH_NAME
    # linear.py and vocab_parallel_embedding.py import the function from the module at call time.
    utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    logger.info("%s: vLLM's CPU linear layers keep their weights (F.linear) for verl's weight sync", PATCH_NAME)
    return True


WARM_UP_PATCH_NAME = "warm_up_in_inference_mode"


def warm_up_in_inference_mode() -> bool:
    """Apply the warm-up patch in this process (idempotent); returns True when it was applied now."""
    import functools

    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    _require_cpu_platform(WARM_UP_PATCH_NAME)
    warm_up = CPUModelRunner.warming_up_model
    if getattr(warm_up, "_diva_patch", None) == WARM_UP_PATCH_NAME:
        return False

    @functools.wraps(warm_up)
    def warming_up_model(self, *args, **kwargs):
        with torch.inference_mode():
            return warm_up(self, *args, **kwargs)

    warming_up_model._diva_patch = WARM_UP_PATCH_NAME
    CPUModelRunner.warming_up_model = warming_up_model
    logger.info("%s: vLLM's CPU warm-up runs in inference mode, as its GPU profile does", WARM_UP_PATCH_NAME)
    return True


class CpuWorkerExtension(vLLMColocateWorkerExtension):
    """verl's worker extension with :func:`keep_cpu_linear_weights` and :func:`warm_up_in_inference_mode` applied in
    the vLLM worker process."""

    def __new__(cls, **kwargs):
        keep_cpu_linear_weights()
        warm_up_in_inference_mode()
        return super().__new__(cls, **kwargs)
