"""NC-GRPO's noise in the rollout servers, on the tiny Qwen2-VL (2 decoder layers): the ``hf_cpu`` server
(transformers) and verl's vLLM server's engine with the noise worker extension (vLLM's CPU build, prompts prefilled
in chunks of 32 tokens; skipped outside the GPU stack's environment unless ``DIVA_REQUIRE_VLLM=1``).

* a clean request's tokens and log-probs are those of the same seeded request without the method (the hook leaves
  nothing behind after a flagged request);
* ``layer_input``: the keys and values of the displaced layer (and of every layer after it) at the prompt's
  positions differ from the clean run's for a flagged request, and only for it; the layers before it are untouched;
  the displaced state is the residual stream entering that layer, moved by exactly ``c * ||h_p|| / sqrt(d) * xi_p``
  per position; every served log-prob is the displaced model's (the same displacement in one transformers pass over
  prompt and response), and later tokens move, not only the first;
* ``final_hidden``: the final hidden state at the prompt's last position is displaced, its first token is sampled
  from ``lm_head(h~)`` and every later token from the unperturbed model;
* both backends noise the same requests with the same vectors for a seed (drawn per response), on the same states,
  whatever the chunking of vLLM's prefill; vLLM's own log-probs are the displaced model's on every token.
"""

from __future__ import annotations

import asyncio
import math
import os
from contextlib import contextmanager

import pytest
import torch
from PIL import Image

from verl_ext.nc_grpo.noise import NOISE_KEY, noise_rows, noise_seed, noise_vector

pytestmark = pytest.mark.gpu_stack

C = 0.5  # large enough that the random tiny model's samples visibly move within 12 tokens


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("torchvision")
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    return build_tiny_qwen2_vl(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def server(tiny_model):
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from verl_ext.cpu.rollout import HFCpuServer

    rollout = RolloutConfig(name="hf_cpu", prompt_length=512, response_length=12, calculate_log_probs=True)
    server = HFCpuServer.__ray_actor_class__(rollout, HFModelConfig(path=tiny_model), 0, RolloutMode.HYBRID)
    server.nc_grpo_keep_tensors = True
    return server


def _image_prompt(server, text: str):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = server.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.new("RGB", (84, 56), (40, 160, 90))
    return server.processor(text=[prompt], images=[image], return_tensors="pt"), image


def _noise(seed: int, target: str = "layer_input", layer: int = -1, scale: float = C) -> dict:
    return {"seed": seed, "scale": scale, "target": target, "layer": layer}


def _params(seed: int, noise: dict | None = None) -> dict:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": seed}
    if noise is not None:
        params["extra_args"] = {NOISE_KEY: noise}
    return params


def _generate(server, prompt_ids, params, image=None, request_id="r"):
    images = [image] if image is not None else None
    request = server.generate(prompt_ids=prompt_ids, sampling_params=params, request_id=request_id, image_data=images)
    return asyncio.run(request)


@contextmanager
def _prefill_kv(model):
    """Keys and values (``k_proj`` / ``v_proj`` outputs, ``(P, kv_dim)``) of every decoder layer's first call."""
    from verl_ext.nc_grpo.hf_hook import decoder_layers

    seen: dict[int, dict[str, torch.Tensor]] = {}
    handles = []
    for index, layer in enumerate(decoder_layers(model)):
        for name in ("k_proj", "v_proj"):

            def hook(module, args, out, index=index, name=name):
                seen.setdefault(index, {}).setdefault(name, out[0].detach().clone())

            handles.append(getattr(layer.self_attn, name).register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def _forward(server, inputs, new_ids, noise=None):
    """Unperturbed (or, with ``noise``, displaced) model over prompt + response in one pass: (hidden states entering
    each layer at the prompt's positions, final hidden state at the prompt's last position, log-probs of every
    response token given the tokens before it)."""
    from verl_ext.nc_grpo.hf_hook import prefill_noise

    prompt_len = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([new_ids])], dim=1)
    extra = {}
    if "pixel_values" in inputs:
        types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(new_ids), dtype=torch.int32)], dim=1)
        extra = {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
        extra["mm_token_type_ids"] = types
    with prefill_noise(server.model, noise, prompt_len, total_len=ids.shape[1]):
        out = server.model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True, **extra)
    logits = out.logits[0, prompt_len - 1 : -1].float()
    log_probs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new_ids)[:, None]).squeeze(-1)
    entering = [h[0, :prompt_len] for h in out.hidden_states[:-1]]
    return entering, out.hidden_states[-1][0, prompt_len - 1], log_probs


