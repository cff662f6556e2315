"""``TextCorridor``: a tiny multi-step text environment with repeated states, for the cpu backend.

A corridor of cells ``0 .. length-1``; the exit is the last cell. The agent starts on a cell drawn
from the reset seed and answers, each turn, with free text; the action is the first ``L`` or ``R``
(either case) in that text. Any other text is an invalid action: the agent stays where it is and
``info["action_valid"]`` is False. Reaching the exit ends the episode with reward 1; running out
of steps truncates it with reward 0.

Why this shape: a random ~100k-parameter model emits near-random tokens, so the parser is lenient
enough that random play already succeeds sometimes (about 30% with the defaults), and the few
cells are visited again and again by the trajectories of one group, which is what GiGPO's anchor
groups and HGPO's context groups need (GiGPO arXiv 2505.10978, HGPO arXiv 2602.22817).

Gymnasium contract: ``reset(seed=None, options=None) -> (obs, info)``, ``step(text) -> (obs, reward, terminated,
truncated, info)``. Pure python; importing it costs nothing.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

ACTIONS = {"L": -1, "R": +1}
_ACTION_RE = re.compile(r"[LR]", re.IGNORECASE)


def parse_action(text: str) -> str | None:
    """``"L"`` or ``"R"``: the first of those letters in ``text`` (either case), else None."""
    match = _ACTION_RE.search(text)
    return match.group(0).upper() if match else None


def instructions(length: int) -> str:
    """The task text a dataset row puts in its prompt (the observations only carry the cell)."""
    return f"A corridor has cells 0 to {length - 1}; the exit is cell {length - 1}. Each turn, answer L or R."


@dataclass
class TextCorridor:
    """One corridor episode at a time.

    Args:
        length: number of cells; the exit is cell ``length - 1``.
        max_steps: turns before the episode is truncated (invalid answers count as turns).
        start: the start cell; None draws it uniformly from ``1 .. length - 2`` with the reset seed.
    """

    length: int = 5
    max_steps: int = 6
    start: int | None = None

    def __post_init__(self) -> None:
        if self.length < 3:
            raise ValueError(f"TextCorridor needs length >= 3 (a start cell that is neither wall nor exit), "
                             f"got {self.length}")
        if self.start is not None and not 0 <= self.start < self.length - 1:
            raise ValueError(f"start must be a cell in 0..{self.length - 2}, got {self.start}")
        self.position = 0
        self.steps = 0

    @property
    def goal(self) -> int:
        return self.length - 1

    def observation(self) -> str:
        """The state as text; it is also the GiGPO anchor, so it names the cell and nothing else."""
        return f"You are at cell {self.position}."

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        start = (options or {}).get("start", self.start)
        self.position = random.Random(seed).randint(1, self.length - 2) if start is None else int(start)
        self.steps = 0
        return self.observation(), {"start": self.position, "goal": self.goal}

    def step(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        action = parse_action(text)
        if action is not None:
            # Cell 0 is a wall: moving left there is a valid action that goes nowhere.
            self.position = min(max(self.position + ACTIONS[action], 0), self.goal)
        self.steps += 1
        terminated = self.position == self.goal
        truncated = not terminated and self.steps >= self.max_steps
        info = {"action": action, "action_valid": action is not None, "success": terminated, "position": self.position}
        return self.observation(), float(terminated), terminated, truncated, info
