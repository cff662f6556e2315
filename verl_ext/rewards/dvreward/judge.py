"""Judges answer yes/no questions about an artifact: ``answer(questions, artifact) -> [p_yes | None]``.

``None`` means the judge failed on that question (timeout, HTTP error, malformed output, an
answer that is neither yes nor no); it is never the same as "no".

``OpenAIJudge`` talks to any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang,
verl's GenRM router, a hosted API, ``verl-ext judge-server``) with ``temperature=0``, a few
``max_tokens`` and first-token ``logprobs``/``top_logprobs``; text or base64 image artifacts;
a concurrency limit, a request-rate limit, per-attempt timeouts, retries with backoff, and an
LRU cache of (question, artifact hash) -> answer.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import statistics
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import httpx

from verl_ext.rewards.dvreward.scoring import p_yes
from verl_ext.rewards.dvreward.transport import Endpoint, RateLimiter, RequestFailed, post_json

JUDGE_SYSTEM_PROMPT = (
    "You check one fact about an artifact (an image, a screen or a text). Reply with one word, "
    "yes or no, and nothing else. If the thing the question is about is absent, reply no."
)


@dataclass(frozen=True)
class Artifact:
    """What the judge looks at: a text (a response, a DOM/state dump) or a base64 image."""

    kind: str  # "text" | "image"
    data: str  # the text, or the image as base64 (no data-URL prefix)
    mime: str = "text/plain"

    @classmethod
    def text(cls, text: str) -> Artifact:
        return cls("text", text)

    @classmethod
    def image(cls, raw: bytes, mime: str = "image/png") -> Artifact:
        return cls("image", base64.b64encode(raw).decode("ascii"), mime)

    @cached_property  # asked once per question; a screenshot's base64 is large
    def digest(self) -> str:
        return hashlib.sha256(f"{self.kind}\0{self.mime}\0{self.data}".encode()).hexdigest()

    def user_content(self, question: str) -> str | list[dict[str, Any]]:
        """The user message for one question (OpenAI chat format)."""
        if self.kind == "image":
            return [
                {"type": "image_url", "image_url": {"url": f"data:{self.mime};base64,{self.data}"}},
                {"type": "text", "text": question},
            ]
        return f"Artifact:\n{self.data}\n\nQuestion: {question}"


class Judge(Protocol):
    """The judge contract (ARCHITECTURE.md "Contracts worth keeping stable")."""

    async def answer(self, questions: Sequence[str], artifact: Artifact) -> list[float | None]: ...


@dataclass
class JudgeStats:
    """Counters since the judge was built (per process); ``summary()`` gives the metrics."""

    questions: int = 0
    cache_hits: int = 0
    requests: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    def summary(self) -> dict[str, float]:
        failed = sum(self.failures.values())
        return {
            "dv_judge/questions": float(self.questions),
            "dv_judge/requests": float(self.requests),
            "dv_judge/failure_rate": failed / self.questions if self.questions else 0.0,
            "dv_judge/cache_hit_rate": self.cache_hits / self.questions if self.questions else 0.0,
            "dv_judge/latency_median_s": statistics.median(self.latencies_s) if self.latencies_s else 0.0,
        }


@dataclass(frozen=True)
class JudgeOptions:
    """Request and client settings of ``OpenAIJudge`` (see docs/reference/dvreward.md)."""

    max_concurrency: int = 16
    requests_per_minute: float | None = None
    max_tokens: int = 4
    top_logprobs: int = 5
    binary: bool = False
    cache_size: int = 100_000


@dataclass(frozen=True)
class JudgeReport:
    """One ``answer_detailed`` call: answers (``None`` = failed), cache hits, failure reasons."""

    answers: list[float | None]
    cache_hits: int
    failures: Counter[str]
    latency_s: float


def parse_choice(body: dict[str, Any]) -> tuple[list[tuple[str, float]], str | None]:
    """First-token candidates ``[(token, logprob)]`` and the answer text of a chat completion.

    Raises ``RequestFailed("malformed")`` when the body is not a chat completion.
    """
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content")
        tokens = (choice.get("logprobs") or {}).get("content") or []
        if not tokens:
            return [], text
        first = tokens[0]
        top = first.get("top_logprobs") or [first]
        return [(str(c["token"]), float(c["logprob"])) for c in top], text
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise RequestFailed("malformed", repr(exc)) from None


class _LoopState:
    """What is bound to one event loop: the HTTP client and the limiters."""

    def __init__(self, options: JudgeOptions) -> None:
        self.loop = asyncio.get_running_loop()
        n = options.max_concurrency
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
        self.semaphore = asyncio.Semaphore(options.max_concurrency)
        self.limiter = RateLimiter(options.requests_per_minute) if options.requests_per_minute else None


class OpenAIJudge:
    """A ``Judge`` over an OpenAI-compatible chat-completions endpoint."""

    def __init__(self, endpoint: Endpoint, options: JudgeOptions | None = None) -> None:
        self.endpoint = endpoint
        self.options = options or JudgeOptions()
        self.stats = JudgeStats()
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._state: _LoopState | None = None

    def _loop_state(self) -> _LoopState:
        # verl calls the manager from one long-lived loop; tests and scripts may use several.
        if self._state is None or self._state.loop is not asyncio.get_running_loop():
            self._state = _LoopState(self.options)
        return self._state

    def payload(self, question: str, artifact: Artifact) -> dict[str, Any]:
        return {
            "model": self.endpoint.model,
            "messages": [
                {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                {"role": "user", "content": artifact.user_content(question)},
            ],
            "temperature": 0.0,
            "max_tokens": self.options.max_tokens,
            "logprobs": True,
            "top_logprobs": self.options.top_logprobs,
        }

    async def answer(self, questions: Sequence[str], artifact: Artifact) -> list[float | None]:
        """P(yes) per question, ``None`` where the judge failed. Order follows ``questions``."""
        return (await self.answer_detailed(questions, artifact)).answers

    async def answer_detailed(self, questions: Sequence[str], artifact: Artifact) -> JudgeReport:
        """``answer`` plus what this call cost: cache hits, failure reasons, wall time."""
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(self._answer_one(q, artifact) for q in questions))
        return JudgeReport(
            answers=[value for value, _ in outcomes],
            cache_hits=sum(source == "cache" for _, source in outcomes),
            failures=Counter(source for value, source in outcomes if value is None),
            latency_s=time.perf_counter() - start,
        )

    async def _answer_one(self, question: str, artifact: Artifact) -> tuple[float | None, str]:
        """(P(yes) or None, where it came from: "cache", "judge" or the failure reason)."""
        self.stats.questions += 1
        key = (question, artifact.digest)
        if key in self._cache:
            self._cache.move_to_end(key)
            self.stats.cache_hits += 1
            return self._cache[key], "cache"
        try:
            value = await self._request(question, artifact)
        except RequestFailed as exc:
            self.stats.failures[exc.reason] += 1
            return None, exc.reason
        self._cache[key] = value
        if len(self._cache) > self.options.cache_size:
            self._cache.popitem(last=False)
        return value, "judge"

    async def _request(self, question: str, artifact: Artifact) -> float:
        state = self._loop_state()
        if state.limiter is not None:
            await state.limiter.acquire()
        async with state.semaphore:
            start = time.perf_counter()
            self.stats.requests += 1
            body = await post_json(state.client, self.endpoint, self.payload(question, artifact))
            self.stats.latencies_s.append(time.perf_counter() - start)
        candidates, text = parse_choice(body)
        value = p_yes(candidates, text, binary=self.options.binary)
        if value is None:
            raise RequestFailed("not_yes_no", repr((text or "")[:40]))
        return value

    async def aclose(self) -> None:
        if self._state is not None:
            await self._state.client.aclose()
            self._state = None
