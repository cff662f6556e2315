"""TextHybrid (``verl_ext.envs.text_hybrid``): the browserless hybrid GUI + tool env, its reference
plans (GUI-only, tool-preferring, oracle), its DVReward questions, faults, the pool, the dataset rows,
and the ``hybrid_gui_tool`` agent loop playing it with verl's real hermes parser and a real tokenizer.
No browser anywhere: nothing here is marked ``browser``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import pytest

from verl_ext.envs.core import GuiAction, ToolCall
from verl_ext.envs.plans import plan_step_action
from verl_ext.envs.policies import RandomPolicy, make_policy
from verl_ext.envs.text_hybrid import (
    MIXED_SHARE,
    InjectScreenCrash,
    ShowTodo,
    TextHybridEnv,
    check,
    make_task,
    questions_of,
    text_hybrid_rows,
)
from verl_ext.envs.text_hybrid_apps import APPS

from .test_agent_loop_on_cpu import ScriptedServer, call, make_loop

TEMPLATES = list(APPS)
MODES = ("gui", "tool", "oracle")


@pytest.fixture
def env():
    env = TextHybridEnv()
    env.ensure_screen()
    yield env
    env.close()


def play(env: TextHybridEnv, policy: Any, template: str, seed: int) -> dict[str, Any]:
    obs, info = env.reset(seed=seed, options={"task": template})
    policy.reset(obs, info, env.tool_schemas())
    done, step_info, reward = False, {}, 0.0
    while not done:
        obs, reward, terminated, truncated, step_info = env.step(policy.act(obs))
        done = terminated or truncated
    return {"info": info, "success": step_info.get("success", False), "reward": reward, **env.counts}


# --- plans and the when-to-switch structure --------------------------------------------------------
@pytest.mark.parametrize("template", TEMPLATES)
def test_every_scripted_policy_solves_every_task_in_exactly_its_plan_length(env, template):
    for seed in range(25):
        for mode in MODES:
            result = play(env, make_policy(f"scripted-{mode}"), template, seed)
            ref = result["info"]["ref_steps"]
            assert result["success"] and result["reward"] == 1.0, (template, seed, mode)
            assert result["steps"] == ref[mode] and result["invalid"] == 0, (template, seed, mode, result)
            if mode == "gui":
                assert result["tool"] == 0
        assert ref["oracle"] <= min(ref["gui"], ref["tool"])


def test_oracle_is_strictly_shorter_than_both_pure_policies_on_the_stated_share():
    """The stated share: the tasks of the ``mixed`` variant, MIXED_SHARE (2/3) of seeds. Measured
    on 4 templates x 60 seeds; every other task is GUI-optimal (no tool call shortens it)."""
    tasks = [(t, s) for t in TEMPLATES for s in range(60)]
    strictly, beneficial = 0, 0
    for template, seed in tasks:
        app, plans, variant = make_task(template, seed)
        gui, tool, oracle = len(plans.gui), len(plans.tool), len(plans.oracle)
        assert len(plans.decisions) == len(app.subgoals) >= 4
        shorter = oracle < gui and oracle < tool
        assert shorter == (variant == "mixed"), (template, seed)
        uses_tool = any(d["oracle"] == "tool" for d in plans.decisions)
        assert uses_tool or variant == "mixed" or oracle == gui
        strictly += shorter
        beneficial += uses_tool
    share = strictly / len(tasks)
    assert abs(share - MIXED_SHARE) < 0.1 and share >= 0.6, share
    assert 0.5 < beneficial / len(tasks) < 0.85  # both kinds of task for the when-to-switch metric


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_better_choice_depends_on_the_step(template):
    """Within a template, the oracle takes the GUI where a tool exists and the tool elsewhere:
    neither pure policy is right at every step."""
    decisions = [d for s in range(40) for d in make_task(template, s)[1].decisions]
    with_tool = [d for d in decisions if d["tool_steps"] is not None]
    assert any(d["oracle"] == "tool" for d in with_tool)
    assert any(d["oracle"] == "gui" for d in with_tool)
    assert any(d["shorter"] == "tool" for d in decisions) and any(d["shorter"] == "gui" for d in decisions)


def test_a_step_takes_well_under_a_millisecond(env):
    durations = []
    for template in TEMPLATES:
        for seed in range(10):
            obs, info = env.reset(seed=seed, options={"task": template})
            for step in info["plans"]["oracle"]:
                action = plan_step_action(step, obs)
                start = time.perf_counter()
                obs, *_ = env.step(action)
                durations.append(time.perf_counter() - start)
    assert statistics.median(durations) < 1e-3, statistics.median(durations)


# --- observations, actions, errors ---------------------------------------------------------------
def test_observation_is_numbered_text_and_tools_have_schemas(env):
    obs, info = env.reset(seed=3, options={"task": "settings_panel"})
    text = obs.render()
    assert text.startswith("Task: In the Settings app, do all of the following: (1) ")
    assert "[1] tab " in text and "Step 0/30" in text
    names = [s["function"]["name"] for s in env.tool_schemas()]
    assert names[0] == "computer_use" and "settings_set" in names and len(names) == 1 + 2 + 2  # + 2 distractors
    setting_key = next(s for s in env.tool_schemas() if s["function"]["name"] == "settings_set")
    assert "night_light" not in setting_key["function"]["parameters"]["properties"]["key"]["enum"]
    assert json.loads(json.dumps(env.state_dump()))["template"] == "settings_panel"


@pytest.mark.parametrize("template", TEMPLATES)
def test_show_todo_lists_the_items_not_done_yet(template):
    """show_todo: each observation ends with the instruction's items whose questions do not all hold,
    so along the oracle's plan the list only shrinks; without it the observation has no such line."""
    env = ShowTodo(TextHybridEnv())
    obs, info = env.reset(seed=5, options={"task": template})
    assert "To do:" not in TextHybridEnv().reset(seed=5, options={"task": template})[0].render()
    app = env.app
    lists = [obs.todo]
    for step in info["plans"]["oracle"]:
        obs, _, terminated, _, _ = env.step(plan_step_action(step, obs))
        lists.append(obs.todo)
        assert obs.render(include_instruction=False).splitlines()[-1] == "To do: " + ("; ".join(obs.todo) or "nothing")
    env.close()
    texts = [f"({i}) {goal.text}" for i, goal in enumerate(app.subgoals, 1)]
    assert lists[0] == tuple(texts) and lists[-1] == () and terminated
    assert all(set(later) <= set(earlier) for earlier, later in zip(lists, lists[1:]))
    assert all(item in texts for items in lists for item in items)


