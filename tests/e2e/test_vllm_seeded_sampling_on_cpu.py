"""vLLM samples a seeded request alike whatever runs beside it: the property the seeded agent loop relies on.

:class:`verl_ext.rollout.agent_loop.SeededSingleTurnAgentLoop` gives every request ``seed`` =
:func:`verl_ext.rollout.seeds.request_seed`; verl's vLLM server builds ``SamplingParams(**sampling_params)`` from it,
so vLLM draws the request's tokens from a generator of its own. Here vLLM 0.24.0's CPU build (the GPU stack's
environment) serves the tiny Qwen2-VL: one batch of seeded requests, then the same seeds in the reverse order among
other requests, then one alone, must give the same tokens and log-probs per seed; different seeds must not all
agree.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def llm_and_prompt(tmp_path_factory, vllm_required):
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl
    from verl_ext.cpu.vllm_launcher import VLLM_CPU_ENV

    os.environ.update(VLLM_CPU_ENV)
    path = str(tmp_path_factory.mktemp("tiny") / "model")
    build_tiny_qwen2_vl(path)
    from transformers import AutoTokenizer
    from vllm import LLM

    engine = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=8, seed=0)
    prompt_ids = AutoTokenizer.from_pretrained(path).encode("What colour is the square? Answer:")
    yield engine, prompt_ids
    del engine


def _generate(llm, requests):
    """``requests``: ``(prompt ids, seed or None)``; returns ``(tokens, log-probs)`` per request."""
    from vllm import SamplingParams, TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in requests]
    params = [SamplingParams(temperature=1.0, max_tokens=12, logprobs=0, seed=seed) for _, seed in requests]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = []
    for out in outputs:
        completion = out.outputs[0]
        pairs = zip(completion.token_ids, completion.logprobs, strict=True)
        logprobs = [entry[token].logprob for token, entry in pairs]
        result.append((list(completion.token_ids), logprobs))
    return result


def test_a_seeded_request_samples_alike_in_any_batch(llm_and_prompt):
    from verl_ext.rollout.seeds import request_seed

    llm, prompt = llm_and_prompt
    seeds = [request_seed(0, 1, "prompt-uid", response) for response in range(6)]
    first = _generate(llm, [(prompt, seed) for seed in seeds])
    # Another batch: the same seeds in reverse order, between requests of other prompts and seeds. Every request is
    # seeded, as the agent loop seeds every request: vLLM 0.24's CPU sampler (TopKTopPSampler.forward_cpu) ignores
    # the per-request generators of a batch in which some request has none (its GPU sampler does not).
    other = request_seed(0, 1, "another-uid", 0)
    mixed = [(prompt[:-2], other), *[(prompt, seed) for seed in reversed(seeds)], (prompt[1:], other + 1)]
    second = _generate(llm, mixed)[1:-1][::-1]
    alone = _generate(llm, [(prompt, seeds[3])])
    assert [tokens for tokens, _ in first] == [tokens for tokens, _ in second]
    assert alone[0][0] == first[3][0]
    for (_, a), (_, b) in zip(first, second, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert len({tuple(tokens) for tokens, _ in first}) > 1  # each response of a group draws its own tokens
