"""The rollout side of the exact providers ``dedicated`` and ``interrupt`` on the cpu backend.

The pieces run for real: the ``hf`` rollout server, the client-side ``SegmentLog`` and the
``dedicated`` scorer (their classes, in this process's event loop; verl-ext makes them Ray
actors), verl's own ``FullyAsyncLLMServerClient`` resume loop through verl-ext's versioned client.
Only the transport is stood in for: the client's innermost call goes straight to the in-process
server instead of through verl's Ray load balancer, and ``_Handle`` gives an in-process object the
``.method.remote(...)`` call shape of a Ray actor handle. The log and the scorer see only what any
engine's server returns (prompt ids, token ids, ``global_steps``) plus the server's
``served_segments`` count, which verl-ext's vLLM server keeps the same way.

On this backend rollout and training share numerics (fp32 transformers), so an exact provider's
old log-probs must equal the rollout's own log-probs, token for token, including the tokens of a
partial rollout that spans two weight versions.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from types import SimpleNamespace

import pytest
import torch
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.llm_server import LLMServerClient

from verl_ext.backends.hf.old_logit_scorer import HFOldLogitScorer
from verl_ext.backends.hf.rollout import HFRolloutServer
from verl_ext.backends.hf.wire import WireTensor, named_to_wire
from verl_ext.old_logits import OldLogitsConfig, build_provider
from verl_ext.old_logits.local_host import LocalPolicyHost
from verl_ext.old_logits.precomputed import (
    SEGMENTS_KEY,
    TOKEN_OLD_LOG_PROBS_KEY,
    SegmentStore,
    precomputed_log_probs,
)
from verl_ext.old_logits.rollout_client import VersionedFullyAsyncLLMServerClient
from verl_ext.old_logits.segment_log import SegmentLog

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}
PROMPT = [3, 4, 5]


class _Handle:
    """``handle.method.remote(*args)`` -> awaitable, like a Ray actor handle, for an in-process object."""

    def __init__(self, target) -> None:
        self._target = target

    def __getattr__(self, name):
        method = getattr(self._target, name)

        async def remote(*args, **kwargs):
            result = method(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result

        return type("_Method", (), {"remote": staticmethod(remote)})()


def _rollout_config() -> RolloutConfig:
    return RolloutConfig(name="hf", prompt_length=32, response_length=24, tensor_model_parallel_size=1, dtype="float32")


@pytest.fixture
def server(tiny_model_dir):
    return HFRolloutServer(config=_rollout_config(), model_config=HFModelConfig(path=tiny_model_dir), replica_rank=0)


def _scorer(tiny_model_dir, server, timeout_s=30.0) -> HFOldLogitScorer:
    return HFOldLogitScorer(
        config=_rollout_config(),
        model_config=HFModelConfig(path=tiny_model_dir),
        servers=[_Handle(server)],
        temperature=PARAMS["temperature"],
        sync_timeout_s=timeout_s,
    )


def _slow(server, seconds=0.02) -> None:
    """Makes decoding slow enough to be interrupted mid-request."""
    forward = server.engine.model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    server.engine.model.forward = slow_forward


def _new_weights(server, seed: int) -> dict[str, WireTensor]:
    """The server's weights moved by noise, as the trainer sends them (``wire.named_to_wire``)."""
    g = torch.Generator().manual_seed(seed)
    state = server.engine.model.state_dict()
    return named_to_wire((n, t + 0.05 * torch.randn(t.shape, generator=g)) for n, t in state.items())


def _client(monkeypatch, server, log=None, scorer=None) -> VersionedFullyAsyncLLMServerClient:
    async def to_server(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        return await server.generate(prompt_ids=prompt_ids, sampling_params=sampling_params, request_id=request_id)

    monkeypatch.setattr(LLMServerClient, "generate", to_server)
    monkeypatch.setattr(asyncio, "sleep", _fast_sleep(asyncio.sleep))  # verl waits 1 s before resuming
    client = object.__new__(VersionedFullyAsyncLLMServerClient)
    client.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(response_length=40)))
    client.old_logit_scorer = None if scorer is None else _Handle(scorer)
    client.segment_log = None if log is None else _Handle(log)
    return client


def _fast_sleep(sleep):
    async def fast(seconds, *args):
        await sleep(0.01 if seconds >= 1 else seconds, *args)

    return fast


