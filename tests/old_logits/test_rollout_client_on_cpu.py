"""Per-token weight versions through verl's own LLM clients, including abort/resume."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_ext.old_logits.rollout_client import (
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


def test_turn_tokens_align_every_per_token_field_of_a_multi_turn_row():
    from verl.workers.rollout.replica import TokenOutput

    from verl_ext.old_logits.precomputed import SEGMENTS_KEY, TOKEN_OLD_LOG_PROBS_KEY
    from verl_ext.old_logits.rollout_client import TOKEN_VERSIONS_KEY, TurnTokens

    row = TurnTokens()
    # turn 1: a server without scorer values; turn 2: scored by the dedicated scorer, logged as a segment
    row.add(TokenOutput(token_ids=[5, 6], extra_fields={"global_steps": 3}))
    row.add(TokenOutput(token_ids=[7], extra_fields={TOKEN_VERSIONS_KEY: [4], TOKEN_OLD_LOG_PROBS_KEY: [-0.5],
                                                      SEGMENTS_KEY: [["s9", 1]]}))
    fields = row.extra_fields([1, 1, 0, 0, 1], limit=5)  # two observation tokens between the turns
    assert fields[TOKEN_VERSIONS_KEY] == [3, 3, NO_VERSION, NO_VERSION, 4]
    assert (fields["min_global_steps"], fields["max_global_steps"]) == (3, 4)
    assert fields[TOKEN_OLD_LOG_PROBS_KEY] == [None, None, None, None, -0.5]
    assert fields[SEGMENTS_KEY] == [["s9", 1]]
    assert row.extra_fields([1, 1, 0, 0, 1], limit=3)[TOKEN_OLD_LOG_PROBS_KEY] == [None, None, None]
    assert TurnTokens().extra_fields([], limit=4) == {}
