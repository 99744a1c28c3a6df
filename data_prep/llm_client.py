"""A bounded, retrying chat-completions client for any OpenAI-compatible endpoint (vLLM, SGLang, OpenAI, ...).

The ``openai`` client's own retries are switched off (``max_retries=0``) so that this module alone decides, visibly
and testably: rate limits (429), server errors (5xx), timeouts and dropped connections are retried with exponential
backoff, ``delay = min(max_delay, base_delay * 2**attempt) * U(0.5, 1)`` (or the server's ``Retry-After`` when it is
longer), at most ``max_retries`` times. Authentication, permission and unknown-model errors stop the whole run.
At most ``concurrency`` requests are in flight (an asyncio semaphore; backoff sleeps do not hold a slot).
The API key comes only from ``OPENAI_API_KEY`` (a placeholder for local servers otherwise) and is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import Counter
from dataclasses import dataclass

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from data_prep.errors import PrepError

logger = logging.getLogger(__name__)

# Local servers (vLLM, SGLang) accept any key; a placeholder keeps the openai client from refusing to start.
PLACEHOLDER_API_KEY = "EMPTY"
RETRYABLE_ERRORS = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
)
FATAL_ERRORS = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)


class RequestFailed(Exception):
    """One request failed for good (retries exhausted, or a 4xx that retrying cannot fix); the run continues."""


class EndpointUnusable(PrepError):
    """The endpoint refuses every request (bad key, no permission, unknown model): stop instead of burning rows."""


@dataclass
class RetryPolicy:
    max_retries: int = 6
    base_delay: float = 1.0
    max_delay: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        backoff = min(self.max_delay, self.base_delay * 2**attempt) * random.uniform(0.5, 1.0)
        if retry_after is not None:
            backoff = max(backoff, min(retry_after, self.max_delay))
        return backoff


@dataclass
class ChatReply:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


def _http_client():
    """openai's aiohttp transport when aiohttp is installed (the client's documented option for high concurrency;
    it spends less CPU per request than the default httpx pool), else None for the default."""
    try:
        return openai.DefaultAioHttpClient()
    except RuntimeError:  # openai installed without its aiohttp extra
        return None


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


class ChatClient:
    """``await client.complete(messages)`` -> :class:`ChatReply`, with bounded concurrency and retries."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        concurrency: int = 32,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
    ):
        if concurrency < 1:
            raise PrepError(f"--concurrency must be at least 1, got {concurrency}")
        self.model = model
        self.retry = retry or RetryPolicy()
        self._client = AsyncOpenAI(
            api_key=os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_API_KEY,
            base_url=base_url,
            max_retries=0,
            timeout=timeout,
            http_client=_http_client(),
        )
        self._slots = asyncio.Semaphore(concurrency)
        self.stats: Counter[str] = Counter()  # requests, retries, prompt_tokens, completion_tokens, failures
        self._refused: EndpointUnusable | None = None  # once refused, later requests are not sent at all

    async def complete(self, messages: list[dict], temperature: float = 0.7, max_tokens: int = 1024) -> ChatReply:
        last_error: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            async with self._slots:
                if self._refused is not None:
                    raise self._refused
                self.stats["requests"] += 1
                try:
                    # The client's generic POST (its documented route for raw bodies) sends our plain-dict body
                    # as is: ``chat.completions.create`` first walks every message through its typed-dict
                    # transform, which costs several ms of CPU per request and caps throughput at high concurrency.
                    # Error mapping, auth and timeouts are the same.
                    response = await self._client.post(
                        "/chat/completions",
                        cast_to=ChatCompletion,
                        body={
                            "model": self.model,
                            "messages": messages,
                            "temperature": temperature,
                            "max_tokens": max_tokens,
                        },
                    )
                except FATAL_ERRORS as exc:
                    self._refused = EndpointUnusable(
                        f"the endpoint refused the request ({type(exc).__name__}, HTTP {exc.status_code}): check "
                        "--base-url, --model and the OPENAI_API_KEY environment variable"
                    )
                    raise self._refused from None
                except RETRYABLE_ERRORS as exc:
                    last_error = exc
                except openai.APIStatusError as exc:  # other 4xx (bad request, too long): retrying cannot help
                    self.stats["failures"] += 1
                    raise RequestFailed(f"HTTP {exc.status_code}: {exc.message}") from None
                else:
                    usage = response.usage
                    prompt_tokens = usage.prompt_tokens if usage else 0
                    completion_tokens = usage.completion_tokens if usage else 0
                    self.stats["prompt_tokens"] += prompt_tokens or 0
                    self.stats["completion_tokens"] += completion_tokens or 0
                    choice = response.choices[0] if response.choices else None
                    return ChatReply(
                        text=(choice.message.content or "") if choice else "",
                        finish_reason=choice.finish_reason if choice else None,
                        prompt_tokens=prompt_tokens or 0,
                        completion_tokens=completion_tokens or 0,
                    )
            if attempt == self.retry.max_retries:
                break
            self.stats["retries"] += 1
            delay = self.retry.delay(attempt, _retry_after(last_error))
            logger.debug("retry %d after %s in %.2fs", attempt + 1, type(last_error).__name__, delay)
            await asyncio.sleep(delay)
        self.stats["failures"] += 1
        last = f"{type(last_error).__name__}: {last_error}"
        raise RequestFailed(f"gave up after {self.retry.max_retries + 1} attempts; last error: {last}")

    async def close(self) -> None:
        await self._client.close()
