"""NC-GRPO's hook on vLLM's V1 model runner (no vLLM import: tested with a stand-in runner).

:func:`install` wraps two methods of one model-runner instance (see :mod:`verl_ext.nc_grpo.vllm_noise`, whose worker
extension calls it after the worker loads its model):

* ``runner.execute_model``: keeps the step's ``SchedulerOutput`` while the step runs;
* ``runner.model.compute_logits``: its input is ``hidden_states[logits_indices]``, one row per request of
  ``runner.input_batch.req_ids`` (vLLM 0.24's ``logits_indices = query_start_loc[1:] - 1`` without speculative
  decoding), the final hidden state of the request's last scheduled token. :func:`flagged_rows` names the rows whose
  request carries the noise entry and whose chunk ends at the prompt's last token; those are displaced.
"""

from __future__ import annotations

import logging

import torch

from verl_ext.nc_grpo.noise import NOISE_KEY, applied_record, noise_vector, perturb, request_noise

logger = logging.getLogger(__name__)

NOISE_RECORDS = 256
_INSTALLED = "_nc_grpo_noise_installed"


def flagged_rows(runner, scheduler_output) -> list[tuple[int, str, dict]]:
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
        rows = flagged_rows(runner, step) if step is not None else []
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
