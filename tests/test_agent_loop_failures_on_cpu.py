"""The failure-rate stop (verl_ext.agent_loops.failures): counts add up across workers, the first
error survives, more than half failed runs stop the run with that error and the count, also when
verl's own sync replay buffer raises first, and repeated failures do not flood the log."""

from __future__ import annotations

import traceback

import pytest

from verl_ext.agent_loops.failures import (
    AgentLoopFailuresError,
    AgentLoopRunFailed,
    RunCounts,
    check_failure_rate,
    describe,
    repeat_of_logged,
    sample_checking_failures,
)


def _raised(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - we want its traceback
        return caught


def test_counts_of_several_workers_keep_the_first_error():
    total = RunCounts(4, 0) + RunCounts(4, 3, "ValueError: a") + RunCounts(2, 2, "ValueError: b")
    assert total == RunCounts(10, 5, "ValueError: a")


def test_half_failed_trains_on_more_than_half_stops_naming_the_error_and_count():
    check_failure_rate(RunCounts(8, 4, "x"), "train")
    check_failure_rate(RunCounts(0, 0), "val")  # nothing ran since the last batch
    error = describe(_raised(ValueError("text_env needs the env seed in the dataset row")))
    with pytest.raises(AgentLoopFailuresError, match=r"5 of 8 agent-loop runs failed \(val batch\)") as info:
        check_failure_rate(RunCounts(8, 5, error), "val")
    assert "ValueError: text_env needs the env seed in the dataset row" in str(info.value)
    assert "test_agent_loop_failures_on_cpu.py" in str(info.value)  # where it was raised


def test_a_worker_counts_each_run_when_it_ends_and_answers_on_its_own_event_loop():
    """Success and failure of a run land in one window; the count request is served by a
    concurrency group of its own, so it does not wait behind the agent loops' event loop."""
    import asyncio
    import threading

    from verl_ext.agent_loops.failures import COUNTS_GROUP, FailureCountingAgentLoopWorker

    worker = FailureCountingAgentLoopWorker.__new__(FailureCountingAgentLoopWorker)  # verl's __init__ needs a cluster
    worker._verl_ext_counts, worker._verl_ext_counts_lock = RunCounts(), threading.Lock()
    worker._count_run(None)
    worker._count_run("ValueError: a")
    worker._count_run("ValueError: b")
    assert asyncio.run(worker.pop_run_counts()) == RunCounts(3, 2, "ValueError: a")
    assert asyncio.run(worker.pop_run_counts()) == RunCounts()
    assert worker.pop_run_counts.__ray_concurrency_group__ == COUNTS_GROUP


def test_the_verl_ext_trainers_select_the_counting_manager_unless_one_is_set():
    from omegaconf import OmegaConf

    from verl_ext.agent_loops.failures import MANAGER_CLASS
    from verl_ext.trainer import _count_agent_loop_failures

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"agent": {"num_workers": 1}}}})
    OmegaConf.set_struct(config, True)
    _count_agent_loop_failures(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_CLASS
    config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = "my.Manager"
    _count_agent_loop_failures(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "my.Manager"


def _sync_buffer_where_every_group_failed():
    """verl's own sync replay buffer whose TransferQueue snapshot holds two prompts, both marked
    ``failure`` by the agent-loop workers, and no trajectory (only the TransferQueue read is replaced)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    class EveryGroupFailed(ReplayBuffer):
        def _sync_metadata_from_transfer_queue(self):
            self.failure_keys["train"] = {"uid0", "uid1"}
            self.prompt_global_steps["train"] = {"uid0": 1, "uid1": 1}

    return EveryGroupFailed("sync", OmegaConf.create({}), None, "drop", OmegaConf.create({}), poll_interval=0.0,
                            train_batch_size=2, gen_batch_size=2)


def test_verls_sample_raises_first_and_the_first_agent_loop_error_is_raised_last():
    buffer = _sync_buffer_where_every_group_failed()
    with pytest.raises(RuntimeError, match="Enable trainer.v1.sampler.sync_refill_failed_groups"):
        buffer.sample(1, "train", 2)  # what a run ended on before: verl's advice, not the cause

    error = describe(_raised(ValueError("VERL_EXT_CHROMIUM=/nope/chromium does not exist")))
    sample = sample_checking_failures(buffer.sample, lambda partition: check_failure_rate(RunCounts(8, 8, error), partition))
    with pytest.raises(AgentLoopFailuresError, match=r"8 of 8 agent-loop runs failed \(train batch\)") as info:
        sample(1, "train", 2)
    assert "sync_refill_failed_groups" in str(info.value.__context__)  # verl's error, printed before ours
    printed = "".join(traceback.format_exception(info.value))
    assert printed.rstrip().endswith("ValueError: VERL_EXT_CHROMIUM=/nope/chromium does not exist")
    assert printed.index("sync_refill_failed_groups") < printed.index("8 of 8 agent-loop runs failed")


def test_a_worker_logs_each_failure_origin_in_full_once_then_one_line():
    def run(seed):
        if seed is None:
            raise ValueError("text_env needs the env seed in the dataset row")
        raise KeyError(seed)

    logged: set = set()
    first, again, other = (_raised_by(run, s) for s in (None, None, "x"))
    assert repeat_of_logged(first, logged) is None  # verl logs it with its full traceback
    repeat = repeat_of_logged(again, logged)
    assert str(repeat) == ("ValueError: text_env needs the env seed in the dataset row "
                           "(like an earlier run of this worker, whose traceback was logged)")
    assert repeat_of_logged(other, logged) is None  # another line: its traceback is logged too
    try:
        raise repeat from None
    except AgentLoopRunFailed as caught:
        assert len(traceback.format_exception(caught)) <= 3  # header, one frame, the message


def _raised_by(fn, *args) -> Exception:
    try:
        fn(*args)
    except Exception as caught:  # noqa: BLE001 - we want its traceback
        return caught
