"""NC-GRPO in verl's vLLM rollout: a worker extension that displaces the prefill's final hidden state.

vLLM builds its worker with the extension class named in ``worker_extension_cls`` (verl's
``vLLMColocateWorkerExtension`` by default; ``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls``
replaces it, since verl spreads ``engine_kwargs`` after its own arguments). :class:`NoiseWorkerExtension` is verl's
class plus, once the worker has loaded its model, two wrappers on that worker's V1 model runner (instance
attributes, nothing of vLLM's files or classes is changed; :mod:`verl_ext.nc_grpo.runner_hook`):

* ``runner.execute_model``: keeps the step's ``SchedulerOutput`` while the step runs;
* ``runner.model.compute_logits``: its input is ``hidden_states[logits_indices]``, the final hidden states (after
  the last decoder layer and its norm) at the last scheduled position of each request of the persistent batch, in
  ``runner.input_batch.req_ids`` order (vLLM 0.24's ``logits_indices = query_start_loc[1:] - 1`` without
  speculative decoding). A row is displaced when its request carries :data:`~verl_ext.nc_grpo.noise.NOISE_KEY` in
  ``sampling_params.extra_args`` and this step's chunk ends at the prompt's last token
  (``num_computed_tokens < num_prompt_tokens == num_computed_tokens + num_scheduled_tokens``): the prefill step
  whose sample is the first generated token. Decode steps, and the KV cache (written inside the decoder layers),
  are untouched.

``compute_logits`` runs outside vLLM's compiled model and CUDA graphs (the runner calls it eagerly on the sampled
rows), so the same code serves GPUs; the noise vector is drawn on the CPU (:func:`verl_ext.nc_grpo.noise.noise_vector`)
and moved to the device. :class:`CpuNoiseWorkerExtension` adds the CPU build's ``keep_cpu_linear_weights`` patch
(:mod:`verl_ext.cpu.vllm_worker`). Refused: vLLM's V2 model runner (another batch layout: set
``VLLM_USE_V2_MODEL_RUNNER=0``) and speculative decoding (more than one logits row per request).
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

    def nc_grpo_applied_noise(self) -> list[dict]:
        """The recent displacements (:func:`verl_ext.nc_grpo.noise.applied_record`), oldest first, their vectors as
        lists (vLLM's RPC serialises tensors as lists)."""
        return [
            {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in record.items()}
            for record in getattr(self.model_runner, "nc_grpo_applied", [])
        ]


class CpuNoiseWorkerExtension(NoiseWorkerExtension, CpuWorkerExtension):
    """:class:`NoiseWorkerExtension` on vLLM's CPU build (with ``keep_cpu_linear_weights``)."""
