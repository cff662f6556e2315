"""The T/G action menu (``verl_ext.envs.menu``) on real MiniDesk pages, and the ``hybrid_gui_tool``
loop in ``action_format=menu`` with verl's Continuous-Token helpers and the tiny tokenizer."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from verl_ext.envs.core import GuiAction, ToolCall
from verl_ext.envs.menu import PlanMenu, describe, parse_choice

from .test_agent_loop_on_cpu import ScriptedServer, make_loop, tokenizer  # noqa: F401  (tokenizer: a fixture)


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    """The loop leases envs from process-wide pools; close their browsers after this module."""
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


def test_the_menu_imports_only_the_plan_steps_not_the_policies():
    """The policies use the menu (``action_format=menu``); the menu needs only the plan-step
    conversion (``verl_ext.envs.plans``), so the two modules do not import each other."""
    probe = "import sys, verl_ext.envs.menu; print('verl_ext.envs.policies' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parse_choice_takes_the_first_t_or_g_letter():
    assert parse_choice("T") == "tool"
    assert parse_choice(" g!") == "gui"
    assert parse_choice("xyzgT") == "gui"  # first letter wins, any case
    assert parse_choice("abc 123") is None
    assert parse_choice("") is None


def test_describe_is_short_and_readable():
    assert describe(None) == "unavailable"
    assert describe(GuiAction("done")) == "done"
    assert describe(GuiAction("click", element=7)) == "click #7"
    long = describe(ToolCall("mail_send", {"to": "a@b.c", "subject": "x" * 80, "body": "y"}))
    assert long.startswith("call mail_send(") and len(long) <= 48 and long.endswith("...")


def test_menu_needs_reference_plans():
    with pytest.raises(ValueError, match="MiniDesk"):
        PlanMenu({"tool": []})


def _play(env, template: str, seed: int, letters: str):
    """Answer ``letters`` in turn (the last one repeats) until the episode ends."""
    obs, info = env.reset(seed=seed, options={"task": {"template": template, "seed": seed}})
    menu = PlanMenu(info["plans"])
    for i in range(10):
        mode = parse_choice(letters[min(i, len(letters) - 1)])
        action = menu.action(mode, obs)
        assert action is not None, (template, i, menu.render(obs))
        menu.advance(mode)
        obs, _, terminated, truncated, step_info = env.step(action)
        if terminated or truncated:
            return step_info, env.counts
    raise AssertionError("episode did not end")


@pytest.mark.browser
def test_tool_path_and_gui_path_both_solve_a_tool_beneficial_task(minidesk):
    info, counts = _play(minidesk, "mail_send", 5, "T")
    assert info["success"] and (counts["steps"], counts["tool"]) == (1, 1)
    info, counts = _play(minidesk, "mail_send", 5, "G")
    assert info["success"] and counts["tool"] == 0 and counts["steps"] > 1


@pytest.mark.browser
def test_mixing_paths_works_when_the_plans_commute(minidesk):
    # mail_reply: open the mail app by GUI, then send the reply with the tool.
    info, counts = _play(minidesk, "mail_reply", 2, "GT")
    assert info["success"] and (counts["gui"], counts["tool"]) == (1, 1)


@pytest.mark.browser
def test_options_name_the_next_step_of_each_plan(minidesk):
    obs, info = minidesk.reset(seed=1, options={"task": {"template": "settings_theme", "seed": 1}})
    text = PlanMenu(info["plans"]).render(obs)
    assert text.startswith("T) call settings_set(") and " | G) select #" in text


def _menu_episode(tokenizer, replies: list[str], template: str, seed: int, **loop_kwargs):
    server = ScriptedServer(tokenizer, [lambda prompt, r=r: r for r in replies])

    async def episode():
        loop = make_loop(tokenizer, server, action_format="menu", max_steps=6, **loop_kwargs)
        extra_info = {"env": {"backend": "minidesk", "task": template, "seed": seed}}
        return await loop.run({"temperature": 1.0}, raw_prompt=[], extra_info=extra_info)

    return asyncio.run(episode()), server


@pytest.mark.browser
def test_menu_loop_records_steps_spans_and_versions(tokenizer):  # noqa: F811
    from verl_ext.steps import step_metadata

    out, server = _menu_episode(tokenizer, ["G", "T"], "mail_reply", 2)
    meta = step_metadata(out.extra_fields)
    assert meta.action_valid == [True, True] and meta.num_steps == 2
    assert meta.extras["success"] is True and meta.extras["stop_reason"] == "terminated"
    assert (meta.extras["num_gui_steps"], meta.extras["num_tool_calls"]) == (1, 1)
    assert meta.extras["format_ok"] is True
    assert meta.extras["actions"][0].startswith("gui: click #") and meta.extras["actions"][1].startswith("tool: call mail_send")
    assert server.prompts[0].count("Options: T) call mail_send") == 1
    assert "Step 1: ok" in server.prompts[1]
    for start, end in meta.spans:
        assert end > start and all(out.response_mask[start:end])
    assert sum(out.response_mask) == sum(end - start for start, end in meta.spans)
    versions = out.extra_fields["token_global_steps"]
    assert [set(versions[a:b]) for a, b in meta.spans] == [{1}, {2}]


@pytest.mark.browser
def test_an_answer_without_a_choice_ends_the_episode(tokenizer):  # noqa: F811
    from verl_ext.steps import step_metadata

    out, _ = _menu_episode(tokenizer, ["hmm", "T"], "mail_send", 4)
    meta = step_metadata(out.extra_fields)
    assert meta.action_valid == [False] and meta.extras["stop_reason"] == "no_valid_choice"
    assert meta.extras["success"] is False and meta.extras["num_steps"] == 0 and meta.extras["format_ok"] is False


@pytest.mark.browser
def test_menu_loop_is_rejected_for_the_per_turn_layout(tokenizer):  # noqa: F811
    with pytest.raises(ValueError, match="layout=trajectory"):
        make_loop(tokenizer, ScriptedServer(tokenizer, []), action_format="menu", layout="per_turn")
