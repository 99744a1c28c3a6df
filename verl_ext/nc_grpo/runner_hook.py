"""NC-GRPO's hooks on vLLM's V1 model runner (no vLLM import: tested with a stand-in runner).

:func:`install` (called by :mod:`verl_ext.nc_grpo.vllm_noise`'s worker extension after the worker loads its model)
puts three things on one model-runner instance:

* a wrapper of ``runner.execute_model`` that keeps the step's ``SchedulerOutput`` while the step runs, and after the
  forward checks that every displacement the step owed was made (a decoder-layer hook that did not run means a
  compiled model: the request would have been sampled clean, silently);
* ``layer_input``: a forward pre-hook on each decoder layer of the language model. vLLM 0.24 flattens a step's
  tokens into rows in ``runner.input_batch.req_ids`` order, ``num_scheduled_tokens[req]`` rows per request, at
  positions ``num_computed_tokens[req] + 0, 1, ...`` (``GPUModelRunner._prepare_inputs``), and a decoder layer is
  called as ``layer(positions, hidden_states, residual)`` with a fused add-norm, so the residual stream entering it
  is ``hidden_states + residual`` (``hidden_states`` alone for the first layer, whose ``residual`` is ``None``).
  :func:`prompt_spans` names the rows of flagged requests' prompt positions in this step (a whole prompt, a chunk of
  a chunked prefill, or the prompt of a preempted request being recomputed: the same rows of the same draw again),
  and the hook adds ``c * (||h_p|| / sqrt(d)) * xi_p`` to ``hidden_states`` there (so that ``hidden_states +
  residual = h~``). The layer's keys and values of those positions, written to the KV cache, are the displaced
  ones, and every decoding step attends to them.
* ``final_hidden``: a wrapper of ``runner.model.compute_logits``, whose input is ``hidden_states[logits_indices]``,
  one row per request of ``runner.input_batch.req_ids`` (``logits_indices = query_start_loc[1:] - 1`` without
  speculative decoding). :func:`flagged_rows` names the rows whose chunk ends at the prompt's last token.

The noise is drawn on the CPU from the request's seed (:func:`~verl_ext.nc_grpo.noise.noise_rows`), so every
tensor-parallel rank (each holds the whole, replicated, hidden state) adds the same numbers. The decoder-layer hooks
are Python run in the model's forward: vLLM's compiled model (torch.compile traced once, called without guards) and
its CUDA graphs (kernels replayed) would not run them per step, so they are not installed on a compiled runner and
a ``layer_input`` request there fails the step naming ``actor_rollout_ref.rollout.enforce_eager=true``.
``compute_logits`` runs eagerly, outside the compiled model, so ``final_hidden`` works either way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from verl_ext.nc_grpo.noise import (
    FINAL_HIDDEN,
    LAYER_INPUT,
    NOISE_KEY,
    applied_record,
    displacement,
    noise_rows,
    noise_vector,
    perturb,
    request_noise,
    resolve_layer,
)

logger = logging.getLogger(__name__)

NOISE_RECORDS = 256
_INSTALLED = "_nc_grpo_noise_installed"
EAGER_KEY = "actor_rollout_ref.rollout.enforce_eager=true"


@dataclass(frozen=True)
class Span:
    """Rows ``rows[0]:rows[1]`` of a step's flattened batch hold prompt positions ``positions[0]:positions[1]`` of
    request ``req_id`` (``prompt_len`` prompt tokens), to be displaced by ``noise`` at decoder layer ``layer``."""

    req_id: str
    rows: tuple[int, int]
    positions: tuple[int, int]
    prompt_len: int
    layer: int
    noise: dict = field(compare=False)


def prompt_spans(batch: list[tuple[str, int, int, int, dict | None]], num_layers: int) -> list[Span]:
    """The :class:`Span` of every flagged ``layer_input`` request with prompt positions in this step.

    ``batch``: per request in the runner's row order, ``(req_id, num_scheduled, num_computed, num_prompt_tokens,
    noise)`` (``noise``: :func:`~verl_ext.nc_grpo.noise.request_noise`'s entry or ``None``). Request ``i``'s rows
    start at the sum of the earlier ones' ``num_scheduled`` and hold positions ``num_computed + 0, 1, ...``; those
    below ``num_prompt_tokens`` are the prompt's."""
    spans, row = [], 0
    for req_id, scheduled, computed, prompt_len, noise in batch:
        end = min(computed + scheduled, prompt_len)
        if noise is not None and noise["target"] == LAYER_INPUT and computed < end:
            layer = resolve_layer(noise["layer"], num_layers)
            spans.append(Span(req_id, (row, row + end - computed), (computed, end), prompt_len, layer, noise))
        row += scheduled
    return spans


def _noise_of(state) -> dict | None:
    params = getattr(state, "sampling_params", None)
    if params is None or not (params.extra_args or {}).get(NOISE_KEY):
        return None
    return request_noise({"extra_args": params.extra_args})


def step_batch(runner, scheduler_output) -> list[tuple[str, int, int, int, dict | None]]:
    """:func:`prompt_spans`'s ``batch`` for this step, read from the runner's persistent batch (the arrays its
    ``_prepare_inputs`` computes positions from)."""
    batch = []
    computed = runner.input_batch.num_computed_tokens_cpu
    for index, req_id in enumerate(runner.input_batch.req_ids):
        state = runner.requests[req_id]
        scheduled = int(scheduler_output.num_scheduled_tokens.get(req_id, 0))
        done, prompt_len = int(computed[index]), int(state.num_prompt_tokens)
        # A request past its prompt (a decode step) is never displaced: its entry is not read, every step.
        batch.append((req_id, scheduled, done, prompt_len, _noise_of(state) if done < prompt_len else None))
    return batch


def check_row_layout(runner, batch: list[tuple[str, int, int, int, dict | None]]) -> None:
    """``RuntimeError`` when the runner's ``query_start_loc`` (when it has one) is not ``batch``'s row layout."""
    starts = getattr(getattr(runner, "query_start_loc", None), "np", None)
    if starts is not None and batch:
        ours = [0]
        for _, scheduled, *_ in batch:
            ours.append(ours[-1] + scheduled)
        if [int(v) for v in starts[: len(ours)]] != ours:
            raise RuntimeError(
                f"nc_grpo: vLLM's query_start_loc {list(starts[: len(ours)])} is not the row layout this hook reads "
                f"({ours}); the model runner changed"
            )


def flagged_rows(runner, scheduler_output) -> list[tuple[int, str, dict]]:
    """(logits row, request id, noise) of the flagged ``final_hidden`` requests whose prompt's last token is in this
    step's chunk (the prefill step whose sample is the first generated token)."""
    rows = []
    for row, req_id in enumerate(runner.input_batch.req_ids):
        state = runner.requests.get(req_id)
        noise = _noise_of(state)
        if noise is None or noise["target"] != FINAL_HIDDEN:
            continue
        computed = int(state.num_computed_tokens)
        scheduled = int(scheduler_output.num_scheduled_tokens.get(req_id, 0))
        if computed < state.num_prompt_tokens == computed + scheduled:
            rows.append((row, req_id, noise))
    return rows


def language_model_layers(model) -> list:
    """The decoder layers of vLLM's language model (``get_language_model().model.layers`` for a VLM)."""
    language = model.get_language_model() if hasattr(model, "get_language_model") else model
    layers = getattr(getattr(language, "model", language), "layers", None)
    if layers is None:
        raise RuntimeError(f"nc_grpo: vLLM's {type(model).__name__} has no decoder layers (model.layers) to hook")
    return layers


def is_compiled(runner) -> bool:
    """Whether vLLM compiles the model or captures CUDA graphs (anything but ``enforce_eager``'s mode NONE)."""
    config = getattr(runner, "compilation_config", None)
    if config is None:
        return False
    return (
        getattr(config.mode, "name", str(config.mode)) != "NONE"
        or getattr(config.cudagraph_mode, "name", str(config.cudagraph_mode)) != "NONE"
    )


class _Step:
    """What the hooks of one ``execute_model`` call share: its scheduler output and the spans, read once."""

    def __init__(self, runner, scheduler_output, num_layers: int):
        self.runner, self.output, self.num_layers = runner, scheduler_output, num_layers
        self._spans: list[Span] | None = None
        self.applied: set[tuple[str, int]] = set()

    def spans(self) -> list[Span]:
        if self._spans is None:
            batch = step_batch(self.runner, self.output)
            self._spans = prompt_spans(batch, self.num_layers)
            if self._spans:
                check_row_layout(self.runner, batch)
        return self._spans


def _layer_hook(runner, index: int):
    def hook(module, args):
        step = runner._nc_grpo_step
        spans = [s for s in step.spans() if s.layer == index] if step is not None else []
        if not spans:
            return None
        if len(args) != 3:
            raise RuntimeError(
                f"nc_grpo: decoder layer {index} was called with {len(args)} positional arguments; this hook reads "
                "vLLM's (positions, hidden_states, residual)"
            )
        positions, hidden, residual = args
        out = hidden.clone()
        for span in spans:
            if span.rows[1] > hidden.shape[0]:
                raise RuntimeError(f"nc_grpo: rows {span.rows} of a {hidden.shape[0]}-row batch at layer {index}")
            rows = slice(*span.rows)
            # The residual stream entering the layer: the fused add-norm adds ``residual`` to ``hidden_states``.
            stream = hidden[rows].float() if residual is None else hidden[rows].float() + residual[rows].float()
            xi = noise_rows(span.noise["seed"], span.prompt_len, *span.positions, hidden.shape[-1])
            moved = displacement(stream, xi, span.noise["scale"])
            out[rows] = (hidden[rows].float() + moved).to(hidden.dtype)
            runner.nc_grpo_applied.append(
                applied_record(
                    span.req_id, span.noise, *span.positions, stream, stream + moved, runner.nc_grpo_keep_tensors, index
                )
            )
            step.applied.add((span.req_id, span.positions[0]))
        del runner.nc_grpo_applied[:-NOISE_RECORDS]
        return (positions, out, residual)

    return hook


def install(runner) -> None:
    """Install the wrappers and hooks of the module docstring on ``runner``; idempotent."""
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
    runner.nc_grpo_keep_tensors = False
    runner._nc_grpo_step = None
    layers = language_model_layers(runner.model)
    compiled = is_compiled(runner)
    ubatching = bool(getattr(getattr(runner, "parallel_config", None), "use_ubatching", False))
    hooked = set()
    if not (compiled or ubatching):
        for index, layer in enumerate(layers):
            # Pipeline parallelism: the layers of other ranks are placeholders without parameters.
            if type(layer).__name__ != "PPMissingLayer":
                layer.register_forward_pre_hook(_layer_hook(runner, index))
                hooked.add(index)
    execute = runner.execute_model
    compute_logits = runner.model.compute_logits

    def execute_model(scheduler_output, *args, **kwargs):
        step = runner._nc_grpo_step = _Step(runner, scheduler_output, len(layers))
        try:
            out = execute(scheduler_output, *args, **kwargs)
        finally:
            runner._nc_grpo_step = None
        # A step without tokens returns before _prepare_inputs: nothing was owed (and the row layout is stale).
        spans = step.spans() if scheduler_output.total_num_scheduled_tokens else []
        owed = [s for s in spans if s.layer in (hooked or range(len(layers)))]
        missed = [s.req_id for s in owed if (s.req_id, s.positions[0]) not in step.applied]
        if missed:
            why = (
                "vLLM compiles this model (torch.compile and CUDA graphs run no Python hook per step)"
                if compiled
                else "micro-batching (DBO) splits the step's rows"
                if ubatching
                else "the decoder layer's hook did not run"
            )
            raise RuntimeError(
                f"nc_grpo: the layer_input noise of requests {missed[:4]} was not applied: {why}. Set {EAGER_KEY} "
                "(the method's launcher does) for noise_contrastive_grpo.target=layer_input"
            )
        return out

    def noisy_compute_logits(hidden_states: torch.Tensor, *args, **kwargs):
        step = runner._nc_grpo_step
        rows = flagged_rows(runner, step.output) if step is not None else []
        if rows:
            if hidden_states.shape[0] != len(runner.input_batch.req_ids):
                raise RuntimeError(
                    f"nc_grpo: {hidden_states.shape[0]} logits rows for {len(runner.input_batch.req_ids)} requests"
                )
            hidden_states = hidden_states.clone()
            for row, req_id, noise in rows:
                before = hidden_states[row]
                after = perturb(before, noise_vector(noise["seed"], before.shape[-1]), noise["scale"])
                prompt_len = int(runner.requests[req_id].num_prompt_tokens)
                runner.nc_grpo_applied.append(
                    applied_record(
                        req_id, noise, prompt_len - 1, prompt_len, before, after, runner.nc_grpo_keep_tensors
                    )
                )
                hidden_states[row] = after
            del runner.nc_grpo_applied[:-NOISE_RECORDS]
        return compute_logits(hidden_states, *args, **kwargs)

    runner.execute_model = execute_model
    runner.model.compute_logits = noisy_compute_logits
    setattr(runner, _INSTALLED, True)
    logger.info(
        "nc_grpo: noise hooks installed on %s (decoder layers %s%s)",
        type(runner).__name__,
        sorted(hooked),
        ", none: compiled model" if compiled else "",
    )
