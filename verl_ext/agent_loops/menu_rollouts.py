"""How ``hybrid_gui_tool``'s T/G menu (``action_format=menu``) plays each model turn: three rollouts
over the same menu (agent-loop kwarg ``rollout``), in pure python (no verl) so they are tested
without a trainer. The loop owns the tokens and the env; a player owns what a turn means.

- ``free`` (default): the menu as it always played (``verl_ext.envs.menu``): each answer is carried
  out; an answer that names no option ends the episode.
- ``semi_online``: UI-S1's semi-online rollout (Lu et al., arXiv 2509.11543; reference code
  X-PLUG/MobileAgent ``UI-S1/``): the episode plays against a reference trajectory (text_hybrid's
  oracle, one answer per decision). Each answer is compared with the reference answer of its
  decision (``matches_reference``) and recorded as ``StepMetadata.action_match``, the input of the
  ``step_grouped`` estimator. A matching answer is carried out. A mismatching one (a wrong letter,
  or no letter) is *patched*: the reference answer is carried out instead, so every rollout stays
  on the reference path and step ``t`` of every rollout of a task is the reference's state ``t``
  (what ``step_grouped`` groups by). After ``patch_threshold`` patches (UI-S1's script: 2; -1: no
  limit) the next mismatch ends the trajectory. The step reward is UI-S1's per-step score
  (``uis1_step_score``) plus the env's reward for the steps the turn took.

  Departures from UI-S1: (1) UI-S1 replaces the mismatched response in the history the model sees
  next by the expert's; here one training row holds the whole trajectory and its tokens are the
  model's own, so the model's answer stays in the context and the next observation says which
  answer was taken instead. (2) UI-S1's action score gives 0.5 for a right action type with wrong
  arguments and 0.1 for a wrong type; a menu answer has no arguments, so the score is 0.9 for a
  match and 0 otherwise, plus 0.1 for an answer that names an option (the format term).
- ``plan_execute``: a planner/executor rollout for ``himac`` and ``hiper`` (HiMAC, arXiv 2603.00977;
  HiPER, arXiv 2602.16165). The same model plays both roles. A *planner* turn starts each subgoal
  (decision) of the task: its answer is the subgoal's plan, ``T`` (by tools) or ``G`` (through the
  GUI), which ``plan_segment`` splits into the plan's steps. Then one *executor* turn per step of
  that plan: the observation shows the step, an answer naming an option takes it. Each turn is
  recorded with its ``role`` and its subgoal key (``StepMetadata.role``/``subgoal``); the planner
  turn and the executor turns of one subgoal form one segment. An answer that names no option
  wastes the turn in either role (recorded with ``action_valid`` False, the env not stepped, the
  same question asked again), as an invalid action of ``TextCorridor`` does: a plan takes a dozen
  turns, and ending the episode at the first slip (the free menu's format rule) would leave a
  random model no finished episode to learn from. Departures: HiMAC's macro policy writes the
  whole blueprint in one turn and HiPER's turns carry a KEEP/SWITCH flag; here a new segment starts
  exactly when the previous subgoal's plan is used up, and the subgoals come in the instruction's
  order, so the planner chooses how, not what. On the menu an executor's only choice is to take
  the shown step or to waste the turn; grounding is the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl_ext.envs.core import Action, Observation
from verl_ext.envs.menu import CHOICES, DecisionMenu, Menu, describe, make_menu, outcome, parse_choice
from verl_ext.envs.plans import plan_step_action

ROLLOUTS = ("free", "semi_online", "plan_execute")
# The optional per-step fields of StepMetadata each rollout records (the start-up checks read this).
RECORDED_FIELDS: dict[str, frozenset[str]] = {
    "free": frozenset(),
    "semi_online": frozenset({"action_match"}),
    "plan_execute": frozenset({"role", "subgoal"}),
}
UIS1_FORMAT_WEIGHT = 0.1  # UI-S1's score: 0.1 * format + 0.9 * action (reward_score/gui_traj.py)
_LETTER = {mode: letter for letter, mode in CHOICES.items()}


def recorded_fields(loop_kwargs: dict[str, Any]) -> frozenset[str]:
    """The optional per-step fields a ``hybrid_gui_tool`` loop built with ``loop_kwargs`` records."""
    return RECORDED_FIELDS.get(str(loop_kwargs.get("rollout", "free")), frozenset())


def uis1_step_score(format_ok: bool, match: bool) -> float:
    """UI-S1's per-step score on the menu: ``0.1 * format + 0.9 * action`` with format = the answer
    names an option and action = it matches the reference answer (no partial credit: see the
    module doc)."""
    return UIS1_FORMAT_WEIGHT * bool(format_ok) + (1.0 - UIS1_FORMAT_WEIGHT) * bool(match)


def matches_reference(done_by: str | None, reference: str | None) -> bool:
    """Whether an answer matches the reference answer of its decision: both do the decision the
    same way (``tool``/``gui``: ``T`` where no tool does the subgoal is done through the GUI, so
    it matches a ``gui`` reference). ``done_by`` None (no option named) never matches."""
    return done_by is not None and done_by == reference


def plan_segment(mode: str, steps: list[dict[str, Any]]) -> list[str]:
    """A subgoal's plan split into the executor turns that carry it out: one line per plan step,
    ``"<mode> <k>/<n>: <step>"`` (what the executor is shown, before grounding on the page)."""
    n = len(steps)
    return [f"{mode} {k}/{n}: {_step_text(step)}" for k, step in enumerate(steps, 1)]


def _step_text(step: dict[str, Any]) -> str:
    if "tool" in step:
        return f"call {step['tool']}"
    return f"{step['gui']} {step.get('k', '')}".strip()


@dataclass
class MenuTurn:
    """What one model turn did, as the loop records it.

    Attributes:
        action: the first env action the turn takes (None: the turn takes none).
        valid_format: the answer names an available option (``StepMetadata.action_valid``).
        description: the turn as logged in ``extras["actions"]``.
        stop: non-empty: the episode ends after this turn; the stop reason.
        decision: the decision record (``{"choice", "better"}``) when the turn makes a decision.
        reward: the turn's own reward, before the env's rewards for its steps are added.
        match: ``action_match`` (``semi_online``), else None.
        role, subgoal: ``plan_execute``'s ``role`` and subgoal key, else ``""`` / None.
    """

    action: Action | None
    valid_format: bool
    description: str
    stop: str = ""
    decision: dict[str, str] | None = None
    reward: float = 0.0
    match: bool | None = None
    role: str = ""
    subgoal: str | None = None


class FreePlay:
    """``free``: each answer is carried out (the menu's own rules)."""

    def __init__(self, menu: Menu):
        self.menu = menu

    def turn(self, text: str, obs: Observation) -> MenuTurn:
        mode = parse_choice(text)
        action = self.menu.action(mode, obs) if mode else None
        description = f"{mode}: {describe(action)}" if mode else ""
        if action is None:  # as in tool_call mode (ToolCUA's format rule): no valid choice ends it
            return MenuTurn(None, False, description, stop="no_valid_choice")
        return MenuTurn(action, True, description, decision=self.menu.advance(mode))

    def follow_up(self, obs: Observation) -> Action | None:
        return self.menu.follow_up(obs)

    def first_message(self, obs: Observation) -> str:
        return self.menu.first_message(obs)

    def feedback(self, obs: Observation) -> str:
        return self.menu.feedback(obs)


class SemiOnlinePlay(FreePlay):
    """``semi_online``: UI-S1's patch rule against a reference answer per decision (module doc).

    Args:
        menu: the episode's decision menu. reference: the reference answer (``tool``/``gui``) of
            each decision, in order (text_hybrid's oracle: ``reset_info["decisions"][i]["oracle"]``).
        patch_threshold: patches allowed per trajectory; the next mismatch ends it (-1: no limit).
    """

    def __init__(self, menu: DecisionMenu, reference: list[str], patch_threshold: int = 2):
        super().__init__(menu)
        self.reference = list(reference)
        self.patch_threshold = patch_threshold
        self.patches = 0
        self._patched: str | None = None  # the letter taken instead of the last answer

    def turn(self, text: str, obs: Observation) -> MenuTurn:
        i = self.menu.decision
        # Past the reference's last decision (the env did not end): any named option is the
        # menu's "done", and matches.
        reference = self.reference[i] if i < len(self.reference) else None
        mode = parse_choice(text)
        done_by = self.menu.done_by(mode) if mode else None
        match = matches_reference(done_by, reference) if reference is not None else mode is not None
        score = uis1_step_score(mode is not None, match)
        self._patched = None
        if match:
            action = self.menu.action(mode, obs)
            return MenuTurn(action, True, f"{mode}: {describe(action)}", decision=self.menu.advance(mode),
                            reward=score, match=True)
        self.patches += 1
        said = f"{mode}" if mode else "no option"
        if 0 <= self.patch_threshold < self.patches:
            return MenuTurn(None, mode is not None, f"{said} (off the reference)", stop="patch_threshold",
                            reward=score, match=False)
        patch = reference or "gui"  # past the last decision any answer is "done"
        action = self.menu.action(patch, obs)
        self._patched = _LETTER[patch]
        return MenuTurn(action, mode is not None, f"{said} -> patched {patch}: {describe(action)}",
                        decision=self.menu.advance(patch), reward=score, match=False)

    def feedback(self, obs: Observation) -> str:
        patched = f"Your answer was replaced by the reference answer {self._patched}.\n" if self._patched else ""
        return patched + self.menu.feedback(obs)


class PlanExecutePlay:
    """``plan_execute``: a planner turn per subgoal, then one executor turn per step of its plan
    (module doc)."""

    def __init__(self, menu: DecisionMenu):
        self.menu = menu
        self.pending: list[dict[str, Any]] = []  # plan steps of the current subgoal not yet taken
        self.shown: list[str] = []  # plan_segment of the current subgoal, for the executor prompts
        self.subgoal: str | None = None

    def turn(self, text: str, obs: Observation) -> MenuTurn:
        mode = parse_choice(text)
        if not self.pending:
            return self._plan(mode)
        if mode is None:  # a wasted turn: the same step is asked for again
            return MenuTurn(None, False, "no option", role="executor", subgoal=self.subgoal)
        action = plan_step_action(self.pending[0], obs)
        if action is None:  # the step's element is not on the page: the plan cannot go on
            return MenuTurn(None, False, f"{mode}: unavailable", stop="plan_step_unavailable", role="executor",
                            subgoal=self.subgoal)
        self.pending.pop(0)
        self.shown.pop(0)
        return MenuTurn(action, True, f"{mode}: {describe(action)}", role="executor", subgoal=self.subgoal)

    def _plan(self, mode: str | None) -> MenuTurn:
        key = f"subgoal {self.menu.decision + 1}"
        done_by = self.menu.done_by(mode) if mode else None
        if mode is None:  # a wasted turn: the subgoal is asked for again
            return MenuTurn(None, False, f"plan {key}: no option", role="planner", subgoal=key)
        if done_by is None:  # no subgoal left, yet the env did not end the episode
            return MenuTurn(None, False, f"plan {key}: none left", stop="no_subgoal_left", role="planner",
                            subgoal=key)
        steps, decision = self.menu.commit(mode)
        self.pending, self.shown, self.subgoal = steps, plan_segment(done_by, steps), key
        return MenuTurn(None, True, f"plan {key}: {done_by}, {len(steps)} steps", decision=decision,
                        role="planner", subgoal=key)

    def follow_up(self, obs: Observation) -> Action | None:
        return None  # one executor turn per plan step

    def _prompt(self, obs: Observation) -> str:
        if self.pending:
            return (f"Execute {self.subgoal}: {self.shown[0]} ({describe(plan_step_action(self.pending[0], obs))})\n"
                    "Answer T or G to take this step.")
        return f"Plan {self.menu.header()}Options: {self.menu.render(obs)}"

    def first_message(self, obs: Observation) -> str:
        return f"Task: {obs.instruction}\n{self._prompt(obs)}"

    def feedback(self, obs: Observation) -> str:
        return f"Step {obs.step}: {outcome(obs)}\n{self._prompt(obs)}"


Player = FreePlay | SemiOnlinePlay | PlanExecutePlay


def make_player(rollout: str, reset_info: dict[str, Any], patch_threshold: int = 2) -> Player:
    """The player of one episode for agent-loop kwarg ``rollout`` (``ROLLOUTS``)."""
    if rollout not in ROLLOUTS:
        raise ValueError(f"hybrid_gui_tool rollout must be one of {ROLLOUTS}, got {rollout!r}")
    menu = make_menu(reset_info)
    if rollout == "free":
        return FreePlay(menu)
    if not isinstance(menu, DecisionMenu) or "decisions" not in reset_info:
        raise ValueError(f"hybrid_gui_tool rollout={rollout} needs an env whose tasks come with subgoal decisions "
                         "and an oracle plan (reset info decision_table and decisions: the text_hybrid backend); "
                         "use rollout=free on other envs")
    if rollout == "semi_online":
        return SemiOnlinePlay(menu, [d["oracle"] for d in reset_info["decisions"]], patch_threshold)
    return PlanExecutePlay(menu)
