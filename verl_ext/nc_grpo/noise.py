"""What both rollout backends share for NC-GRPO: which responses are noisy, their noise seed, the noise draws and
the displacement. Pure functions of their arguments (torch on the CPU), so that ``hf_cpu`` and vLLM noise the same
requests by the same vectors for a seed, and every tensor-parallel rank of one vLLM replica by the same numbers.

A flagged request carries :data:`NOISE_KEY` in its sampling params' ``extra_args`` (vLLM's
``SamplingParams.extra_args``, which verl's vLLM server passes through; the ``hf_cpu`` server reads the same key):
``{"seed": int, "scale": float, "target": "layer_input" | "final_hidden", "layer": int}``.

The two readings (:data:`TARGETS`), both in the prefill only, both ``h~ = h + c * (||h|| / sqrt(d)) * xi``:

* ``layer_input``: ``h`` is the residual stream entering decoder layer ``layer`` (``(P, d)``, every prompt
  position ``p``, each displaced by its own ``xi_p``: rows of one ``(P, d)`` draw). That layer's keys and values of
  the prompt are displaced, so every decoding step attends to them: the displacement persists.
* ``final_hidden``: ``h`` is the final hidden state (after the last decoder layer and its norm, the LM head's
  input) at the prompt's last position (``(d,)``, one ``xi``): only the first generated token's distribution moves.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from verl_ext.rollout.seeds import stable_seed

# The sampling params' extra_args entry of a flagged request, and the trajectory's extra_fields keys.
NOISE_KEY = "nc_grpo_noise"
FLAG_FIELD = "nc_grpo_noisy"
SEED_FIELD = "nc_grpo_noise_seed"
# Where the noise goes (module docstring). LAYER_INPUT: the residual stream entering a decoder layer at every prompt
# position; FINAL_HIDDEN: the final hidden state at the prompt's last position (the first-token reading).
LAYER_INPUT = "layer_input"
FINAL_HIDDEN = "final_hidden"
TARGETS = (LAYER_INPUT, FINAL_HIDDEN)
# The agent loop that flags requests (recipe/diva_grpo/config/agent_loops.yaml) and vLLM's worker extensions that
# apply the noise (GPU; vLLM's CPU build), by name: the trainer checks the config against them without vLLM.
AGENT_LOOP_NAME = "noise_contrastive_agent"
NOISE_WORKER_EXTENSION = "verl_ext.nc_grpo.vllm_noise.NoiseWorkerExtension"
CPU_NOISE_WORKER_EXTENSION = "verl_ext.nc_grpo.vllm_noise.CpuNoiseWorkerExtension"


def noisy_count(n: int, noisy_fraction: float) -> int:
    """``noisy_fraction * n`` responses of a group of ``n``; ``ValueError`` naming the keys if it is not integral."""
    count = Fraction(str(noisy_fraction)) * int(n)
    if not 0 <= noisy_fraction <= 1 or count.denominator != 1:
        raise ValueError(
            f"noise_contrastive_grpo.noisy_fraction={noisy_fraction} with actor_rollout_ref.rollout.n={n}: "
            f"noisy_fraction * n = {float(count):g} must be a whole number of responses in [0, n] (for the default "
            "0.5, n must be even)"
        )
    return int(count)


def noisy_responses(run_seed: int, step: int, uid: str, n: int, noisy_fraction: float) -> frozenset[int]:
    """The response indices (of ``range(n)``) of prompt ``uid`` at ``step`` that are noised: the ``noisy_fraction
    * n`` with the smallest seeded key, a seeded choice that depends only on (run seed, step, uid)."""
    count = noisy_count(n, noisy_fraction)
    keys = sorted(range(int(n)), key=lambda i: (stable_seed("nc_grpo_half", int(run_seed), int(step), str(uid), i), i))
    return frozenset(keys[:count])


def noise_seed(run_seed: int, step: int, uid: str, response_index: int) -> int:
    """The seed of response ``response_index``'s noise (apart from its sampling seed)."""
    return stable_seed("nc_grpo_noise", int(run_seed), int(step), str(uid), int(response_index))


