"""Rewards and metrics for hybrid GUI + tool episodes (``hybrid_gui_tool`` agent loop).

``compute_score`` is a verl ``custom_reward_function`` (``reward.custom_reward_function.path=
pkg://verl_ext.rewards.env_rewards``). It reads the episode record the agent loop left in
``extra_info["verl_ext"]`` (``verl_ext.steps.StepMetadata``) and returns a dict whose ``score``
is either the plain verifier reward (``mode="verifier"``) or the per-sample part of ToolCUA's
Tool-Efficient Path Reward (``mode="path"``, default), plus every component as its own key so
GDPO-style per-component normalisation (``algorithm.gdpo_reward_keys``) works.

ToolCUA (arXiv 2605.12481, Tool-Efficient Path Reward):
``R = R_fmt + R_acc + 0.4 * R_tool + 0.2 * R_length``, with ``R_tool = I_succ * [(t_b > 0 and c > 0)
or (t_b < 0 and c = 0)]`` and ``R_length`` comparing the step count with the rollout-group mean.
The group term cannot be computed per sample; ``group_path_reward`` applies it over a group
through ``verl_ext.rewards.tool_path`` (a group reward post-processor). ``len_gain`` =
``I_succ * (1 - s / S_max)`` is the zero-patch GDPO approximation of the group term.

Faulted episodes (``valid == 0``) score 0 only as a placeholder: the agent loop has zeroed their
response mask and marked the metadata invalid, so they carry no gradient, and the verl-ext
trainers keep them out of every estimator's group statistics (``verl_ext.advantages.validity``,
verl's own estimators included). Metrics (``episode_metrics``) exclude them and count them apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from verl_ext.steps import step_metadata

DEFAULT_MAX_STEPS = 30
TOOL_TERMS = {"task": "tool_ok", "decision": "decision_tool_ok"}  # reward_kwargs.tool_term -> component


def reward_components(extras: dict[str, Any], valid: bool, max_steps: int = DEFAULT_MAX_STEPS) -> dict[str, float]:
    """The per-sample components of one episode, as floats (verl stores them as reward extras).

    Keys: ``success`` (R_acc), ``format_ok`` (R_fmt), ``tool_ok`` (R_tool), ``len_gain``,
    ``num_steps`` (s), ``num_tool_calls`` (c), ``num_tool_calls_ok`` (the app tool calls the app
    carried out: their ratio of means is the share of tool calls with arguments the app took), ``used_tool``, ``tool_beneficial`` (1 when tools
    help, else 0: verl averages every extra into ``val-aux/<source>/<key>/mean@N``, so this reads
    as the share of tool-beneficial tasks; ToolCUA's ``t_b`` is ``+1``/``-1`` for the same label),
    ``valid``, ``valid_call_rate`` (share of the model's turns that held exactly one parseable
    function call; 0 for an episode without turns), ``used_tool_beneficial`` (``used_tool`` on a
    tool-beneficial task, else 0: mean(this) / mean(``tool_beneficial``) is the tool-use rate
    where tools help) and, per decision of a text_hybrid menu episode (``extras["decisions"]``),
    counts ``decisions_<better>`` and ``decisions_<better>_tool`` for ``better`` = ``tool``/``gui``
    (which answer was strictly shorter from that state; their ratio of means is the per-decision
    tool-use rate), and ``decision_tool_ok``, the per-decision tool term (``decision_tool_term``).
    """
    success = bool(extras.get("success")) and valid
    turns = len(extras.get("actions") or [])
    calls = int(extras.get("num_tool_calls") or 0)
    steps = int(extras.get("num_steps") or 0)
    beneficial = bool(extras.get("tool_beneficial"))
    tool_ok = success and (calls > 0) == beneficial  # R_tool: tools used exactly where they help
    return {
        "success": float(success),
        "format_ok": float(bool(extras.get("format_ok")) and valid),
        "tool_ok": float(tool_ok),
        "len_gain": float(success) * max(0.0, 1.0 - steps / max_steps),
        "num_steps": float(steps),
        "num_tool_calls": float(calls),
        "num_tool_calls_ok": float(extras.get("num_tool_calls_ok") or 0),
        "used_tool": float(calls > 0),
        "tool_beneficial": float(beneficial),
        "valid": float(valid),
        "valid_call_rate": float(extras.get("valid_calls") or 0) / turns if turns else 0.0,
        "used_tool_beneficial": float(calls > 0 and beneficial),
        **decision_counts(extras.get("decisions") or []),
        "decision_tool_ok": decision_tool_term(extras.get("decisions") or [], success, tool_ok),
    }


def decision_tool_term(decisions: list[dict[str, str]], success: bool, task_tool_ok: bool) -> float:
    """Per-decision ``R_tool``: ``I_succ * (decisions done the shorter way) / (decisions where one
    way was strictly shorter)``, over the episode's decision records (``{choice, better}``: menu
    answers, or the calls ``menu.DecisionFollower`` attributed). With no such decision recorded it
    falls back to the per-task indicator ``task_tool_ok``.

    Gated by success like ToolCUA's per-task term (an unsuccessful trajectory gets no tool bonus).
    """
    scored = [d for d in decisions if d["better"] in ("tool", "gui")]
    if not scored:
        return float(task_tool_ok)
    return float(success) * sum(d["choice"] == d["better"] for d in scored) / len(scored)


def decision_counts(decisions: list[dict[str, str]]) -> dict[str, float]:
    """Decisions where tools / the GUI were strictly shorter, and how many of each were done by tool."""
    out = {}
    for better in ("tool", "gui"):
        chosen = [d["choice"] for d in decisions if d["better"] == better]
        out[f"decisions_{better}"] = float(len(chosen))
        out[f"decisions_{better}_tool"] = float(chosen.count("tool"))
    return out


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    mode: str = "path",
    tool_weight: float = 0.4,
    max_steps: int = DEFAULT_MAX_STEPS,
    tool_term: str = "task",
    **kwargs: Any,
) -> dict[str, float]:
    """verl reward function for ``hybrid_gui_tool`` rows.

    Args:
        mode: ``"verifier"``: score = env verifier success (0/1). ``"path"``: score =
            ``R_fmt + R_acc + tool_weight * R_tool`` (the group length term is left to
            ``group_path_reward`` / the advantages plugin).
        tool_weight: lambda of ToolCUA (0.4). max_steps: ``S_max`` for ``len_gain``.
        tool_term: ``R_tool`` of ``mode="path"``: ``"task"`` (ToolCUA's, default: tools used on
            the episode exactly when the task benefits, ``tool_ok``) or ``"decision"`` (the share
            of decisions done the shorter way, ``decision_tool_ok``; text_hybrid episodes).

    Raises:
        verl_ext.steps.MissingStepMetadataError: the row was not produced by ``hybrid_gui_tool``.
    """
    if mode not in ("path", "verifier"):
        raise ValueError(f"env reward mode must be 'path' or 'verifier', got {mode!r} (reward_kwargs.mode)")
    if tool_term not in TOOL_TERMS:
        raise ValueError(f"env reward tool_term must be one of {sorted(TOOL_TERMS)}, got {tool_term!r} "
                         "(reward.custom_reward_function.reward_kwargs.tool_term)")
    meta = step_metadata(extra_info)
    parts = reward_components(meta.extras, meta.valid, max_steps)
    if mode == "verifier":
        score = parts["success"]
    else:
        score = parts["format_ok"] + parts["success"] + tool_weight * parts[TOOL_TERMS[tool_term]]
    return {"score": score, **parts}


def group_path_reward(
    uid: np.ndarray, components: list[dict[str, float]], *, tool_weight: float = 0.4, length_weight: float = 0.2,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> np.ndarray:
    """The full ToolCUA reward over rollout groups (``uid``), with ``R_length`` from each group's
    mean step count. Invalid (faulted) rows are left out of the group mean and get NaN, so a caller
    cannot mistake them for failures. Shape (m,)."""
    from verl_ext.rewards.tool_path import tool_efficient_reward

    uid = np.asarray(uid)
    column = {key: np.array([c[key] for c in components]) for key in components[0]} if components else {}
    out = np.full(len(components), np.nan)
    keep = column.get("valid", np.ones(0)) > 0
    if keep.any():
        out[keep] = tool_efficient_reward(
            uid[keep], column["num_steps"][keep], column["success"][keep] > 0, column["format_ok"][keep],
            column["num_tool_calls"][keep], np.where(column["tool_beneficial"][keep] > 0, 1, -1),  # t_b
            tool_weight=tool_weight, length_weight=length_weight, max_steps=max_steps,
        )
    return out


def episode_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """OSWorld-MCP metrics over episodes (each a ``reward_components`` dict).

    accuracy: success rate. TIR (tool-invocation rate, ToolCUA's definition): a tool-beneficial
    episode counts when it succeeded using a tool, a non-beneficial one when it succeeded without
    tools. ACS: mean steps of successful episodes. Faulted episodes are excluded (``faults``);
    with no episode left there is no rate to report, so only ``episodes`` (0) and ``faults`` are.
    """
    valid = [r for r in records if r["valid"] > 0]
    n = len(valid)
    if n == 0:
        return {"episodes": 0.0, "faults": float(len(records))}
    successes = [r for r in valid if r["success"] > 0]
    return {
        "episodes": float(n),
        "faults": float(len(records) - n),
        "accuracy": len(successes) / n,
        "tir": sum(r["tool_ok"] for r in valid) / n,
        "acs": float(np.mean([r["num_steps"] for r in successes])) if successes else 0.0,
        "tool_use_rate": sum(r["used_tool"] for r in valid) / n,
        # the function-call format: episodes whose every turn held a call, and the share of such turns
        "format_ok": sum(r["format_ok"] for r in valid) / n,
        "valid_call_rate": float(np.mean([r["valid_call_rate"] for r in valid])),
    }


def training_batch_metrics(extra_fields: list[dict], max_steps: int = DEFAULT_MAX_STEPS) -> dict[str, float]:
    """``episode_metrics`` of the hybrid-env trajectories in a training batch, as verl metrics
    (``verl_ext/episode/*``). Rows without hybrid-env step metadata (padding, other envs) are
    skipped; a trajectory split over several rows (one row per turn) counts once."""
    from verl_ext.steps import EXTRA_FIELDS_KEY, StepMetadata

    records, seen = [], set()
    for fields in extra_fields:
        if not fields or EXTRA_FIELDS_KEY not in fields:
            continue
        meta = StepMetadata.from_extra_fields(fields)
        if "tool_beneficial" not in meta.extras or meta.traj_uid in seen:
            continue
        seen.add(meta.traj_uid)
        records.append(reward_components(meta.extras, meta.valid, max_steps))
    if not records:
        return {}
    return {f"verl_ext/episode/{key}": value for key, value in episode_metrics(records).items()}
