"""Every bounded wait on another component expires within its (here shortened) bound when the other
side hangs, with an error or a warning that names the component, the bound and the key; every key
that sets a bound is accepted by its config class and a bound that is not positive is refused,
naming the key. The hung sides are real: Ray actors whose methods never return, an asyncio future
that is never set."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import ray
from verl.workers.config import RolloutConfig

from .messages import assert_names
from verl_ext.backends.hf.rollout import HF_KEY, HFServerAdapter, HFServerTimeouts
from verl_ext.old_logits import OldLogitsConfig
from verl_ext.old_logits.rollout_client import _RecordCallVersions
from verl_ext.old_logits.rollout_side import wait_until_recorded
from verl_ext.rewards.dvreward.settings import DVRewardSettings
from verl_ext.waits import WaitExpired, ray_get, wait_for

BOUND_S = 0.5


@pytest.fixture(scope="module")
def hung():
    """A Ray actor whose methods below never return (an async actor: each call waits forever)."""

    class Hung:  # defined here so Ray ships it by value: its workers cannot import the tests package
        async def _forever(self, *args, **kwargs):
            await asyncio.Event().wait()

        served_segments = recorded = score = record = update_weights = _forever

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.remote(Hung).options(num_cpus=0).remote()
    finally:
        ray.shutdown()


def _quickly(seconds: float) -> None:
    assert seconds < BOUND_S + 5, f"the wait took {seconds:.1f} s for a bound of {BOUND_S} s"


def test_an_asyncio_future_never_set_expires_naming_the_component():
    async def wait() -> None:
        await wait_for(asyncio.get_running_loop().create_future(), BOUND_S, "the test component",
                       "answer", "some.section.timeout_s")

    start = time.perf_counter()
    with pytest.raises(WaitExpired) as caught:
        asyncio.run(wait())
    _quickly(time.perf_counter() - start)
    assert_names(str(caught.value), "the test component", f"{BOUND_S:g} s", "some.section.timeout_s")


def test_ray_get_on_a_hung_actor_expires_naming_the_component(hung):
    start = time.perf_counter()
    with pytest.raises(WaitExpired) as caught:
        ray_get(hung.score.remote(), BOUND_S, "the hung actor", "score", "some.key")
    _quickly(time.perf_counter() - start)
    assert_names(str(caught.value), "the hung actor", f"{BOUND_S:g} s", "some.key")


@pytest.mark.parametrize(("kwargs", "component", "key"), [
    ({"old_logit_scorer": "actor"}, "verl_ext_old_logit_scorer", "algorithm.old_logits.dedicated.call_timeout_s"),
    ({"segment_log": "actor"}, "verl_ext_old_logit_segment_log", "algorithm.old_logits.interrupt.call_timeout_s"),
])
def test_the_llm_client_stops_waiting_for_a_hung_scorer_or_segment_log(hung, monkeypatch, kwargs, component, key):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    async def one_segment(self, request_id, **kwargs):  # the server's answer: a segment of version 0
        return TokenOutput(token_ids=[7, 8], log_probs=[-1.0, -1.0], extra_fields={"global_steps": 0})

    monkeypatch.setattr(LLMServerClient, "generate", one_segment)
    client = object.__new__(_RecordCallVersions)  # the recording layer only: no server manager
    client.call_timeout_s = BOUND_S
    for name in kwargs:
        setattr(client, name, hung)
    start = time.perf_counter()
    with pytest.raises(WaitExpired) as caught:
        asyncio.run(client.generate("r0", prompt_ids=[1, 2]))
    _quickly(time.perf_counter() - start)
    assert_names(str(caught.value), component, f"{BOUND_S:g} s", key)


def test_interrupt_sync_counts_a_hung_rollout_server_as_a_sync_timeout(hung):
    start = time.perf_counter()
    waited, timed_out = wait_until_recorded(hung.recorded, [hung], version=0, timeout_s=BOUND_S)
    _quickly(time.perf_counter() - start)
    assert timed_out and waited >= BOUND_S - 0.05


def test_the_hf_server_adapter_stops_waiting_for_a_hung_weight_update(hung):
    config = RolloutConfig(name="hf", engine_kwargs={"hf": {"update_timeout_s": BOUND_S}})
    adapter = HFServerAdapter(config, model_config=None, device_mesh=None, replica_rank=0)
    adapter._server = hung  # the replica's server, hung

    async def weights():
        yield "w", __import__("torch").zeros(2)

    start = time.perf_counter()
    with pytest.raises(WaitExpired) as caught:
        asyncio.run(adapter.update_weights(weights(), global_steps=3))
    _quickly(time.perf_counter() - start)
    assert_names(str(caught.value), "hf rollout server", "hf_rollout_server_0", f"{BOUND_S:g} s",
                 f"{HF_KEY}.update_timeout_s")


def test_the_dedicated_scorer_sync_wait_counts_a_hung_rollout_server(hung, tiny_model_dir, caplog):
    from verl.workers.config import HFModelConfig

    from verl_ext.backends.hf.old_logit_scorer import HFOldLogitScorer

    scorer = HFOldLogitScorer(config=RolloutConfig(name="hf", prompt_length=8, response_length=8, dtype="float32"),
                              model_config=HFModelConfig(path=tiny_model_dir), servers=[hung], temperature=1.0,
                              sync_timeout_s=BOUND_S)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="verl_ext.hf_rollout"):
        asyncio.run(scorer._wait_until_scored(0))
    _quickly(time.perf_counter() - start)
    assert asyncio.run(scorer.take_stats())["sync_timeouts"] == 1
    assert_names(caplog.text, "old-logit scorer", "algorithm.old_logits.dedicated.sync_timeout_s")


def test_a_weight_transfer_reader_stops_waiting_for_a_sender_that_never_sends(hung):
    from verl_ext.backends.host_memory import (
        BUCKET_TIMEOUT_KEY,
        MAILBOX_ACTOR_NAME,
        HostMemoryCheckpointEngine,
        WeightMailbox,
    )

    mailbox = ray.remote(WeightMailbox).options(name=MAILBOX_ACTOR_NAME, num_cpus=0, max_concurrency=10).remote()
    reader = HostMemoryCheckpointEngine(bucket_size=1, bucket_timeout_s=BOUND_S)
    reader.init_process_group("receiver", ray.get(mailbox.open.remote(1)))  # a transfer nobody sends on

    async def read() -> list:
        return [item async for item in reader.receive_weights()]

    start = time.perf_counter()
    try:
        with pytest.raises(WaitExpired) as caught:
            asyncio.run(read())
    finally:
        ray.kill(mailbox)
    _quickly(time.perf_counter() - start)
    assert_names(str(caught.value), MAILBOX_ACTOR_NAME, "bucket 0", f"{BOUND_S:g} s", BUCKET_TIMEOUT_KEY)
    with pytest.raises(ValueError) as caught:
        HostMemoryCheckpointEngine(bucket_size=1, bucket_timeout_s=0)
    assert_names(str(caught.value), BUCKET_TIMEOUT_KEY)


# --- the keys -----------------------------------------------------------------------------------

OLD_LOGIT_KEYS = [("dedicated", "sync_timeout_s"), ("dedicated", "start_timeout_s"), ("dedicated", "call_timeout_s"),
                  ("interrupt", "sync_timeout_s"), ("interrupt", "call_timeout_s")]


@pytest.mark.parametrize(("section", "name"), OLD_LOGIT_KEYS)
def test_old_logit_bounds_are_keys_and_refuse_a_bound_that_is_not_positive(section, name):
    config = OldLogitsConfig.from_config({section: {name: 12.5}}, 2)
    assert getattr(getattr(config, section), name) == 12.5
    for bad in (0, -1.0):
        with pytest.raises(ValueError) as caught:
            OldLogitsConfig.from_config({section: {name: bad}}, 2)
        assert_names(str(caught.value), f"algorithm.old_logits.{section}.{name}", str(bad))


@pytest.mark.parametrize("name", ["start_timeout_s", "update_timeout_s"])
def test_hf_server_bounds_are_engine_kwargs_and_refuse_a_bound_that_is_not_positive(name):
    assert getattr(HFServerTimeouts.from_rollout(RolloutConfig(engine_kwargs={"hf": {name: 7}})), name) == 7.0
    assert HFServerTimeouts.from_rollout(RolloutConfig()) == HFServerTimeouts()
    with pytest.raises(ValueError) as caught:
        HFServerTimeouts.from_rollout(RolloutConfig(engine_kwargs={"hf": {name: 0}}))
    assert_names(str(caught.value), f"{HF_KEY}.{name}")
    with pytest.raises(ValueError) as caught:
        HFServerTimeouts.from_rollout(RolloutConfig(engine_kwargs={"hf": {"start_timeout": 7}}))
    assert_names(str(caught.value), f"{HF_KEY}.start_timeout")


@pytest.mark.parametrize(("name", "bad"), [("timeout_s", 0), ("timeout_s", -1.0), ("max_retries", -1),
                                           ("backoff_s", -0.5)])
def test_dvreward_judge_bounds_refuse_bad_values_naming_the_key(name, bad):
    assert DVRewardSettings.from_mapping({name: 3}).timeout_s == (3 if name == "timeout_s" else 30.0)
    with pytest.raises(ValueError) as caught:
        DVRewardSettings.from_mapping({name: bad})
    assert_names(str(caught.value), f"reward.reward_kwargs.dvreward.{name}")


def test_browser_command_bound_refuses_a_bound_that_is_not_positive():
    from verl_ext.envs.browser import Browser

    assert Browser(command_timeout_s=5).command_timeout_s == 5
    with pytest.raises(ValueError) as caught:
        Browser(command_timeout_s=0)
    assert_names(str(caught.value), "env_options.command_timeout_s")
