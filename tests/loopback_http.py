"""The part every loopback test server shares: one aiohttp route on 127.0.0.1 in its own thread and event loop.

The code under test talks to a subclass through a real socket with the real ``openai`` client. A subclass sets
``route`` (e.g. ``"/v1/embeddings"``) and implements ``_handle``; ``with Server(...) as server:`` starts it on a free
port (``server.url`` is its ``/v1`` base URL) and stops it on exit. Importable from every test folder as
``loopback_http``: ``tests/conftest.py`` puts ``tests/`` on ``sys.path`` (pytest's default rootdir-relative import).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


def scripted_error(status: int, headers: dict) -> web.Response:
    """An OpenAI-style error body with ``status`` (a scripted failure)."""
    error = {"error": {"message": f"scripted {status}", "type": "scripted", "code": status}}
    return web.json_response(error, status=status, headers=headers)


class LoopbackHttpServer:
    """Serves ``POST route`` with ``self._handle`` on ``127.0.0.1:port`` (``port`` chosen by the OS on start)."""

    route: str = ""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, request: web.Request) -> web.Response:
        raise NotImplementedError

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(self.route, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
