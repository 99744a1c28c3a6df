"""The agent loop of NC-GRPO (``noise_contrastive_agent``): the seeded single-turn loop that flags requests.

For a training prompt (a run uid, :func:`verl_ext.rollout.seeds.is_run_uid`) with ``n = rollout.n`` responses,
the ``noisy_fraction * n`` responses :func:`verl_ext.nc_grpo.noise.noisy_responses` picks for (rollout seed, step,
uid) are flagged: their sampling params get ``extra_args[NOISE_KEY] = {seed, scale, target, layer}``, which the
server (``hf_cpu`` or vLLM with :mod:`verl_ext.nc_grpo.vllm_noise`) applies to the prefill. Validation prompts
(verl's ``uuid4``) are never noised: the inference protocol is untouched. Every trajectory carries its flag and
noise seed (``-1``: clean) in ``extra_fields``, which verl writes to TransferQueue with the response, so the trainer
reads the flag in step with it.

Branch probe (``branch_probe_tokens > 0``): a flagged request is sent together with its clean twin, the same
params (seed included) without the noise entry and with ``max_tokens = branch_probe_tokens``: the response the same
draw gives without the noise. The twin is not trained on; the trajectory carries
:func:`verl_ext.nc_grpo.branching.first_difference` of the two (``extra_fields[FIRST_DIFFERENCE_FIELD]``), which the
method turns into the step's branch metrics. It costs one prefill and at most ``branch_probe_tokens`` decoding
steps per noisy response.

Registered with verl by configuration (``recipe/diva_grpo/config/agent_loops.yaml``) and selected by
``rollout.agent.default_agent_loop=noise_contrastive_agent`` (the method's launcher sets it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl_ext.config import config_block
from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD, NOT_PROBED, first_difference
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
    return {
        "seed": noise_seed(run_seed, step, key, response),
        "scale": float(knobs.noise_scale),
        "target": knobs.target,
        "layer": int(knobs.layer),
    }


def trajectory_fields(rollout_config, knobs, kwargs: dict[str, Any]) -> dict[str, int]:
    """What the trajectory of request ``kwargs`` carries in ``extra_fields`` before it is generated: its flag, its
    noise seed (-1: clean) and ``FIRST_DIFFERENCE_FIELD = NOT_PROBED`` (the probe, if any, fills it in)."""
    noise = request_noise_entry(rollout_config, knobs, kwargs)
    return {
        FLAG_FIELD: int(noise is not None),
        SEED_FIELD: noise["seed"] if noise is not None else -1,
        FIRST_DIFFERENCE_FIELD: NOT_PROBED,
    }


def clean_twin_params(sampling_params: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A flagged request's params without the noise entry (an ``extra_args`` left empty is dropped), capped at
    ``max_tokens``: the same draw, undisplaced."""
    params = dict(sampling_params)
    extra = {k: v for k, v in (params.pop("extra_args", None) or {}).items() if k != NOISE_KEY}
    if extra:
        params["extra_args"] = extra
    params["max_tokens"] = int(max_tokens)
    return params


class BranchProbe:
    """Stands in for the loop's ``server_manager`` during one flagged request: ``generate`` sends the request and
    its clean twin (:func:`clean_twin_params`) together, returns the request's output and keeps
    :func:`first_difference` of the two in ``self.first_difference``. Anything else goes to the server manager."""

    def __init__(self, server_manager, max_tokens: int):
        self._server_manager = server_manager
        self.max_tokens = int(max_tokens)
        self.first_difference = NOT_PROBED

    async def generate(self, *, request_id: str, sampling_params: dict[str, Any], **kwargs):
        twin = clean_twin_params(sampling_params, self.max_tokens)
        # Copies: a server may change the params it is given (verl's vLLM server pops max_tokens, logprobs).
        output, clean = await asyncio.gather(
            self._server_manager.generate(request_id=request_id, sampling_params=dict(sampling_params), **kwargs),
            self._server_manager.generate(request_id=f"{request_id}-nc-grpo-clean", sampling_params=twin, **kwargs),
        )
        self.first_difference = first_difference(output.token_ids, clean.token_ids, self.max_tokens)
        return output

    def __getattr__(self, name: str):
        return getattr(self._server_manager, name)


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
        fields = trajectory_fields(self.rollout_config, self.nc_grpo, kwargs)
        probe = None
        tokens = min(int(self.nc_grpo.branch_probe_tokens), int(self.rollout_config.response_length))
        if fields[FLAG_FIELD] and tokens > 0:
            # One loop instance per request (verl's worker builds it per sample): the stand-in is this request's.
            probe = self.server_manager = BranchProbe(self.server_manager, tokens)
        output = await super().run(sampling_params, **kwargs)
        if probe is not None:
            fields[FIRST_DIFFERENCE_FIELD] = probe.first_difference
        output.extra_fields.update(fields)
        return output
