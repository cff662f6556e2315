"""Per-token weight versions through verl's own LLM clients, including abort/resume."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_ext.rollout_client import (
    NO_VERSION,
    VersionedFullyAsyncLLMServerClient,
    VersionedLLMServerClient,
    align_token_versions,
)


def _client(cls, monkeypatch, script):
    """A client whose innermost server call (verl's LLMServerClient.generate) replays ``script``."""
    calls = iter(script)
    seen_prompts = []

    async def fake_generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        seen_prompts.append(list(prompt_ids))
        return next(calls)

    monkeypatch.setattr(LLMServerClient, "generate", fake_generate)
    client = object.__new__(cls)
    client.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(response_length=8)))
    return client, seen_prompts


def test_a_resumed_partial_rollout_keeps_each_tokens_version(monkeypatch):
    monkeypatch.setattr(asyncio, "sleep", lambda *_: _done())  # verl waits 1 s before resuming
    script = [  # aborted after 3 tokens at version 4, resumed at version 5 (vLLM-style: no per-token list)
        TokenOutput(token_ids=[11, 12, 13], log_probs=[-1.0] * 3, stop_reason="aborted", extra_fields={"global_steps": 4}),
        TokenOutput(token_ids=[14, 15], log_probs=[-1.0] * 2, stop_reason="completed", extra_fields={"global_steps": 5}),
    ]
    client, prompts = _client(VersionedFullyAsyncLLMServerClient, monkeypatch, script)
    out = asyncio.run(client.generate("r", prompt_ids=[1, 2], sampling_params={}))
    assert out.token_ids == [11, 12, 13, 14, 15]
    assert out.extra_fields["token_global_steps"] == [4, 4, 4, 5, 5]
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (4, 5)
    assert prompts == [[1, 2], [1, 2, 11, 12, 13]]  # verl's resume: prompt + tokens so far


def test_sync_client_uses_the_servers_own_per_token_list(monkeypatch):
    script = [TokenOutput(token_ids=[7, 8], log_probs=[-1.0, -1.0], stop_reason="completed",
                          extra_fields={"global_steps": 2, "token_global_steps": [2, 2]})]
    client, _ = _client(VersionedLLMServerClient, monkeypatch, script)
    out = asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={}))
    assert out.extra_fields["token_global_steps"] == [2, 2]


def test_align_token_versions_marks_non_model_tokens():
    assert align_token_versions([1, 1, 0, 0, 1], [3, 3, 4]) == [3, 3, NO_VERSION, NO_VERSION, 4]
    with pytest.raises(ValueError, match="token versions"):
        align_token_versions([1, 0, 1], [3])


async def _done():
    return None
