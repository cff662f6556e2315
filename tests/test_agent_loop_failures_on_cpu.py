"""The failure-rate stop (verl_ext.agent_loops.failures): counts add up across workers, the first
error survives, and more than half failed runs stop the run with that error and the count."""

from __future__ import annotations

import pytest

from verl_ext.agent_loops.failures import AgentLoopFailuresError, RunCounts, check_failure_rate, describe


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
