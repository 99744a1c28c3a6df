"""NC-GRPO's hooks on vLLM's V1 model runner, against a stand-in runner with vLLM 0.24's state (``input_batch.req_ids``,
``input_batch.num_computed_tokens_cpu``, ``requests[req_id]`` with ``sampling_params.extra_args`` and
``num_prompt_tokens``, the scheduler output's ``num_scheduled_tokens``, ``query_start_loc``, the compilation config)
and its decoder layers' call ``layer(positions, hidden_states, residual)`` with a fused add-norm:

* ``layer_input``: which rows of a step's flattened batch are displaced (flagged requests' prompt positions: a whole
  prompt, a chunk of a chunked prefill, a preempted request's recomputed prompt; never a decode step, a clean
  request or a response position), at which layer, by what (the residual stream ``hidden + residual`` is the
  displaced state; the same rows of one draw whatever the chunking), against slow references;
* ``final_hidden``: the flagged requests whose chunk ends at the prompt's last token (not a first chunk, a decode step
  or a resumed request; a prefix-cache hit is);
* nothing outside ``execute_model`` (vLLM's warm-up); a compiled runner gets no decoder-layer hooks and fails a
  ``layer_input`` step naming ``enforce_eager``, while ``final_hidden`` still works there; V2 runner, speculative
  decoding refused; a row layout other than vLLM's refused.

vLLM itself runs in ``test_nc_grpo_backends_on_cpu.py``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl_ext.nc_grpo.noise import NOISE_KEY, noise_rows, noise_vector
from verl_ext.nc_grpo.runner_hook import EAGER_KEY, flagged_rows, install, prompt_spans

D = 16
LAYERS = 3


class _Layer(torch.nn.Module):
    """vLLM's decoder layer contract: ``(positions, hidden, residual) -> (hidden, residual)``, fused add-norm."""

    def __init__(self, index: int):
        super().__init__()
        self.index = index
        self.seen_stream = []

    def forward(self, positions, hidden, residual):
        stream = hidden if residual is None else hidden + residual
        self.seen_stream.append(stream.clone())
        return stream * 0.5 + 0.1 * (self.index + 1), stream


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = SimpleNamespace(layers=torch.nn.ModuleList(_Layer(i) for i in range(LAYERS)))
        self.logits_seen = []

    def compute_logits(self, hidden_states):
        self.logits_seen.append(hidden_states.clone())
        return hidden_states.sum(-1)


def _mode(name: str):
    return SimpleNamespace(name=name)


def _request(prompt: int, noise: dict | None):
    params = SimpleNamespace(extra_args={NOISE_KEY: noise} if noise is not None else None)
    return SimpleNamespace(num_prompt_tokens=prompt, num_computed_tokens=0, sampling_params=params)


def _noise(seed: int, target: str = "layer_input", layer: int = -1, scale: float = 0.5) -> dict:
    return {"seed": seed, "scale": scale, "target": target, "layer": layer}


def _runner(requests: dict, compiled: bool = False):
    """A stand-in V1 runner; ``execute_model`` flattens the step's rows (``req_ids`` order) and runs the layers."""
    model = _Model()
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=[], num_computed_tokens_cpu=np.zeros(0, dtype=np.int32)),
        requests=dict(requests),
        speculative_config=None,
        model=model,
        compilation_config=SimpleNamespace(
            mode=_mode("VLLM_COMPILE" if compiled else "NONE"),
            cudagraph_mode=_mode("PIECEWISE" if compiled else "NONE"),
        ),
        query_start_loc=SimpleNamespace(np=np.zeros(16, dtype=np.int32)),
        inputs=[],
    )

    def execute_model(step, intermediate_tensors=None):
        # _update_states: this step's batch order and computed tokens; _prepare_inputs: query_start_loc.
        runner.input_batch.req_ids = list(step.order)
        runner.input_batch.num_computed_tokens_cpu = np.array([step.computed[r] for r in step.order], dtype=np.int32)
        for req_id in step.order:
            runner.requests[req_id].num_computed_tokens = step.computed[req_id]
        counts = [step.num_scheduled_tokens[r] for r in step.order]
        runner.query_start_loc.np[: len(counts) + 1] = np.concatenate([[0], np.cumsum(counts)])
        total = int(sum(counts))
        hidden = torch.randn(total + 2, D, generator=torch.Generator().manual_seed(total))  # 2 padding rows
        runner.inputs.append(hidden.clone())
        residual = None
        for layer in model.model.layers:
            hidden, residual = layer(None, hidden, residual)
        last = np.cumsum(counts) - 1
        return model.compute_logits(hidden[torch.as_tensor(last)])

    runner.execute_model = execute_model
    return runner


