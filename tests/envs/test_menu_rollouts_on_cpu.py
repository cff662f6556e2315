"""The T/G menu's rollouts (``verl_ext.agent_loops.menu_rollouts``): UI-S1's semi-online patch rule
and the planner/executor rollout, played on TextHybrid without a trainer, then through the
``hybrid_gui_tool`` loop with a scripted server (verl's real Continuous-Token helpers)."""

from __future__ import annotations

import asyncio

import pytest

from verl_ext.agent_loops.menu_rollouts import (
    PlanExecutePlay, SemiOnlinePlay, make_player, matches_reference, plan_segment, recorded_fields, uis1_step_score,
)
from verl_ext.envs.text_hybrid import TextHybridEnv
from verl_ext.envs.text_hybrid_apps import APPS

from .test_agent_loop_on_cpu import ScriptedServer, make_loop, tokenizer  # noqa: F401  (tokenizer: a fixture)
from .test_text_hybrid_on_cpu import env  # noqa: F401  (a fixture)

LETTER = {"tool": "T", "gui": "G"}


def _play(env: TextHybridEnv, start, answer, max_turns: int = 60) -> tuple[list, dict, dict]:  # noqa: F811
    """Answer ``answer(turn index, player)`` each turn until the episode or the player stops;
    (turns, last step info, counts). ``start``: ``(info, player, obs)`` of ``_reset``."""
    _, player, obs = start
    turns, step_info = [], {}
    for i in range(max_turns):
        turn = player.turn(answer(i, player), obs)
        turns.append(turn)
        if turn.stop:
            return turns, step_info, dict(env.counts)
        action = turn.action
        while action is not None:
            obs, _, terminated, truncated, step_info = env.step(action)
            if terminated or truncated:
                return turns, step_info, dict(env.counts)
            action = player.follow_up(obs)
    raise AssertionError("episode did not end")


def _reset(env: TextHybridEnv, template: str, seed: int, rollout: str, **kwargs):  # noqa: F811
    obs, info = env.reset(seed=seed, options={"task": template})
    return info, make_player(rollout, info, **kwargs), obs


def test_uis1_score_and_match():
    assert uis1_step_score(True, True) == pytest.approx(1.0)
    assert uis1_step_score(True, False) == pytest.approx(0.1)
    assert uis1_step_score(False, False) == 0.0
    assert matches_reference("gui", "gui") and not matches_reference("tool", "gui")
    assert not matches_reference(None, "gui")
    assert recorded_fields({"rollout": "semi_online"}) == {"action_match"}
    assert recorded_fields({"rollout": "plan_execute"}) == {"role", "subgoal"}
    assert recorded_fields({}) == frozenset()


def test_plan_segment_splits_a_plan_into_one_line_per_step():
    steps = [{"gui": "click", "k": "tab:2"}, {"tool": "set_value", "args": {"x": 1}}]
    assert plan_segment("gui", steps) == ["gui 1/2: click tab:2", "gui 2/2: call set_value"]
    assert plan_segment("tool", []) == []


@pytest.mark.parametrize("template", list(APPS))
def test_semi_online_the_reference_answers_match_every_step_and_replay_the_oracle(env, template):  # noqa: F811
    for seed in range(4):
        start = _reset(env, template, seed, "semi_online")
        info, player, _ = start
        turns, step_info, counts = _play(env, start, lambda i, p: LETTER[p.reference[p.menu.decision]])
        assert step_info["success"] and counts["steps"] == info["ref_steps"]["oracle"]
        assert [t.match for t in turns] == [True] * len(info["decisions"])
        assert all(t.reward == pytest.approx(1.0) for t in turns) and player.patches == 0


@pytest.mark.parametrize("template", list(APPS))
def test_semi_online_patches_mismatches_onto_the_reference_path(env, template):  # noqa: F811
    # No answer at all: every step mismatches, is patched (no limit), and the episode still walks the oracle path.
    for seed in range(4):
        start = _reset(env, template, seed, "semi_online", patch_threshold=-1)
        info, player, _ = start
        turns, step_info, counts = _play(env, start, lambda i, p: "??")
        assert step_info["success"] and counts["steps"] == info["ref_steps"]["oracle"]
        assert [t.match for t in turns] == [False] * len(info["decisions"])
        assert [t.valid_format for t in turns] == [False] * len(info["decisions"])
        assert all(t.reward == 0.0 for t in turns) and player.patches == len(info["decisions"])
        assert [d["choice"] for d in (t.decision for t in turns)] == [d["oracle"] for d in info["decisions"]]


def test_semi_online_stops_after_the_patch_threshold(env):  # noqa: F811
    start = _reset(env, "file_manager", 3, "semi_online", patch_threshold=2)
    info, player, _ = start
    assert len(info["decisions"]) > 3
    # the reference answer first, then answers that name no option
    turns, _, _ = _play(env, start, lambda i, p: LETTER[p.reference[0]] if i == 0 else "??")
    assert [t.match for t in turns] == [True, False, False, False]
    assert [bool(t.action) for t in turns] == [True, True, True, False] and turns[-1].stop == "patch_threshold"
    assert player.patches == 3
    assert [t.reward for t in turns] == [pytest.approx(1.0), 0.0, 0.0, 0.0]


