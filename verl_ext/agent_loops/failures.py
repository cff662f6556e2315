"""When most agent-loop runs fail, stop with the first error and the count.

verl's agent-loop workers log a failing run and mark its prompt ``failure``; the trainer then
carries on with whatever finished, and when every run failed it dies later, far from the cause
(TransferQueue's ``ValueError: Received an empty list as keys``, or the sync replay buffer's
"Enable trainer.v1.sampler.sync_refill_failed_groups" advice). The verl-ext trainers select
``FailureCountingAgentLoopManager`` through verl's own
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` setting: its workers (verl's
``AgentLoopWorkerTQ``) count their runs and keep the first error, and each time the trainer takes
a batch from the replay buffer (``sample_checking_failures``), also when verl's ``sample`` raises,
it calls ``check_failure_rate`` on the counts since the last batch, so the first underlying
error is the last thing the run prints. A worker logs the full traceback of the first failure
from each place; later failures from the same place are re-raised as one-line
``AgentLoopRunFailed`` errors, so 64 identical tracebacks do not bury the cause.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

MANAGER_CLASS = f"{__name__}.FailureCountingAgentLoopManager"
MAX_FAILED_FRACTION = 0.5  # "most runs failed": more than this share
# The workers answer the trainer's count request on an event loop of their own: on the loop that
# runs the agent loops, the request waited behind them (0.06-0.25 s a step on an H200, the largest
# of verl-ext's per-step costs; docs/results.md, "GPU: per-step breakdown").
COUNTS_GROUP = "verl_ext_run_counts"


class AgentLoopFailuresError(RuntimeError):
    """Most agent-loop runs since the last batch failed."""


class AgentLoopRunFailed(RuntimeError):
    """A run failed like an earlier one of the same worker, whose full traceback was logged."""


@dataclass
class RunCounts:
    runs: int = 0
    failed: int = 0
    first_error: str | None = None  # the exception and where it was raised

    def __add__(self, other: RunCounts) -> RunCounts:
        return RunCounts(self.runs + other.runs, self.failed + other.failed, self.first_error or other.first_error)


def check_failure_rate(counts: RunCounts, partition_id: str) -> None:
    """Raise ``AgentLoopFailuresError`` naming the first error when more than half the runs failed."""
    if counts.runs and counts.failed > MAX_FAILED_FRACTION * counts.runs:
        raise AgentLoopFailuresError(
            f"verl-ext: {counts.failed} of {counts.runs} agent-loop runs failed ({partition_id} batch); "
            f"stopping instead of training on what is left. The first error:\n{counts.first_error}"
        )


def sample_checking_failures(
    sample: Callable[[int, str, int], Any], check: Callable[[str], None]
) -> Callable[[int, str, int], Any]:
    """A replay buffer's ``sample(global_steps, partition_id, batch_size)`` followed by
    ``check(partition_id)`` (the failure-rate check), which also runs when ``sample`` raises:
    verl's sync buffer raises its own error when every group of a batch failed, and the check's
    ``AgentLoopFailuresError`` then carries verl's as its context and is printed after it."""

    def sample_then_check(global_steps: int, partition_id: str, batch_size: int) -> Any:
        try:
            batch = sample(global_steps, partition_id, batch_size)
        except Exception:
            check(partition_id)
            raise
        check(partition_id)
        return batch

    return sample_then_check


def repeat_of_logged(exc: BaseException, logged: set[tuple[str, str, int | None]]) -> AgentLoopRunFailed | None:
    """A one-line stand-in for ``exc`` when a failure of the same type from the same line is in
    ``logged`` (its traceback was logged in full), else ``None`` after adding it there."""
    frames = traceback.extract_tb(exc.__traceback__)
    origin = (type(exc).__name__, frames[-1].filename, frames[-1].lineno) if frames else (type(exc).__name__, "", None)
    if origin not in logged:
        logged.add(origin)
        return None
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return AgentLoopRunFailed(f"{message} (like an earlier run of this worker, whose traceback was logged)")


def describe(exc: BaseException) -> str:
    """The exception and the innermost frame it came from, in a few lines."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f'  File "{frames[-1].filename}", line {frames[-1].lineno}, in {frames[-1].name}\n' if frames else ""
    return where + "".join(traceback.format_exception_only(type(exc), exc)).strip()


class FailureCountingAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # type: ignore[name-defined, misc]
    """verl's TransferQueue agent-loop worker, counting runs and keeping the first error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verl_ext_counts = RunCounts()
        self._verl_ext_counts_lock = threading.Lock()  # pop_run_counts runs on another thread
        self._verl_ext_seen: set[tuple[str, str, int | None]] = set()  # origins already logged in full

    async def _run_agent_loop(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = await super()._run_agent_loop(*args, **kwargs)
        except Exception as exc:
            self._count_run(describe(exc))
            repeat = repeat_of_logged(exc, self._verl_ext_seen)
            if repeat is None:
                raise  # verl logs it with its traceback and marks the prompt failed
            raise repeat from None
        self._count_run(None)
        return result

    def _count_run(self, error: str | None) -> None:
        """A run counts when it ends, success and failure in the same window."""
        with self._verl_ext_counts_lock:
            self._verl_ext_counts = self._verl_ext_counts + RunCounts(1, int(error is not None), error)

    @ray.method(concurrency_group=COUNTS_GROUP)
    async def pop_run_counts(self) -> RunCounts:
        with self._verl_ext_counts_lock:
            counts, self._verl_ext_counts = self._verl_ext_counts, RunCounts()
        return counts


class FailureCountingAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager with ``FailureCountingAgentLoopWorker`` workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(concurrency_groups={COUNTS_GROUP: 1})(FailureCountingAgentLoopWorker)

    def pop_run_counts(self) -> RunCounts:
        """Runs and failures of every worker since the last call."""
        total = RunCounts()
        for counts in ray.get([worker.pop_run_counts.remote() for worker in self.agent_loop_workers]):
            total = total + counts
        return total