def _step(order, scheduled: dict, computed: dict):
    return SimpleNamespace(
        order=order,
        num_scheduled_tokens=scheduled,
        computed=computed,
        total_num_scheduled_tokens=sum(scheduled.values()),
    )


def _slow_spans(batch, num_layers):
    """Rows by enumerating every scheduled token: row r is request i's position computed_i + k."""
    rows = []
    for req_id, scheduled, computed, prompt, noise in batch:
        for k in range(scheduled):
            rows.append((req_id, computed + k, prompt, noise))
    out = {}
    for row, (req_id, position, prompt, noise) in enumerate(rows):
        if noise is not None and noise["target"] == "layer_input" and position < prompt:
            layer = noise["layer"] % num_layers
            out.setdefault((req_id, layer), []).append((row, position))
    return out


def test_prompt_spans_against_enumerated_rows():
    rng = np.random.default_rng(0)
    for trial in range(50):
        batch = []
        for r in range(int(rng.integers(1, 7))):
            prompt = int(rng.integers(1, 30))
            computed = int(rng.integers(0, prompt + 5))
            scheduled = int(rng.integers(1, 12)) if computed < prompt else 1
            target = rng.choice(["layer_input", "final_hidden", "clean"])
            noise = None if target == "clean" else _noise(r, str(target), int(rng.integers(-LAYERS, LAYERS)))
            batch.append((f"r{r}", scheduled, computed, prompt, noise))
        spans = prompt_spans(batch, LAYERS)
        got = {}
        for s in spans:
            assert s.rows[1] - s.rows[0] == s.positions[1] - s.positions[0] > 0
            got[(s.req_id, s.layer)] = list(zip(range(*s.rows), range(*s.positions), strict=True))
        assert got == _slow_spans(batch, LAYERS), trial


def _reference_streams(inputs: torch.Tensor, displaced: dict[int, list[tuple]], scale: float = 0.5) -> list:
    """The residual stream entering each stand-in layer, by hand: at layer ``l``, rows ``r0:r1`` of each
    ``(r0, r1, seed, prompt_len, p0, p1)`` in ``displaced[l]`` get ``c * ||h_r|| / sqrt(D) * xi_p`` row by row."""
    hidden, residual, streams = inputs.clone(), None, []
    for index in range(LAYERS):
        stream = (hidden if residual is None else hidden + residual).clone()
        for r0, r1, seed, prompt_len, p0, p1 in displaced.get(index, []):
            xi = torch.randn(prompt_len, D, generator=torch.Generator().manual_seed(seed))  # one (P, D) draw
            for row, position in zip(range(r0, r1), range(p0, p1), strict=True):
                norm = math.sqrt(sum(float(v) ** 2 for v in stream[row]))
                stream[row] = stream[row] + scale * norm / math.sqrt(D) * xi[position]
        streams.append(stream)
        hidden, residual = stream * 0.5 + 0.1 * (index + 1), stream
    return streams


