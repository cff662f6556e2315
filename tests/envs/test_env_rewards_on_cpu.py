"""The env reward function (verl ``custom_reward_function``), ToolCUA's path reward with the group
term, and the OSWorld-MCP metrics."""

from __future__ import annotations

import numpy as np
import pytest

from verl_ext.rewards.env_rewards import compute_score, episode_metrics, group_path_reward, reward_components
from verl_ext.steps import MissingStepMetadataError, StepMetadata


def row(success: bool, steps: int, tools: int, beneficial: bool, valid: bool = True, format_ok: bool = True) -> dict:
    meta = StepMetadata(traj_uid="t", step_idx=list(range(steps)), anchor=[""] * steps, step_reward=[0.0] * steps,
                        valid=valid, extras={"success": success, "num_steps": steps, "num_tool_calls": tools,
                                             "tool_beneficial": beneficial, "format_ok": format_ok})
    return {"index": 0, **meta.to_extra_fields()}  # as NaiveRewardManager merges extra_fields into extra_info


def test_compute_score_modes_and_components():
    out = compute_score("minidesk", "", None, row(True, 3, 1, beneficial=True))
    assert out["score"] == pytest.approx(1 + 1 + 0.4) and out["tool_ok"] == 1.0
    assert compute_score("minidesk", "", None, row(True, 3, 1, True), mode="verifier")["score"] == 1.0
    # Tool use on a task where tools do not help: no tool bonus.
    assert compute_score("minidesk", "", None, row(True, 2, 1, beneficial=False))["tool_ok"] == 0.0
    assert compute_score("minidesk", "", None, row(True, 2, 0, beneficial=False))["tool_ok"] == 1.0
    # Bonuses only on success.
    failed = compute_score("minidesk", "", None, row(False, 9, 2, beneficial=True))
    assert failed["score"] == 1.0 and failed["tool_ok"] == 0.0 and failed["len_gain"] == 0.0
    assert all(isinstance(v, float) for v in failed.values())


def test_validation_tool_beneficial_metric_is_the_share_of_tool_beneficial_rows():
    # verl's validation averages every reward extra per data source (val-aux/<source>/<key>/mean@1);
    # with half the rows tool-beneficial that must read 0.5, not the 0.0 that +1/-1 labels average to.
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    cases = [(True, 1, True), (True, 0, False), (True, 0, True), (True, 1, False), (False, 1, True), (False, 0, False),
             (True, 1, True), (True, 0, False)]  # (success, tool calls, tool-beneficial)
    outputs = [compute_score("minidesk", "", None, row(s, 3, c, beneficial=b)) for s, c, b in cases]
    infos = {key: [out[key] for out in outputs] for key in outputs[0]}
    metrics = process_validation_metrics(["verl_ext/minidesk"] * 8, [f"u{i}" for i in range(8)], infos)
    assert metrics["verl_ext/minidesk"]["tool_beneficial"]["mean@1"] == 0.5
    assert [out["tool_ok"] for out in outputs] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # R_tool unchanged


def test_faulted_episode_is_flagged_not_scored_as_failure():
    out = compute_score("minidesk", "", None, row(True, 3, 1, True, valid=False))
    assert out["valid"] == 0.0 and out["success"] == 0.0
    assert episode_metrics([out])["faults"] == 1.0 and episode_metrics([out])["episodes"] == 0.0


def test_missing_metadata_names_the_agent_loop_setting():
    with pytest.raises(MissingStepMetadataError, match="hybrid_gui_tool"):
        compute_score("minidesk", "", None, {"index": 0})
    with pytest.raises(ValueError, match="reward_kwargs.mode"):
        compute_score("minidesk", "", None, row(True, 1, 0, True), mode="x")


def test_group_path_reward_matches_the_worked_example():
    """ToolCUA (arXiv 2605.12481) worked check with λ=0.4, β=0.2: s_bar = 13.5, rewards [2.756, 2.267, 1.0, 0.0]."""
    extras = [(True, 3, 1, True), (True, 9, 0, True), (False, 30, 0, True), (False, 12, 0, True)]
    parts = [reward_components({"success": s, "num_steps": n, "num_tool_calls": c, "tool_beneficial": b,
                                "format_ok": i < 3}, valid=True) for i, (s, n, c, b) in enumerate(extras)]
    rewards = group_path_reward(np.zeros(4), parts)
    np.testing.assert_allclose(rewards, [2.756, 2.267, 1.0, 0.0], atol=1e-3)


