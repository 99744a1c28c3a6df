"""NC-GRPO in the ``hf_cpu`` rollout server: the prefill's final hidden state at the prompt's last position.

``model.generate`` runs the prompt once (prefill), then one token at a time. :func:`prefill_noise` puts a forward
pre-hook on the LM head (``model.get_output_embeddings()``: its input is the final hidden state, after the last
decoder layer and its norm) that displaces the last position of the first call only, the prefill; the hook is
removed when the request is done. The KV cache is built inside the decoder layers, before the LM head, so decoding
after the first token is the unperturbed model's.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from verl_ext.nc_grpo.noise import applied_record, noise_vector, perturb


@contextmanager
def prefill_noise(model: torch.nn.Module, noise: dict | None, request_id: str = "", records: list | None = None):
    """Within the block, the next LM-head call (the prefill) sees ``h~`` at its last position (``noise``:
    :func:`verl_ext.nc_grpo.noise.request_noise`); nothing happens for ``noise=None``. ``records`` gets one
    :func:`~verl_ext.nc_grpo.noise.applied_record`."""
    if noise is None:
        yield
        return
    head = model.get_output_embeddings()
    state = {"done": False}

    def hook(module, args):
        if state["done"]:
            return None
        state["done"] = True
        hidden = args[0]
        last = hidden[:, -1, :]
        if last.shape[0] != 1:
            raise RuntimeError(f"nc_grpo: the hf_cpu prefill hook expects one sequence, got {last.shape[0]}")
        xi = noise_vector(noise["seed"], last.shape[-1])
        noisy = perturb(last[0], xi, noise["scale"])
        if records is not None:
            records.append(applied_record(request_id, noise["seed"], noise["scale"], last[0], noisy))
        out = hidden.clone()
        out[0, -1, :] = noisy
        return (out, *args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
    if not state["done"]:
        raise RuntimeError("nc_grpo: the flagged request's prefill never reached the LM head; no noise was applied")
