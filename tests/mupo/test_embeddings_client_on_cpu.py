"""MUPO's embeddings backends: the OpenAI-compatible client against a loopback /v1/embeddings server with injected
failures, and the local sentence-transformers backend with a tiny randomly initialised model (no hub)."""

from __future__ import annotations

import socket
from collections import Counter

import numpy as np
import pytest
from loopback_embeddings_server import LoopbackEmbeddingsServer, Reply, fake_embedding

from data_prep.llm_client import RetryPolicy
from verl_ext.mupo import EmbeddingConfig, EmbeddingEndpointRefused, EmbeddingError, build_embedder, shared_embedder
from verl_ext.mupo.embeddings_client import BASE_URL_ENV, OpenAIEmbedder

FAST_RETRY = RetryPolicy(max_retries=4, base_delay=0.01, max_delay=0.05)


def texts_of(n: int) -> list[str]:
    return [f"<think>reasoning number {i}</think>" for i in range(n)]


def expected(texts: list[str]) -> np.ndarray:
    return np.stack([fake_embedding(t) for t in texts])


def client(server, **kwargs) -> OpenAIEmbedder:
    options = {"batch_size": 7, "concurrency": 4, "timeout": 5.0, "retry": FAST_RETRY} | kwargs
    return OpenAIEmbedder(server.url, "Qwen/Qwen3-Embedding-0.6B", **options)