def test_bad_actions_are_results_not_exceptions(env):
    obs, _ = env.reset(seed=1, options={"task": "contacts_book"})
    button = next(e.id for e in obs.elements if e.role == "button" and e.text == "Add contact")
    cases = [
        (GuiAction("click", element=999), "no element [999]"),
        (GuiAction("type", element=button, text="x"), "not a text field"),
        (GuiAction("click", element=button), "fill in the new contact"),
        (GuiAction("answer", text="42"), "asks no question"),
        (GuiAction("click_at", x=1, y=2), "has none"),
        (ToolCall("contacts_update", {"id": 1, "phone": "1"}), "no contact with id 1"),
        (ToolCall("contacts_update", {"phone": "1"}), "missing required argument(s) ['id']"),
        (ToolCall("settings_set", {"key": "wifi", "value": "on"}), "unknown tool 'settings_set'"),
    ]
    for action, message in cases:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not obs.last_result["success"] and message in obs.last_result["error_message"], (action, obs.last_result)
        assert not (terminated or truncated) and info["fault"] is None
    assert env.counts["invalid"] == 7  # every action but the failed tool call (a tool result, not an invalid action)
    assert (env.counts["tool"], env.counts["tool_succeeded"]) == (3, 0)  # three tool calls, none the app carried out
    obs, *_ = env.step(ToolCall("contacts_find", {"name": "a"}))
    assert obs.last_result["success"] and obs.last_result["result"][0]["id"] >= 100
    assert (env.counts["tool"], env.counts["tool_succeeded"]) == (4, 1)
    obs, _, terminated, _, _ = env.step(GuiAction("done"))
    assert terminated


