"""Critical switching steps: TextHybrid's GUI-vs-tool decisions as single-turn prompts, for the
single-turn RL stage of ToolCUA's pipeline (its "Tool-Bootstrapped GUI RFT").

ToolCUA trains, between SFT and online RL, on single steps where the agent must choose between a
tool call and GUI actions (the paper: 5k "critical switching steps" out of 180k). Here
such a step is a decision of a TextHybrid task (``text_hybrid.decision_table``): subgoal ``i``
reached in view ``v``, where a tool does the subgoal and either the tool or the GUI is strictly
the shorter way to the end of the task. Every reachable ``(i, v)`` is a row, off the oracle's path
too: the earlier decisions are played on the real env by the first choice sequence that reaches
``v`` (the oracle's own when it does), and the prompt is the ``hybrid_gui_tool`` loop's transcript
up to that turn, built with the loop's message builders (``verl_ext.datasets.demos.take_turn``):
the dataset's system prompt, the task and first page, each earlier call and its ``tool``
observation. These are the loop's tokens at that state when the earlier replies were written the
way the chat template renders a call (what the SFT demonstrations teach); the model's answer is
one function call.

What each choice costs travels with the row (``extra_info.decision``): ``remaining`` = steps to
the end of the task after taking the GUI or the tool path for this subgoal and the shortest path
afterwards (``len(option) + cost_to_go(i + 1, view after)``), ``best`` = the smaller, and the first
call of each option (``first_calls``), which is how the reward recognises the model's choice
(``verl_ext.rewards.decision_reward``). Task instances are ``text_hybrid_rows``' (validation seeds
disjoint from training seeds), and every row of an instance is in the instance's split.

Prompts and call arguments differ in shape from row to row, so ``prompt``, ``tools`` and
``first_calls`` are stored as JSON text (parquet would merge them into one struct type and hand
missing keys back as null: ``verl_ext.datasets.demos``); :class:`DecisionDataset` (``data.custom_cls``)
decodes the prompt for verl's ``RLHFDataset``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

from verl_ext.envs.text_hybrid import cost_to_go, decision_table, make_task, plan_task
from verl_ext.envs.text_hybrid_apps import Subgoal

DATA_SOURCE = "verl_ext/text_hybrid_decisions"
AGENT_NAME = "decision_turn"
MODES = ("gui", "tool")
SPARE_TASKS = 16  # tasks drawn beyond n: some tasks have no critical switching step


@dataclass(frozen=True)
class DecisionState:
    """One critical switching step of a task: decision ``index`` reached in ``view`` by the earlier
    choices ``prefix`` (``gui``/``tool`` per earlier decision); ``remaining[mode]`` = fewest steps to
    the end after doing this decision by ``mode``; ``better`` = the mode with fewer."""

    index: int
    view: int
    prefix: tuple[str, ...]
    on_oracle_path: bool
    remaining: dict[str, int]
    better: str


def decision_states(subgoals: list[Subgoal], start_view: int) -> list[DecisionState]:
    """Every reachable decision where a tool exists and one mode is strictly shorter, in decision
    order (views ascending, the oracle's view first).

    A view of ``decision_table`` that no choice sequence reaches (the table keeps a subgoal's view
    as reachable after it even where no tool exists) has no prefix and is left out.
    """
    table = decision_table(subgoals, start_view)
    best = cost_to_go(subgoals)
    oracle = [d["oracle"] for d in plan_task(subgoals, start_view).decisions]
    prefixes = {start_view: ()}  # view -> the first choice sequence found that reaches it
    states: list[DecisionState] = []
    for i, row in enumerate(table):
        following: dict[int, tuple[str, ...]] = {}
        # the oracle's own prefix first, so it is the one kept for the views it reaches
        for view, prefix in sorted(prefixes.items(), key=lambda item: (list(item[1]) != oracle[:i], item[0])):
            option = row[view]
            if option["tool"] is not None and option["better"] in MODES:
                remaining = {"gui": len(option["gui"]) + best(i + 1, option["after"])[0],
                             "tool": len(option["tool"]) + best(i + 1, view)[0]}
                states.append(DecisionState(i, view, prefix, list(prefix) == oracle[:i], remaining, option["better"]))
            own = [oracle[i]] if list(prefix) == oracle[:i] else []
            for mode in dict.fromkeys(own + list(MODES)):
                if mode == "tool" and option["tool"] is None:
                    continue
                following.setdefault(option["after"] if mode == "gui" else view, prefix + (mode,))
        prefixes = following
    return states


def play_to(template: str, seed: int, state: DecisionState, prompt: list[dict[str, Any]],
            max_steps: int = 30, show_todo: bool = False) -> dict[str, Any] | None:
    """Play the choices of ``state.prefix`` on a fresh env; return the loop's ``messages`` up to the
    decision's turn, the episode's ``tools``, each mode's ``first_calls`` there and the names of the
    ``app_tools`` (neither ``computer_use`` nor distractors); None when the prefix does not fit in
    ``max_steps`` (the loop would never reach this state)."""
    import verl.experimental.agent_loop  # noqa: F401  (first: its plugin hook imports the agent loop module)
    from verl_ext.agent_loops.tool_call_messages import first_messages, tool_schemas
    from verl_ext.datasets.demos import call_of, take_turn
    from verl_ext.envs.plans import plan_step_action
    from verl_ext.envs.pool import make_env

    env = make_env("text_hybrid", max_steps=max_steps, show_todo=show_todo)
    try:
        obs, info = env.reset(seed=seed, options={"task": template})
        table = info["decision_table"]
        messages = first_messages(list(prompt), obs.render())
        view = next(iter(table[0]))  # row 0 holds the start view only
        for i, mode in enumerate(state.prefix):
            option = table[i][view]
            done_by = mode if option["tool"] is not None else "gui"
            for step in option[done_by]:
                if obs.step + 1 >= max_steps:
                    return None
                obs, done, _ = take_turn(env, plan_step_action(step, obs), messages)
                if done:
                    raise RuntimeError(f"text_hybrid {template} seed {seed}: the episode ended before decision "
                                       f"{state.index} (prefix {state.prefix})")
            view = option["after"] if done_by == "gui" else view
        if view != state.view:
            raise RuntimeError(f"text_hybrid {template} seed {seed}: prefix {state.prefix} reached view {view}, "
                               f"not {state.view}")
        option = table[state.index][view]
        first_calls = {mode: call_of(plan_step_action(option[mode][0], obs)) for mode in MODES}
        app_tools = [t.name for t in env.tool_defs() if t.group not in ("gui", "distractor")]
        return {"messages": messages, "tools": tool_schemas(env.tool_defs()), "first_calls": first_calls,
                "app_tools": app_tools}
    finally:
        env.close()


def decision_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                  max_steps: int = 30, show_todo: bool = False, balance_labels: bool = False) -> list[dict[str, Any]]:
    """``n`` single-turn decision rows: every critical switching step of the tasks of
    ``text_hybrid_rows(n + SPARE_TASKS, seed, split)``, task after task, until ``n`` rows (the
    tasks' seeds keep train and validation instances apart; a task may have no such step).
    ``show_todo``: the env's option, as in the SFT demonstrations and the online loop.
    ``balance_labels``: ``n / 2`` rows where the GUI is shorter and ``n / 2`` where tools are (``n``
    even), skipping a task's steps of a label once it has its half, so that a policy gains nothing
    from the label's base rate (tools are shorter at about 70% of settings_panel's steps) and only
    from reading the state."""
    from verl_ext.envs.text_hybrid import text_hybrid_rows

    if balance_labels and n % 2:
        raise ValueError(f"balance_labels needs an even number of rows (half per label), got {n}")
    quota = {mode: n // 2 if balance_labels else n for mode in MODES}
    rows: list[dict[str, Any]] = []
    for task_row in text_hybrid_rows((2 if balance_labels else 1) * n + SPARE_TASKS, seed, split, templates):
        spec = task_row["extra_info"]["env"]
        app, _, _ = make_task(spec["task"], spec["seed"])
        for state in decision_states(app.subgoals, app.view):
            if quota[state.better] == 0:
                continue
            played = play_to(spec["task"], spec["seed"], state, task_row["prompt"], max_steps, show_todo)
            if played is None:
                continue
            rows.append({
                "data_source": DATA_SOURCE,
                "agent_name": AGENT_NAME,
                "prompt": json.dumps(played["messages"]),
                "ability": "computer_use",
                "reward_model": {"style": "rule", "ground_truth": state.better},
                "extra_info": {
                    "split": split, "index": len(rows), "env": spec,
                    "tools": json.dumps(played["tools"]),
                    "decision": {
                        "index": state.index, "view": state.view, "prefix": list(state.prefix),
                        "on_oracle_path": state.on_oracle_path, "better": state.better,
                        "remaining": state.remaining, "best": min(state.remaining.values()),
                        "first_calls": json.dumps(played["first_calls"]), "app_tools": played["app_tools"],
                    },
                },
            })
            quota[state.better] -= 1
            if len(rows) == n:
                return rows
    raise RuntimeError(f"only {len(rows)} critical switching steps" + (" (half per label)" if balance_labels else "")
                       + f" in the text_hybrid tasks of {split}, seed {seed}, templates {templates or 'all'}; "
                       "ask for fewer rows")


def decoded_prompt(value: Any) -> Any:
    """A row's ``prompt``: JSON text in these rows, already a message list elsewhere."""
    return json.loads(value) if isinstance(value, str) else value


class DecisionDataset(RLHFDataset):
    """verl's ``RLHFDataset`` over rows whose ``prompt`` is JSON text (``decision_rows``). Select it
    with ``data.custom_cls.path=pkg://verl_ext.datasets.decisions data.custom_cls.name=DecisionDataset``
    and ``data.filter_overlong_prompts=false`` (verl's length filter tokenises the raw column; the
    ``decision_turn`` loop checks the prompt length itself)."""

    def _build_messages(self, example: dict, key: str) -> list:
        return super()._build_messages({**example, key: decoded_prompt(example[key])}, key)


WARMUP_TARGETS = ("both", "shorter")  # switch_warmup_rows: which options of a decision are SFT targets


def switch_warmup_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                       max_steps: int = 30, show_todo: bool = False, targets: str = "both") -> list[dict[str, Any]]:
    """SFT rows for the warm-up half of ToolCUA's Tool-Bootstrapped GUI RFT (warm-up SFT, then
    single-turn RL on critical switching steps): for each decision of ``decision_rows``, its transcript
    up to the decision followed by an option's first call (the loop's ``assistant_message``).

    ``targets="both"``: one row per option of each of ``ceil(n / 2)`` decisions, so the rows teach how
    to write either call at a switching step and hold no preference between GUI and tool; which one is
    shorter is left to the RL half's reward. ``targets="shorter"``: one row per decision of ``n``
    decisions, the shorter way's call only (the label the RL half's reward pays for, taught directly:
    whether the model can learn the decision from these prompts at all, or only the format).

    Rows are ``JsonMultiTurnSFTDataset``'s (``messages`` and ``tools`` as JSON text), ``n`` of them."""
    import verl.experimental.agent_loop  # noqa: F401  (first: its plugin hook imports the agent loop module)
    from verl_ext.agent_loops.tool_call_messages import assistant_message
    from verl_ext.datasets.demos import _Call

    if targets not in WARMUP_TARGETS:
        raise ValueError(f"targets must be one of {WARMUP_TARGETS}, got {targets!r}")
    per_decision = len(MODES) if targets == "both" else 1
    rows: list[dict[str, Any]] = []
    for decision in decision_rows(-(-n // per_decision), seed, split, templates, max_steps, show_todo):
        info = decision["extra_info"]
        first_calls = json.loads(info["decision"]["first_calls"])
        for mode in MODES if targets == "both" else (info["decision"]["better"],):
            call = first_calls[mode]
            messages = json.loads(decision["prompt"]) + [assistant_message("", _Call(call["name"], call["arguments"]))]
            rows.append({"messages": json.dumps(messages), "tools": info["tools"],
                         "extra_info": {"split": split, "index": len(rows), "env": info["env"], "mode": mode,
                                        "better": info["decision"]["better"]}})
    return rows[:n]