def test_layer_input_displaces_the_flagged_prompt_rows_at_their_layer_only():
    requests = {
        "whole": _request(6, _noise(11)),  # whole prompt this step, last layer
        "clean": _request(5, None),
        "chunk": _request(10, _noise(12, layer=1)),  # first chunk of 4 of a 10-token prompt, layer 1
        "decode": _request(4, _noise(13)),  # a decode step: nothing
        "final": _request(3, _noise(14, target="final_hidden")),  # the other reading: not a layer hook
    }
    runner = _runner(requests)
    install(runner)
    install(runner)  # idempotent: one set of hooks
    step = _step(
        ["whole", "clean", "chunk", "decode", "final"],
        {"whole": 6, "clean": 5, "chunk": 4, "decode": 1, "final": 3},
        {"whole": 0, "clean": 0, "chunk": 0, "decode": 5, "final": 0},
    )
    runner.execute_model(step)
    # Rows: whole 0-5, clean 6-10, chunk 11-14, decode 15, final 16-18, padding 19-20.
    want = _reference_streams(runner.inputs[0], {1: [(11, 15, 12, 10, 0, 4)], 2: [(0, 6, 11, 6, 0, 6)]})
    undisplaced = _reference_streams(runner.inputs[0], {})
    for index, layer in enumerate(runner.model.model.layers):
        (seen,) = layer.seen_stream
        assert torch.allclose(seen, want[index], atol=1e-5), index
    # Exactly those rows moved, at exactly those layers (row 15 is the flagged request's decode step).
    moved = {(i, r) for i in range(LAYERS) for r in range(21) if not torch.equal(want[i][r], undisplaced[i][r])}
    assert {r for i, r in moved if i == 1} == set(range(11, 15))
    assert {r for i, r in moved if i == 2} >= set(range(0, 6)) and not {r for i, r in moved if i == 0}
    records = {(r["request_id"], r["layer"]): r for r in runner.nc_grpo_applied}
    assert set(records) == {("chunk", 1), ("whole", 2), ("final", None)}  # final: its own reading, in compute_logits
    assert records["final", None]["positions"] == (2, 3)
    assert records["chunk", 1]["positions"] == (0, 4) and records["whole", 2]["positions"] == (0, 6)
    assert "hidden" not in records["whole", 2]  # the tensors only on request (nc_grpo_keep_tensors)


def test_chunks_and_a_recomputed_prompt_get_the_rows_of_one_draw():
    """A 10-token prompt prefilled as 4 + 6, and again from scratch after a preemption: the same xi_p per position."""
    runner = _runner({"a": _request(10, _noise(21)), "b": _request(3, None)})
    runner.nc_grpo_keep_tensors = False
    install(runner)
    runner.nc_grpo_keep_tensors = True
    runner.execute_model(_step(["b", "a"], {"b": 3, "a": 4}, {"b": 0, "a": 0}))
    runner.execute_model(_step(["a", "b"], {"a": 6, "b": 1}, {"a": 4, "b": 3}))  # rest of the prompt, b decodes
    runner.execute_model(_step(["a"], {"a": 12}, {"a": 0}))  # preempted, recomputed: prompt + 2 outputs
    first, second, recomputed = runner.nc_grpo_applied
    assert (first["positions"], second["positions"], recomputed["positions"]) == ((0, 4), (4, 10), (0, 10))
    xi = noise_rows(21, 10, 0, 10, D)
    for record in (first, second, recomputed):
        start, end = record["positions"]
        h = record["hidden"]
        want = 0.5 * h.norm(dim=-1, keepdim=True) / math.sqrt(D) * xi[start:end]
        assert torch.allclose(record["displacement"], want, atol=1e-6)
    # The recomputation displaced the 10 prompt rows and left the 2 output positions as they were.
    want = _reference_streams(runner.inputs[2], {2: [(0, 10, 21, 10, 0, 10)]})
    assert torch.allclose(runner.model.model.layers[-1].seen_stream[2], want[-1], atol=1e-5)


def test_final_hidden_rows_are_the_flagged_requests_whose_chunk_ends_at_the_prompt():
    requests = {
        "whole": _request(10, _noise(1, "final_hidden")),  # a prefill in one chunk: flagged
        "clean": _request(10, None),
        "chunk1": _request(20, _noise(2, "final_hidden")),  # first chunk of 8: not yet
        "chunk2": _request(20, _noise(3, "final_hidden")),  # last chunk: flagged
        "cached": _request(12, _noise(4, "final_hidden")),  # prefix-cache hit, rest computed now: flagged
        "decode": _request(10, _noise(5, "final_hidden")),  # a decode step: never
        "resumed": _request(10, _noise(6, "final_hidden")),  # preempted: prompt + outputs recomputed: never
        "layer": _request(10, _noise(7)),  # the other reading
    }
    computed = {"whole": 0, "clean": 0, "chunk1": 0, "chunk2": 12, "cached": 8, "decode": 11, "resumed": 0, "layer": 0}
    runner = _runner(requests)
    runner.input_batch.req_ids = list(requests)
    for req_id, value in computed.items():
        requests[req_id].num_computed_tokens = value
    step = _step(
        list(requests),
        {"whole": 10, "clean": 10, "chunk1": 8, "chunk2": 8, "cached": 4, "decode": 1, "resumed": 14, "layer": 10},
        computed,
    )
    rows = flagged_rows(runner, step)
    assert [(row, req) for row, req, _ in rows] == [(0, "whole"), (3, "chunk2"), (4, "cached")]
    assert [noise["seed"] for _, _, noise in rows] == [1, 3, 4]


