"""LLM clients that record, for every generated token, the weight version that produced it.

verl's ``FullyAsyncLLMServerClient`` resumes an aborted generation by re-submitting prompt +
tokens so far, possibly to weights of a newer version, and keeps only the min/max version of
the whole trajectory. Exact old-logit providers need the version of each token, so these
clients wrap verl's own: the inner layer records each server call's versions (one call never
spans a weight update), the outer layer concatenates them into
``TokenOutput.extra_fields["token_global_steps"]`` (one entry per token). Agent loops copy
``extra_fields`` into ``AgentLoopOutput.extra_fields``, which reaches the trainer through
TransferQueue.

The verl-ext trainers return these clients from ``get_llm_client``; nothing else changes.

The same per-call layer carries the rollout side of the exact old-logit providers
(``verl_ext.old_logits.precomputed``), for every rollout engine alike, right after each call that
returned tokens (an aborted call included): with ``old_logit_scorer`` (provider ``dedicated``) it
has the scorer score the call's tokens, and the outer layer writes
``extra_fields["token_old_log_probs"]``; with ``segment_log`` (provider ``interrupt``,
``verl_ext.old_logits.segment_log``) it records the call's prompt, tokens and version, and the
outer layer lists the ids the log hands out in ``extra_fields["old_logit_segments"]``.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_ext.old_logits.config import KEY, DedicatedConfig
from verl_ext.old_logits.precomputed import SEGMENTS_KEY, TOKEN_OLD_LOG_PROBS_KEY
from verl_ext.old_logits.segment_log import SEGMENT_LOG_COMPONENT
from verl_ext.waits import wait_for

TOKEN_VERSIONS_KEY = "token_global_steps"
NO_VERSION = -1  # the version of a response token the model did not generate


@dataclass
class _Call:
    """What one server call contributes to its logical generate()."""

    versions: list[Any]
    old_log_probs: list[float | None] | None  # the dedicated scorer's values (None: no scorer)
    segment_id: str | None  # the segment log's id (None: no tokens, no log, or recorded too late)


# Per asyncio task: the server calls made by the current outer generate().
_calls: ContextVar[list[_Call] | None] = ContextVar("verl_ext_calls", default=None)


def call_token_versions(output: TokenOutput) -> list[Any]:
    """One server call's per-token versions: the server's own list if it sends one (the ``hf``
    backend does), else the call's ``global_steps`` repeated (vLLM/SGLang: constant per call)."""
    versions = output.extra_fields.get(TOKEN_VERSIONS_KEY)
    if versions is None:
        versions = [output.extra_fields.get("global_steps")] * len(output.token_ids)
    return list(versions)


def align_token_versions(response_mask: list[int], model_versions: list[Any], fill: Any = NO_VERSION) -> list[Any]:
    """One value per response token of a multi-turn row: the model's tokens take
    ``model_versions`` in order, every other token (observations, chat markup) gets ``fill``
    (``NO_VERSION`` for versions; old log-probs use None).

    Raises:
        ValueError: the mask counts a different number of model tokens than values recorded.
    """
    if sum(response_mask) != len(model_versions):
        raise ValueError(
            f"{sum(response_mask)} model tokens in the response but {len(model_versions)} token versions "
            "from the server: the agent loop must add call_token_versions(output) for every generate()"
        )
    model = iter(model_versions)
    return [next(model) if m else fill for m in response_mask]


PER_CALL_KEYS = (TOKEN_VERSIONS_KEY, TOKEN_OLD_LOG_PROBS_KEY, SEGMENTS_KEY)


@dataclass
class TurnTokens:
    """The per-token fields of one multi-turn row, gathered over its generate() calls: weight
    versions, and the rollout-side old log-probs / segment list of the exact old-logit providers
    (``dedicated`` / ``interrupt``) when the client records them. ``add`` every output whose
    tokens join the row's response; ``extra_fields`` aligns them with the response."""

    versions: list[Any] = field(default_factory=list)
    old_log_probs: list[float | None] | None = None
    segments: list[list[Any]] = field(default_factory=list)

    def add(self, output: TokenOutput) -> None:
        before = len(self.versions)
        self.versions += call_token_versions(output)
        scored = output.extra_fields.get(TOKEN_OLD_LOG_PROBS_KEY)
        if scored is not None or self.old_log_probs is not None:
            self.old_log_probs = (self.old_log_probs or [None] * before) + (
                list(scored) if scored is not None else [None] * len(output.token_ids))
        self.segments += output.extra_fields.get(SEGMENTS_KEY) or []

    def extra_fields(self, response_mask: list[int], limit: int) -> dict[str, Any]:
        """``token_global_steps`` (+ min/max), and the providers' fields, for a response cut at ``limit``."""
        if not self.versions:
            return {}
        fields: dict[str, Any] = {TOKEN_VERSIONS_KEY: align_token_versions(response_mask, self.versions)[:limit]}
        known = [v for v in self.versions if v is not None]
        if known:
            fields["min_global_steps"], fields["max_global_steps"] = min(known), max(known)
        if self.old_log_probs is not None:
            fields[TOKEN_OLD_LOG_PROBS_KEY] = align_token_versions(response_mask, self.old_log_probs, None)[:limit]
        if self.segments:
            fields[SEGMENTS_KEY] = self.segments
        return fields


