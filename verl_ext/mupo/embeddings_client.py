"""Embeddings from any OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM, SGLang, TEI, OpenAI), for MUPO.

The data-prep CLI's conventions (``data_prep/llm_client.py``): the ``openai`` client's own retries are off, so this
module alone decides. Rate limits (429), server errors (5xx), timeouts and dropped connections are retried with
exponential backoff (``data_prep.llm_client.RetryPolicy``: ``min(max_delay, base_delay * 2**attempt) * U(0.5, 1)``,
or the server's ``Retry-After`` when longer), at most ``max_retries`` times per request; 401/403/404 (key,
permission, unknown model) stop the whole batch at once, and no later request is sent. At most ``concurrency``
requests are in flight (a thread pool: the trainer's driver is synchronous, and threads need no event loop).

The texts are sent ``batch_size`` per request; each request is retried until answered and never sent again once
answered, and every answer is placed by its ``index`` field, so no embedding is lost or misplaced. A batch that
cannot be embedded raises :class:`EmbeddingError` naming the endpoint: the MUPO step fails rather than silently
becoming GRPO. The API key comes only from the environment variable ``api_key_env`` and is never logged.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import numpy as np
import openai

from data_prep.llm_client import FATAL_ERRORS, PLACEHOLDER_API_KEY, RETRYABLE_ERRORS, RetryPolicy
from verl_ext.mupo.backend import checked_texts
from verl_ext.mupo.errors import EmbeddingEndpointRefused, EmbeddingError

logger = logging.getLogger(__name__)

# Read when mupo.embedding.base_url is null, so a launcher can point at the endpoint without editing the yaml.
BASE_URL_ENV = "MUPO_EMBEDDING_BASE_URL"


class _Stopped(Exception):
    """Another request of the batch failed for good: this one gives up without sending (not the error reported)."""


class OpenAIEmbedder:
    """``embed(texts) -> (B, D) float32`` through an OpenAI-compatible endpoint; ``stats`` counts requests,
    retries, texts and prompt tokens over the embedder's life."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 8,
        batch_size: int = 64,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
    ):
        if not isinstance(base_url, str) or not base_url.strip():
            raise ValueError(
                f"mupo.embedding.base_url must be the endpoint's URL (e.g. http://host:8000/v1), got {base_url!r}; "
                f"set it or the {BASE_URL_ENV} environment variable"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"mupo.embedding.model must name the served embedding model, got {model!r}")
        for name, value in (("concurrency", concurrency), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"mupo.embedding.{name} must be a positive integer, got {value!r}")
        if not timeout > 0:
            raise ValueError(f"mupo.embedding.timeout must be positive seconds, got {timeout!r}")
        self.base_url = base_url.strip().rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.retry = retry or RetryPolicy()
        if isinstance(self.retry.max_retries, bool) or not isinstance(self.retry.max_retries, int):
            raise ValueError(f"mupo.embedding.max_retries must be an integer >= 0, got {self.retry.max_retries!r}")
        for name in ("max_retries", "base_delay", "max_delay"):
            if not getattr(self.retry, name) >= 0:
                raise ValueError(f"mupo.embedding.{name} must be >= 0, got {getattr(self.retry, name)!r}")
        self._client = openai.OpenAI(
            api_key=os.environ.get(api_key_env) or PLACEHOLDER_API_KEY,
            base_url=self.base_url,
            max_retries=0,
            timeout=timeout,
        )
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"embeddings endpoint {self.base_url} (model {self.model})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), D) float32`` embeddings, row ``i`` for ``texts[i]``; raises :class:`EmbeddingError`."""
        texts = checked_texts(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        # OpenAI's API refuses an empty input string; an empty response is embedded as one space.
        chunks = [[t or " " for t in texts[s : s + self.batch_size]] for s in range(0, len(texts), self.batch_size)]
        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks))) as pool:
            futures = [pool.submit(self._request, chunk, stop) for chunk in chunks]
            wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                stop.set()  # queued requests are not sent, backoff sleeps end; in-flight ones finish or time out
                for f in futures:
                    f.cancel()
        errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
        real = [e for e in errors if not isinstance(e, _Stopped)]
        if real:
            refused = [e for e in real if isinstance(e, EmbeddingEndpointRefused)]
            raise (refused or real)[0]
        rows = [f.result() for f in futures]
        dims = {r.shape[1] for r in rows}
        if len(dims) != 1:
            raise EmbeddingError(f"the {self.describe()} returned embeddings of different sizes {sorted(dims)}")
        with self._lock:
            self.stats["texts"] += len(texts)
        return np.concatenate(rows, axis=0)

    def _request(self, chunk: list[str], stop: threading.Event) -> np.ndarray:
        try:
            return self._request_until_answered(chunk, stop)
        except EmbeddingError:
            stop.set()  # before this worker takes the next chunk: nothing more is sent once the batch has failed
            raise

    def _request_until_answered(self, chunk: list[str], stop: threading.Event) -> np.ndarray:
        last_error: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            if stop.is_set():
                raise _Stopped()
            with self._lock:
                self.stats["requests"] += 1
            try:
                response = self._client.embeddings.create(model=self.model, input=chunk, encoding_format="base64")
            except FATAL_ERRORS as exc:
                raise EmbeddingEndpointRefused(
                    f"the {self.describe()} refused the request ({type(exc).__name__}, HTTP {exc.status_code}): "
                    f"check mupo.embedding.base_url, mupo.embedding.model and the {self.api_key_env} environment "
                    "variable"
                ) from exc
            except RETRYABLE_ERRORS as exc:
                last_error = exc
            except openai.APIStatusError as exc:  # other 4xx (bad request, input too long): retrying cannot help
                raise EmbeddingError(
                    f"the {self.describe()} rejected a request of {len(chunk)} texts (HTTP {exc.status_code}: "
                    f"{exc.message})"
                ) from exc
            else:
                return self._decode(response, len(chunk))
            if attempt == self.retry.max_retries:
                break
            with self._lock:
                self.stats["retries"] += 1
            delay = self.retry.delay(attempt, _retry_after(last_error))
            logger.debug("embeddings retry %d after %s in %.2fs", attempt + 1, type(last_error).__name__, delay)
            if stop.wait(delay):
                raise _Stopped()
        attempts = self.retry.max_retries + 1
        if isinstance(last_error, openai.APIConnectionError) and not isinstance(last_error, openai.APITimeoutError):
            raise EmbeddingError(
                f"cannot reach the {self.describe()} after {attempts} attempts ({last_error}); is the embedding "
                f"server running, and is mupo.embedding.base_url (or {BASE_URL_ENV}) right?"
            ) from last_error
        raise EmbeddingError(
            f"the {self.describe()} failed {attempts} attempts in a row; last error "
            f"{type(last_error).__name__}: {last_error}"
        ) from last_error

    def _decode(self, response, expected: int) -> np.ndarray:
        """``(expected, D)`` rows placed by each item's ``index``; base64 (little-endian float32) or float lists."""
        data = list(response.data or [])
        indices = sorted(int(item.index) for item in data)
        if indices != list(range(expected)):
            raise EmbeddingError(
                f"the {self.describe()} answered {len(data)} embeddings (indices {indices[:8]}...) for {expected} "
                "texts; every text needs exactly one"
            )
        rows: list[np.ndarray] = [np.empty(0)] * expected
        for item in data:
            vector = item.embedding
            if isinstance(vector, str):
                rows[int(item.index)] = np.frombuffer(base64.b64decode(vector), dtype="<f4")
            else:  # a server that ignores encoding_format and answers float lists
                rows[int(item.index)] = np.asarray(vector, dtype=np.float32)
        dims = {row.shape[0] for row in rows}
        if len(dims) != 1 or 0 in dims:
            raise EmbeddingError(f"the {self.describe()} returned embeddings of sizes {sorted(dims)} in one answer")
        usage = getattr(response, "usage", None)
        with self._lock:
            self.stats["prompt_tokens"] += int(getattr(usage, "prompt_tokens", 0) or 0)
        return np.stack(rows).astype(np.float32, copy=False)

    def close(self) -> None:
        self._client.close()


def _retry_after(exc: Exception | None) -> float | None:
    """The server's ``Retry-After`` in seconds, when it sent one as a number."""
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: our own backoff
        return None
