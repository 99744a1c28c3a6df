"""NC-GRPO's noise in the rollout servers, on the tiny Qwen2-VL: the ``hf_cpu`` server (transformers) and verl's
vLLM server's engine with the noise worker extension (vLLM's CPU build; skipped outside the GPU stack's
environment unless ``DIVA_REQUIRE_VLLM=1``).

* a clean request's tokens and log-probs are those of the same seeded request without the method (the hook leaves
  nothing behind after a flagged request);
* a flagged request's final hidden state at the prompt's last position is the unperturbed model's, displaced by
  exactly ``c * (||h|| / sqrt(d)) * xi`` (norm measured against ``c * ||h||``), its first token is sampled from
  ``lm_head(h~)`` and every later token from the unperturbed model given the tokens so far;
* both backends noise the same requests with the same vector for a seed, on the same hidden state.
"""

from __future__ import annotations

import asyncio
import math
import os

import pytest
import torch
from PIL import Image

from verl_ext.nc_grpo.noise import NOISE_KEY, noise_seed, noise_vector

pytestmark = pytest.mark.gpu_stack

C = 0.5  # larger than the default 0.1, so that a 64-token response's first token visibly moves on a random model


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
    return HFCpuServer.__ray_actor_class__(rollout, HFModelConfig(path=tiny_model), 0, RolloutMode.HYBRID)


def _image_prompt(server, text: str):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = server.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.new("RGB", (84, 56), (40, 160, 90))
    return server.processor(text=[prompt], images=[image], return_tensors="pt"), image


def _params(seed: int, noise_seed_: int | None = None, scale: float = C) -> dict:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "seed": seed}
    if noise_seed_ is not None:
        params["extra_args"] = {NOISE_KEY: {"seed": noise_seed_, "scale": scale, "layer": "final"}}
    return params


def _generate(server, prompt_ids, params, image=None, request_id="r"):
    images = [image] if image is not None else None
    request = server.generate(prompt_ids=prompt_ids, sampling_params=params, request_id=request_id, image_data=images)
    return asyncio.run(request)


@torch.no_grad()
def _clean_forward(server, inputs, new_ids):
    """Unperturbed model over prompt + response: (final hidden state at the prompt's last position, log-probs of
    every response token given the tokens before it)."""
    prompt_len = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([new_ids])], dim=1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(new_ids), dtype=torch.int32)], dim=1)
    out = server.model(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
        mm_token_type_ids=types,
        output_hidden_states=True,
    )
    logits = out.logits[0, prompt_len - 1 : -1].float()
    log_probs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(new_ids)[:, None]).squeeze(-1)
    return out.hidden_states[-1][0, prompt_len - 1], log_probs


def test_clean_request_is_the_run_without_the_method(server):
    inputs, image = _image_prompt(server, "How many squares?")
    ids = inputs["input_ids"][0].tolist()
    without = _generate(server, ids, _params(seed=11), image)
    # A flagged request in between: its hook must leave nothing behind.
    _generate(server, ids, _params(seed=12, noise_seed_=noise_seed(0, 1, "u", 0)), image)
    clean = _generate(server, ids, _params(seed=11), image)
    assert clean.token_ids == without.token_ids and clean.log_probs == without.log_probs
    assert len(clean.token_ids) > 1


def test_flagged_request_moves_only_the_first_token_by_the_stated_scale(server):
    inputs, image = _image_prompt(server, "Which colour is the square?")
    ids = inputs["input_ids"][0].tolist()
    seed = noise_seed(0, 1, "u", 3)
    before = len(server.nc_grpo_applied)
    noisy = _generate(server, ids, _params(seed=21, noise_seed_=seed), image, request_id="noisy")
    (record,) = server.nc_grpo_applied[before:]
    assert record["request_id"] == "noisy" and record["seed"] == seed and record["scale"] == C

    h, clean_log_probs = _clean_forward(server, inputs, noisy.token_ids)
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


@pytest.fixture(scope="module")
def vllm_engine(tiny_model, vllm_required):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from vllm import LLM

    from verl_ext.nc_grpo.noise import CPU_NOISE_WORKER_EXTENSION

    llm = LLM(
        model=tiny_model,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=512,
        max_num_seqs=8,
        seed=0,
        worker_extension_cls=CPU_NOISE_WORKER_EXTENSION,
        limit_mm_per_prompt={"image": 0},
    )
    yield llm
    del llm