@pytest.mark.parametrize("template", list(APPS))
def test_plan_execute_a_planner_turn_per_subgoal_then_its_steps(env, template):  # noqa: F811
    for seed, letter in ((0, "T"), (1, "G")):
        start = _reset(env, template, seed, "plan_execute")
        info, player, _ = start
        assert isinstance(player, PlanExecutePlay)
        turns, step_info, counts = _play(env, start, lambda i, p, a=letter: a)
        plan = info["plans"]["tool" if letter == "T" else "gui"]
        assert step_info["success"] and counts["steps"] == len(plan)
        roles = [t.role for t in turns]
        assert roles.count("planner") == len(info["decisions"]) and roles.count("executor") == len(plan)
        assert roles[0] == "planner" and all(t.action is None for t in turns if t.role == "planner")
        # each planner turn opens the segment of its subgoal; its executors carry the same key
        keys = [t.subgoal for t in turns]
        starts = [i for i, r in enumerate(roles) if r == "planner"]
        for k, (a, b) in enumerate(zip(starts, [*starts[1:], len(turns)]), 1):
            assert set(keys[a:b]) == {f"subgoal {k}"}


def test_plan_execute_a_turn_without_an_option_is_wasted_and_asked_again(env):  # noqa: F811
    start = _reset(env, "file_manager", 3, "plan_execute")
    info, player, _ = start
    answers = ["xx", "T", "xx", "xx"]  # a wasted planner turn, a plan, two wasted executor turns, then T
    turns, step_info, counts = _play(env, start, lambda i, p: answers[i] if i < len(answers) else "T")
    assert step_info["success"] and counts["steps"] == len(info["plans"]["tool"])
    assert [(t.role, t.valid_format, t.action is None) for t in turns[:5]] == [
        ("planner", False, True), ("planner", True, True), ("executor", False, True), ("executor", False, True),
        ("executor", True, False)]
    assert {t.subgoal for t in turns[:5]} == {"subgoal 1"} and not any(t.stop for t in turns)


def test_rollouts_other_than_free_need_text_hybrids_decisions():
    with pytest.raises(ValueError, match="text_hybrid"):
        make_player("semi_online", {"plans": {"gui": [], "tool": []}})
    with pytest.raises(ValueError, match="rollout must be one of"):
        make_player("offline", {})
    assert isinstance(make_player("semi_online", {"decision_table": [{0: {}}], "decisions": []}), SemiOnlinePlay)


def _loop_episode(tokenizer, replies, **loop_kwargs):  # noqa: F811
    server = ScriptedServer(tokenizer, [lambda prompt, r=r: r for r in replies])

    async def episode():
        loop = make_loop(tokenizer, server, action_format="menu", max_steps=40, **loop_kwargs)
        loop.max_turns = 40  # make_loop's multi_turn.max_assistant_turns is 10; a planned episode takes more turns
        extra_info = {"env": {"backend": "text_hybrid", "task": "file_manager", "seed": 3}}
        return await loop.run({"temperature": 1.0}, raw_prompt=[], extra_info=extra_info)

    return asyncio.run(episode()), server


def test_loop_semi_online_records_action_match_per_step(tokenizer):  # noqa: F811
    from verl_ext.steps import step_metadata

    out, server = _loop_episode(tokenizer, ["x"] * 10, rollout="semi_online", patch_threshold=1)
    meta = step_metadata(out.extra_fields)
    assert meta.action_match == [False, False] and meta.role is None
    assert meta.extras["stop_reason"] == "patch_threshold" and meta.extras["patches"] == 2
    assert meta.step_reward == [0.0, 0.0]
    assert "replaced by the reference answer" in server.prompts[1]


def test_loop_plan_execute_records_roles_and_subgoals(tokenizer):  # noqa: F811
    from verl_ext.envs.text_hybrid import make_task
    from verl_ext.steps import step_metadata

    _, plans, _ = make_task("file_manager", 3)
    n = len(plans.decisions) + len(plans.tool)
    out, server = _loop_episode(tokenizer, ["T"] * n, rollout="plan_execute")
    meta = step_metadata(out.extra_fields)
    assert meta.extras["success"] is True and meta.num_steps == n
    assert meta.role[0] == "planner" and meta.role.count("planner") == len(plans.decisions)
    assert meta.subgoal[0] == "subgoal 1" and meta.subgoal[-1] == f"subgoal {len(plans.decisions)}"
    assert meta.action_match is None and meta.step_reward[-1] == 1.0  # the env's success reward
    assert "Execute subgoal 1" in server.prompts[1]


def test_loop_refuses_a_rollout_outside_the_menu(tokenizer):  # noqa: F811
    with pytest.raises(ValueError, match="action_format=menu"):
        make_loop(tokenizer, ScriptedServer(tokenizer, []), rollout="semi_online")


def test_semi_online_without_a_reference_answer_any_option_matches_and_no_option_is_patched(env):  # noqa: F811
    obs, info = env.reset(seed=3, options={"task": "file_manager"})
    for text, match in (("T", True), ("??", False)):
        player = make_player("semi_online", info, patch_threshold=-1)
        player.reference = []  # as past the reference's last decision
        turn = player.turn(text, obs)
        assert turn.match is match and turn.action is not None and player.patches == (not match)
