"""Verifiable reward of one GUI-vs-tool decision (a critical switching step,
``verl_ext.datasets.decisions``): the single-turn RL stage of ToolCUA's pipeline.

A verl ``custom_reward_function`` (``reward.custom_reward_function.path=
pkg://verl_ext.rewards.decision_reward``) for rows rolled out by the ``decision_turn`` loop, which
leaves the reply's calls (verl's tool parser) in ``extra_info["decision_calls"]``.

``R = choice_weight * R_choice + format_weight * R_fmt + R_path`` with

- ``R_choice`` = 1 when the function the reply *names* is of the shorter mode here (``computer_use``
  where the GUI is shorter, an app tool where tools are), else 0. The name is read from the reply's
  text (``named_function``), so it counts even when the arguments do not parse: the choice between
  GUI and tool is scored apart from how well the call is written. ``choice_weight`` is 0 by default
  (the reward below, unchanged); the recipe's RFT stage sets it (``RFT_CHOICE_WEIGHT``). With
  ``choice_weight >= format_weight + 1`` a right choice with broken arguments scores at least as
  much as a wrong choice written perfectly (whose ``R_path`` is below 1);
- ``R_fmt`` = 1 when the reply holds exactly one parseable call of a function the row offers (the
  ``hybrid_gui_tool`` loop's ``valid_call_rate`` rule; ToolCUA's format term), else 0 and ``R_path =
  0``. A name the row does not offer is no call an environment could run: the cpu tiny model, whose
  tokenizer splits names into shared pieces, learnt under RL to write ``computer_set`` (the GUI
  tool's first piece, a tool's last) while such a call still scored as a wasted step;
- ``R_path = best / remaining``: ``remaining`` = steps to the end of the task after this call,
  ``best`` = the fewest over the choices (so the shorter choice scores 1, the longer one
  ``best / remaining`` < 1). The call is the first call of the GUI or the tool option when it
  equals it (name and arguments); otherwise it is counted as one wasted step followed by the
  path of its mode (``computer_use`` -> GUI, an app tool -> tool), and a call of a distractor or
  of an unknown function as one wasted step followed by the longer of the two paths.

ToolCUA's own single-turn RFT reward is not documented in its paper's abstract or code (arXiv 2605.12481,
X-PLUG/ToolCUA; its project page says only that the RFT stage "calibrate[s] local switching
behavior"); this one is built from the path-efficiency idea of its Tool-Efficient Path Reward, per
decision. Where it departs: ToolCUA's path reward gates its tool term on success (``I_succ`` in
``R_tool``), and the per-decision analogue would gate the choice on a parseable call; ``R_choice``
is *not* gated on the format, because a model that cannot yet write a tool's arguments (the cpu
tiny model, recipes/toolcua_sft_rl/README.md) would otherwise be taught to avoid tools.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from typing import Any

from verl_ext.envs.core import GUI_TOOL_NAME

REWARD_KWARGS = {"format_weight": 1.0, "choice_weight": 0.0}  # reward_kwargs compute_score takes, and defaults
CALLS_KEY = "decision_calls"  # where the decision_turn loop leaves the parsed calls (its CALLS_KEY)
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


def row_tools(extra_info: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A decision row's tool schemas (``extra_info["tools"]``: JSON text as the rows store it, or a
    list); None when the row has none."""
    tools = extra_info.get("tools")
    if tools is None:
        return None
    return json.loads(tools) if isinstance(tools, str) else list(tools)


def named_function(reply: str) -> str | None:
    """The function the reply names first (its first ``"name": "<fn>"``), parseable or not; None when
    it names none. ``'{"name": "settings_set", "arguments": "click", "click"'`` names ``settings_set``."""
    match = _NAME.search(reply)
    return match.group(1) if match else None


def mode_of_name(name: str | None, app_tools: list[str]) -> str:
    """``gui`` for ``computer_use``, ``tool`` for an app tool, ``other`` (a distractor, an unknown
    function, or no name)."""
    if name == GUI_TOOL_NAME:
        return "gui"
    return "tool" if name is not None and name in app_tools else "other"


