"""A real HTTP server on 127.0.0.1 speaking ``POST /v1/embeddings``, with scripted failures per request.

It runs aiohttp in its own thread and event loop (``tests/loopback_http.py``, as
``tests/data_prep/loopback_chat_server.py`` does), so the client under test talks to it through a real socket with
the real ``openai`` client. Each text's embedding is a fixed function of the text (:func:`fake_embedding`), so a
test can check every row of the result. Each request is recorded as ``(inputs, outcome)``; scripted replies (a list
per request's first input text) are used first, then a correct answer. ``outcome`` is the HTTP status, or
``"slow"`` for a scripted delay (the client times out and never reads that answer, so it does not count as
answered).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import threading
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web
from loopback_http import LoopbackHttpServer, scripted_error

DIM = 16


def fake_embedding(text: str, dim: int = DIM) -> np.ndarray:
    """A deterministic float32 vector for ``text`` (seeded by its SHA-256), never all zero."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return (np.random.default_rng(seed).normal(size=dim) + 0.01).astype(np.float32)


@dataclass
class Reply:
    status: int = 200
    delay: float = 0.0  # seconds before answering (above the client's timeout: a timeout)
    headers: dict = field(default_factory=dict)
    drop_one: bool = False  # answer one embedding too few (a malformed answer)


class LoopbackEmbeddingsServer(LoopbackHttpServer):
    route = "/v1/embeddings"

    def __init__(self, scripts: dict | None = None, *, floats: bool = False, shuffle: bool = True, dim: int = DIM):
        super().__init__()
        self.scripts = {key: list(replies) for key, replies in (scripts or {}).items()}
        self.floats = floats  # answer float lists whatever encoding_format asks (servers that ignore it)
        self.shuffle = shuffle  # answer the items out of order: the client must place them by index
        self.dim = dim
        self.default = Reply()  # the reply once a request's script is used up (set status=401 to refuse all)
        self.records: list[tuple[tuple[str, ...], str]] = []
        self.auth_headers: list[str] = []
        self.models: list[str] = []
        self._lock = threading.Lock()

    def answered(self) -> list[tuple[str, ...]]:
        with self._lock:
            return [inputs for inputs, outcome in self.records if outcome == "200"]

    def outcomes(self) -> list[str]:
        with self._lock:
            return [outcome for _, outcome in self.records]

    def _next_reply(self, first: str) -> Reply:
        with self._lock:
            script = self.scripts.get(first)
            return script.pop(0) if script else self.default

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        with self._lock:
            self.auth_headers.append(request.headers.get("Authorization", ""))
            self.models.append(body.get("model", ""))
        reply = self._next_reply(inputs[0])
        if reply.delay:
            with self._lock:
                self.records.append((tuple(inputs), "slow"))
            await asyncio.sleep(reply.delay)
            return web.Response(status=503)
        with self._lock:
            self.records.append((tuple(inputs), str(reply.status)))
        if reply.status != 200:
            return scripted_error(reply.status, reply.headers)
        as_base64 = body.get("encoding_format") == "base64" and not self.floats
        items = []
        for i, text in enumerate(inputs[:-1] if reply.drop_one else inputs):
            vector = fake_embedding(text, self.dim)
            payload = base64.b64encode(vector.astype("<f4").tobytes()).decode() if as_base64 else vector.tolist()
            items.append({"object": "embedding", "index": i, "embedding": payload})
        if self.shuffle:
            random.Random(len(inputs)).shuffle(items)
        return web.json_response(
            {
                "object": "list",
                "data": items,
                "model": body.get("model", ""),
                "usage": {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)},
            }
        )
