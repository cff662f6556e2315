"""What the TextHybrid apps share: reference-plan steps, DVReward questions, subgoals, the
screen widget shape, and the ``App`` / ``PagedApp`` bases."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_ext.envs.core import ActionError
from verl_ext.envs.tools import Param, ToolDef

Step = dict[str, Any]  # a reference-plan step, MiniDesk's format: {gui, k, text?} or {tool, args}


def click(key: str) -> Step:
    return {"gui": "click", "k": key}


def type_(key: str, text: str) -> Step:
    return {"gui": "type", "k": key, "text": str(text)}


def choose(key: str, text: str) -> Step:
    return {"gui": "select", "k": key, "text": str(text)}


def call(tool: str, /, **args: Any) -> Step:
    return {"tool": tool, "args": args}


@dataclass(frozen=True)
class Question:
    """A DVReward question about the final state and the predicate that answers it.
    ``parents`` index earlier questions of the same subgoal (made global by the env)."""

    text: str
    holds: Callable[[Any], bool]
    parents: tuple[int, ...] = ()
    kind: str = "semantic"


@dataclass(frozen=True)
class Subgoal:
    """One decision of a task. ``gui(view)`` -> (GUI steps from ``view``, view afterwards);
    ``tool(view)`` -> tool-path steps from ``view`` (they never change the view), or None when no
    tool does this operation."""

    text: str
    questions: tuple[Question, ...]
    gui: Callable[[int], tuple[list[Step], int]]
    tool: Callable[[int], list[Step] | None]


def same(a: Any, b: Any) -> bool:
    """Values equal as numbers when both are numbers, else as trimmed, case-folded text."""
    x, y = str(a).strip().lower(), str(b).strip().lower()
    try:
        return abs(float(x) - float(y)) < 1e-9
    except ValueError:
        return x == y


def widget(role: str, text: str, key: str, value: str | None = None, states: tuple[str, ...] = ()) -> dict[str, Any]:
    """One screen element in the shape ``Browser.observe`` returns (the env numbers them)."""
    return {"role": role, "text": text, "value": value, "states": list(states), "key": key}


def page_steps(current: int, target: int) -> list[Step]:
    """Previous/Next clicks from page ``current`` to page ``target``."""
    key = "page-next" if target > current else "page-prev"
    return [click(key)] * abs(target - current)


class App:
    """Base of the apps. ``view`` is the open tab or page (an int); subclasses fill ``subgoals``.

    ``variant``: ``mixed`` or ``gui``; for ``gui`` the generator leaves out the operations whose
    tool always wins (bulk tool operations, adding), so that a GUI-only optimum can be drawn.
    """

    name = ""
    tools: tuple[ToolDef, ...] = ()

    def __init__(self, rng: random.Random, variant: str = "mixed"):
        self.rng = rng
        self.tool_ops = variant != "gui"
        self.view = 0
        self.subgoals: list[Subgoal] = []

    # --- screen and GUI -----------------------------------------------------------------------
    def title(self) -> str:
        raise NotImplementedError

    def widgets(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def click(self, key: str) -> None:
        """An element without a click action: nothing happens (as in a browser), the step is spent."""

    def type(self, key: str, text: str) -> None:
        raise ActionError("this element is not a text field")

    def select(self, key: str, text: str) -> None:
        raise ActionError("this element is not a drop-down")

    def scroll(self, direction: str) -> None:
        """Scrolling moves nothing on these small screens (paged apps page)."""

    # --- tools and state ----------------------------------------------------------------------
    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def dump(self) -> dict[str, Any]:
        raise NotImplementedError

    def quality(self) -> list[Question]:
        """Questions about changes the task forbids (DVReward ``quality`` kind)."""
        return []

    def instruction(self) -> str:
        items = "; ".join(f"({i}) {goal.text}" for i, goal in enumerate(self.subgoals, 1))
        return f"In the {self.title().split(' - ')[0]} app, do all of the following: {items}."


class PagedApp(App):
    """A list shown ``page_size`` items a page, with Previous/Next buttons (no page jumps)."""

    page_size = 5

    def n_items(self) -> int:
        raise NotImplementedError

    def pages(self) -> int:
        return max(1, math.ceil(self.n_items() / self.page_size))

    def page_of(self, index: int) -> int:
        return index // self.page_size

    def visible(self) -> range:
        start = self.view * self.page_size
        return range(start, min(start + self.page_size, self.n_items()))

    def pager(self) -> list[dict[str, Any]]:
        first, last = self.view == 0, self.view >= self.pages() - 1
        return [widget("button", "Previous page", "page-prev", states=("disabled",) if first else ()),
                widget("text", f"Page {self.view + 1} of {self.pages()}", "page-label"),
                widget("button", "Next page", "page-next", states=("disabled",) if last else ())]

    def page_click(self, key: str) -> bool:
        """Handle Previous/Next (a disabled one does nothing, as in a browser); True if it was one."""
        if key == "page-prev":
            self.view = max(0, self.view - 1)
        elif key == "page-next":
            self.view = min(self.pages() - 1, self.view + 1)
        else:
            return False
        return True

    def scroll(self, direction: str) -> None:
        self.page_click("page-next" if direction == "down" else "page-prev")


def string_param(description: str) -> Param:
    return Param("string", description)
