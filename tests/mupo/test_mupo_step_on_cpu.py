"""MUPO's per-step logic (verl_ext.mupo.step) end to end on CPU: decode -> think spans -> loopback embeddings ->
partition -> diversity -> reward -> advantage, checked against the pure functions composed by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from loopback_embeddings_server import LoopbackEmbeddingsServer, Reply, fake_embedding

from data_prep.llm_client import RetryPolicy
from verl_ext.algos import add_diversity_reward, compute_mupo_advantage, mupo_diversity, mupo_lambda, mupo_partition
from verl_ext.mupo import (
    EmbeddingError,
    MupoConfig,
    add_sequence_bonus,
    check_rollout_n,
    decode_responses,
    extract_think_span,
    mupo_config_from,
    mupo_step,
)
from verl_ext.mupo.embeddings_client import OpenAIEmbedder

MODES = ["we add the two angles", "we use the area formula", "we draw a helper line"]


def byte_tokenizer():
    """A real fast tokenizer, one token per byte (no merges), built locally; ``<eos>`` ends a response."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(sorted(ByteLevel.alphabet(), key=ord))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens({"eos_token": "<eos>", "pad_token": "<pad>"})
    return tokenizer


def make_step_batch(rng, prompts=4, n=10, small_prompt=4):
    """Responses of ``prompts`` prompts x ``n`` (plus one prompt of ``small_prompt``, too small to split)."""
    uids, texts = [], []
    for p in range(prompts + 1):
        count = n if p < prompts else small_prompt
        for r in range(count):
            mode = MODES[int(rng.integers(0, 3))]
            body = f"<think>step {r % 2}: {mode}.</think> The answer is \\boxed{{{r % 3}}}."
            texts.append(body if rng.random() > 0.1 else f"no tags, {mode}")  # some responses lack the span
            uids.append(f"uid-{p}")
    acc = rng.integers(0, 2, size=len(texts)).astype(np.float64)
    scores = torch.tensor(0.9 * acc + 0.1, dtype=torch.float32)
    return texts, np.array(uids, dtype=object), acc, scores


def loopback_embedder(server, **kwargs):
    options = {"batch_size": 8, "concurrency": 3, "timeout": 5.0} | kwargs
    return OpenAIEmbedder(server.url, "Qwen/Qwen3-Embedding-0.6B", retry=RetryPolicy(3, 0.01, 0.02), **options)


def test_step_composes_the_pure_functions_and_embeds_the_think_spans():
    rng = np.random.default_rng(0)
    texts, uids, acc, scores = make_step_batch(rng)
    config = MupoConfig(k=3, min_size=3, seed=0)
    with LoopbackEmbeddingsServer({extract_think_span(texts[8]): [Reply(500)]}) as server:
        embedder = loopback_embedder(server)
        new_scores, partition, metrics = mupo_step(texts, scores, acc, uids, 3, 10, config, embedder)
        spans = [extract_think_span(t) for t in texts]
        sent = sorted(text for inputs in server.answered() for text in inputs)
        assert sent == sorted(spans)  # each span embedded once (the 500 was retried, not repeated once answered)

    embeddings = np.stack([fake_embedding(s) for s in spans])
    expected_partition = mupo_partition(embeddings, uids, k=3, min_size=3, seed=0)
    np.testing.assert_array_equal(partition, expected_partition)
    diversity = mupo_diversity(embeddings, uids, expected_partition)
    lam = mupo_lambda(3, 10)
    torch.testing.assert_close(new_scores, add_diversity_reward(scores, acc, diversity, lam))
    assert new_scores.dtype == torch.float32
    assert set(partition[uids == "uid-4"].tolist()) == {0}  # 4 < k * min_size

    assert metrics["mupo/lambda"] == lam
    assert metrics["mupo/one_group_rate"] == pytest.approx(1 / 5)
    assert metrics["mupo/embed/requests"] == len(server.records) and metrics["mupo/embed/retries"] == 1
    assert metrics["mupo/embed/latency_s"] > 0 and metrics["mupo/partition/latency_s"] > 0
    assert metrics["mupo/think_span_rate"] == pytest.approx(np.mean(["<think>" in t for t in texts]))
    assert metrics["mupo/diversity/correct_mean"] == pytest.approx(float(diversity[acc > 0].mean()))