# --- DVReward questions ---------------------------------------------------------------------------
@pytest.mark.parametrize("template", TEMPLATES)
def test_questions_are_valid_no_at_start_and_yes_when_solved(env, template):
    from verl_ext.rewards.dvreward.question_set import from_extra_info

    for seed in range(10):
        obs, info = env.reset(seed=seed, options={"task": template})
        record = info["dv_questions"]
        questions = questions_of(env.app)
        assert [q["text"] for q in record["questions"]] == [q[0] for q in questions]
        assert record["version"] == "text-hybrid-v1" and from_extra_info(info, "dv_questions") is not None
        # Each subgoal's change is not there yet; DSG children point at earlier questions.
        assert not check(env.app) and not obs.last_result
        start = {t: holds(env.app) for t, kind, _, holds in questions if kind == "semantic"}
        assert not any(start.values()), [t for t, v in start.items() if v]
        assert all(p < i for i, q in enumerate(record["questions"]) for p in q["parents"])
        for step in info["plans"]["oracle"]:
            obs, *_ = env.step(plan_step_action(step, obs))
        assert check(env.app) and all(holds(env.app) for *_, holds in questions)


def test_random_states_pass_the_verifier_only_when_every_question_is_yes(env):
    """``check`` is the conjunction of the questions' predicates, so the DVReward questions and the
    verifier agree on every state, including states random play leaves (collateral changes)."""
    seen_quality_no = 0
    for template in TEMPLATES:
        for seed in range(15):
            result = play(env, RandomPolicy(seed, tool_prob=0.5), template, seed)
            answers = [holds(env.app) for *_, holds in questions_of(env.app)]
            assert result["success"] == check(env.app) == all(answers)
            quality = [holds(env.app) for _, kind, _, holds in questions_of(env.app) if kind == "quality"]
            seen_quality_no += not all(quality)
    assert seen_quality_no > 0  # random play does make collateral changes the quality questions catch


# --- faults, pool, registration -------------------------------------------------------------------
def test_injected_crash_is_a_fault_and_the_pool_restarts_the_screen():
    from verl_ext.envs.pool import EnvPool

    pool = EnvPool(lambda: InjectScreenCrash(TextHybridEnv(), 1.0), max_envs=1)
    with pool.lease() as env:
        obs, info = pool.reset(env, seed=2, options={"task": "file_manager"})
        for step in info["plans"]["oracle"]:
            obs, reward, terminated, truncated, step_info = env.step(plan_step_action(step, obs))
            if step_info["fault"]:
                break
        assert step_info["fault"]["kind"] == "browser_crash" and truncated and not terminated and reward == 0.0
        assert env.step(GuiAction("done"))[4]["fault"] is not None  # stays faulted until reset
    with pool.lease() as env:
        obs, _ = pool.reset(env, seed=2, options={"task": "file_manager"})
        assert obs.elements and env.faulted is None
    assert pool.stats()["restarts"] == 1 and pool.stats()["faults"] == 1


def test_make_env_builds_it_and_importing_verl_ext_stays_cheap():
    from verl_ext.envs.pool import make_env, register_env_backend

    assert isinstance(make_env("text_hybrid", max_steps=5), TextHybridEnv)
    with pytest.raises(ValueError, match="built in"):
        register_env_backend("text_hybrid", TextHybridEnv)
    with pytest.raises(ValueError, match="screenshots=false"):
        TextHybridEnv(screenshots=True)
    code = "import sys, verl_ext, verl_ext.envs.pool; print(any('text_hybrid' in m for m in sys.modules))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert imported.strip() == "False"


# --- dataset rows --------------------------------------------------------------------------------
def test_rows_name_the_task_and_carry_labels_and_questions(tmp_path):
    import pandas as pd

    from verl_ext.data import main

    rows = text_hybrid_rows(12, seed=0, split="train")
    assert rows == text_hybrid_rows(12, seed=0, split="train")  # deterministic
    val_seeds = {r["extra_info"]["env"]["seed"] for r in text_hybrid_rows(12, seed=0, split="val")}
    assert not val_seeds & {r["extra_info"]["env"]["seed"] for r in rows}
    assert sorted({r["extra_info"]["env"]["task"] for r in rows}) == sorted(TEMPLATES)
    env = TextHybridEnv()
    env.ensure_screen()
    for row in rows[:4]:
        extra = row["extra_info"]
        assert row["agent_name"] == "hybrid_gui_tool" and extra["env"]["backend"] == "text_hybrid"
        _, info = env.reset(seed=extra["env"]["seed"], options={"task": extra["env"]["task"]})
        assert extra["dv_questions"] == info["dv_questions"] and extra["ref_steps"] == info["ref_steps"]
        assert extra["tool_beneficial"] == info["tool_beneficial"]
    assert main(["text_hybrid", str(tmp_path), "--train-size", "8", "--val-size", "4",
                 "--templates", "contacts_book,inventory_sheet"]) == 0
    frame = pd.read_parquet(tmp_path / "train.parquet")
    assert set(frame.extra_info.map(lambda e: e["env"]["task"])) == {"contacts_book", "inventory_sheet"}
    with pytest.raises(ValueError, match="unknown text_hybrid templates"):
        text_hybrid_rows(2, 0, "train", ["mail_star_sender"])