async def _partial_rollout_across_a_weight_sync(server, client, sync):
    """One generate() aborted at version 1 after a few tokens, resumed at version 2. ``sync`` is
    the weight update (what verl's trainer does between abort and resume)."""
    _slow(server)
    await server.set_global_steps(1)
    task = asyncio.create_task(
        client.generate("r", prompt_ids=list(PROMPT), sampling_params={**PARAMS, "max_tokens": 40})
    )
    while not server._running:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    await server.abort_all_requests()
    await sync()
    await server.resume_generation()
    return await task


async def test_dedicated_scores_every_token_at_its_own_version(monkeypatch, server, tiny_model_dir):
    scorer = _scorer(tiny_model_dir, server)
    await scorer.set_global_steps(1)
    client = _client(monkeypatch, server, scorer=scorer)
    new = _new_weights(server, seed=7)

    async def sync():  # the trainer's order: verl's sync of the rollout servers, then the scorer
        await server.update_weights(new, global_steps=2)
        await scorer.update_weights(new, global_steps=2)

    out = await _partial_rollout_across_a_weight_sync(server, client, sync)
    versions = out.extra_fields["token_global_steps"]
    assert set(versions) == {1, 2} and versions == sorted(versions), versions  # it spans the sync
    old = torch.tensor(out.extra_fields[TOKEN_OLD_LOG_PROBS_KEY])
    # shared numerics: the scorer's old log-probs are the rollout's own, token for token
    torch.testing.assert_close(old, torch.tensor(out.log_probs), rtol=0, atol=1e-5)
    stats = await scorer.take_stats()
    assert stats["segments"] == 2 and stats["tokens"] == len(out.token_ids) and stats["refused"] == 0


async def test_scorer_computes_in_the_training_dtype_it_is_given(tiny_model_dir):
    """The scorer stands for the training engine: bf16 weights and activations where the actor's
    FSDP mixed precision is bf16 (GPUs), fp32 on the cpu backend; its memory is reported."""
    fp32 = HFOldLogitScorer(config=_rollout_config(), model_config=HFModelConfig(path=tiny_model_dir),
                            servers=[], temperature=1.0, sync_timeout_s=1.0)
    bf16 = HFOldLogitScorer(config=_rollout_config(), model_config=HFModelConfig(path=tiny_model_dir),
                            servers=[], temperature=1.0, sync_timeout_s=1.0, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in bf16.engine.model.parameters()} == {torch.bfloat16}
    scores = []
    for scorer in (fp32, bf16):
        await scorer.set_global_steps(1)
        scores.append(torch.tensor(await scorer.score(PROMPT, [7, 8, 9, 10], version=1)))
    gap = (scores[0] - scores[1]).abs().max()
    assert 0 < gap < 0.1, gap  # bf16 numerics: not fp32's values, not far from them
    memory = [await scorer.memory() for scorer in (fp32, bf16)]
    assert memory[1]["verl_ext/mem/dedicated_scorer/host_bytes"] * 2 == memory[0]["verl_ext/mem/dedicated_scorer/host_bytes"]
    assert memory[0]["verl_ext/mem/dedicated_scorer/gpu_bytes"] == 0


async def test_scorer_refuses_a_version_it_does_not_hold(server, tiny_model_dir):
    scorer = _scorer(tiny_model_dir, server)
    await scorer.set_global_steps(3)
    assert await scorer.score(PROMPT, [7, 8], version=2) is None
    assert (await scorer.take_stats())["refused"] == 1


async def test_scorer_weight_update_waits_for_the_outgoing_versions_segments(server, tiny_model_dir):
    await server.set_global_steps(1)
    scorer = _scorer(tiny_model_dir, server)
    await scorer.set_global_steps(1)
    out = await server.generate(prompt_ids=list(PROMPT), sampling_params={**PARAMS, "max_tokens": 4}, request_id="a")
    assert await server.served_segments(1) == 1
    update = asyncio.create_task(scorer.update_weights(_new_weights(server, seed=1), global_steps=2))
    await asyncio.sleep(0.2)
    assert not update.done()  # one segment of version 1 is still unscored: version 1 must stay
    scored = await scorer.score(PROMPT, out.token_ids, version=1)
    torch.testing.assert_close(torch.tensor(scored), torch.tensor(out.log_probs), rtol=0, atol=1e-5)
    await asyncio.wait_for(update, timeout=5)
    assert await scorer.get_global_steps() == 2


