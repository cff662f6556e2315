"""HTTP plumbing shared by the judge client and the question builder: one OpenAI-compatible
endpoint, POST with timeouts and retries, and a request-rate limiter.

API keys are read from an environment variable at request time and never stored, printed or
logged; log lines name the URL and the failure, never the headers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

logger = logging.getLogger(__name__)


class RequestFailed(Exception):
    """A request that failed after its retries; ``reason`` is a short label for metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server (vLLM, SGLang, verl's GenRM router or a hosted API).

    Attributes:
        base_url: the URL that ``/chat/completions`` is appended to, e.g. ``http://127.0.0.1:8000/v1``.
        model: the ``model`` field sent with every request.
        api_key_env: name of the environment variable holding the API key (sent as a Bearer
            token); ``None`` sends no key.
        timeout_s: timeout of one attempt (connect + read).
        max_retries: attempts after the first one, for timeouts, connection errors, 429 and 5xx.
        backoff_s: the first retry waits this long, then it doubles.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 30.0
    max_retries: int = 3
    backoff_s: float = 0.5

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        if not self.api_key_env:
            return {}
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RequestFailed("no_api_key", f"environment variable {self.api_key_env} is not set")
        return {"Authorization": f"Bearer {key}"}


def probe(endpoint: Endpoint, timeout_s: float = 5.0) -> RequestFailed | None:
    """One ``GET {base_url}/models``, before any real request: ``None`` when a server answers
    (any status but 401/403: not every server lists its models), else why not (``connect``,
    ``timeout``, ``no_api_key``, ``http_401``, ...). The key is sent, never shown."""
    try:
        response = httpx.get(endpoint.base_url.rstrip("/") + "/models", headers=endpoint.headers(), timeout=timeout_s)
    except RequestFailed as failed:
        return failed
    except httpx.TimeoutException as exc:
        return RequestFailed("timeout", f"no answer within {timeout_s:g} s ({type(exc).__name__})")
    except httpx.TransportError as exc:
        return RequestFailed("connect", f"{type(exc).__name__}: {exc}")
    if response.status_code in (401, 403):
        return RequestFailed(f"http_{response.status_code}", "the server refused the API key (or its absence)")
    return None


def _retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


async def post_json(client: httpx.AsyncClient, endpoint: Endpoint, payload: dict[str, Any]) -> dict[str, Any]:
    """POST ``payload`` to the endpoint's chat URL and return the JSON body.

    Retries timeouts, connection errors, HTTP 429 and 5xx with exponential backoff; any other
    4xx and a body that is not JSON fail at once. Raises ``RequestFailed`` after the last attempt.
    """
    headers = endpoint.headers()
    last = RequestFailed("unknown")
    for attempt in range(endpoint.max_retries + 1):
        if attempt:
            await asyncio.sleep(endpoint.backoff_s * 2 ** (attempt - 1))
        try:
            response = await client.post(endpoint.chat_url, json=payload, headers=headers, timeout=endpoint.timeout_s)
        except httpx.TimeoutException as exc:
            last = RequestFailed("timeout", type(exc).__name__)
            continue
        except httpx.TransportError as exc:
            last = RequestFailed("connect", type(exc).__name__)
            continue
        if response.status_code != 200:
            last = RequestFailed(f"http_{response.status_code}", response.text[:200])
            if _retryable_status(response.status_code):
                continue
            break
        try:
            return response.json()
        except ValueError as exc:
            raise RequestFailed("bad_json", str(exc)) from None
    logger.debug("request to %s failed: %s", endpoint.chat_url, last)
    raise last


class RateLimiter:
    """A token bucket of ``per_minute`` requests (burst: one second's worth, at least 1)."""

    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self.lock:  # serialise waiters so they are served in order
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return
                await asyncio.sleep((1.0 - self.tokens) / self.rate)
