"""A real HTTP server on 127.0.0.1 speaking ``POST /v1/chat/completions``, with scripted replies per question.

It runs aiohttp in its own thread and event loop (``tests/loopback_http.py``), so the code under test talks to it
through a real socket with the real ``openai`` client. Each request is recorded as ``(question, task, outcome)``;
``task`` is "paraphrases" or "hint" (recognised from the system prompt), ``question`` is the question text found in
the user message. Scripted replies (a list per ``(question, task)``) are used first, then a correct default reply.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

from aiohttp import web
from loopback_http import LoopbackHttpServer, scripted_error


@dataclass
class Reply:
    status: int = 200
    content: str | None = None  # the assistant message; None -> the correct default reply
    delay: float = 0.0  # seconds before answering (a delay above the client's timeout is a timeout)
    headers: dict = field(default_factory=dict)
    finish_reason: str = "stop"


def good_paraphrases(question: str, k: int) -> str:
    return json.dumps({"paraphrases": [f"Restated, version {chr(65 + j)}: {question}" for j in range(k)]})


def good_hint(answer: str) -> str:
    steps = ["Look at the figure and note what is given.", "Choose the formula that fits.", "Substitute and simplify."]
    return json.dumps({"steps": steps, "final_answer": answer})


def parse_request(body: dict) -> tuple[str, str, int]:
    """(question, task, paraphrases asked) from a chat-completions request made by data_prep.generation."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    if isinstance(user, list):
        user = next(part["text"] for part in user if part["type"] == "text")
    task = "paraphrases" if '"paraphrases"' in system else "hint"
    marker = "Question: " if task == "paraphrases" else "Problem: "
    question = user.split(marker, 1)[1].strip()
    wanted = int(user.split("Write ", 1)[1].split(" ", 1)[0]) if task == "paraphrases" else 0
    return question, task, wanted


class LoopbackChatServer(LoopbackHttpServer):
    route = "/v1/chat/completions"

    def __init__(self, answers: dict[str, str], scripts: dict | None = None, latency: float = 0.0):
        super().__init__()
        self.answers = answers  # question -> ground truth, for the default hint reply
        self.scripts = {key: list(replies) for key, replies in (scripts or {}).items()}
        self.latency = latency
        self.records: list[tuple[str, str, str]] = []
        self.auth_headers: list[str] = []
        self.hold_after: int | None = None  # answer this many requests, then hold the rest until released
        # Requests let through so far: counted when admitted, not when answered, so that concurrent arrivals
        # cannot all pass the hold check while earlier answers are still in flight.
        self._admitted = 0
        self.released = threading.Event()
        self._lock = threading.RLock()

    def answered(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(q, t) for q, t, outcome in self.records if outcome == "200"]

    def _next_reply(self, question: str, task: str) -> Reply:
        with self._lock:
            script = self.scripts.get((question, task))
            return script.pop(0) if script else Reply()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.auth_headers.append(request.headers.get("Authorization", ""))
        question, task, wanted = parse_request(body)
        with self._lock:
            held = self.hold_after is not None and self._admitted >= self.hold_after
            if held:
                self.records.append((question, task, "held"))
            else:
                self._admitted += 1
        if held:  # never answered: the client is killed meanwhile
            while not self.released.is_set():
                await asyncio.sleep(0.05)
            return web.Response(status=503)
        reply = self._next_reply(question, task)
        await asyncio.sleep(self.latency + reply.delay)
        with self._lock:
            self.records.append((question, task, str(reply.status)))
        if reply.status != 200:
            return scripted_error(reply.status, reply.headers)
        content = reply.content
        if content is None:
            content = good_paraphrases(question, wanted) if task == "paraphrases" else good_hint(self.answers[question])
        return web.json_response(
            {
                "id": "chatcmpl-loopback",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            }
        )

    def __exit__(self, *exc) -> None:
        self.released.set()  # held requests answer 503 before the server stops
        super().__exit__(*exc)