async def test_scorer_sync_timeout_moves_on_and_says_so(server, tiny_model_dir, caplog):
    await server.set_global_steps(1)
    scorer = _scorer(tiny_model_dir, server, timeout_s=0.1)
    await scorer.set_global_steps(1)
    await server.generate(prompt_ids=list(PROMPT), sampling_params={**PARAMS, "max_tokens": 2}, request_id="a")
    with caplog.at_level(logging.WARNING, logger="verl_ext.hf_rollout"):
        await scorer.update_weights(_new_weights(server, seed=1), global_steps=2)
    assert "dedicated.sync_timeout_s" in caplog.text
    assert (await scorer.take_stats())["sync_timeouts"] == 1


async def _until_recorded(log, server, version: int) -> None:
    """``host.wait_until_recorded`` in this event loop: the clients have recorded every segment
    of ``version`` the server served (the server's count is final once its abort returned)."""
    while log.recorded(version) < await server.served_segments(version):
        await asyncio.sleep(0.005)


async def test_interrupt_segments_are_logged_by_the_client_with_aborted_prefixes(monkeypatch, server):
    log = SegmentLog()
    client = _client(monkeypatch, server, log)
    taken_at_sync = []

    async def sync():  # what the trainer sees after verl's abort: every version-1 segment
        assert await server.served_segments(1) == 1  # counted before the abort returned
        await _until_recorded(log, server, 1)  # the aborted prefix may still be on its way to the client
        segments, late = log.take(1)
        assert late == 0
        taken_at_sync.extend(segments)
        await server.update_weights(_new_weights(server, seed=7), global_steps=2)

    out = await _partial_rollout_across_a_weight_sync(server, client, sync)
    assert [s["version"] for s in taken_at_sync] == [1]
    prefix = taken_at_sync[0]
    n1 = out.extra_fields["token_global_steps"].count(1)
    assert prefix["prompt_ids"] == PROMPT and prefix["token_ids"] == out.token_ids[:n1]
    rest, _ = log.take(2)  # the resumed call, of version 2, for the next sync
    assert [s["version"] for s in rest] == [2] and rest[0]["prompt_ids"] == PROMPT + out.token_ids[:n1]
    segments = out.extra_fields[SEGMENTS_KEY]
    assert segments == [[prefix["segment_id"], n1], [rest[0]["segment_id"], len(out.token_ids) - n1]]


async def test_interrupt_identity_through_the_segment_store(monkeypatch, server, tiny_model_dir):
    """Each segment scored at the sync with the weights that generated it (here by an independent
    fp32 forward, the trainer's numerics on this backend) reassembles into the rollout's
    log-probs for a partial rollout that spans the sync."""
    log = SegmentLog()
    client = _client(monkeypatch, server, log)
    store = SegmentStore(max_versions=2)

    def score_logged(segments):
        for seg in segments:
            ids = torch.tensor([seg["prompt_ids"] + seg["token_ids"]])
            with torch.no_grad():
                logits = server.engine.model(input_ids=ids).logits[0, len(seg["prompt_ids"]) - 1 : -1]
            lp = logits.log_softmax(-1).gather(-1, ids[0, len(seg["prompt_ids"]) :, None]).squeeze(-1)
            store.put(seg["segment_id"], seg["version"], lp)

    async def sync():
        await _until_recorded(log, server, 1)
        score_logged(log.take(1)[0])  # before the weights change
        await server.update_weights(_new_weights(server, seed=7), global_steps=2)

    out = await _partial_rollout_across_a_weight_sync(server, client, sync)
    score_logged(log.take(2)[0])  # the next sync
    mask = torch.ones(1, len(out.token_ids) + 3, dtype=torch.long)
    mask[0, -3:] = 0  # padding after the response
    old = precomputed_log_probs([out.extra_fields], mask, store)
    torch.testing.assert_close(old[0, :-3], torch.tensor(out.log_probs), rtol=0, atol=1e-5)
    assert torch.isnan(old[0, -3:]).all()


def test_segment_log_refuses_a_segment_of_a_version_already_taken_and_counts_it():
    log = SegmentLog()
    first = log.record([1, 2], [3, 4], 5)
    assert log.record([1], [], 5) is None  # no tokens: no segment
    assert log.recorded(5) == 1
    taken, late = log.take(5)
    assert [s["segment_id"] for s in taken] == [first] and late == 0
    # a version-5 call recorded after its sync gave up waiting: never scored with other weights
    assert log.record([1, 2], [9], 5) is None
    kept = log.record([1, 2], [9], 6)
    assert log.recorded(6) == 1 and log.recorded(5) == 0  # a taken version's count is dropped
    taken, late = log.take(6)
    assert late == 1 and [s["segment_id"] for s in taken] == [kept]
    assert SegmentLog().record([1], [2], 0).split(":")[0] != first.split(":")[0]  # unique across resumes