def test_final_hidden_displaces_its_logits_rows_within_a_step_only():
    requests = {"a": _request(10, None), "b": _request(10, _noise(77, "final_hidden")), "c": _request(10, None)}
    runner = _runner(requests)
    install(runner)
    runner.execute_model(_step(["a", "b", "c"], {"a": 10, "b": 10, "c": 10}, {"a": 0, "b": 0, "c": 0}))
    (seen,) = runner.model.logits_seen
    last = runner.model.model.layers[-1]
    out = last.seen_stream[0] * 0.5 + 0.1 * LAYERS  # the stand-in's last layer output
    undisplaced = out[torch.tensor([9, 19, 29])]
    assert torch.equal(seen[0], undisplaced[0]) and torch.equal(seen[2], undisplaced[2])
    want = undisplaced[1] + 0.5 * undisplaced[1].norm() / math.sqrt(D) * noise_vector(77, D)
    assert torch.allclose(seen[1], want, atol=1e-6)
    (record,) = runner.nc_grpo_applied
    assert record["request_id"] == "b" and record["positions"] == (9, 10) and record["layer"] is None
    # Outside execute_model (vLLM's dummy and warm-up runs) nothing is displaced, flags or not.
    hidden = torch.ones(3, D)
    runner.model.compute_logits(hidden)
    assert torch.equal(runner.model.logits_seen[-1], hidden) and len(runner.nc_grpo_applied) == 1
    for layer in runner.model.model.layers:
        layer(None, torch.ones(30, D), None)  # a warm-up forward: no step, no displacement
    assert len(runner.nc_grpo_applied) == 1


def test_compiled_runner_refuses_layer_input_and_keeps_final_hidden():
    runner = _runner({"f": _request(4, _noise(5, "final_hidden")), "l": _request(4, _noise(6))}, compiled=True)
    install(runner)
    assert not any(layer._forward_pre_hooks for layer in runner.model.model.layers)
    runner.execute_model(_step(["f"], {"f": 4}, {"f": 0}))
    assert [r["request_id"] for r in runner.nc_grpo_applied] == ["f"]
    with pytest.raises(RuntimeError, match=EAGER_KEY.replace(".", r"\.")) as err:
        runner.execute_model(_step(["l"], {"l": 4}, {"l": 0}))
    assert "compiles this model" in str(err.value) and "'l'" in str(err.value)


def test_a_hook_that_did_not_run_fails_the_step():
    runner = _runner({"l": _request(4, _noise(6))})
    install(runner)
    runner.model.model.layers[-1]._forward_pre_hooks.clear()  # as if the forward ran elsewhere (a compiled graph)
    with pytest.raises(RuntimeError, match="was not applied"):
        runner.execute_model(_step(["l"], {"l": 4}, {"l": 0}))


def test_a_row_layout_other_than_query_start_loc_is_refused():
    runner = _runner({"l": _request(4, _noise(6)), "m": _request(4, None)})
    install(runner)
    original = runner.query_start_loc

    class _Shifted:
        @property
        def np(self):
            return original.np + 1

    runner.query_start_loc = _Shifted()
    with pytest.raises(RuntimeError, match="row layout"):
        runner.execute_model(_step(["l", "m"], {"l": 4, "m": 4}, {"l": 0, "m": 0}))


def test_install_refuses_what_it_cannot_read():
    with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        install(SimpleNamespace(model=_Model()))
    runner = _runner({"a": _request(10, None)})
    runner.speculative_config = object()
    with pytest.raises(RuntimeError, match="speculative decoding"):
        install(runner)
