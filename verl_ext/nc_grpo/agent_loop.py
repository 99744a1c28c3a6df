"""The agent loop of NC-GRPO (``noise_contrastive_agent``): the seeded single-turn loop that flags requests.

For a training prompt (a run uid, :func:`verl_ext.rollout.seeds.is_run_uid`) with ``n = rollout.n`` responses,
the ``noisy_fraction * n`` responses :func:`verl_ext.nc_grpo.noise.noisy_responses` picks for (rollout seed, step,
uid) are flagged: their sampling params get ``extra_args[NOISE_KEY] = {seed, scale, layer}``, which the server
(``hf_cpu`` or vLLM with :mod:`verl_ext.nc_grpo.vllm_noise`) applies to the prefill. Validation prompts (verl's
``uuid4``) are never noised: the inference protocol is untouched. Every trajectory carries its flag and noise seed
(``-1``: clean) in ``extra_fields``, which verl writes to TransferQueue with the response, so the trainer reads
the flag in step with it.

Registered with verl by configuration (``recipe/diva_grpo/config/agent_loops.yaml``) and selected by
``rollout.agent.default_agent_loop=noise_contrastive_agent`` (the method's launcher sets it).
"""

from __future__ import annotations

from typing import Any

from verl_ext.config import config_block
from verl_ext.nc_grpo.noise import FLAG_FIELD, NOISE_KEY, SEED_FIELD, noise_seed, noisy_responses
from verl_ext.rollout.agent_loop import SeededSingleTurnAgentLoop, request_place
from verl_ext.rollout.seeds import is_run_uid


def method_config(config):
    """The ``noise_contrastive_grpo:`` block of the trainer config, typed (defaults for a missing block)."""
    from verl_ext.methods.noise_contrastive_grpo import NAME, NoiseContrastiveConfig

    return config_block(NoiseContrastiveConfig, config.get(NAME), NAME)


def request_noise_entry(rollout_config, knobs, kwargs: dict[str, Any]) -> dict | None:
    """The noise entry of the request ``kwargs`` names, or ``None`` when it stays clean."""
    if not is_run_uid(str(kwargs["uid"])):
        return None
    step, key, response = request_place(kwargs)
    run_seed = int(rollout_config.seed)
    if response not in noisy_responses(run_seed, step, key, int(rollout_config.n), knobs.noisy_fraction):
        return None
    return {"seed": noise_seed(run_seed, step, key, response), "scale": float(knobs.noise_scale), "layer": knobs.layer}


def trajectory_fields(rollout_config, knobs, kwargs: dict[str, Any]) -> dict[str, int]:
    """What the trajectory of request ``kwargs`` carries in ``extra_fields``: its flag and noise seed (-1: clean)."""
    noise = request_noise_entry(rollout_config, knobs, kwargs)
    return {FLAG_FIELD: int(noise is not None), SEED_FIELD: noise["seed"] if noise is not None else -1}


class NoiseContrastiveAgentLoop(SeededSingleTurnAgentLoop):
    """:class:`SeededSingleTurnAgentLoop` whose flagged requests carry the noise entry (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.nc_grpo = method_config(self.config)

    def request_sampling_params(self, sampling_params: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        params = super().request_sampling_params(sampling_params, kwargs)
        noise = request_noise_entry(self.rollout_config, self.nc_grpo, kwargs)
        if noise is not None:
            params["extra_args"] = {**(params.get("extra_args") or {}), NOISE_KEY: noise}
        return params

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        output = await super().run(sampling_params, **kwargs)
        output.extra_fields.update(trajectory_fields(self.rollout_config, self.nc_grpo, kwargs))
        return output