@pytest.mark.timeout(900)
def test_both_backends_noise_the_same_requests_by_the_same_vector(server, vllm_engine):
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_ext.methods.noise_contrastive_grpo import NoiseContrastiveConfig
    from verl_ext.nc_grpo.agent_loop import request_noise_entry
    from verl_ext.rollout.seeds import prompt_uid

    messages = [{"role": "user", "content": "What is two plus three?"}]
    text = server.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = server.tokenizer(text)["input_ids"]
    rollout, knobs = SimpleNamespace(seed=0, n=4), NoiseContrastiveConfig(noise_scale=C)
    uid = prompt_uid(0, 1, 0, 0)
    entries = [request_noise_entry(rollout, knobs, {"uid": uid, "global_steps": 1, "session_id": i}) for i in range(4)]
    assert sum(e is not None for e in entries) == 2

    hf_records, vllm_params = {}, []
    for i, entry in enumerate(entries):
        params = _params(seed=100 + i)
        if entry is not None:
            params["extra_args"] = {NOISE_KEY: entry}
        before = len(server.nc_grpo_applied)
        _generate(server, ids, params, request_id=f"hf-{i}")
        applied = server.nc_grpo_applied[before:]
        assert len(applied) == (entry is not None)
        if applied:
            hf_records[entry["seed"]] = applied[0]
        vllm_params.append(
            SamplingParams(max_tokens=8, temperature=1.0, seed=100 + i, logprobs=0, extra_args=params.get("extra_args"))
        )
    outputs = vllm_engine.generate([TokensPrompt(prompt_token_ids=ids)] * 4, vllm_params, use_tqdm=False)
    assert all(len(out.outputs[0].token_ids) > 0 for out in outputs)
    (records,) = vllm_engine.collective_rpc("nc_grpo_applied_noise")
    vllm_records = {
        r["seed"]: {**r, "hidden": torch.tensor(r["hidden"]), "displacement": torch.tensor(r["displacement"])}
        for r in records
    }
    # The same two requests (by their noise seeds), noised once each, in the prefill only.
    assert sorted(vllm_records) == sorted(hf_records) == sorted(e["seed"] for e in entries if e)
    assert len(records) == 2
    for seed, hf in hf_records.items():
        ours = vllm_records[seed]
        d = hf["hidden"].numel()
        assert torch.allclose(ours["hidden"], hf["hidden"], atol=1e-4, rtol=1e-4)  # the same departure state
        xi = noise_vector(seed, d)
        for record in (hf, ours):
            want = C * record["hidden"].norm() / math.sqrt(d) * xi
            assert torch.allclose(record["displacement"], want, atol=1e-5)
        assert torch.allclose(ours["displacement"], hf["displacement"], atol=1e-4, rtol=1e-4)

    # vLLM's own tokens: a clean request's log-probs are the unperturbed model's on every token; a flagged one's on
    # every token but the first, which is lm_head(h~)'s (vLLM's log-probs: raw, over the whole vocabulary, T = 1).
    head = server.model.get_output_embeddings()
    for out, entry in zip(outputs, entries, strict=True):
        new_ids = list(out.outputs[0].token_ids)
        served = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, new_ids, strict=True)])
        full = torch.tensor([ids + new_ids])
        with torch.no_grad():
            logits = server.model(input_ids=full, attention_mask=torch.ones_like(full)).logits[0, len(ids) - 1 : -1]
        clean = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(new_ids)[:, None]).squeeze(-1)
        if entry is None:
            assert torch.allclose(served, clean, atol=1e-4)
            continue
        record = vllm_records[entry["seed"]]
        with torch.no_grad():
            noisy_first = torch.log_softmax(head(record["hidden"] + record["displacement"]).float(), -1)
        assert float(served[0]) == pytest.approx(float(noisy_first[new_ids[0]]), abs=1e-4)
        assert abs(float(served[0] - clean[0])) > 1e-3
        assert len(new_ids) > 2 and torch.allclose(served[1:], clean[1:], atol=1e-4)
