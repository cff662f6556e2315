"""A run whose agent loops all fail stops at the first batch with the first error and the count
(verl_ext.agent_loops.failures), not later with TransferQueue's "Received an empty list as keys"
nor, on a train batch, with the sync replay buffer's "sync_refill_failed_groups" advice, which verl
raises first. The quickstart's arithmetic rows carry no env seed, so the ``text_env`` agent loop
raises on each."""

from __future__ import annotations

import pytest

from .conftest import run_recipe

pytestmark = pytest.mark.e2e


def test_a_run_whose_agent_loops_all_fail_stops_with_the_first_error(tmp_path):
    """On a train batch (the validation batch goes through the same check, ``partition="val"``)."""
    proc = run_recipe("quickstart/run_cpu.sh", tmp_path, "actor_rollout_ref.rollout.agent.default_agent_loop=text_env",
                      "trainer.val_before_train=false", steps=2, must_fail=True)
    log = proc.stdout + proc.stderr
    stop = log.rfind("agent-loop runs failed (train batch)")
    assert "AgentLoopFailuresError" in log and stop >= 0, log[-6000:]
    first_error = log.find("text_env needs the env seed in the dataset row", stop)
    assert first_error > stop, log[-6000:]  # the first error closes the stop message
    # verl's sync buffer raises its replay-buffer advice first on a train batch; it comes before the cause
    assert log.rfind("sync_refill_failed_groups") < stop
    assert "Received an empty list as keys" not in log
    # each worker logs one full traceback per failure origin, the other failures in one line
    assert "like an earlier run of this worker" in log
