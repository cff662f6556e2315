"""A two-option action menu over an env's reference plans, for models too small to write
function calls (the cpu recipes' tiny random model). Two menus, picked by what the env's reset
info holds (``make_menu``):

- :class:`PlanMenu` (MiniDesk): each answer is one *step* of a whole-task plan (below).
- :class:`DecisionMenu` (text_hybrid): each answer is one *decision*: the next subgoal of the
  task done by tool calls (``T``) or through the GUI (``G``), from the view the earlier choices
  left. The oracle's mixed path is a sequence of answers, and which answer is shorter changes
  from decision to decision with the instruction and the view: the when-to-switch choice is
  made per step, and a wrong one costs path length or a wasted call (Tool-Efficient Path Reward).

PlanMenu:

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
    """The T/G menu of one MiniDesk episode: a cursor into each reference plan.

    Args:
        plans: ``{"tool": [...], "gui": [...]}`` from the env's reset info (MiniDesk).
    """

    def __init__(self, plans: dict[str, list[dict[str, Any]]]):
        missing = [mode for mode in CHOICES.values() if mode not in plans]
        if missing:
            raise ValueError(f"the T/G menu needs reference plans {missing} in the env's reset info; "
                             "MiniDesk provides them (text_hybrid a decision_table instead; agent loop action_format=menu)")
        self._plans = {mode: list(plans[mode]) for mode in CHOICES.values()}
        self._cursor = dict.fromkeys(self._plans, 0)

    def action(self, mode: str, obs: Observation) -> Action | None:
        """The action option ``mode`` stands for on ``obs``: the plan's next step, ``done`` when the
        plan is used up, None when the step's element is not on the page."""
        plan, cursor = self._plans[mode], self._cursor[mode]
        return plan_step_action(plan[cursor], obs) if cursor < len(plan) else GuiAction("done")

    def advance(self, mode: str) -> dict[str, str] | None:
        """Commit the answer ``mode``; returns the decision record (None: plans have no decisions)."""
        self._cursor[mode] += 1
        return None

    def follow_up(self, obs: Observation) -> Action | None:
        """One answer is one step here: nothing follows it."""
        return None

    def render(self, obs: Observation) -> str:
        """``T) <next tool-path step> | G) <next GUI-path step>``."""
        return " | ".join(f"{letter}) {describe(self.action(mode, obs))}" for letter, mode in CHOICES.items())

    def first_message(self, obs: Observation) -> str:
        return f"Task: {obs.instruction}\nOptions: {self.render(obs)}"

    def feedback(self, obs: Observation) -> str:
        """The observation after a step: how the last action went, then the new options."""
        return f"Step {obs.step}: {outcome(obs)}\nOptions: {self.render(obs)}"


def outcome(obs: Observation) -> str:
    """How the last action went: ``ok`` or the env's error message, cut short."""
    if obs.last_result and not obs.last_result.get("success", True):
        return "error: " + str(obs.last_result.get("error_message", ""))[:MAX_DESCRIPTION_CHARS]
    return "ok"


