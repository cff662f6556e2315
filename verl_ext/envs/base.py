"""The step loop every screen-backed env shares: counters, GUI primitives, tool dispatch, faults.

A backend (``MiniDeskEnv``, ``MiniWoBEnv`` on a ``BrowserEnv``; ``TextHybridEnv`` on its text
screen) says how to load a task, how to run a tool, how the page verifies itself and what an
answer means; ``ScreenEnv`` does the rest, identically, on any ``verl_ext.envs.screen.Screen``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from verl_ext.envs.core import (
    GUI_TOOL_NAME,
    Action,
    ActionError,
    Element,
    EnvFault,
    GuiAction,
    Observation,
    TaskSpec,
    ToolCall,
    action_from_call,
    task_option,
    tool_result,
)
from verl_ext.envs.screen import Screen
from verl_ext.envs.tools import COMPUTER_USE, ToolDef

if TYPE_CHECKING:
    from verl_ext.envs.browser import Browser


class ScreenEnv(ABC):
    """Gymnasium-style env on one ``Screen`` (``reset`` / ``step`` / ``close``).

    Args:
        screen: what shows the page and takes the GUI primitives.
        max_steps: actions per episode before ``truncated``.
        screenshots: attach a PNG screenshot to every observation.

    ``step`` never raises for a bad action (the result says what was wrong) and never raises for
    an env failure either: it returns ``truncated=True`` with ``info["fault"]`` set. ``reset``
    raises :class:`EnvFault` when the screen cannot be brought up (the pool restarts it).
    """

    name = "screen"
    root_selector = "body"
    # Body of a JS function returning the page's verifier status; runs with every observation.
    status_js = ""

    def __init__(self, screen: Screen, max_steps: int = 30, screenshots: bool = False):
        self.max_steps = max_steps
        self.screenshots = screenshots
        self.screen = screen
        self.task: TaskSpec | None = None
        self.instruction = ""
        self._tools: dict[str, ToolDef] = {}
        self._fault: dict[str, str] | None = None
        self._done = False
        self._last_obs: Observation | None = None
        self.counts = {"steps": 0, "gui": 0, "tool": 0, "tool_succeeded": 0, "invalid": 0}
        self.screen_restarts = 0
        self._started = False

    # --- backend hooks ----------------------------------------------------------------------
    @abstractmethod
    def _load(self, task: TaskSpec) -> dict[str, Any]:
        """Bring the page to the task's initial state; set ``self.instruction``; return info."""

    @abstractmethod
    def _episode_tools(self, task: TaskSpec) -> list[ToolDef]:
        """The app tools offered this episode (``computer_use`` is added by the base class)."""

    @abstractmethod
    def _run_tool(self, tool: ToolDef, arguments: dict[str, Any]) -> dict[str, Any]:
        """Execute a validated tool call; return ``{success, result, error_message}``."""

    @abstractmethod
    def _answer(self, text: str) -> None:
        """Record the policy's answer to a question task (or raise ActionError if none is asked)."""

    @abstractmethod
    def _verdict(self, status: Any) -> tuple[bool, float, dict[str, Any]]:
        """(episode over?, reward, extra info) from ``status_js``'s result, after each step."""

    @abstractmethod
    def state_dump(self) -> dict[str, Any]:
        """The final-state artifact (JSON-serialisable) that judge rewards read."""

    def _after_action(self, status: Any) -> None:
        """Hook run after every action with the page status (e.g. mirror files to the sandbox)."""

    # --- the API ----------------------------------------------------------------------------
    def ensure_screen(self) -> bool:
        """Start the screen if needed, restart it if it died (counted in ``screen_restarts``);
        True when a (re)start happened."""
        if self.screen.driver is not None and self.screen.alive():
            return False
        self.screen.close()
        if self._started:
            self.screen_restarts += 1
        self.screen.start()
        self._started = True
        self._on_screen_start()
        return True

    def _on_screen_start(self) -> None:
        """Hook: the screen is new (load the app page)."""

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Gymnasium's reset: the task is ``options["task"]`` (an id, ``{"template", "seed"}`` or a
        ``TaskSpec``); ``seed``, when given, replaces the task's own seed."""
        self.task = TaskSpec.parse(task_option(options), seed)
        self._fault, self._done = None, False
        self.counts = {"steps": 0, "gui": 0, "tool": 0, "tool_succeeded": 0, "invalid": 0}
        try:
            self.ensure_screen()
            info = self._load(self.task)
            self._tools = {t.name: t for t in [COMPUTER_USE, *self._episode_tools(self.task)]}
            self._last_obs, _ = self._observe(None)
        except EnvFault as fault:
            self._fault = fault.as_dict()  # so the pool restarts this screen before reusing it
            raise
        return self._last_obs, {"task": self.task.template, "seed": self.task.seed, **info}

    def tool_defs(self) -> list[ToolDef]:
        return list(self._tools.values())

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def step(self, action: Action) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self.task is None or self._done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        if self._fault is not None:
            return self._last_obs, 0.0, False, True, self._info(action, None, {"fault": self._fault})
        self.counts["steps"] += 1
        try:
            try:
                if isinstance(action, ToolCall) and action.name == GUI_TOOL_NAME:
                    action = action_from_call(action.name, action.arguments)  # a GUI action in call form
                self.counts["gui" if isinstance(action, GuiAction) else "tool"] += 1
                result = self._perform(action)
                if isinstance(action, ToolCall) and result["success"]:
                    self.counts["tool_succeeded"] += 1  # an app tool call whose arguments the app took
            except ActionError as err:
                self.counts["invalid"] += 1
                result = tool_result(False, None, str(err))
            obs, status = self._observe(result)
            self._after_action(status)
            terminated, reward, extra = self._verdict(status)
            if isinstance(action, GuiAction) and action.kind == "done":
                terminated = True
            self._last_obs = obs
        except EnvFault as fault:
            self._fault = fault.as_dict()
            return self._last_obs, 0.0, False, True, self._info(action, None, {"fault": self._fault})
        truncated = not terminated and self.counts["steps"] >= self.max_steps
        self._done = terminated or truncated
        return self._last_obs, reward, terminated, truncated, self._info(action, result, extra)

    def screenshot(self) -> bytes:
        return self.screen.screenshot()

    def close(self) -> None:
        self.screen.close()

    @property
    def faulted(self) -> dict[str, str] | None:
        return self._fault

    # --- internals --------------------------------------------------------------------------
    def _perform(self, action: Action) -> dict[str, Any]:
        if isinstance(action, ToolCall):
            tool = self._tools.get(action.name)
            if tool is None:
                raise ActionError(f"unknown tool {action.name!r}; available: {sorted(self._tools)}")
            return self._run_tool(tool, tool.validate(action.arguments))
        screen = self.screen
        if action.kind == "click":
            screen.click(action.element)
        elif action.kind == "click_at":
            screen.click_at(action.x, action.y)
        elif action.kind == "type":
            screen.type(action.element, action.text)
        elif action.kind == "select":
            screen.select(action.element, action.text)
        elif action.kind == "key":
            screen.key(action.key)
        elif action.kind == "scroll":
            screen.scroll(action.direction, action.element)
        elif action.kind == "answer":
            self._answer(action.text)
        return tool_result(True, None, "")

    def _observe(self, last_result: dict[str, Any] | None) -> tuple[Observation, Any]:
        page = self.screen.observe(self.root_selector, self.status_js)
        elements = [
            Element(id=e["id"], role=e["role"], text=e.get("text", ""), value=e.get("value"),
                    states=tuple(e.get("states", ())), key=e.get("key"))
            for e in page["elements"]
        ]
        return Observation(
            instruction=self.instruction, elements=elements, tools=list(self._tools), step=self.counts["steps"],
            max_steps=self.max_steps, last_result=last_result,
            screenshot=self.screen.screenshot() if self.screenshots else None, title=page.get("title", ""),
        ), page["status"]

    def _info(self, action: Action, result: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "action_kind": "gui" if isinstance(action, GuiAction) else "tool",
            "action_name": action.kind if isinstance(action, GuiAction) else action.name,
            "action_ok": bool(result and result.get("success")),
            "counts": dict(self.counts),
            "fault": None,
            **extra,
        }


class BrowserEnv(ScreenEnv):
    """A ``ScreenEnv`` on one headless Chromium (MiniDesk, MiniWoB++, your own pages).

    Args:
        max_steps / screenshots: as ``ScreenEnv``.
        width / height: viewport in CSS pixels.
        command_timeout_s: a driver command slower than this is a ``driver_timeout`` fault
            (page loads, scripts, the driver's HTTP calls; 30 s: a page of these envs loads in
            well under a second, and a hung renderer costs the episode, not the run).
    """

    name = "browser"

    def __init__(self, max_steps: int = 30, screenshots: bool = False, width: int = 1024, height: int = 768,
                 command_timeout_s: float = 30.0):
        from verl_ext.envs.browser import Browser

        super().__init__(Browser(width, height, command_timeout_s, env=self.name), max_steps, screenshots)

    @property
    def browser(self) -> Browser:
        """The screen, with the browser's own API (``js``, ``get``, ``pids``, ...)."""
        return self.screen