def test_segment_store_round_trips_through_a_checkpoint(tmp_path):
    store = SegmentStore(max_versions=2)
    store.put("a:0", 3, torch.tensor([-1.0, -2.0]))
    torch.save(store.state_dict(), tmp_path / "rollout_side.pt")
    restored = SegmentStore(max_versions=2)
    restored.load_state_dict(torch.load(tmp_path / "rollout_side.pt", weights_only=False))
    old = precomputed_log_probs([{SEGMENTS_KEY: [["a:0", 2]]}], torch.ones(1, 2, dtype=torch.long), restored)
    assert old.tolist() == [[-1.0, -2.0]]
    assert restored.evict(current_version=6) == 1


def test_assembly_layouts_and_errors():
    store = SegmentStore(max_versions=1)
    store.put("0:1", 4, torch.tensor([-1.0, -2.0]))
    store.put("0:2", 5, torch.tensor([-3.0]))
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    extra = [
        {SEGMENTS_KEY: [["0:1", 2], ["0:2", 1]]},  # multi-turn: two calls around an observation
        {TOKEN_OLD_LOG_PROBS_KEY: [-0.5, None, -0.25]},  # dedicated, one unscored segment
        {SEGMENTS_KEY: [["gone", 2]]},  # evicted / never scored
    ]
    old = precomputed_log_probs(extra, mask, store)
    nan = math.nan
    expected = torch.tensor([[-1.0, -2.0, nan, nan, -3.0], [-0.5, nan, -0.25, nan, nan], [nan] * 5])
    torch.testing.assert_close(old, expected, equal_nan=True)
    assert store.evict(current_version=6) == 1 and store.get("0:1") is None  # 4 < 6 - 1
    with pytest.raises(ValueError, match="multi-turn agent loops must concatenate"):
        precomputed_log_probs([{SEGMENTS_KEY: [["0:2", 1]]}], torch.ones(1, 2, dtype=torch.long), store)
    with pytest.raises(ValueError, match="scored tokens"):
        precomputed_log_probs([{SEGMENTS_KEY: [["0:2", 2]]}], torch.ones(1, 2, dtype=torch.long), store)


@pytest.mark.parametrize("name", ["dedicated", "interrupt"])
def test_stale_unscored_tokens_error_or_counted_fallback(name, caplog):
    """A stale token without a rollout-side score: an error naming the setting, or with
    on_missing=current the current weights' value, logged and counted as inexact."""
    versions = torch.tensor([[4, 4, 5], [5, 5, 5]])
    pre = torch.tensor([[-1.0, math.nan, -3.0], [math.nan, -2.0, math.nan]])
    current = torch.full((2, 3), -9.0)
    batch = {
        "response_mask": torch.ones(2, 3, dtype=torch.long),
        "token_versions": versions,
        "precomputed_old_log_probs": pre,
    }
    host = LocalPolicyHost(lambda b, rows: current[rows], version=5)
    with pytest.raises(ValueError, match=f"algorithm.old_logits.{name}.on_missing=current"):
        build_provider(OldLogitsConfig.from_config({"provider": name}, 4)).compute(host, dict(batch), {})
    config = OldLogitsConfig.from_config({"provider": name, name: {"on_missing": "current"}}, 4)
    metrics: dict = {}
    with caplog.at_level(logging.WARNING, logger="verl_ext.old_logits"):
        out = build_provider(config).compute(host, dict(batch), metrics)
    assert "stale tokens" in caplog.text
    assert out["old_log_probs"].tolist() == [[-1.0, -9.0, -3.0], [-9.0, -2.0, -9.0]]
    assert metrics[f"old_logits/{name}/inexact_frac"] == pytest.approx(1 / 6)  # the version-4 token
    assert metrics[f"old_logits/{name}/filled_by_current_frac"] == pytest.approx(3 / 6)
    assert metrics[f"old_logits/{name}/forward_rows"] == 2


def test_config_sections_are_strict():
    with pytest.raises(ValueError, match="algorithm.old_logits.dedicated.bogus"):
        OldLogitsConfig.from_config({"provider": "dedicated", "dedicated": {"bogus": 1}}, 4)
    with pytest.raises(ValueError, match="interrupt.on_missing"):
        OldLogitsConfig.from_config({"provider": "interrupt", "interrupt": {"on_missing": "skip"}}, 4)
    with pytest.raises(ValueError, match="max_off_policy_threshold is null"):
        OldLogitsConfig.from_config({"provider": "interrupt"}, None).interrupt_max_versions()