class DecisionMenu:
    """The T/G menu of one text_hybrid episode: one answer per decision (subgoal), in the
    instruction's order.

    ``T`` does the decision with the tool steps from the current view, or through the GUI where
    no tool does it (as the tool-preferring plan does, so all-T replays ``plans["tool"]``); ``G``
    does it through the GUI (all-G replays ``plans["gui"]``). The menu tracks the view itself:
    GUI steps may change it, tool steps never do (``text_hybrid.decision_table``).

    Args:
        table: ``decision_table`` from the env's reset info. start_view: the app's view at reset.
    """

    def __init__(self, table: list[dict[int, dict[str, Any]]], start_view: int):
        self._table = table
        self._view = start_view
        self._decision = 0
        self._queue: list[dict[str, Any]] = []  # steps of the committed answer not yet taken

    def _option(self) -> dict[str, Any] | None:
        return self._table[self._decision][self._view] if self._decision < len(self._table) else None

    @property
    def decision(self) -> int:
        """Index of the next decision (= the number of decisions made)."""
        return self._decision

    @property
    def n_decisions(self) -> int:
        return len(self._table)

    def done_by(self, mode: str) -> str | None:
        """How answer ``mode`` would do the current decision (``tool``/``gui``); None once every
        decision is made."""
        option = self._option()
        return None if option is None else self._done_by(mode, option)

    @staticmethod
    def _done_by(mode: str, option: dict[str, Any]) -> str:
        """How answer ``mode`` does the decision: by tool only where a tool does this subgoal."""
        return "tool" if mode == "tool" and option["tool"] is not None else "gui"

    def steps(self, mode: str) -> list[dict[str, Any]] | None:
        """The plan steps answer ``mode`` stands for now; None once every decision is made."""
        option = self._option()
        return None if option is None else option[self._done_by(mode, option)]

    def action(self, mode: str, obs: Observation) -> Action | None:
        """The first action of answer ``mode`` on ``obs`` (``done`` once every decision is made)."""
        steps = self.steps(mode)
        return GuiAction("done") if steps is None else plan_step_action(steps[0], obs)

    def advance(self, mode: str) -> dict[str, str] | None:
        """Commit ``mode`` for the current decision (its first step is being taken, the rest come
        from ``follow_up``); returns ``{"choice": the mode done, "better": the shorter one from here}``."""
        steps, record = self.commit(mode)
        self._queue = steps[1:]
        return record

    def commit(self, mode: str) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
        """Commit ``mode`` for the current decision without taking any of its steps; returns the
        plan steps it stands for (the caller takes them) and the decision record (as ``advance``)."""
        option = self._option()
        if option is None:
            return [], None
        done = self._done_by(mode, option)
        if done == "gui":
            self._view = option["after"]
        self._decision += 1
        return list(option[done]), {"choice": done, "better": option["better"]}

    def resync(self, state: tuple[int, int] | None) -> bool:
        """Drop any committed answer and stand at ``state`` = ``(decision, view)``, where the env says
        the episode is; False (the menu cannot place it) for None or a state the table lacks."""
        self._queue = []
        if state is None or state[0] >= len(self._table) or state[1] not in self._table[state[0]]:
            return False
        self._decision, self._view = state
        return True

    def follow_up(self, obs: Observation) -> Action | None:
        """The next action of the committed answer on ``obs``, None when it is complete (or its
        element is not on the page: the answer stops there)."""
        return plan_step_action(self._queue.pop(0), obs) if self._queue else None

    def render(self, obs: Observation) -> str:
        """``T) 2 calls | G) 3 GUI steps`` for the next decision (``T) 3 GUI steps, no tool``)."""
        option = self._option()
        if option is None:
            return "T) done | G) done"
        n_gui = len(option["gui"])
        tool = f"{len(option['tool'])} calls" if option["tool"] is not None else f"{n_gui} GUI steps, no tool"
        return f"T) {tool} | G) {n_gui} GUI steps"

    def first_message(self, obs: Observation) -> str:
        return f"Task: {obs.instruction}\n{self.header()}Options: {self.render(obs)}"

    def feedback(self, obs: Observation) -> str:
        return f"Step {obs.step}: {outcome(obs)}\n{self.header()}Options: {self.render(obs)}"

    def header(self) -> str:
        return f"Decision {self._decision + 1}/{len(self._table)}\n" if self._decision < len(self._table) else ""


class DecisionFollower:
    """Per-decision record of a *function-call* episode on text_hybrid: follows the model's calls
    through the decisions of ``decision_table`` (as :class:`DecisionMenu` would play them) and
    records ``{"choice", "better"}`` for each decision the calls take as one of its two options.

    A decision is taken by the call that equals the first step of its tool or GUI option from the
    state the env reports (``decision_state()``: which decision, from which view); the rest of that
    option's steps are then expected call by call. Any other call (a wasted call, a wrong argument,
    a step off the committed option) is not attributed, and the next call is placed anew from the
    env's state, so one unplanned call does not end the record. Where the env cannot place the
    episode in the table (a subgoal done out of order or half done) no call is attributed.
    """

    def __init__(self, table: list[dict[int, dict[str, Any]]], start_view: int):
        self._menu = DecisionMenu(table, start_view)

    def observe(self, action: Action | None, obs: Observation,
                state: tuple[int, int] | None) -> dict[str, str] | None:
        """Account for ``action`` (None: a call that is no valid action) taken on ``obs`` in the
        env's ``state`` (``(decision, view)``, None where it has none); returns the decision record
        when the action starts a decision."""
        expected = self._menu.follow_up(obs)  # the committed option's next step, None at a decision
        if expected is not None and expected == action:
            return None
        if not self._menu.resync(state) or action is None:
            return None
        for mode in CHOICES.values():
            steps = self._menu.steps(mode)
            if steps is not None and plan_step_action(steps[0], obs) == action:
                return self._menu.advance(mode)
        return None


Menu = PlanMenu | DecisionMenu


def _start_view(table: list[dict[int, dict[str, Any]]]) -> int:
    return next(iter(table[0])) if table else 0  # row 0 holds the start view only


def decision_follower(reset_info: dict[str, Any]) -> DecisionFollower | None:
    """A follower of the episode's decisions where the env hands out a ``decision_table`` (text_hybrid;
    such an env also places the episode in it with ``decision_state()``, see :class:`DecisionFollower`)."""
    table = reset_info.get("decision_table")
    return None if table is None else DecisionFollower(table, _start_view(table))


def make_menu(reset_info: dict[str, Any]) -> Menu:
    """The env's menu: per decision where the env hands out a ``decision_table`` (text_hybrid),
    per plan step otherwise (MiniDesk's ``plans``)."""
    if "decision_table" in reset_info:
        table = reset_info["decision_table"]
        return DecisionMenu(table, _start_view(table))
    return PlanMenu(reset_info.get("plans") or {})
