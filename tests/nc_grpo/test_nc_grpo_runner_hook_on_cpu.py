"""NC-GRPO's hook on vLLM's V1 model runner, against a stand-in runner with vLLM 0.24's state (``input_batch.req_ids``,
``requests[req_id]`` with ``sampling_params.extra_args``, ``num_computed_tokens``, ``num_prompt_tokens``; the
scheduler output's ``num_scheduled_tokens``): which rows of a step are displaced (the flagged requests whose chunk
ends at the prompt's last token: not a first chunk of a chunked prefill, not a decode step, not a resumed request)
and by what; ``compute_logits`` outside ``execute_model`` (vLLM's warm-up) is untouched. vLLM itself runs in
``test_nc_grpo_backends_on_cpu.py``."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from verl_ext.nc_grpo.noise import NOISE_KEY, noise_vector
from verl_ext.nc_grpo.runner_hook import flagged_rows, install

D = 16


class _Model:
    def __init__(self):
        self.seen = []

    def compute_logits(self, hidden_states):
        self.seen.append(hidden_states.clone())
        return hidden_states.sum(-1)


def _request(prompt: int, computed: int, noise_seed: int | None):
    extra = {NOISE_KEY: {"seed": noise_seed, "scale": 0.5, "layer": "final"}} if noise_seed is not None else None
    params = SimpleNamespace(extra_args=extra)
    return SimpleNamespace(num_prompt_tokens=prompt, num_computed_tokens=computed, sampling_params=params)


def _runner(requests: dict):
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=list(requests)),
        requests=dict(requests),
        speculative_config=None,
        model=_Model(),
    )

    def execute_model(scheduler_output, intermediate_tensors=None):
        hidden = torch.arange(len(runner.input_batch.req_ids) * D, dtype=torch.float32).reshape(-1, D) / 10 + 1
        return runner.model.compute_logits(hidden)

    runner.execute_model = execute_model
    return runner


def _step(scheduled: dict):
    return SimpleNamespace(num_scheduled_tokens=scheduled)


def test_rows_are_the_flagged_requests_whose_chunk_ends_at_the_prompt():
    requests = {
        "whole": _request(prompt=10, computed=0, noise_seed=1),  # a prefill in one chunk: flagged
        "clean": _request(prompt=10, computed=0, noise_seed=None),  # not flagged
        "chunk1": _request(prompt=20, computed=0, noise_seed=2),  # first chunk of 8: not yet
        "chunk2": _request(prompt=20, computed=12, noise_seed=3),  # last chunk: flagged
        "cached": _request(prompt=12, computed=8, noise_seed=4),  # prefix-cache hit, rest computed now: flagged
        "decode": _request(prompt=10, computed=11, noise_seed=5),  # a decode step: never
        "resumed": _request(prompt=10, computed=0, noise_seed=6),  # preempted: prompt + outputs recomputed: never
    }
    runner = _runner(requests)
    step = _step({"whole": 10, "clean": 10, "chunk1": 8, "chunk2": 8, "cached": 4, "decode": 1, "resumed": 14})
    rows = flagged_rows(runner, step)
    assert [(row, req) for row, req, _ in rows] == [(0, "whole"), (3, "chunk2"), (4, "cached")]
    assert [noise["seed"] for _, _, noise in rows] == [1, 3, 4]


def test_installed_hook_displaces_those_rows_only_within_a_step():
    runner = _runner(
        {"a": _request(10, 0, None), "b": _request(10, 0, 77), "c": _request(10, 10, 78)}
    )  # c: a decode step
    install(runner)
    install(runner)  # idempotent: one wrapper
    hidden = torch.arange(3 * D, dtype=torch.float32).reshape(-1, D) / 10 + 1
    runner.execute_model(_step({"a": 10, "b": 10, "c": 1}))
    (seen,) = runner.model.seen
    assert torch.equal(seen[0], hidden[0]) and torch.equal(seen[2], hidden[2])
    want = hidden[1] + 0.5 * hidden[1].norm() / math.sqrt(D) * noise_vector(77, D)
    assert torch.allclose(seen[1], want, atol=1e-6)
    (record,) = runner.nc_grpo_applied
    assert record["request_id"] == "b" and torch.equal(record["hidden"], hidden[1])
    assert torch.allclose(record["displacement"], want - hidden[1], atol=1e-6)
    # Outside execute_model (vLLM's dummy and warm-up runs) nothing is displaced, flags or not.
    runner.model.compute_logits(hidden)
    assert torch.equal(runner.model.seen[-1], hidden) and len(runner.nc_grpo_applied) == 1


def test_install_refuses_what_it_cannot_read():
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        install(SimpleNamespace(model=_Model()))
    runner = _runner({"a": _request(10, 0, 1)})
    runner.speculative_config = object()
    with pytest.raises(RuntimeError, match="speculative decoding"):
        install(runner)