def test_clean_request_is_the_run_without_the_method(server):
    inputs, image = _image_prompt(server, "How many squares?")
    ids = inputs["input_ids"][0].tolist()
    without = _generate(server, ids, _params(seed=11), image)
    # Flagged requests of both readings in between: their hooks must leave nothing behind.
    _generate(server, ids, _params(seed=12, noise=_noise(noise_seed(0, 1, "u", 0))), image)
    _generate(server, ids, _params(seed=12, noise=_noise(noise_seed(0, 1, "u", 1), "final_hidden")), image)
    clean = _generate(server, ids, _params(seed=11), image)
    assert clean.token_ids == without.token_ids and clean.log_probs == without.log_probs
    assert len(clean.token_ids) > 1


@pytest.mark.parametrize("layer", [-1, 0])
def test_layer_input_displaces_that_layers_prompt_keys_and_values_and_every_later_token(server, layer):
    inputs, image = _image_prompt(server, "Which colour is the square?")
    ids = inputs["input_ids"][0].tolist()
    prompt_len, index = len(ids), layer % 2
    seed = noise_seed(0, 1, "u", 3)
    with _prefill_kv(server.model) as clean_kv:
        clean = _generate(server, ids, _params(seed=21), image)
    before = len(server.nc_grpo_applied)
    with _prefill_kv(server.model) as noisy_kv:
        noisy = _generate(server, ids, _params(seed=21, noise=_noise(seed, layer=layer)), image, request_id="noisy")
    with _prefill_kv(server.model) as again_kv:
        _generate(server, ids, _params(seed=21), image)
    (record,) = server.nc_grpo_applied[before:]
    assert (record["request_id"], record["seed"], record["layer"]) == ("noisy", seed, index)
    assert record["target"] == "layer_input" and record["positions"] == (0, prompt_len)

    for i in range(2):
        for name in ("k_proj", "v_proj"):
            assert clean_kv[i][name].shape[0] == prompt_len
            assert torch.equal(again_kv[i][name], clean_kv[i][name])  # a clean request: untouched
            moved = (noisy_kv[i][name] - clean_kv[i][name]).abs().amax(-1)
            if i < index:
                assert torch.equal(noisy_kv[i][name], clean_kv[i][name])  # layers before the noise: untouched
            else:
                assert bool((moved > 1e-4).all()), (i, name)  # every prompt position's key and value moved

    # The displaced state: the residual stream entering the layer, moved by c ||h_p|| / sqrt(d) xi_p per position.
    entering, _, clean_log_probs = _forward(server, inputs, noisy.token_ids)
    h = entering[index]
    assert torch.allclose(record["hidden"], h, atol=1e-5)
    xi = noise_rows(seed, prompt_len, 0, prompt_len, h.shape[-1])
    want = C * h.norm(dim=-1, keepdim=True) / math.sqrt(h.shape[-1]) * xi
    assert torch.allclose(record["displacement"], want, atol=1e-5)

    # Every served log-prob is the displaced model's; later tokens moved too, not only the first.
    served = torch.tensor(noisy.log_probs)
    _, _, displaced_log_probs = _forward(server, inputs, noisy.token_ids, _noise(seed, layer=layer))
    assert torch.allclose(served, displaced_log_probs, atol=1e-5)
    assert len(noisy.token_ids) > 2 and bool(((served - clean_log_probs).abs()[1:] > 1e-4).any())
    assert clean.token_ids != noisy.token_ids or not torch.allclose(served, clean_log_probs, atol=1e-4)


def test_final_hidden_moves_only_the_first_token_by_the_stated_scale(server):
    inputs, image = _image_prompt(server, "Which colour is the square?")
    ids = inputs["input_ids"][0].tolist()
    seed = noise_seed(0, 1, "u", 3)
    before = len(server.nc_grpo_applied)
    noisy = _generate(server, ids, _params(seed=21, noise=_noise(seed, "final_hidden")), image, request_id="noisy")
    (record,) = server.nc_grpo_applied[before:]
    assert record["request_id"] == "noisy" and record["seed"] == seed and record["scale"] == C
    assert record["positions"] == (len(ids) - 1, len(ids)) and record["layer"] is None

    _, h, clean_log_probs = _forward(server, inputs, noisy.token_ids)
    d = h.shape[-1]
    # The displaced state is the final hidden state (after the last layer and its norm) at the prompt's last token.
    assert torch.allclose(record["hidden"], h, atol=1e-5)
    xi = noise_vector(seed, d)
    assert torch.allclose(record["displacement"], C * h.norm() / math.sqrt(d) * xi, atol=1e-5)
    ratio = float(record["displacement"].norm() / (C * h.norm()))
    assert ratio == pytest.approx(float(xi.norm()) / math.sqrt(d), rel=1e-4) and abs(ratio - 1) < 4 / math.sqrt(2 * d)

    served = torch.tensor(noisy.log_probs)
    # First token: sampled from lm_head(h~), not lm_head(h).
    head = server.model.get_output_embeddings()
    with torch.no_grad():
        noisy_first = torch.log_softmax(head(h + record["displacement"]).float(), -1)[noisy.token_ids[0]]
    assert float(served[0]) == pytest.approx(float(noisy_first), abs=1e-5)
    assert abs(float(served[0] - clean_log_probs[0])) > 1e-4
    # Every later token: the unperturbed model given the tokens so far (the KV cache is untouched).
    assert len(noisy.token_ids) > 2
    assert torch.allclose(served[1:], clean_log_probs[1:], atol=1e-5)
    _, _, displaced_log_probs = _forward(server, inputs, noisy.token_ids, _noise(seed, "final_hidden"))
    assert torch.allclose(served, displaced_log_probs, atol=1e-5)  # the exact check's recomputation