# --- the hybrid_gui_tool agent loop on it ---------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


class PlanModel:
    """A scripted model that writes the function calls of a reference plan. It keeps a shadow env
    of the same task to turn plan steps into element ids, and checks that the page in its prompt
    is the shadow's page (so it acts on what a model would read)."""

    def __init__(self, template: str, seed: int, mode: str):
        self.env = TextHybridEnv()
        self.env.ensure_screen()
        self.obs, info = self.env.reset(seed=seed, options={"task": template})
        self.plan = list(info["plans"][mode])

    def __call__(self, prompt: str) -> str:
        assert self.obs.page_text() in prompt.rsplit("Page (", 1)[1]
        action = plan_step_action(self.plan.pop(0), self.obs)
        self.obs, *_ = self.env.step(action)
        if isinstance(action, ToolCall):
            return call(action.name, **action.arguments)
        fields = {k: v for k, v in (("element", action.element), ("text", action.text)) if v is not None}
        return call("computer_use", action=action.kind, **fields)


def run_loop(tokenizer: Any, server: ScriptedServer, template: str, seed: int, **loop_kwargs: Any):
    extra_info = {"env": {"backend": "text_hybrid", "task": template, "seed": seed}}
    prompt = [{"role": "system", "content": "Use GUI actions or tools."}, {"role": "user", "content": "Task:"}]

    async def episode():
        loop = make_loop(tokenizer, server, **loop_kwargs)
        loop.max_turns = 40  # the helper's config allows 10 turns; oracle plans here take up to ~20
        return await loop.run({"temperature": 1.0}, raw_prompt=prompt, extra_info=extra_info)

    return asyncio.run(episode())


@pytest.mark.parametrize("template", TEMPLATES)
def test_agent_loop_plays_the_oracle_plan_with_function_calls(tokenizer, template):
    from verl_ext.steps import step_metadata

    seed = 4
    model = PlanModel(template, seed, "oracle")
    n = len(model.plan)
    out = run_loop(tokenizer, ScriptedServer(tokenizer, [model] * n), template, seed)
    meta = step_metadata(out.extra_fields)
    _, info = TextHybridEnv().reset(seed=seed, options={"task": template})
    assert meta.valid and meta.num_steps == n == meta.extras["num_steps"] == info["ref_steps"]["oracle"]
    assert meta.extras["success"] is True and meta.extras["stop_reason"] == "terminated"
    assert meta.step_reward == [0.0] * (n - 1) + [1.0] and meta.extras["format_ok"]
    assert meta.extras["num_tool_calls"] == sum("tool" in s for s in info["plans"]["oracle"])
    assert meta.extras["tool_beneficial"] == info["tool_beneficial"]
    assert meta.extras["dv_questions"] == info["dv_questions"]
    assert json.loads(meta.extras["artifact"]["state"])["template"] == template
    assert sum(out.response_mask) == sum(end - start for start, end in meta.spans) > 0


def test_agent_loop_reports_a_wasted_call_and_the_per_turn_layout(tokenizer):
    from verl_ext.steps import step_metadata

    model = PlanModel("inventory_sheet", 2, "oracle")
    wasted = lambda prompt: call("sheet_set_cell", cell="Z99", value="1")  # noqa: E731
    replies = [wasted] + [model] * len(model.plan)
    out = run_loop(tokenizer, ScriptedServer(tokenizer, replies), "inventory_sheet", 2)
    meta = step_metadata(out.extra_fields)
    assert meta.extras["success"] and meta.num_steps == len(replies)  # the wasted call cost a step
    assert meta.extras["actions"][0] == "sheet_set_cell"

    model = PlanModel("settings_panel", 0, "gui")
    outputs = run_loop(tokenizer, ScriptedServer(tokenizer, [model] * len(model.plan)), "settings_panel", 0,
                       layout="per_turn")
    metas = [step_metadata(o.extra_fields) for o in outputs]
    assert len(outputs) == len(metas) == metas[0].extras["num_steps"] and metas[-1].extras["success"]
    assert metas[-1].step_reward == [1.0] and metas[0].extras["num_tool_calls"] == 0


