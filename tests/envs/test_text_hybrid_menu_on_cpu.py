"""The T/G menu on text_hybrid (``verl_ext.envs.menu.DecisionMenu``): one answer per decision
(subgoal), so the oracle's mixed path is a sequence of answers and all-T / all-G replay the pure
plans; and the ``hybrid_gui_tool`` loop playing it (``action_format=menu``) with a real tokenizer.
No browser."""

from __future__ import annotations

import asyncio

import pytest

from verl_ext.envs.menu import PlanMenu, make_menu
from verl_ext.envs.text_hybrid import TextHybridEnv, decision_table, make_task
from verl_ext.envs.text_hybrid_apps import APPS
from verl_ext.rewards.env_rewards import decision_counts, reward_components

from .test_agent_loop_on_cpu import ScriptedServer, make_loop, tokenizer  # noqa: F401  (tokenizer: a fixture)
from .test_text_hybrid_on_cpu import env  # noqa: F401  (a fixture)

SEEDS = range(12)


def _play(env: TextHybridEnv, template: str, seed: int, answers) -> tuple[dict, dict, list[dict]]:
    """Answer ``answers(i, info)`` at decision ``i`` until the episode ends; (step info, counts, decisions)."""
    obs, info = env.reset(seed=seed, options={"task": template})
    menu = make_menu(info)
    decisions = []
    for i in range(len(info["decisions"]) + 1):
        mode = answers(i, info)
        action = menu.action(mode, obs)
        assert action is not None, (template, seed, i)
        decisions.append(menu.advance(mode))
        while action is not None:
            obs, _, terminated, truncated, step_info = env.step(action)
            if terminated or truncated:
                return step_info, dict(env.counts), decisions
            action = menu.follow_up(obs)
    raise AssertionError("episode did not end after its last decision")


@pytest.mark.parametrize("template", list(APPS))
def test_all_t_and_all_g_replay_the_pure_plans(env, template):  # noqa: F811
    for seed in SEEDS:
        for mode in ("tool", "gui"):
            info, counts, _ = _play(env, template, seed, lambda i, _, m=mode: m)
            plan = env.reset(seed=seed, options={"task": template})[1]["plans"][mode]
            assert info["success"], (template, seed, mode)
            assert counts["steps"] == len(plan)
            assert counts["tool"] == sum("tool" in step for step in plan)


@pytest.mark.parametrize("template", list(APPS))
def test_the_oracles_answers_reproduce_the_oracle_path(env, template):  # noqa: F811
    shorter = 0
    for seed in SEEDS:
        info, counts, decisions = _play(env, template, seed, lambda i, reset: reset["decisions"][i]["oracle"])
        ref = env.reset(seed=seed, options={"task": template})[1]["ref_steps"]
        assert info["success"] and counts["steps"] == ref["oracle"], (template, seed)
        # along the oracle's path its answer is never the strictly longer one
        assert all(d["better"] in (d["choice"], "tie", "none") for d in decisions)
        shorter += ref["oracle"] < min(ref["gui"], ref["tool"])
    assert shorter > 0  # the menu reaches mixed paths that beat both pure plans


def test_the_shorter_answer_changes_from_decision_to_decision():
    """Within one task, tools are strictly shorter at some decisions and the GUI at others."""
    both = 0
    for template in APPS:
        for seed in SEEDS:
            app, plans, _ = make_task(template, seed)
            labels = {d["better"] for row in decision_table(app.subgoals, app.view) for d in row.values()}
            both += {"tool", "gui"} <= labels
    assert both >= len(APPS) * len(SEEDS) // 3


def _cost(table, first: str) -> int:
    """Steps to finish the task answering ``first`` at decision 0, then the shorter answer
    (``better``; GUI on ties and where there is no tool) at every later decision."""
    view, total = next(iter(table[0])), 0
    for i, row in enumerate(table):
        option = row[view]
        mode = first if i == 0 else ("tool" if option["better"] == "tool" else "gui")
        if mode == "tool" and option["tool"] is not None:
            total += len(option["tool"])
        else:
            total, view = total + len(option["gui"]), option["after"]
    return total


@pytest.mark.parametrize("template", list(APPS))
def test_a_wrong_answer_costs_path_length(template):
    """Where one answer is strictly shorter, the other one lengthens the whole path; the labels
    followed from the start give the oracle's length."""
    strict = 0
    for seed in SEEDS:
        app, plans, _ = make_task(template, seed)
        table = decision_table(app.subgoals, app.view)
        (first,) = table[0].values()
        right = "tool" if first["better"] == "tool" else "gui"
        assert _cost(table, right) == len(plans.oracle)
        if first["better"] in ("tool", "gui"):
            strict += 1
            assert _cost(table, "gui" if right == "tool" else "tool") > len(plans.oracle)
    assert strict > 0


def test_minidesk_still_gets_the_step_menu():
    assert isinstance(make_menu({"plans": {"tool": [], "gui": []}}), PlanMenu)
    with pytest.raises(ValueError, match="decision_table"):
        make_menu({})


def test_decision_counts_and_the_tool_use_split():
    decisions = [{"choice": "tool", "better": "tool"}, {"choice": "gui", "better": "tool"},
                 {"choice": "tool", "better": "gui"}, {"choice": "gui", "better": "none"}]
    assert decision_counts(decisions) == {"decisions_tool": 2.0, "decisions_tool_tool": 1.0,
                                          "decisions_gui": 1.0, "decisions_gui_tool": 1.0}
    parts = reward_components({"num_tool_calls": 2, "tool_beneficial": True, "decisions": decisions}, valid=True)
    assert parts["used_tool_beneficial"] == 1.0 and parts["decisions_tool"] == 2.0
    assert reward_components({"num_tool_calls": 2, "tool_beneficial": False}, valid=True)["used_tool_beneficial"] == 0.0


def test_menu_loop_plays_decisions_and_records_them(tokenizer):  # noqa: F811
    from verl_ext.steps import step_metadata

    _, plans, _ = make_task("file_manager", 3)
    replies = ["T"] * 8
    server = ScriptedServer(tokenizer, [lambda prompt, r=r: r for r in replies])

    async def episode():
        loop = make_loop(tokenizer, server, action_format="menu", max_steps=40)
        extra_info = {"env": {"backend": "text_hybrid", "task": "file_manager", "seed": 3}}
        return await loop.run({"temperature": 1.0}, raw_prompt=[], extra_info=extra_info)

    out = asyncio.run(episode())
    meta = step_metadata(out.extra_fields)
    assert meta.extras["success"] is True and meta.extras["stop_reason"] == "terminated"
    assert meta.num_steps == len(plans.decisions)  # one model turn per decision
    assert meta.extras["num_steps"] == len(plans.tool)  # ... each taking that answer's env steps
    assert len(meta.extras["decisions"]) == len(plans.decisions)
    assert "Decision 1/" in server.prompts[0] and "Options: T) " in server.prompts[0]