# ---------------------------------------------------------------------------------------------------- vLLM


def _capture_kv(worker, layer_indices):
    """Runs in vLLM's engine process: record the keys and values each decoder layer's attention gets, per (layer,
    request id, position), the rows mapped by vLLM's own ``query_start_loc`` and ``num_computed_tokens_cpu``."""
    from verl_ext.nc_grpo.runner_hook import language_model_layers

    runner = worker.model_runner
    runner.kv_capture = {}
    for index in layer_indices:

        def hook(module, args, index=index):
            if runner._nc_grpo_step is None:
                return
            key, value = args[1], args[2]
            starts = runner.query_start_loc.np
            for i, req_id in enumerate(runner.input_batch.req_ids):
                computed = int(runner.input_batch.num_computed_tokens_cpu[i])
                for row in range(int(starts[i]), int(starts[i + 1])):
                    position = computed + row - int(starts[i])
                    runner.kv_capture[f"{index}/{req_id}/{position}"] = (key[row].tolist(), value[row].tolist())

        language_model_layers(runner.model)[index].self_attn.attn.register_forward_pre_hook(hook)


def _captured_kv(worker):
    out = dict(worker.model_runner.kv_capture)
    worker.model_runner.kv_capture.clear()
    return out


@pytest.fixture(scope="module")
def vllm_engine(tiny_model, vllm_required):
    saved = {k: os.environ.get(k) for k in ("VLLM_ALLOW_INSECURE_SERIALIZATION",)}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    # The test's K/V capture is a function sent to the engine process (collective_rpc with a callable).
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM

    from verl_ext.nc_grpo.noise import CPU_NOISE_WORKER_EXTENSION

    llm = LLM(
        model=tiny_model,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=512,
        max_num_seqs=8,
        # Prompts of ~80 tokens are prefilled in chunks: the rows of a flagged prompt span several steps.
        enable_chunked_prefill=True,
        max_num_batched_tokens=32,
        seed=0,
        worker_extension_cls=CPU_NOISE_WORKER_EXTENSION,
        limit_mm_per_prompt={"image": 0},
    )
    llm.collective_rpc("nc_grpo_keep_tensors", args=(True,))
    llm.collective_rpc(_capture_kv, args=([0, 1],))
    yield llm
    del llm
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _vllm_generate(llm, ids, params_list):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # No sampling seed: vLLM 0.24's CPU build cannot seed a request whose prompt is prefilled in chunks (the runner
    # rewinds the request's generator after a partial chunk with set_offset, which a CPU generator refuses). The
    # checks below hold for whatever tokens are sampled.
    sampling = [
        SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, extra_args=p.get("extra_args")) for p in params_list
    ]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids)] * len(params_list), sampling, use_tqdm=False)
    (kv,) = llm.collective_rpc(_captured_kv)
    return outputs, kv


def _kv_of(kv: dict, request_id: str, layer: int, prompt_len: int) -> torch.Tensor:
    """``(P, 2 * kv_dim)``: keys and values of the request's prompt positions. The runner knows a request by vLLM's
    internal id, the external one plus ``-`` and 8 random characters (``InputProcessor``)."""
    (internal,) = {key.split("/")[1] for key in kv if key.split("/")[1].rsplit("-", 1)[0] == request_id}
    return torch.tensor(
        [kv[f"{layer}/{internal}/{p}"][0] + kv[f"{layer}/{internal}/{p}"][1] for p in range(prompt_len)]
    )