def chunks_of(texts: list[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(texts[s : s + size]) for s in range(0, len(texts), size)]


def test_every_text_embedded_once_in_order_and_the_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("MY_EMBED_KEY", "sk-test-secret")
    texts = texts_of(100)
    with LoopbackEmbeddingsServer() as server:  # answers items shuffled: placed by index
        embedder = client(server, api_key_env="MY_EMBED_KEY")
        out = embedder.embed(texts)
        assert out.dtype == np.float32 and out.shape == (100, 16)
        np.testing.assert_array_equal(out, expected(texts))
        assert sorted(server.answered()) == sorted(chunks_of(texts, 7))  # each chunk answered exactly once
        assert set(server.auth_headers) == {"Bearer sk-test-secret"}
        assert set(server.models) == {"Qwen/Qwen3-Embedding-0.6B"}
        assert embedder.stats["requests"] == 15 and embedder.stats["retries"] == 0
        assert embedder.stats["texts"] == 100 and embedder.stats["prompt_tokens"] == 300
        assert "sk-test-secret" not in embedder.describe()


def test_float_list_answers_and_empty_texts():
    texts = ["", "a", "b"]
    with LoopbackEmbeddingsServer(floats=True) as server:
        out = client(server).embed(texts)
    np.testing.assert_array_equal(out, expected([" ", "a", "b"]))  # an empty text is sent as one space


def test_injected_429_500_and_timeouts_lose_nothing_and_repeat_no_answered_request():
    texts = texts_of(60)
    chunks = chunks_of(texts, 7)
    scripts = {
        chunks[0][0]: [Reply(429, headers={"Retry-After": "0.05"}), Reply(500)],
        chunks[2][0]: [Reply(delay=1.5)],  # a timeout (client timeout 0.4 s), then answered
        chunks[3][0]: [Reply(503), Reply(502), Reply(delay=1.5)],
        chunks[5][0]: [Reply(429)],
        chunks[8][0]: [Reply(500), Reply(500), Reply(500)],
    }
    injected = sum(len(v) for v in scripts.values())
    with LoopbackEmbeddingsServer(scripts) as server:
        embedder = client(server, timeout=0.4)
        out = embedder.embed(texts)
        np.testing.assert_array_equal(out, expected(texts))
        answered = Counter(server.answered())
        assert sorted(answered) == sorted(chunks) and set(answered.values()) == {1}
        outcomes = Counter(server.outcomes())
        assert outcomes["429"] == 2 and outcomes["500"] == 4 and outcomes["503"] == 1 and outcomes["502"] == 1
        assert outcomes["slow"] == 2
        assert embedder.stats["retries"] == injected
        assert embedder.stats["requests"] == len(chunks) + injected


def test_retries_exhausted_fail_naming_the_endpoint():
    texts = texts_of(10)
    with LoopbackEmbeddingsServer() as server:
        server.default = Reply(500)
        embedder = client(server, retry=RetryPolicy(max_retries=2, base_delay=0.01, max_delay=0.02))
        with pytest.raises(EmbeddingError, match=rf"embeddings endpoint {server.url} .* failed 3 attempts in a row"):
            embedder.embed(texts)


@pytest.mark.parametrize("status", [401, 403, 404])
def test_refusal_stops_at_once_and_says_what_to_check(monkeypatch, status):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    with LoopbackEmbeddingsServer() as server:
        server.default = Reply(status)
        embedder = client(server, concurrency=1)
        with pytest.raises(EmbeddingEndpointRefused, match=rf"{server.url} .*refused.*HTTP {status}") as info:
            embedder.embed(texts_of(50))
        assert "OPENAI_API_KEY" in str(info.value) and "sk-wrong" not in str(info.value)
        assert len(server.records) == 1  # no retry, and no later chunk sent
        assert embedder.stats["retries"] == 0


def test_other_client_errors_are_not_retried():
    with LoopbackEmbeddingsServer() as server:
        server.default = Reply(400)
        with pytest.raises(EmbeddingError, match=r"rejected a request of 3 texts \(HTTP 400"):
            client(server).embed(["a", "b", "c"])
        assert len(server.records) == 1


def test_a_malformed_answer_is_an_error_not_a_silent_gap():
    with LoopbackEmbeddingsServer({"a": [Reply(drop_one=True)]}) as server:
        with pytest.raises(EmbeddingError, match="answered 2 embeddings .* for 3 texts"):
            client(server).embed(["a", "b", "c"])


def test_unreachable_endpoint_is_named():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    embedder = OpenAIEmbedder(url, "m", retry=RetryPolicy(max_retries=1, base_delay=0.01, max_delay=0.01))
    with pytest.raises(EmbeddingError, match=rf"cannot reach the embeddings endpoint {url} .*after 2 attempts"):
        embedder.embed(["x"])


def test_config_builds_the_backend_and_names_bad_settings(monkeypatch):
    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    with pytest.raises(ValueError, match=f"mupo.embedding.base_url .* {BASE_URL_ENV}"):
        build_embedder(EmbeddingConfig())
    with pytest.raises(ValueError, match="mupo.embedding.backend must be one of"):
        build_embedder(EmbeddingConfig(backend="tfidf"))
    with pytest.raises(ValueError, match="mupo.embedding.concurrency must be a positive integer"):
        build_embedder(EmbeddingConfig(base_url="http://x/v1", concurrency=0))
    with pytest.raises(ValueError, match="mupo.embedding.max_retries must be an integer"):
        build_embedder(EmbeddingConfig(base_url="http://x/v1", max_retries=1.5))
    with LoopbackEmbeddingsServer() as server:
        monkeypatch.setenv(BASE_URL_ENV, server.url)
        embedder = build_embedder(EmbeddingConfig(batch_size=2, max_retries=0))
        assert isinstance(embedder, OpenAIEmbedder) and embedder.base_url == server.url
        np.testing.assert_array_equal(embedder.embed(["p", "q", "r"]), expected(["p", "q", "r"]))
        assert len(server.answered()) == 2
        shared = shared_embedder(EmbeddingConfig(base_url=server.url))
        assert shared is shared_embedder(EmbeddingConfig(base_url=server.url))  # one client per config
        assert shared is not shared_embedder(EmbeddingConfig(base_url=server.url, concurrency=2))


# ---------------------------------------------------------------------------------------------------------------
# Local backend: a tiny random BERT saved as a sentence-transformers model, loaded from disk only.
# ---------------------------------------------------------------------------------------------------------------

WORDS = ["the", "answer", "is", "area", "angle", "triangle", "circle", "so", "we", "add", "subtract", "think"]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    root = tmp_path_factory.mktemp("tiny_st")
    bert_dir = root / "bert"
    bert_dir.mkdir()
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "<",
        ">",
        "/",
        *WORDS,
        *"abcdefghijklmnopqrstuvwxyz0123456789",
    ]
    (bert_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(bert_dir)
    BertTokenizer(str(bert_dir / "vocab.txt")).save_pretrained(bert_dir)
    # A plain transformers folder loads as Transformer + mean pooling; saved, it is a sentence-transformers model.
    model_dir = root / "st"
    with pytest.MonkeyPatch.context() as offline:
        offline.setenv("HF_HUB_OFFLINE", "1")
        sentence_transformers.SentenceTransformer(str(bert_dir), device="cpu").save(str(model_dir))
    return str(model_dir)


def test_local_sentence_transformers_backend(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    config = EmbeddingConfig(backend="sentence_transformers", model=tiny_model_dir, device="cpu", batch_size=2)
    embedder = build_embedder(config)
    texts = ["<think>the area of the circle</think>", "<think>we add the angle</think>", "the answer is 7", ""]
    out = embedder.embed(texts)
    assert out.dtype == np.float32 and out.shape == (4, 24) and np.isfinite(out).all()
    again = embedder.embed([texts[1], texts[0]])
    np.testing.assert_allclose(again, out[[1, 0]], rtol=1e-5, atol=1e-6)  # per text, whatever the batch
    assert not np.allclose(out[0], out[1])
    assert embedder.stats["texts"] == 6
    assert tiny_model_dir in embedder.describe()


def test_local_backend_missing_model_is_named(tmp_path, monkeypatch):
    pytest.importorskip("sentence_transformers")
    missing = str(tmp_path / "no_such_model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EmbeddingError, match="cannot load the local embedding model"):
        build_embedder(EmbeddingConfig(backend="sentence_transformers", model=missing, device="cpu"))
