"""Crash points: where the kill tests stop a trainer the way a preempted node or an OOM kill does.

``VERL_EXT_CRASH_AT=<point>@<global step>`` makes the trainer process SIGKILL itself when it
reaches ``point`` in that step (nothing is flushed, no handler runs). Without the variable every
crash point is a string comparison. Points:

- ``update``: the start of the actor update of the step (during a step);
- ``verl_checkpoint``: inside verl's checkpoint save, after the actor's files are written and
  before verl marks the checkpoint complete (``latest_checkpointed_iteration.txt``);
- ``verl_ext_checkpoint``: inside verl-ext's state save, after the workers' files and before the
  rollout side's file and the manifest (``verl_ext.checkpoint_files``).
"""

from __future__ import annotations

import os
import signal
import sys

CRASH_ENV = "VERL_EXT_CRASH_AT"
POINTS = ("update", "verl_checkpoint", "verl_ext_checkpoint")


def armed(point: str) -> bool:
    """Whether ``VERL_EXT_CRASH_AT`` names ``point`` (at any step)."""
    return os.environ.get(CRASH_ENV, "").partition("@")[0] == point


def crash_point(point: str, step: int) -> None:
    """SIGKILL this process if ``VERL_EXT_CRASH_AT`` is ``<point>@<step>``."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; expected one of {POINTS}")
    if os.environ.get(CRASH_ENV) == f"{point}@{step}":
        print(f"verl-ext: {CRASH_ENV}={point}@{step}: killing the trainer process", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