def test_three_steps_of_the_advantage_chain():
    """decode -> mupo_step -> bonus at the last token -> MUPO advantage, as the trainer runs it, three steps."""
    tokenizer = byte_tokenizer()
    config = mupo_config_from({"k": 2, "min_size": 3, "lambda_schedule": "exponential", "embedding": {"batch_size": 5}})
    with LoopbackEmbeddingsServer() as server:
        embedder = loopback_embedder(server, batch_size=config.embedding.batch_size)
        lambdas = []
        for step in (1, 2, 3):
            rng = np.random.default_rng(step)
            texts, uids, acc, _ = make_step_batch(rng, prompts=3, n=8, small_prompt=2)
            encoded = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
            width = max(map(len, encoded)) + 3
            responses = torch.full((len(texts), width), tokenizer.pad_token_id)
            mask = torch.zeros((len(texts), width), dtype=torch.int64)
            rewards = torch.zeros((len(texts), width))
            for i, ids in enumerate(encoded):
                responses[i, : len(ids)] = torch.tensor(ids)
                mask[i, : len(ids)] = 1
                rewards[i, len(ids) - 1] = 0.9 * acc[i] + 0.1
            decoded = decode_responses(responses, mask, tokenizer)
            assert decoded == texts  # the eos is a special token: skipped

            scores = rewards.sum(-1)
            new_scores, partition, metrics = mupo_step(decoded, scores, acc, uids, step, 3, config, embedder)
            bonus = new_scores - scores
            rewards_with_bonus = add_sequence_bonus(rewards, mask, bonus)
            torch.testing.assert_close(rewards_with_bonus.sum(-1), new_scores)
            assert bool((rewards_with_bonus[mask == 0] == 0).all())
            advantages, _ = compute_mupo_advantage(rewards_with_bonus, mask, uids, partition, balance_beta=1.0)
            assert advantages.shape == rewards.shape and bool(torch.isfinite(advantages).all())
            assert bool((advantages[mask == 0] == 0).all())
            groups = [len(set(partition[uids == u].tolist())) for u in dict.fromkeys(uids)]
            assert groups == [2, 2, 2, 1]
            lambdas.append(metrics["mupo/lambda"])
    np.testing.assert_allclose(lambdas, [0.4 * np.exp(-9e-3 * s) for s in (1, 2, 3)])


def test_a_failing_endpoint_fails_the_step():
    rng = np.random.default_rng(1)
    texts, uids, acc, scores = make_step_batch(rng)
    with LoopbackEmbeddingsServer() as server:
        server.default = Reply(503)
        embedder = OpenAIEmbedder(server.url, "m", retry=RetryPolicy(1, 0.01, 0.01))
        with pytest.raises(EmbeddingError, match=server.url):
            mupo_step(texts, scores, acc, uids, 1, 10, MupoConfig(), embedder)


def test_think_span_extraction():
    assert extract_think_span("<think>a\nb</think> so \\boxed{1}") == "<think>a\nb</think>"
    assert extract_think_span("x <think>1</think> y <think>2</think>") == "<think>1</think>"  # the first span
    assert extract_think_span("<think>cut off before the end") == "<think>cut off before the end"
    assert extract_think_span("plain answer \\boxed{2}") == "plain answer \\boxed{2}"
    assert extract_think_span("") == ""
    with pytest.raises(ValueError, match="response must be a str"):
        extract_think_span(None)


def test_sequence_bonus_and_config_checks():
    rewards = torch.zeros(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = add_sequence_bonus(rewards, mask, [0.5, -0.25, 0.0])
    assert out[0, 1] == 0.5 and out[1, 3] == -0.25 and out.abs().sum() == 0.75
    assert rewards.abs().sum() == 0  # not modified in place
    with pytest.raises(ValueError, match="response 2 has no response tokens but a bonus of 1.0"):
        add_sequence_bonus(rewards, mask, [0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"bonus must have shape \(3,\)"):
        add_sequence_bonus(rewards, mask, [0.0])

    check_rollout_n(15, MupoConfig())
    with pytest.raises(ValueError, match=r"rollout.n=8 is below mupo.k \* mupo.min_size = 3 \* 3 = 9"):
        check_rollout_n(8, MupoConfig())
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['kk'\] under 'mupo'"):
        mupo_config_from({"kk": 3})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['url'\] under 'mupo.embedding'"):
        mupo_config_from({"embedding": {"url": "x"}})
    from omegaconf import OmegaConf

    built = mupo_config_from(OmegaConf.create({"k": 4, "embedding": {"base_url": "http://e/v1"}}))
    assert built.k == 4 and built.embedding.base_url == "http://e/v1" and built.min_size == 3
