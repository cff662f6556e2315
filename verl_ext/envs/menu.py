"""A two-option action menu over MiniDesk's reference plans, for models too small to write
function calls (the cpu recipes' tiny random model).

Each turn the policy answers one letter: ``T`` takes the next step of the task's tool-preferring
plan, ``G`` the next step of its GUI-only plan (``info["plans"]``, the same plans the scripted
policies replay). The env executes the real action in the browser, counts it as a tool call or a
GUI step, and verifies the page state as usual; mixing the two paths is allowed and may fail (a
GUI step whose element is not on the page is unavailable). An answer that names no available
option ends the episode, like a reply without a function call in ``tool_call`` mode. What is left for the policy to
learn is ToolCUA's *when to switch* decision: use tools on tasks where they shorten the path, stay
in the GUI where they do not (the Tool-Efficient Path Reward scores exactly that). Grounding
(which element, which arguments) is the plan's, so this measures decision learning only.
"""

from __future__ import annotations

import json
from typing import Any

from verl_ext.envs.core import Action, GuiAction, Observation, ToolCall
from verl_ext.envs.plans import plan_step_action

CHOICES = {"T": "tool", "G": "gui"}
SYSTEM_PROMPT = (
    "You operate a desktop. Each turn answer with one letter: T takes the next step of the tool "
    "path (app tools), G the next step of the GUI path (clicks and typing). Prefer tools only when "
    "they make the task shorter."
)
MAX_DESCRIPTION_CHARS = 48


def parse_choice(text: str) -> str | None:
    """The plan (``tool``/``gui``) named by the first T or G letter (any case) in ``text``."""
    for char in text:
        mode = CHOICES.get(char.upper())
        if mode is not None:
            return mode
    return None


def describe(action: Action | None) -> str:
    """A short human-readable form of an option (shown to the model, logged in ``actions``)."""
    if action is None:
        return "unavailable"
    if isinstance(action, ToolCall):
        text = f"call {action.name}({json.dumps(action.arguments, ensure_ascii=False)})"
    elif action.kind == "done":
        text = "done"
    else:
        target = f" #{action.element}" if action.element is not None else ""
        value = f" {json.dumps(action.text, ensure_ascii=False)}" if action.text is not None else ""
        text = f"{action.kind}{target}{value}"
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[: MAX_DESCRIPTION_CHARS - 3] + "..."


class PlanMenu:
    """The T/G menu of one episode: a cursor into each reference plan.

    Args:
        plans: ``{"tool": [...], "gui": [...]}`` from the env's reset info (MiniDesk).
    """

    def __init__(self, plans: dict[str, list[dict[str, Any]]]):
        missing = [mode for mode in CHOICES.values() if mode not in plans]
        if missing:
            raise ValueError(f"the T/G menu needs reference plans {missing} in the env's reset info; "
                             "only MiniDesk provides them (agent loop action_format=menu)")
        self._plans = {mode: list(plans[mode]) for mode in CHOICES.values()}
        self._cursor = dict.fromkeys(self._plans, 0)

    def action(self, mode: str, obs: Observation) -> Action | None:
        """The action option ``mode`` stands for on ``obs``: the plan's next step, ``done`` when the
        plan is used up, None when the step's element is not on the page."""
        plan, cursor = self._plans[mode], self._cursor[mode]
        return plan_step_action(plan[cursor], obs) if cursor < len(plan) else GuiAction("done")

    def advance(self, mode: str) -> None:
        self._cursor[mode] += 1

    def render(self, obs: Observation) -> str:
        """``T) <next tool-path step> | G) <next GUI-path step>``."""
        return " | ".join(f"{letter}) {describe(self.action(mode, obs))}" for letter, mode in CHOICES.items())

    def first_message(self, obs: Observation) -> str:
        return f"Task: {obs.instruction}\nOptions: {self.render(obs)}"

    def feedback(self, obs: Observation) -> str:
        """The observation after a step: how the last action went, then the new options."""
        if obs.last_result and not obs.last_result.get("success", True):
            outcome = "error: " + str(obs.last_result.get("error_message", ""))[:MAX_DESCRIPTION_CHARS]
        else:
            outcome = "ok"
        return f"Step {obs.step}: {outcome}\nOptions: {self.render(obs)}"
