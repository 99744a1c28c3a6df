"""MUPO checks its embedding backend when the trainer starts, before the first rollout: an endpoint that is not set,
down, or refusing the key fails there, naming the ``mupo.embedding`` keys and the variables to set (against a real
loopback ``/v1/embeddings`` server and the real ``openai`` client)."""

from __future__ import annotations

import socket

import pytest
from loopback_embeddings_server import LoopbackEmbeddingsServer, Reply
from omegaconf import OmegaConf

from verl_ext.methods.mupo import check_config
from verl_ext.mupo import EmbeddingConfig, MupoConfig, check_embedder
from verl_ext.mupo.embedder import STARTUP_TEXT
from verl_ext.mupo.embeddings_client import BASE_URL_ENV

NO_RETRY = {"max_retries": 0, "timeout": 5.0}


def test_no_endpoint_named_fails_naming_the_key_and_the_variable(monkeypatch):
    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    with pytest.raises(ValueError, match="mupo.embedding.base_url") as info:
        check_embedder(EmbeddingConfig(**NO_RETRY))
    assert BASE_URL_ENV in str(info.value) and "start-up check" in str(info.value)


def test_a_refused_key_fails_naming_the_key_variable_without_the_key(monkeypatch):
    monkeypatch.setenv("MY_EMBED_KEY", "sk-not-this-one")
    with LoopbackEmbeddingsServer() as server:
        server.default = Reply(401)
        with pytest.raises(ValueError, match="MY_EMBED_KEY") as info:
            check_embedder(EmbeddingConfig(base_url=server.url, api_key_env="MY_EMBED_KEY", **NO_RETRY))
        assert "sk-not-this-one" not in str(info.value)
        assert "mupo.embedding.api_key_env" in str(info.value)
        assert server.auth_headers == ["Bearer sk-not-this-one"]  # the key was sent, once


def test_an_endpoint_that_is_down_fails_naming_it():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(ValueError, match=f"cannot reach the embeddings endpoint {url}") as info:
        check_embedder(EmbeddingConfig(base_url=url, **NO_RETRY))
    assert BASE_URL_ENV in str(info.value)


def test_a_served_endpoint_passes_with_one_request():
    with LoopbackEmbeddingsServer() as server:
        check_embedder(EmbeddingConfig(base_url=server.url, model="served-model", **NO_RETRY))
        assert server.answered() == [(STARTUP_TEXT,)]
        assert server.models == ["served-model"]


def test_the_model_free_backend_needs_no_check():
    check_embedder(EmbeddingConfig(backend="hashing", base_url="http://127.0.0.1:9/v1"))


def test_the_trainers_start_up_check_runs_it(monkeypatch):
    """verl_ext.methods.mupo.check_config is what the toolkit trainer calls at start-up, before any rollout."""
    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    full = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 15}}})  # the paper's n
    with pytest.raises(ValueError, match="mupo.embedding.base_url"):
        check_config(full, MupoConfig(embedding=EmbeddingConfig(**NO_RETRY)))
    with LoopbackEmbeddingsServer() as server:
        check_config(full, MupoConfig(embedding=EmbeddingConfig(base_url=server.url, **NO_RETRY)))
        assert len(server.answered()) == 1
