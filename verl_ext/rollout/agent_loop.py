"""verl's single-turn agent loop with a sampling seed per request (``seeded_single_turn_agent``).

verl's agent loop sends every request the same sampling params; the server's sampler then draws from its own
stream (vLLM: one engine seed per replica), so a response's random numbers depend on which requests ran before it.
:class:`SeededSingleTurnAgentLoop` adds ``seed`` = :func:`verl_ext.rollout.seeds.request_seed` of (the rollout's
seed, the step, the prompt's uid, the response's index in its group) to each request's sampling params, which vLLM
takes as ``SamplingParams.seed`` (a generator per request) and the ``hf_cpu`` server as its own generator's seed.

Training prompts carry the trainer's run uids (:func:`verl_ext.rollout.seeds.prompt_uid`); verl draws validation
uids with ``uuid4``, so a validation request is keyed by its prompt's content and dataset index instead.

Every request goes through :class:`verl_ext.rollout.request_retry.RetryingClient`, which stands in for the loop's
``server_manager``: a failed request is sent again with the same params (its seed included, so the same tokens come
back) up to ``rollout_requests.max_attempts`` times, then it is recorded for the replay buffer, which fails the step
naming it. Subclasses that wrap the server manager further (NC-GRPO's branch probe) wrap the retrying one, so each of
their requests is retried on its own.

It is registered with verl's agent-loop registry by configuration (``rollout.agent.agent_loop_config_path``, the
recipe's ``config/agent_loops.yaml``) and made the default loop by ``rollout.agent.default_agent_loop``; the agent
loop workers build it by its dotted path. Subclasses change the request through :meth:`request_sampling_params`.

A validation row may ask for greedy decoding whatever ``rollout.val_kwargs`` says: its ``validation_sampling``
column is ``"greedy"`` (:mod:`data_prep.validation_views`, which pairs each question's greedy copy with a sampled
one, so that one validation pass reports both; verl takes the sampling params from ``val_kwargs`` for the whole
pass). It gets verl's own greedy params (``verl.trainer.ppo.v1.agent_loop_tq.apply_greedy_sampling_params``).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.trainer.ppo.v1.agent_loop_tq import apply_greedy_sampling_params

from verl_ext import faults
from verl_ext.rollout.request_retry import RetryingClient
from verl_ext.rollout.seeds import content_key, is_run_uid, request_seed

AGENT_LOOP_NAME = "seeded_single_turn_agent"
# A row's column that asks for greedy decoding (value GREEDY), see the module docstring.
VALIDATION_SAMPLING = "validation_sampling"
GREEDY = "greedy"


# Keys of an image item that tell the processor how to resize the image, not what the image is: DIVA's dataset sets
# ``max_pixels`` on every image item and verl's dataset sets none, so keying on them would give the same validation
# question different sampling seeds under DIVA-GRPO and under GRPO, and their sampled validations would not be paired.
RESIZE_HINTS = frozenset({"max_pixels", "min_pixels", "resized_height", "resized_width"})


def without_resize_hints(value: Any) -> Any:
    """``value`` (a raw prompt: messages, content lists, image items) with :data:`RESIZE_HINTS` left out of every
    dict."""
    if isinstance(value, dict):
        return {k: without_resize_hints(v) for k, v in value.items() if k not in RESIZE_HINTS}
    if isinstance(value, list | tuple):
        return [without_resize_hints(v) for v in value]
    return value


def request_place(kwargs: dict[str, Any]) -> tuple[int, str, int]:
    """(step, prompt key, response index) of the request verl's agent loop worker calls ``run`` with. A prompt
    without a run uid (validation) is keyed on its content: its messages and images, not their resize hints."""
    uid = str(kwargs["uid"])
    if is_run_uid(uid):
        key = uid
    else:
        key = content_key(without_resize_hints(kwargs.get("raw_prompt")), kwargs.get("index"))
    return int(kwargs.get("global_steps", 0) or 0), key, int(kwargs.get("session_id", 0))


class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's ``single_turn_agent`` whose requests each carry their own sampling seed and are retried when they
    fail."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # verl builds one loop per request: this stand-in is the request's (its rollout_requests knobs are read
        # when the request is sent, so that a bad value fails it with its message).
        self.request_retry = RetryingClient(self.server_manager, self.config)
        self.server_manager = self.request_retry

    def request_sampling_params(self, sampling_params: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The sampling params of this request: verl's, plus its seed. ``kwargs`` are the prompt's fields."""
        step, key, response = request_place(kwargs)
        params = dict(sampling_params)
        params["seed"] = request_seed(int(self.rollout_config.seed), step, key, response)
        if kwargs.get(VALIDATION_SAMPLING) == GREEDY:
            apply_greedy_sampling_params(params)
        return params

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        faults.inject("agent_loop_run", int(kwargs.get("global_steps", 0) or 0))
        retry = getattr(self, "request_retry", None)  # absent in a loop built without __init__ (tests)
        if retry is not None:
            retry.for_request(kwargs)
        return await super().run(self.request_sampling_params(sampling_params, kwargs), **kwargs)
