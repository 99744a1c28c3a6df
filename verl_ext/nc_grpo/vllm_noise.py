"""NC-GRPO in verl's vLLM rollout: a worker extension that displaces the prefill's final hidden state.

vLLM builds its worker with the extension class named in ``worker_extension_cls`` (verl's
``vLLMColocateWorkerExtension`` by default; ``actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls``
replaces it, since verl spreads ``engine_kwargs`` after its own arguments). :class:`NoiseWorkerExtension` is verl's
class plus, once the worker has loaded its model, two wrappers on that worker's V1 model runner (instance
attributes, nothing of vLLM's files or classes is changed):

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

import logging

import torch
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from verl_ext.cpu.vllm_worker import CpuWorkerExtension
from verl_ext.nc_grpo.noise import NOISE_KEY, applied_record, noise_vector, perturb, request_noise

logger = logging.getLogger(__name__)

NOISE_RECORDS = 256
_INSTALLED = "_nc_grpo_noise_installed"


def _flagged_rows(runner, scheduler_output) -> list[tuple[int, str, dict]]:
    """(row, request id, noise) of the requests whose prompt's last token is in this step's chunk."""
    rows = []
    for row, req_id in enumerate(runner.input_batch.req_ids):
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        if params is None or not (params.extra_args or {}).get(NOISE_KEY):
            continue
        computed = int(state.num_computed_tokens)
        scheduled = int(scheduler_output.num_scheduled_tokens.get(req_id, 0))
        if computed < state.num_prompt_tokens == computed + scheduled:
            rows.append((row, req_id, request_noise({"extra_args": params.extra_args})))
    return rows


def install(runner) -> None:
    """Wrap ``runner.execute_model`` and ``runner.model.compute_logits`` (see the module docstring); idempotent."""
    if getattr(runner, _INSTALLED, False):
        return
    if not (hasattr(runner, "input_batch") and hasattr(runner, "requests")):
        raise RuntimeError(
            f"nc_grpo: vLLM's {type(runner).__name__} is not the V1 model runner this hook reads (input_batch, "
            "requests); run vLLM with VLLM_USE_V2_MODEL_RUNNER=0"
        )
    if getattr(runner, "speculative_config", None) is not None:
        raise RuntimeError("nc_grpo: speculative decoding gives several logits rows per request; it is not supported")
    runner.nc_grpo_applied = []
    runner._nc_grpo_step = None
    execute = runner.execute_model
    compute_logits = runner.model.compute_logits

    def execute_model(scheduler_output, *args, **kwargs):
        runner._nc_grpo_step = scheduler_output
        try:
            return execute(scheduler_output, *args, **kwargs)
        finally:
            runner._nc_grpo_step = None

    def noisy_compute_logits(hidden_states: torch.Tensor, *args, **kwargs):
        step = runner._nc_grpo_step
        rows = _flagged_rows(runner, step) if step is not None else []
        if rows:
            if hidden_states.shape[0] != len(runner.input_batch.req_ids):
                raise RuntimeError(
                    f"nc_grpo: {hidden_states.shape[0]} logits rows for {len(runner.input_batch.req_ids)} requests"
                )
            hidden_states = hidden_states.clone()
            for row, req_id, noise in rows:
                before = hidden_states[row]
                xi = noise_vector(noise["seed"], before.shape[-1])
                after = perturb(before, xi, noise["scale"])
                runner.nc_grpo_applied.append(applied_record(req_id, noise["seed"], noise["scale"], before, after))
                hidden_states[row] = after
            del runner.nc_grpo_applied[:-NOISE_RECORDS]
        return compute_logits(hidden_states, *args, **kwargs)

    runner.execute_model = execute_model
    runner.model.compute_logits = noisy_compute_logits
    setattr(runner, _INSTALLED, True)
    logger.info("nc_grpo: prefill noise hook installed on %s", type(runner).__name__)


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
