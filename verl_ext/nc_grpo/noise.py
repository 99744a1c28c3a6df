"""What both rollout backends share for NC-GRPO: which responses are noisy, their noise seed, the noise vector and
the displacement. Pure functions of their arguments (torch on the CPU), so that ``hf_cpu`` and vLLM noise the same
requests by the same vector for a seed.

A flagged request carries :data:`NOISE_KEY` in its sampling params' ``extra_args`` (vLLM's
``SamplingParams.extra_args``, which verl's vLLM server passes through; the ``hf_cpu`` server reads the same key):
``{"seed": int, "scale": float, "layer": "final"}``.
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
# The layers the noise may go on. "final": the final hidden state (after the last decoder layer and its norm), the
# LM head's input; the only one implemented (README, NC-GRPO: the other reading is not built).
LAYERS = ("final",)
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
    """The seed of response ``response_index``'s noise vector (apart from its sampling seed)."""
    return stable_seed("nc_grpo_noise", int(run_seed), int(step), str(uid), int(response_index))


def noise_vector(seed: int, dim: int) -> torch.Tensor:
    """``xi ~ N(0, I_dim)``, float32 on the CPU, from a generator seeded by ``seed`` (move it to the device after)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    return torch.randn(int(dim), generator=generator, dtype=torch.float32)


def perturb(hidden: torch.Tensor, xi: torch.Tensor, scale: float) -> torch.Tensor:
    """``h + scale * (||h|| / sqrt(d)) * xi`` for ``hidden`` of shape ``(d,)``, computed in float32 and returned
    in ``hidden``'s dtype. ``xi`` (``(d,)``, float32) is moved to ``hidden``'s device."""
    h = hidden.float()
    d = h.shape[-1]
    step = (float(scale) * h.norm() / math.sqrt(d)) * xi.to(device=h.device, dtype=torch.float32)
    return (h + step).to(hidden.dtype)


def request_noise(sampling_params: dict) -> dict | None:
    """The noise entry of a request's sampling params (``extra_args[NOISE_KEY]``), or ``None`` for a clean one."""
    extra = sampling_params.get("extra_args") or {}
    noise = extra.get(NOISE_KEY)
    if noise is None:
        return None
    layer = noise.get("layer", "final")
    if layer not in LAYERS:
        raise ValueError(f"{NOISE_KEY}.layer={layer!r}: implemented layers are {LAYERS}")
    return {"seed": int(noise["seed"]), "scale": float(noise["scale"]), "layer": layer}


def applied_record(request_id: str, seed: int, scale: float, before: torch.Tensor, after: torch.Tensor) -> dict:
    """What a backend records of one applied displacement (tests compare backends on it)."""
    # Copies: ``before`` may be a view of the batch the caller then overwrites with ``after``.
    before32, after32 = before.detach().float().cpu().clone(), after.detach().float().cpu().clone()
    return {
        "request_id": str(request_id),
        "seed": int(seed),
        "scale": float(scale),
        "hidden": before32,
        "displacement": after32 - before32,
    }
