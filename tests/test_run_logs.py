"""tests/run_logs.py: which tracebacks of a verl run's console log fail a GPU test's clean-end check.
The logs are shaped as Ray prints them (every worker line prefixed with its actor and pid)."""

from __future__ import annotations

from .run_logs import unexplained_tracebacks

WORKER = "\x1b[36m(FailureCountingAgentLoopWorker pid=19994)\x1b[0m "
DONE = "Training Progress: 100%|##########| 6/6 [00:38<00:00, 38.72s/it]\n"
STEP = "(TaskRunnerV1 pid=924) step:6 - actor/pg_loss:0.01\n"


def _traceback(error: str, logged_by: str = "Error in _run_prompt for uid=bbef26a1") -> str:
    lines = [f"ERROR:2026-11-28 04:13:55,709:{logged_by}", "Traceback (most recent call last):",
             '  File "verl/experimental/agent_loop/agent_loop.py", line 694, in _run_agent_loop', *error.splitlines()]
    return "".join(WORKER + line + "\n" for line in lines)


SERVER_GONE = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
               "\tclass_name: SegmentCountingVLLMServer\n"
               "The actor is dead because its owner has died. Owner worker exit type: INTENDED_SYSTEM_EXIT")


def test_a_prompt_losing_its_server_after_the_last_step_is_verls_exit_race():
    assert unexplained_tracebacks(STEP + DONE + _traceback(SERVER_GONE) + _traceback(SERVER_GONE)) == []


def test_the_same_error_before_training_finished_fails_the_check():
    assert len(unexplained_tracebacks(STEP + _traceback(SERVER_GONE) + DONE)) == 1
    assert len(unexplained_tracebacks(_traceback(SERVER_GONE))) == 1  # no progress bar: never finished


def test_any_other_traceback_fails_the_check_wherever_it_is():
    other = _traceback("RuntimeError: old_logits: 3 stale tokens have no score")
    found = unexplained_tracebacks(STEP + DONE + _traceback(SERVER_GONE) + other)
    assert len(found) == 1 and "no score" in found[0]
    # the server's death logged by something other than verl's agent loop is not the race either
    assert len(unexplained_tracebacks(DONE + _traceback(SERVER_GONE, logged_by="scorer sync failed"))) == 1
