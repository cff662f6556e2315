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
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

TOKEN_VERSIONS_KEY = "token_global_steps"
NO_VERSION = -1  # the version of a response token the model did not generate

# Per asyncio task: the versions of each server call made by the current outer generate().
_call_versions: ContextVar[list[list[Any]] | None] = ContextVar("verl_ext_call_versions", default=None)


def call_token_versions(output: TokenOutput) -> list[Any]:
    """One server call's per-token versions: the server's own list if it sends one (the ``hf``
    backend does), else the call's ``global_steps`` repeated (vLLM/SGLang: constant per call)."""
    versions = output.extra_fields.get(TOKEN_VERSIONS_KEY)
    if versions is None:
        versions = [output.extra_fields.get("global_steps")] * len(output.token_ids)
    return list(versions)


def align_token_versions(response_mask: list[int], model_versions: list[Any]) -> list[Any]:
    """One version per response token of a multi-turn row: the model's tokens take
    ``model_versions`` in order, every other token (observations, chat markup) gets ``NO_VERSION``.

    Raises:
        ValueError: the mask counts a different number of model tokens than versions recorded.
    """
    if sum(response_mask) != len(model_versions):
        raise ValueError(
            f"{sum(response_mask)} model tokens in the response but {len(model_versions)} token versions "
            "from the server: the agent loop must add call_token_versions(output) for every generate()"
        )
    model = iter(model_versions)
    return [next(model) if m else NO_VERSION for m in response_mask]


class _RecordCallVersions(LLMServerClient):
    """Innermost layer: sees every single server call, including resumed ones."""

    async def generate(self, request_id, **kwargs: Any) -> TokenOutput:
        output = await super().generate(request_id, **kwargs)
        sink = _call_versions.get()
        if sink is not None:
            sink.append(call_token_versions(output))
        return output


class _AttachTokenVersions:
    """Outermost layer: one logical generate() -> per-token versions for all its tokens."""

    async def generate(self, request_id, **kwargs: Any) -> TokenOutput:
        sink: list[list[Any]] = []
        token = _call_versions.set(sink)
        try:
            output = await super().generate(request_id, **kwargs)
        finally:
            _call_versions.reset(token)
        versions = [v for call in sink for v in call]
        if len(versions) != len(output.token_ids):
            raise RuntimeError(
                f"verl-ext: recorded {len(versions)} token versions for {len(output.token_ids)} tokens "
                f"(request {request_id}); the client's resume logic changed, token versions would be wrong"
            )
        output.extra_fields[TOKEN_VERSIONS_KEY] = versions
        return output


class VersionedLLMServerClient(_AttachTokenVersions, _RecordCallVersions):
    """verl's ``LLMServerClient`` (sync trainers) with per-token versions."""


class VersionedFullyAsyncLLMServerClient(_AttachTokenVersions, FullyAsyncLLMServerClient, _RecordCallVersions):
    """verl's ``FullyAsyncLLMServerClient`` (async trainers, partial rollouts) with per-token versions."""