def test_group_path_reward_leaves_faults_out_of_the_group_mean():
    parts = [reward_components({"success": True, "num_steps": 3, "num_tool_calls": 1, "tool_beneficial": True,
                                "format_ok": True}, valid=v) for v in (True, True, False)]
    parts[1]["num_steps"] = 9.0
    rewards = group_path_reward(np.zeros(3), parts)
    assert np.isnan(rewards[2])
    np.testing.assert_allclose(rewards[:2], group_path_reward(np.zeros(2), parts[:2]))


def test_episode_metrics_tir_and_acs():
    records = [reward_components(e, valid=True) for e in [
        {"success": True, "num_steps": 2, "num_tool_calls": 1, "tool_beneficial": True},    # TIR hit
        {"success": True, "num_steps": 6, "num_tool_calls": 0, "tool_beneficial": True},    # success, no tool
        {"success": True, "num_steps": 1, "num_tool_calls": 0, "tool_beneficial": False},   # TIR hit
        {"success": False, "num_steps": 30, "num_tool_calls": 3, "tool_beneficial": True},
    ]]
    m = episode_metrics(records)
    assert m["accuracy"] == 0.75 and m["tir"] == 0.5 and m["acs"] == pytest.approx(3.0)


def test_dataset_rows_are_balanced_and_splits_disjoint():
    from verl_ext.envs.dataset import minidesk_rows
    from verl_ext.envs.minidesk.env import list_templates

    train, val = minidesk_rows(76, 0, "train"), minidesk_rows(38, 0, "val")
    templates = [r["extra_info"]["env"]["task"] for r in train]
    assert {templates.count(t) for t in list_templates()} == {2}
    def tasks(rows: list[dict]) -> set[tuple[str, int]]:
        return {(r["extra_info"]["env"]["task"], r["extra_info"]["env"]["seed"]) for r in rows}

    assert not tasks(train) & tasks(val)
    assert all(r["agent_name"] == "hybrid_gui_tool" and r["prompt"][-1]["role"] == "user" for r in train)
    assert minidesk_rows(76, 0, "train") == train


def decided(success: bool, decisions: list[tuple[str, str]], tools: int = 1, beneficial: bool = True) -> dict:
    """A text_hybrid episode with ``(choice, better)`` per decision."""
    fields = row(success, 7, tools, beneficial)
    fields["verl_ext"]["extras"]["decisions"] = [{"choice": c, "better": b} for c, b in decisions]
    return fields


def test_per_decision_tool_term_is_the_share_of_decisions_done_the_shorter_way():
    # 4 decisions: 3 have a strictly shorter way (tool, tool, gui), 2 of them done that way; one has no tool
    decisions = [("tool", "tool"), ("gui", "tool"), ("gui", "gui"), ("gui", "none")]
    per_task = compute_score("text_hybrid", "", None, decided(True, decisions))
    assert per_task["score"] == pytest.approx(1 + 1 + 0.4 * 1)  # default: ToolCUA's per-task term (a tool was used)
    per_decision = compute_score("text_hybrid", "", None, decided(True, decisions), tool_term="decision")
    assert per_decision["decision_tool_ok"] == pytest.approx(2 / 3)
    assert per_decision["score"] == pytest.approx(1 + 1 + 0.4 * 2 / 3)  # 2.2667
    # gated by success, as the per-task term
    failed = compute_score("text_hybrid", "", None, decided(False, decisions), tool_term="decision")
    assert failed["score"] == 1.0 and failed["decision_tool_ok"] == 0.0
    # every decision right: the full bonus; no decision with a shorter way: the per-task term
    right = compute_score("text_hybrid", "", None, decided(True, [("tool", "tool"), ("gui", "gui")]), tool_term="decision")
    assert right["score"] == pytest.approx(2.4)
    no_scored = decided(True, [("gui", "none"), ("tool", "tie")], tools=1, beneficial=False)
    assert compute_score("text_hybrid", "", None, no_scored, tool_term="decision")["score"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="reward_kwargs.tool_term"):
        compute_score("text_hybrid", "", None, decided(True, decisions), tool_term="step")
