"""The hybrid GUI + tool environment contract (Gymnasium-style), shared by every backend.

An action is either a :class:`GuiAction` (click / type / select / key / scroll / answer / done,
addressed by the element ids of the last observation) or a :class:`ToolCall` (a tool name and
JSON arguments). Both reach the env through one function-calling surface: GUI primitives are the
``computer_use`` tool (ToolCUA's design), every other name is an app tool.

Faults: when the environment itself fails (browser crash, driver hang, page error) ``step`` and
``reset`` return ``info["fault"]`` (an :class:`EnvFault` description) and ``truncated=True``; the
episode is marked and must be excluded from training, never scored 0.

This module is import-cheap (no selenium): backends import the browser stack lazily.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

GUI_TOOL_NAME = "computer_use"
GUI_ACTIONS = ("click", "click_at", "type", "select", "key", "scroll", "answer", "done")
GuiKind = Literal["click", "click_at", "type", "select", "key", "scroll", "answer", "done"]
KEYS = ("Enter", "Tab", "Escape", "Backspace", "Delete", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Space")
# Rendered observations longer than this are cut (the model's context is the budget).
MAX_OBS_CHARS = 12000


class EnvFault(RuntimeError):
    """The environment (not the policy) failed: the episode is invalid, not a failure.

    Attributes:
        kind: ``browser_crash`` | ``driver_timeout`` | ``page_error`` | ``setup_error``.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


class ActionError(ValueError):
    """The policy's action is malformed (unknown action, missing or ill-typed argument).

    Reported back to the model as a failed step result; it never ends the rollout.
    """


@dataclass(frozen=True)
class GuiAction:
    """A GUI primitive on the element ids of the latest observation.

    ``click(element)``, ``click_at(x, y)`` (CSS pixels of the viewport), ``type(element, text)``
    (replaces the field's value), ``select(element, text)`` (option label of a ``<select>``),
    ``key(key)`` (one of :data:`KEYS`, sent to the focused element), ``scroll(direction,
    element?)``, ``answer(text)`` (the reply to a question task) and ``done()``.
    """

    kind: GuiKind
    element: int | None = None
    text: str | None = None
    key: str | None = None
    direction: str | None = None
    x: int | None = None
    y: int | None = None


@dataclass(frozen=True)
class ToolCall:
    """An app tool call: ``name`` and its JSON-object arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


Action = GuiAction | ToolCall

# What each GUI action needs; checked before anything reaches the browser.
_GUI_REQUIRED: dict[str, tuple[str, ...]] = {
    "click": ("element",),
    "click_at": ("x", "y"),
    "type": ("element", "text"),
    "select": ("element", "text"),
    "key": ("key",),
    "scroll": ("direction",),
    "answer": ("text",),
    "done": (),
}
_INT_FIELDS = ("element", "x", "y")
_STR_FIELDS = ("text", "key", "direction")


def action_from_call(name: str, arguments: dict[str, Any] | str | None) -> Action:
    """Turn a parsed function call into an :class:`Action`; raise :class:`ActionError` if malformed."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ActionError(f"arguments of {name!r} are not valid JSON: {exc}") from None
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, dict):
        raise ActionError(f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}")
    if name != GUI_TOOL_NAME:
        return ToolCall(name, arguments)
    kind = arguments.get("action")
    if kind not in _GUI_REQUIRED:
        raise ActionError(f"computer_use: 'action' must be one of {list(GUI_ACTIONS)}, got {kind!r}")
    unknown = set(arguments) - {"action", *_INT_FIELDS, *_STR_FIELDS}
    if unknown:
        raise ActionError(f"computer_use: unknown argument(s) {sorted(unknown)}")
    values: dict[str, Any] = {}
    for key in _INT_FIELDS:
        if arguments.get(key) is not None:
            value = arguments[key]
            # Models often quote numbers ("element": "7"); accept exact integer strings only.
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ActionError(f"computer_use: {key!r} must be an integer, got {value!r}")
            values[key] = value
    for key in _STR_FIELDS:
        if arguments.get(key) is not None:
            if not isinstance(arguments[key], (str, int, float)):
                raise ActionError(f"computer_use: {key!r} must be a string, got {arguments[key]!r}")
            values[key] = str(arguments[key])
    missing = [k for k in _GUI_REQUIRED[kind] if k not in values]
    if missing:
        raise ActionError(f"computer_use action {kind!r} needs {missing}")
    if kind == "key" and values["key"] not in KEYS:
        raise ActionError(f"computer_use: key must be one of {list(KEYS)}, got {values['key']!r}")
    if kind == "scroll" and values["direction"] not in ("up", "down"):
        raise ActionError(f"computer_use: direction must be 'up' or 'down', got {values['direction']!r}")
    return GuiAction(kind=kind, **values)