def check_weights(format_weight: float, choice_weight: float) -> None:
    """Raise ``ValueError`` naming the reward_kwargs key when a weight is negative or not finite."""
    for key, value in (("format_weight", format_weight), ("choice_weight", choice_weight)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ValueError(f"decision reward: reward.custom_reward_function.reward_kwargs.{key}={value!r} must be a "
                             f"finite number >= 0; set it to e.g. {1.0 if key == 'format_weight' else 2.0} "
                             "(choice_weight 0 scores only format and path, the reward without the choice term)")


def classify_call(call: dict[str, Any], first_calls: dict[str, dict[str, Any]], app_tools: list[str]) -> tuple[str, bool]:
    """``(mode, exact)`` of one parsed call: ``mode`` = ``gui`` / ``tool`` / ``other`` (a distractor or
    unknown function), ``exact`` = it is that mode's option's first call.

    Args:
        call: ``{"name", "arguments"}``, arguments as verl's parser leaves them (JSON text) or a dict.
        first_calls: ``{"gui": call, "tool": call}`` of the decision row.
        app_tools: names of the app's tools in this episode.
    """
    arguments = json.loads(call["arguments"]) if isinstance(call["arguments"], str) else call["arguments"]
    for mode, expected in first_calls.items():
        if call["name"] == expected["name"] and arguments == expected["arguments"]:
            return mode, True
    if call["name"] == GUI_TOOL_NAME:
        return "gui", False
    return ("tool" if call["name"] in app_tools else "other"), False


def decision_reward(calls: list[dict[str, Any]], decision: dict[str, Any], format_weight: float = 1.0,
                    reply: str | None = None, choice_weight: float = 0.0,
                    offered: Collection[str] | None = None) -> dict[str, float]:
    """Reward and components of one reply at one decision.

    Args:
        calls: the reply's parsed calls (``decision_turn``: ``extra_info["decision_calls"]``).
        reply: the reply's text, from which ``named_function`` reads the chosen function when its call
            does not parse (None: only the parsed call names it).
        choice_weight: weight of ``R_choice`` (0: the reward without the choice term).
        decision: the row's ``extra_info["decision"]``: ``remaining`` ({gui, tool}: steps to the end
            after each option), ``best``, ``better``, ``first_calls`` (JSON text or dict), ``app_tools``.
        format_weight: weight of ``R_fmt``.
        offered: the names of the functions the row offers (its ``tools``); a call of any other name
            is not a valid call. None: every parsed name counts as a call.

    Returns:
        ``score`` and ``format_ok``, ``path`` (``R_path``), ``exact`` (the call is an option's first
        call), ``chose_better``, ``tool_call`` (the call's mode is ``tool``), ``better_tool`` /
        ``better_gui`` (which option is shorter here), ``tool_call_tool_shorter`` /
        ``tool_call_gui_shorter`` (``tool_call`` where tools / the GUI are shorter, else 0: verl
        averages each extra over the batch, so mean(``tool_call_tool_shorter``) / mean(``better_tool``)
        is the per-decision T rate where tools are shorter), ``extra_steps`` (``remaining - best``;
        0 for a malformed reply); ``choice`` (``R_choice``), ``named_tool`` (the named function is an app
        tool, parseable or not) and ``named_tool_tool_shorter`` / ``named_tool_gui_shorter`` (as
        ``tool_call_*``, from the name).
    """
    check_weights(format_weight, choice_weight)
    remaining = {mode: int(n) for mode, n in decision["remaining"].items()}
    best = int(decision["best"])
    out = {"format_ok": 0.0, "path": 0.0, "exact": 0.0, "chose_better": 0.0, "tool_call": 0.0,
           "better_tool": float(decision["better"] == "tool"), "better_gui": float(decision["better"] == "gui"),
           "extra_steps": 0.0}
    if len(calls) == 1 and (offered is None or calls[0]["name"] in offered):
        first_calls = decision["first_calls"]
        first_calls = json.loads(first_calls) if isinstance(first_calls, str) else first_calls
        try:
            mode, exact = classify_call(calls[0], first_calls, list(decision["app_tools"]))
        except (json.JSONDecodeError, TypeError):  # verl's parser re-dumps what it decoded: not expected
            mode, exact = None, False
        if mode is not None:
            cost = remaining[mode] if exact else 1 + (remaining[mode] if mode in remaining else max(remaining.values()))
            out.update(format_ok=1.0, path=best / cost, exact=float(exact), chose_better=float(mode == decision["better"]),
                       tool_call=float(mode == "tool"), extra_steps=float(cost - best))
    app_tools = list(decision["app_tools"])
    name = calls[0]["name"] if len(calls) == 1 else named_function(reply) if reply is not None else None
    named = mode_of_name(name, app_tools)
    out["choice"] = float(named == decision["better"])
    out["named_tool"] = float(named == "tool")
    out["named_tool_tool_shorter"] = out["named_tool"] * out["better_tool"]
    out["named_tool_gui_shorter"] = out["named_tool"] * out["better_gui"]
    out["tool_call_tool_shorter"] = out["tool_call"] * out["better_tool"]
    out["tool_call_gui_shorter"] = out["tool_call"] * out["better_gui"]
    out["score"] = choice_weight * out["choice"] + format_weight * out["format_ok"] + out["path"]
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  format_weight: float = 1.0, choice_weight: float = 0.0, **kwargs: Any) -> dict[str, float]:
    """verl reward function for ``decision_turn`` rows (``decision_reward`` of the parsed calls and,
    for ``R_choice``, of the reply's text ``solution_str``)."""
    extra_info = extra_info or {}
    if CALLS_KEY not in extra_info or "decision" not in extra_info:
        raise KeyError(f"decision reward needs extra_info.{CALLS_KEY} (written by the decision_turn agent loop) and "
                       "extra_info.decision (rows of `verl-ext prepare-data text_hybrid_decisions`); set the rows' "
                       "agent_name to decision_turn")
    tools = row_tools(extra_info)
    offered = None if tools is None else [t["function"]["name"] for t in tools]
    return decision_reward(list(extra_info[CALLS_KEY]), extra_info["decision"], format_weight,
                           reply=solution_str, choice_weight=choice_weight, offered=offered)