def test_agent_loop_menu_format_runs_on_text_hybrid(tokenizer):
    """The T/G menu reads the env's gui/tool plans, so the tiny-model recipes can use TextHybrid."""
    from verl_ext.steps import step_metadata

    _, info = TextHybridEnv().reset(seed=1, options={"task": "file_manager"})
    replies = [lambda prompt: "T"] * info["ref_steps"]["tool"]
    out = run_loop(tokenizer, ScriptedServer(tokenizer, replies), "file_manager", 1, action_format="menu")
    meta = step_metadata(out.extra_fields)
    assert meta.extras["success"] and meta.extras["num_steps"] == info["ref_steps"]["tool"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from verl_ext.tiny_model import make_tiny_model

    return AutoTokenizer.from_pretrained(make_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0))


def test_function_call_episodes_record_the_decisions_their_calls_take(tokenizer):
    """``menu.DecisionFollower`` in the function-call loop: the oracle's calls take every decision
    the oracle's way, also after a wasted first call (the next call is placed from the env's state)."""
    from verl_ext.steps import step_metadata

    template, seed = "contacts_book", 4
    _, info = TextHybridEnv().reset(seed=seed, options={"task": template})
    model = PlanModel(template, seed, "oracle")
    out = run_loop(tokenizer, ScriptedServer(tokenizer, [model] * len(model.plan)), template, seed)
    decisions = step_metadata(out.extra_fields).extras["decisions"]
    assert [d["choice"] for d in decisions] == [d["oracle"] for d in info["decisions"]]
    view, table = next(iter(info["decision_table"][0])), info["decision_table"]
    for i, d in enumerate(decisions):  # `better` is the table's at the view the oracle's choices reach
        option = table[i][view]
        assert d["better"] == option["better"]
        view = option["after"] if d["choice"] == "gui" else view

    model = PlanModel(template, seed, "oracle")
    wasted = lambda prompt: call("no_such_tool", query="x")  # noqa: E731
    out = run_loop(tokenizer, ScriptedServer(tokenizer, [wasted] + [model] * len(model.plan)), template, seed)
    assert step_metadata(out.extra_fields).extras["decisions"] == decisions


def _step(env: TextHybridEnv, follower: Any, step: dict[str, Any], obs: Any) -> tuple[Any, dict | None]:
    """Take one plan step as the agent loop does: the follower sees the call first, then the env runs it."""
    action = plan_step_action(step, obs)
    record = follower.observe(action, obs, env.decision_state())
    return env.step(action)[0], record


def test_decision_follower_places_calls_where_the_env_stands_and_not_out_of_order(env):
    """A subgoal done before its turn leaves the env's state outside ``decision_table``: no call is
    attributed until the earlier subgoal is done too, then the follower picks up at the next decision."""
    from verl_ext.envs.menu import decision_follower

    def second_subgoal_has_a_tool(template: str, seed: int) -> bool:
        table = env.reset(seed=seed, options={"task": template})[1]["decision_table"]
        return len(table) >= 3 and table[1].get(env.app.view, {}).get("tool") is not None

    template, seed = next((t, s) for t in TEMPLATES for s in range(50) if second_subgoal_has_a_tool(t, s))
    obs, info = env.reset(seed=seed, options={"task": template})
    table, view = info["decision_table"], env.app.view
    assert env.decision_state() == (0, view)  # every task starts with nothing done
    follower = decision_follower(info)

    for step in table[1][view]["tool"]:  # the second subgoal first, by its tool
        obs, record = _step(env, follower, step, obs)
        assert record is None
    assert env.decision_state() is None
    for step in table[0][view]["gui"]:  # then the first one, through the GUI
        obs, record = _step(env, follower, step, obs)
        assert record is None  # not attributed: the env is off the table until both are done
    state = env.decision_state()
    assert state == (2, table[0][view]["after"])

    option = table[2][state[1]]
    obs, record = _step(env, follower, option["gui"][0], obs)
    assert record == {"choice": "gui", "better": option["better"]}