class _RecordCallVersions(LLMServerClient):
    """Innermost layer: sees every single server call, including resumed ones.

    Args:
        old_logit_scorer: the ``dedicated`` provider's scorer actor (``score(prompt_ids,
            token_ids, version)``), or None.
        segment_log: the ``interrupt`` provider's ``SegmentLog`` actor (``record(prompt_ids,
            token_ids, version)``), or None.
        call_timeout_s: the bound on one call to whichever of the two is set (its provider's
            ``call_timeout_s``).
    """

    old_logit_scorer: Any = None
    segment_log: Any = None
    call_timeout_s: float = DedicatedConfig.call_timeout_s

    def __init__(self, *args: Any, old_logit_scorer: Any = None, segment_log: Any = None,
                 call_timeout_s: float = DedicatedConfig.call_timeout_s, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old_logit_scorer = old_logit_scorer
        self.segment_log = segment_log
        self.call_timeout_s = call_timeout_s

    async def generate(self, request_id, **kwargs: Any) -> TokenOutput:
        output = await super().generate(request_id, **kwargs)
        version = output.extra_fields.get("global_steps")
        segment_id = None
        if self.segment_log is not None and output.token_ids:
            segment_id = await wait_for(self.segment_log.record.remote(kwargs["prompt_ids"], output.token_ids, version),
                                        self.call_timeout_s, SEGMENT_LOG_COMPONENT, "record a segment",
                                        f"{KEY}.interrupt.call_timeout_s")
        old_log_probs = await self._score(kwargs["prompt_ids"], output, version)
        sink = _calls.get()
        if sink is not None:
            sink.append(_Call(call_token_versions(output), old_log_probs, segment_id))
        return output

    async def _score(self, prompt_ids: list[int], output: TokenOutput, version: Any) -> list[float | None] | None:
        """The scorer's log-probs of the call's tokens, asked for right away, while the scorer
        still holds the call's version (every call with tokens: the scorer's weight update waits
        for all of them). None without a scorer; ``None`` entries where the scorer refused."""
        if self.old_logit_scorer is None:
            return None
        if not output.token_ids:
            return []
        from verl_ext.backends.hf.old_logit_scorer import SCORER_COMPONENT

        scored = await wait_for(self.old_logit_scorer.score.remote(prompt_ids, output.token_ids, version),
                                self.call_timeout_s, SCORER_COMPONENT, "score a segment",
                                f"{KEY}.dedicated.call_timeout_s")
        return scored if scored is not None else [None] * len(output.token_ids)


class _AttachTokenVersions:
    """Outermost layer: one logical generate() -> per-token versions (and old log-probs or
    segment ids, see the module docstring) for all its tokens."""

    async def generate(self, request_id, **kwargs: Any) -> TokenOutput:
        sink: list[_Call] = []
        token = _calls.set(sink)
        try:
            output = await super().generate(request_id, **kwargs)
        finally:
            _calls.reset(token)
        versions = [v for call in sink for v in call.versions]
        if len(versions) != len(output.token_ids):
            raise RuntimeError(
                f"verl-ext: recorded {len(versions)} token versions for {len(output.token_ids)} tokens "
                f"(request {request_id}); the client's resume logic changed, token versions would be wrong"
            )
        output.extra_fields[TOKEN_VERSIONS_KEY] = versions
        if self.old_logit_scorer is not None:
            output.extra_fields[TOKEN_OLD_LOG_PROBS_KEY] = [lp for call in sink for lp in call.old_log_probs]
        if any(call.segment_id is not None for call in sink):
            output.extra_fields[SEGMENTS_KEY] = [
                [call.segment_id, len(call.versions)] for call in sink if call.versions
            ]
        return output


class VersionedLLMServerClient(_AttachTokenVersions, _RecordCallVersions):
    """verl's ``LLMServerClient`` (sync trainers) with per-token versions."""


class VersionedFullyAsyncLLMServerClient(_AttachTokenVersions, FullyAsyncLLMServerClient, _RecordCallVersions):
    """verl's ``FullyAsyncLLMServerClient`` (async trainers, partial rollouts) with per-token versions."""