@dataclass(frozen=True)
class Element:
    """One element of the text rendering. ``key`` is a stable app-side name (``data-k``) that
    scripted policies use to find targets; it is not shown to the model."""

    id: int
    role: str
    text: str = ""
    value: str | None = None
    states: tuple[str, ...] = ()
    key: str | None = None

    def render(self) -> str:
        parts = [f"[{self.id}] {self.role}"]
        if self.text:
            parts.append(json.dumps(self.text, ensure_ascii=False))
        if self.value is not None:
            parts.append(f"value={json.dumps(self.value, ensure_ascii=False)}")
        parts.extend(self.states)
        return " ".join(parts)


@dataclass
class Observation:
    """What the policy sees after ``reset`` / ``step``.

    Attributes:
        instruction: the task, in words.
        elements: the page's visible elements, in document order, with ids valid until the next step.
        tools: names of the tools callable this episode (``computer_use`` first).
        step / max_steps: counters; ``step`` counts actions taken so far.
        last_result: ``{success, result, error_message}`` of the previous action (None after reset).
        screenshot: PNG bytes when the env was asked for screenshots, else None.
        title: the focused app / page title.
        todo: the task's items still to do, when the env shows them (rendered last), else None.
    """

    instruction: str
    elements: list[Element]
    tools: list[str]
    step: int
    max_steps: int
    last_result: dict[str, Any] | None = None
    screenshot: bytes | None = None
    title: str = ""
    todo: tuple[str, ...] | None = None

    def page_text(self) -> str:
        lines = [element.render() for element in self.elements]
        text = "\n".join(lines)
        if len(text) > MAX_OBS_CHARS:
            text = text[:MAX_OBS_CHARS] + "\n... (page truncated)"
        return text

    def render(self, include_instruction: bool = True) -> str:
        """The text a language model reads (observation messages use this)."""
        parts = []
        if include_instruction:
            parts.append(f"Task: {self.instruction}")
        if self.last_result is not None:
            parts.append("Result: " + json.dumps(self.last_result, ensure_ascii=False, default=str))
        parts.append(f"Step {self.step}/{self.max_steps}. Page ({self.title}):\n{self.page_text()}")
        if self.todo is not None:
            parts.append("To do: " + ("; ".join(self.todo) or "nothing"))
        return "\n".join(parts)

    def find(self, key: str) -> Element | None:
        """The element whose app-side key is ``key`` (for scripted policies and tests)."""
        return next((e for e in self.elements if e.key == key), None)


def tool_result(success: bool, result: Any = None, error_message: str = "") -> dict[str, Any]:
    """OSWorld-MCP's normalised tool result."""
    return {"success": bool(success), "result": result, "error_message": error_message}


@dataclass(frozen=True)
class TaskSpec:
    """One task instance: template (or MiniWoB task) id + seed, as a dataset row names it."""

    template: str
    seed: int = 0

    @classmethod
    def parse(cls, task: TaskSpec | str | dict[str, Any], seed: int | None = None) -> TaskSpec:
        """From a spec, an id, or ``{"template", "seed"}``; an explicit ``seed`` wins."""
        if isinstance(task, str):
            task = cls(template=task)
        elif isinstance(task, dict):
            task = cls(template=task["template"], seed=int(task.get("seed", 0)))
        return task if seed is None else cls(task.template, int(seed))


def task_option(options: dict[str, Any] | None) -> TaskSpec | str | dict[str, Any]:
    """The task of a Gymnasium-style ``reset(seed=..., options={"task": ...})``."""
    if not options or options.get("task") is None:
        raise ValueError("reset needs the task: env.reset(seed=..., options={'task': <template id, "
                         "{'template', 'seed'} or TaskSpec>})")
    return options["task"]


class HybridEnv(Protocol):
    """The env API every backend implements (minidesk, miniwob)."""

    name: str

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]: ...

    def step(self, action: Action) -> tuple[Observation, float, bool, bool, dict]: ...

    def tool_schemas(self) -> list[dict[str, Any]]: ...

    def state_dump(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