def noise_vector(seed: int, dim: int) -> torch.Tensor:
    """``xi ~ N(0, I_dim)``, ``(dim,)`` float32 on the CPU, from a generator seeded by ``seed`` (the
    ``final_hidden`` reading's one vector; move it to the device after)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return torch.randn(int(dim), generator=generator, dtype=torch.float32)


def noise_rows(seed: int, prompt_len: int, start: int, end: int, dim: int) -> torch.Tensor:
    """Rows ``start:end`` of ``Xi ~ N(0, I)`` of shape ``(prompt_len, dim)``, float32 on the CPU, drawn at once
    from a generator seeded by ``seed`` (the ``layer_input`` reading: row ``p`` is prompt position ``p``'s ``xi_p``).

    The whole ``(prompt_len, dim)`` matrix is drawn and sliced, whatever the slice: torch's CPU normal sampler
    fills a tensor in blocks whose tail depends on its size, so a shorter draw is not a prefix of a longer one, and
    a prompt prefilled in chunks (vLLM's chunked prefill) must get the rows of one draw."""
    if not 0 <= start <= end <= prompt_len:
        raise ValueError(f"nc_grpo: noise rows {start}:{end} outside a prompt of {prompt_len} positions")
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return torch.randn(int(prompt_len), int(dim), generator=generator, dtype=torch.float32)[start:end]


def displacement(stream: torch.Tensor, xi: torch.Tensor, scale: float) -> torch.Tensor:
    """``c * (||h_p|| / sqrt(d)) * xi_p`` for every row ``p`` of ``stream`` (``(..., d)``; the norm over the last
    dimension), float32 on ``stream``'s device. ``xi``: the same shape, float32 (moved to the device)."""
    h = stream.float()
    norms = h.norm(dim=-1, keepdim=True)
    return (float(scale) / math.sqrt(h.shape[-1])) * norms * xi.to(device=h.device, dtype=torch.float32)


def perturb(hidden: torch.Tensor, xi: torch.Tensor, scale: float) -> torch.Tensor:
    """``h + c * (||h|| / sqrt(d)) * xi`` per row of ``hidden`` (``(..., d)``, ``(d,)`` for one vector), computed
    in float32 and returned in ``hidden``'s dtype. ``xi`` (same shape, float32) is moved to ``hidden``'s device."""
    return (hidden.float() + displacement(hidden, xi, scale)).to(hidden.dtype)


def resolve_layer(layer: int, num_layers: int) -> int:
    """The decoder layer index ``layer`` names in a model of ``num_layers`` (negative counts from the end: -1 is the
    last); ``ValueError`` naming the key when it is outside the model."""
    index = int(layer) + int(num_layers) if int(layer) < 0 else int(layer)
    if not 0 <= index < int(num_layers):
        raise ValueError(
            f"noise_contrastive_grpo.layer={layer}: the model has {num_layers} decoder layers (use 0..{num_layers - 1}"
            f" or -1..-{num_layers})"
        )
    return index


def request_noise(sampling_params: dict) -> dict | None:
    """The noise entry of a request's sampling params (``extra_args[NOISE_KEY]``), checked, or ``None`` for a clean
    one: ``{"seed", "scale", "target", "layer"}``."""
    extra = sampling_params.get("extra_args") or {}
    noise = extra.get(NOISE_KEY)
    if noise is None:
        return None
    target = noise.get("target")
    if target not in TARGETS:
        raise ValueError(f"{NOISE_KEY}.target={target!r}: the readings implemented are {TARGETS}")
    layer = noise.get("layer", -1)
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ValueError(f"{NOISE_KEY}.layer={layer!r}: a decoder layer index (int; -1 is the last)")
    return {"seed": int(noise["seed"]), "scale": float(noise["scale"]), "target": target, "layer": layer}


def applied_record(
    request_id: str,
    noise: dict,
    start: int,
    end: int,
    before: torch.Tensor,
    after: torch.Tensor,
    keep_tensors: bool = True,
    layer: int | None = None,
) -> dict:
    """What a backend records of one applied displacement of prompt positions ``start:end`` (``before`` and
    ``after``: ``(end - start, d)``, or ``(d,)`` for the final hidden state). ``layer``: the resolved decoder layer
    (``None`` for ``final_hidden``). The tensors (float32 CPU copies) only with ``keep_tensors`` (tests compare
    backends on them; a 7B prompt's rows are tens of MB): otherwise nothing leaves the device but the relative size
    ``||h~ - h|| / ||h||``, one scalar, computed where the rows are."""
    before32, after32 = before.detach().float(), after.detach().float()
    moved = after32 - before32  # a new tensor, made before the caller overwrites ``before`` (it may be a view)
    record = {
        "request_id": str(request_id),
        "seed": int(noise["seed"]),
        "scale": float(noise["scale"]),
        "target": noise["target"],
        "layer": layer,
        "positions": (int(start), int(end)),
        "relative_norm": float(moved.norm() / before32.norm().clamp_min(1e-30)),
    }
    if keep_tensors:
        record.update(hidden=before32.cpu().clone(), displacement=moved.cpu().clone())
    return record
