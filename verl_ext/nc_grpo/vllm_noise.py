"""NC-GRPO in verl's vLLM rollout: a worker extension that displaces flagged requests' prompts in the prefill.

vLLM builds its worker with the extension class named in ``worker_extension_cls`` (verl's
``vLLMColocateWorkerExtension`` by default; ``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls``
replaces it, since verl spreads ``engine_kwargs`` after its own arguments). :class:`NoiseWorkerExtension` is verl's
class plus, once the worker has loaded its model, the hooks of :mod:`verl_ext.nc_grpo.runner_hook` on that worker's
V1 model runner (instance attributes and forward pre-hooks on its own modules; nothing of vLLM's files or classes is
changed):

* ``layer_input`` (the default reading): a pre-hook on each decoder layer displaces the residual stream entering
  it at the rows of flagged requests' prompt positions in this step (whole prompts, chunks of a chunked prefill,
  a preempted request's recomputed prompt), so that layer's keys and values of the prompt are the displaced ones.
  Python inside the model's forward: it needs an eager model (``actor_rollout_ref.rollout.enforce_eager=true``);
  on a compiled runner the hooks are not installed and a ``layer_input`` request fails its step, naming the key.
* ``final_hidden``: ``runner.model.compute_logits`` displaces the final hidden state of the request's last prompt
  token in the step whose chunk ends there (eager in vLLM, outside the compiled model and CUDA graphs).

A request is flagged by :data:`~verl_ext.nc_grpo.noise.NOISE_KEY` in ``sampling_params.extra_args``. The noise is
drawn on the CPU from the request's seed (:func:`verl_ext.nc_grpo.noise.noise_rows`) and moved to the device: every
tensor-parallel rank adds the same numbers to its replicated hidden states. :class:`CpuNoiseWorkerExtension` adds
the CPU build's two patches (:mod:`verl_ext.cpu.vllm_worker`). Refused: vLLM's V2 model
runner (another batch layout: set ``VLLM_USE_V2_MODEL_RUNNER=0``) and speculative decoding (more than one logits row
per request).
"""

from __future__ import annotations

import torch
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from verl_ext.cpu.vllm_worker import CpuWorkerExtension
from verl_ext.nc_grpo.runner_hook import install


class NoiseWorkerExtension(vLLMColocateWorkerExtension):
    """verl's worker extension; after ``load_model`` the worker's model runner noises flagged prefills."""

    def __new__(cls, **kwargs):
        instance = super().__new__(cls, **kwargs)
        load_model = instance.load_model

        def load_model_then_install(*args, **kw):
            out = load_model(*args, **kw)
            install(instance.model_runner)
            return out

        # An instance attribute: vLLM's collective_rpc("load_model") finds it before the class's method.
        instance.load_model = load_model_then_install
        return instance

    def nc_grpo_keep_tensors(self, keep: bool = True) -> None:
        """Keep the displaced rows and displacements in the records (tests; a 7B prompt's rows are tens of MB)."""
        self.model_runner.nc_grpo_keep_tensors = bool(keep)

    def nc_grpo_applied_noise(self) -> list[dict]:
        """The recent displacements (:func:`verl_ext.nc_grpo.noise.applied_record`), oldest first, their vectors as
        lists (vLLM's RPC serialises tensors as lists)."""
        return [
            {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in record.items()}
            for record in getattr(self.model_runner, "nc_grpo_applied", [])
        ]


class CpuNoiseWorkerExtension(NoiseWorkerExtension, CpuWorkerExtension):
    """:class:`NoiseWorkerExtension` on vLLM's CPU build (with its two patches, :class:`CpuWorkerExtension`)."""
