"""When most agent-loop runs fail, stop with the first error and the count.

verl's agent-loop workers log a failing run and mark its prompt ``failure``; the trainer then
carries on with whatever finished, and when every run failed it dies later, far from the cause
(TransferQueue's ``ValueError: Received an empty list as keys``). The verl-ext trainers select
``FailureCountingAgentLoopManager`` through verl's own
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` setting: its workers (verl's
``AgentLoopWorkerTQ``) count their runs and keep the first error, and each time the trainer takes
a batch from the replay buffer it calls ``check_failure_rate`` on the counts since the last batch.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

MANAGER_CLASS = f"{__name__}.FailureCountingAgentLoopManager"
MAX_FAILED_FRACTION = 0.5  # "most runs failed": more than this share


class AgentLoopFailuresError(RuntimeError):
    """Most agent-loop runs since the last batch failed."""


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

    async def _run_agent_loop(self, *args: Any, **kwargs: Any) -> Any:
        self._verl_ext_counts.runs += 1
        try:
            return await super()._run_agent_loop(*args, **kwargs)
        except Exception as exc:
            counts = self._verl_ext_counts
            counts.failed += 1
            counts.first_error = counts.first_error or describe(exc)
            raise  # verl still logs it and marks the prompt failed

    def pop_run_counts(self) -> RunCounts:
        counts, self._verl_ext_counts = self._verl_ext_counts, RunCounts()
        return counts


class FailureCountingAgentLoopManager(AgentLoopManagerTQ):
    """verl's TransferQueue agent-loop manager with ``FailureCountingAgentLoopWorker`` workers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_loop_workers_class = ray.remote(FailureCountingAgentLoopWorker)

    def pop_run_counts(self) -> RunCounts:
        """Runs and failures of every worker since the last call."""
        total = RunCounts()
        for counts in ray.get([worker.pop_run_counts.remote() for worker in self.agent_loop_workers]):
            total = total + counts
        return total
