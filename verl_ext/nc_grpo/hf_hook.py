"""NC-GRPO on a transformers model: the displacement of a flagged request's prompt, in the first forward call only.

``model.generate`` runs the prompt once (prefill), then one token at a time; a log-prob recomputation
(:mod:`verl_ext.checks.logprob_check`) runs prompt and response in one call. In both, the first call of the hooked
module sees the prompt's positions ``0 .. prompt_len - 1`` first, and :func:`prefill_noise` displaces those:

* ``layer_input``: a forward pre-hook on decoder layer ``layer`` (``model.get_decoder().layers``; its input is
  the residual stream ``(1, T, d)``) adds ``c * (||h_p|| / sqrt(d)) * xi_p`` to every prompt position ``p <
  prompt_len`` (``xi_p``: row ``p`` of :func:`~verl_ext.nc_grpo.noise.noise_rows`). The layer's keys and values of
  the prompt, cached by ``generate``, are those of the displaced input, so every decoding step attends to them; the
  response positions of a one-call recomputation are left as they are, which is what decoding computes for them.
* ``final_hidden``: a forward pre-hook on the LM head (its input is the final hidden state, after the last decoder
  layer and its norm) displaces the prompt's last position: only the first generated token's distribution moves
  (``generate``'s prefill may pass the last position alone: ``logits_to_keep``).

The hook is removed when the block ends; a block whose first call never came raises (no noise was applied).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from verl_ext.nc_grpo.noise import FINAL_HIDDEN, applied_record, noise_rows, noise_vector, perturb, resolve_layer


def decoder_layers(model: torch.nn.Module):
    """The language model's decoder layers of a transformers model (``model.get_decoder().layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise RuntimeError(f"nc_grpo: {type(model).__name__} has no get_decoder().layers to put the noise on")
    return layers


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


@contextmanager
def prefill_noise(
    model: torch.nn.Module,
    noise: dict | None,
    prompt_len: int,
    total_len: int | None = None,
    request_id: str = "",
    records: list | None = None,
    keep_tensors: bool = True,
):
    """Within the block, the first call of the hooked module displaces the prompt (module docstring).

    ``noise``: :func:`verl_ext.nc_grpo.noise.request_noise`'s entry, or ``None`` (nothing happens). ``prompt_len``:
    the prompt's tokens; ``total_len``: the tokens of the first forward call (``prompt_len`` for ``generate``'s
    prefill, prompt plus response for a one-call recomputation; default ``prompt_len``). ``records`` gets one
    :func:`~verl_ext.nc_grpo.noise.applied_record` (tensors with ``keep_tensors``)."""
    if noise is None:
        yield
        return
    total_len = prompt_len if total_len is None else int(total_len)
    state = {"done": False}
    if noise["target"] == FINAL_HIDDEN:
        module, layer = model.get_output_embeddings(), None
    else:
        layers = decoder_layers(model)
        layer = resolve_layer(noise["layer"], len(layers))
        module = layers[layer]

    def hook(module, args, kwargs):
        if state["done"]:
            return None
        state["done"] = True
        hidden = _hidden_arg(args, kwargs)
        if hidden.shape[0] != 1:
            raise RuntimeError(f"nc_grpo: the prefill hook expects one sequence, got {hidden.shape[0]}")
        # The call covers the last ``seq`` positions of the ``total_len`` tokens (the LM head may get the last only).
        first = total_len - hidden.shape[1]
        if noise["target"] == FINAL_HIDDEN:
            start, end = prompt_len - 1, prompt_len
            xi = noise_vector(noise["seed"], hidden.shape[-1])[None]
        else:
            start, end = 0, prompt_len
            xi = noise_rows(noise["seed"], prompt_len, 0, prompt_len, hidden.shape[-1])
        if not 0 <= start - first <= end - first <= hidden.shape[1]:
            raise RuntimeError(
                f"nc_grpo: the first call of {type(module).__name__} covers positions {first}..{total_len - 1}, not "
                f"the prompt's {start}..{end - 1}"
            )
        rows = slice(start - first, end - first)
        before = hidden[0, rows]
        after = perturb(before, xi, noise["scale"])
        if records is not None:
            shown = (before[0], after[0]) if noise["target"] == FINAL_HIDDEN else (before, after)
            records.append(
                applied_record(request_id, noise, start, end, *shown, keep_tensors=keep_tensors, layer=layer)
            )
        out = hidden.clone()
        out[0, rows] = after
        return _with_hidden(args, kwargs, out)

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
    if not state["done"]:
        raise RuntimeError(f"nc_grpo: the flagged request's prefill never reached {type(module).__name__}; no noise")
