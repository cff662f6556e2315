"""Verifiable reward of one GUI-vs-tool decision (a critical switching step,
``verl_ext.envs.decisions``): the single-turn RL stage of ToolCUA's pipeline.

A verl ``custom_reward_function`` (``reward.custom_reward_function.path=
pkg://verl_ext.rewards.decision_reward``) for rows rolled out by the ``decision_turn`` loop, which
leaves the reply's calls (verl's tool parser) in ``extra_info["decision_calls"]``.

``R = format_weight * R_fmt + R_path`` with

- ``R_fmt`` = 1 when the reply holds exactly one parseable function call (the ``hybrid_gui_tool``
  loop's ``valid_call_rate`` rule; ToolCUA's format term), else 0 and ``R = 0``;
- ``R_path = best / remaining``: ``remaining`` = steps to the end of the task after this call,
  ``best`` = the fewest over the choices (so the shorter choice scores 1, the longer one
  ``best / remaining`` < 1). The call is the first call of the GUI or the tool option when it
  equals it (name and arguments); otherwise it is counted as one wasted step followed by the
  path of its mode (``computer_use`` -> GUI, an app tool -> tool), and a call of a distractor or
  of an unknown function as one wasted step followed by the longer of the two paths.

ToolCUA's own single-turn RFT reward is not documented in the sources available here (research
notes §2.4, §12); this one is built from the path-efficiency idea of its Tool-Efficient Path
Reward, per decision.
"""

from __future__ import annotations

import json
from typing import Any

from verl_ext.envs.core import GUI_TOOL_NAME

CALLS_KEY = "decision_calls"  # where the decision_turn loop leaves the parsed calls (its CALLS_KEY)


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


def decision_reward(calls: list[dict[str, Any]], decision: dict[str, Any], format_weight: float = 1.0) -> dict[str, float]:
    """Reward and components of one reply at one decision.

    Args:
        calls: the reply's parsed calls (``decision_turn``: ``extra_info["decision_calls"]``).
        decision: the row's ``extra_info["decision"]``: ``remaining`` ({gui, tool}: steps to the end
            after each option), ``best``, ``better``, ``first_calls`` (JSON text or dict), ``app_tools``.
        format_weight: weight of ``R_fmt``.

    Returns:
        ``score`` and ``format_ok``, ``path`` (``R_path``), ``exact`` (the call is an option's first
        call), ``chose_better``, ``tool_call`` (the call's mode is ``tool``), ``better_tool`` /
        ``better_gui`` (which option is shorter here), ``tool_call_tool_shorter`` /
        ``tool_call_gui_shorter`` (``tool_call`` where tools / the GUI are shorter, else 0: verl
        averages each extra over the batch, so mean(``tool_call_tool_shorter``) / mean(``better_tool``)
        is the per-decision T rate where tools are shorter), ``extra_steps`` (``remaining - best``;
        0 for a malformed reply).
    """
    remaining = {mode: int(n) for mode, n in decision["remaining"].items()}
    best = int(decision["best"])
    out = {"format_ok": 0.0, "path": 0.0, "exact": 0.0, "chose_better": 0.0, "tool_call": 0.0,
           "better_tool": float(decision["better"] == "tool"), "better_gui": float(decision["better"] == "gui"),
           "extra_steps": 0.0}
    if len(calls) == 1:
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
    out["tool_call_tool_shorter"] = out["tool_call"] * out["better_tool"]
    out["tool_call_gui_shorter"] = out["tool_call"] * out["better_gui"]
    out["score"] = format_weight * out["format_ok"] + out["path"]
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None,
                  format_weight: float = 1.0, **kwargs: Any) -> dict[str, float]:
    """verl reward function for ``decision_turn`` rows (``decision_reward`` of the parsed calls)."""
    extra_info = extra_info or {}
    if CALLS_KEY not in extra_info or "decision" not in extra_info:
        raise KeyError(f"decision reward needs extra_info.{CALLS_KEY} (written by the decision_turn agent loop) and "
                       "extra_info.decision (rows of `verl-ext prepare-data text_hybrid_decisions`); set the rows' "
                       "agent_name to decision_turn")
    return decision_reward(list(extra_info[CALLS_KEY]), extra_info["decision"], format_weight)