@pytest.mark.timeout(900)
def test_both_backends_noise_the_same_requests_by_the_same_vectors(server, vllm_engine):
    from types import SimpleNamespace

    from verl_ext.methods.noise_contrastive_grpo import NoiseContrastiveConfig
    from verl_ext.nc_grpo.agent_loop import request_noise_entry
    from verl_ext.rollout.seeds import prompt_uid

    messages = [{"role": "user", "content": "What is two plus three? Answer in a full sentence, please."}]
    text = server.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = server.tokenizer(text)["input_ids"]
    prompt_len = len(ids)
    assert prompt_len > 64  # three chunks of vLLM's 32-token budget
    uid = prompt_uid(0, 1, 0, 0)
    places = [{"uid": uid, "global_steps": 1, "session_id": i} for i in range(4)]
    rollout = SimpleNamespace(seed=0, n=4)

    for target in ("layer_input", "final_hidden"):
        knobs = NoiseContrastiveConfig(noise_scale=C, target=target)
        entries = [request_noise_entry(rollout, knobs, place) for place in places]
        assert sum(e is not None for e in entries) == 2
        hf_records, params_list = {}, []
        for i, entry in enumerate(entries):
            params = _params(seed=100 + i, noise=entry)
            before = len(server.nc_grpo_applied)
            _generate(server, ids, params, request_id=f"hf-{i}")
            applied = server.nc_grpo_applied[before:]
            assert len(applied) == (entry is not None)
            if applied:
                hf_records[entry["seed"]] = applied[0]
            params_list.append(params)
        (before,) = vllm_engine.collective_rpc("nc_grpo_applied_noise")
        outputs, kv = _vllm_generate(vllm_engine, ids, params_list)
        clean_outputs, clean_kv = _vllm_generate(vllm_engine, ids, [_params(seed=100 + i) for i in range(4)])
        (records,) = vllm_engine.collective_rpc("nc_grpo_applied_noise")
        records = records[len(before) :]
        by_seed: dict[int, list] = {}
        for r in records:
            by_seed.setdefault(r["seed"], []).append(r)
        # The same two requests (by their noise seeds), in the prefill only: layer_input in chunks of the prompt.
        assert sorted(by_seed) == sorted(hf_records) == sorted(e["seed"] for e in entries if e)
        for seed, hf in hf_records.items():
            chunks = sorted(by_seed[seed], key=lambda r: r["positions"])
            if target == "layer_input":
                # Chunks of the prefill (vLLM's scheduler shares the 32-token budget among the requests): contiguous,
                # from the prompt's first position to its last, each displaced at the rows of its own step.
                spans = [r["positions"] for r in chunks]
                assert len(spans) > 1 and spans[0][0] == 0 and spans[-1][1] == prompt_len
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
                hidden = torch.cat([torch.tensor(r["hidden"]) for r in chunks])
                moved = torch.cat([torch.tensor(r["displacement"]) for r in chunks])
                xi = noise_rows(seed, prompt_len, 0, prompt_len, hidden.shape[-1])
                want = C * hidden.norm(dim=-1, keepdim=True) / math.sqrt(hidden.shape[-1]) * xi
            else:
                (only,) = chunks
                assert only["positions"] == (prompt_len - 1, prompt_len)
                hidden, moved = torch.tensor(only["hidden"]), torch.tensor(only["displacement"])
                want = C * hidden.norm() / math.sqrt(hidden.shape[-1]) * noise_vector(seed, hidden.shape[-1])
            assert torch.allclose(hidden, hf["hidden"], atol=1e-4, rtol=1e-4)  # the same state in both backends
            assert torch.allclose(moved, want, atol=1e-5) and torch.allclose(moved, hf["displacement"], atol=1e-4)

        # vLLM's own log-probs (raw, whole vocabulary, T = 1) are the displaced model's on every token of a flagged
        # request and the unperturbed model's on a clean one; the keys and values of the last layer (the default
        # layer_input) at the prompt moved for the flagged requests only, and the first layer's for none.
        flagged_ids = set()
        for out, clean_out, entry in zip(outputs, clean_outputs, entries, strict=True):
            new_ids = list(out.outputs[0].token_ids)
            served = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, new_ids, strict=True)])
            _, _, expected = _forward(server, {"input_ids": torch.tensor([ids])}, new_ids, entry)
            assert torch.allclose(served, expected, atol=1e-4), (target, entry)
            last = [_kv_of(k, o.request_id, 1, prompt_len) for k, o in ((kv, out), (clean_kv, clean_out))]
            first = [_kv_of(k, o.request_id, 0, prompt_len) for k, o in ((kv, out), (clean_kv, clean_out))]
            assert torch.allclose(first[0], first[1], atol=1e-6)
            if entry is not None and target == "layer_input":
                flagged_ids.add(out.request_id)
                assert bool(((last[0] - last[1]).abs().amax(-1) > 1e-4).all())
            else:
                assert torch.allclose(last[0], last[1], atol=1e-6)
        if target == "layer_input":
            assert len(flagged_ids) == 2
