"""What the ``hybrid_gui_tool`` loop records of an episode beyond the shared ``Episode``, and the
one writer of its step metadata (both action formats, both layouts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_ext.agent_loops.episode import Episode
from verl_ext.envs import menu
from verl_ext.envs.core import Observation
from verl_ext.steps import StepMetadata


@dataclass
class HybridEpisode(Episode):
    """The shared records plus the hybrid env's: its observation, counts, final-state artifact, the
    text_hybrid decisions taken, and the menu rollouts' optional per-step fields."""

    obs: Observation | None = None
    counts: dict[str, int] = field(default_factory=dict)
    artifact: dict[str, Any] = field(default_factory=dict)
    decisions: list[dict[str, str]] = field(default_factory=list)  # {choice, better} per decision (text_hybrid)
    follower: menu.DecisionFollower | None = None  # tool_call format: which decisions the calls take
    matches: list[bool] = field(default_factory=list)  # per step: action_match (rollout=semi_online)
    roles: list[str] = field(default_factory=list)  # per step: role (rollout=plan_execute)
    subgoals: list[str | None] = field(default_factory=list)  # per step: subgoal key (rollout=plan_execute)
    recorded: frozenset[str] = frozenset()  # which of the three lists above go into StepMetadata
    counts_extra: dict[str, int] = field(default_factory=dict)  # rollout-specific counts for extras


def write_step_metadata(episode: HybridEpisode, traj_uid: str, step: int | None = None) -> StepMetadata:
    """The one writer of this loop's ``extra_fields["verl_ext"]`` (contract: ``verl_ext.steps``;
    layouts: ``StepMetadata.of_row``). Episode-level ``extras`` are the same on every row."""
    counts = episode.counts
    return StepMetadata.of_row(
        traj_uid, step, anchors=episode.anchors, step_rewards=episode.rewards, spans=episode.spans,
        action_valid=episode.action_valid,
        action_match=episode.matches if "action_match" in episode.recorded else None,
        role=episode.roles if "role" in episode.recorded else None,
        subgoal=episode.subgoals if "subgoal" in episode.recorded else None,
        valid=episode.fault is None,
        invalid_reason=f"env_fault:{episode.fault['kind']}" if episode.fault else "",
        truncated=episode.truncated,
        extras={
            "success": episode.success,
            "num_steps": counts.get("steps", 0),
            "num_tool_calls": counts.get("tool", 0),
            "num_tool_calls_ok": counts.get("tool_succeeded", 0),
            "num_gui_steps": counts.get("gui", 0),
            "num_invalid_actions": counts.get("invalid", 0),
            "format_ok": bool(episode.anchors) and all(episode.action_valid),
            "valid_calls": sum(episode.action_valid),  # model turns holding exactly one parseable call
            "tool_beneficial": episode.reset_info.get("tool_beneficial"),
            "ref_steps": episode.reset_info.get("ref_steps"),
            "task": episode.reset_info.get("task"),
            "seed": episode.reset_info.get("seed"),
            "actions": episode.actions,
            "stop_reason": episode.stop_reason,
            "env_fault": episode.fault,
            "artifact": episode.artifact,
            "dv_questions": episode.reset_info.get("dv_questions"),  # DVReward questions (MiniDesk)
            "decisions": episode.decisions,  # text_hybrid: {choice, better} per decision (menu answers, or calls)
            **episode.counts_extra,  # rollout=semi_online: patches
        },
    )
