"""TextHybrid: a hybrid GUI + tool environment in pure Python (no browser), for machines without
Chromium and for tasks where the tool-vs-GUI choice matters at every step.

The env is a :class:`~verl_ext.envs.base.ScreenEnv` on :class:`TextScreen`, an in-process
screen over one of the apps of ``text_hybrid_apps`` (settings panel, contacts book,
file manager, inventory sheet). So the step loop, counters, ``computer_use`` + app tools, action
errors, faults, the env pool and the ``hybrid_gui_tool`` agent loop are exactly MiniDesk's; only
the page is Python. A step costs well under a millisecond.

A task is 4 to 6 subgoals (decisions) done in any order; each can be done through the GUI or,
where a tool exists, through tool calls, and which is shorter depends on the instruction and the
current view (see ``text_hybrid_apps``). ``reset`` info carries three reference plans in the
instruction's order (``plans``): ``gui`` (GUI only), ``tool`` (a tool wherever one exists) and
``oracle`` (the shortest mix, by dynamic programming over subgoal x view, ties to the GUI), their
lengths (``ref_steps``), the per-subgoal costs along the oracle's path (``decisions``),
``tool_beneficial`` (the oracle calls a tool at all) and the DVReward questions (``dv_questions``).

Task ids: ``<app>`` with a seed. The seed also picks the task's *variant*: ``mixed`` (the oracle
is strictly shorter than both pure plans; 2 seeds in 3) or ``gui`` (no tool call shortens the
path); generation redraws until the variant holds.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from verl_ext.envs.base import ScreenEnv
from verl_ext.envs.core import ActionError, EnvFault, Observation, TaskSpec
from verl_ext.envs.text_hybrid_apps import APPS, App, Step, Subgoal
from verl_ext.envs.tools import ToolDef
from verl_ext.envs.wrappers import EnvWrapper

DV_QUESTIONS_VERSION = "text-hybrid-v1"  # bump when an app's questions change
MIXED_SHARE = 2 / 3  # share of seeds whose task is drawn so that the oracle beats both pure plans
_MAX_DRAWS = 400


# --- reference plans --------------------------------------------------------------------------
@dataclass(frozen=True)
class Plans:
    """The three reference plans of a task and the oracle's per-subgoal decisions."""

    gui: list[Step]
    tool: list[Step]
    oracle: list[Step]
    decisions: list[dict[str, Any]]


def plan_task(subgoals: list[Subgoal], start_view: int) -> Plans:
    """GUI-only, tool-preferring and shortest (oracle) plans over ``subgoals`` in order.

    GUI steps may change the view (tab/page); tool steps never do. The oracle minimises the total
    number of steps by dynamic programming over (subgoal, view); on a tie it takes the GUI.
    ``decisions[i]``: the GUI and tool cost of subgoal ``i`` from the view the oracle reaches it
    in, which is shorter there (``gui``/``tool``/``tie``), and the oracle's choice (it may differ
    from the locally shorter option when the GUI's view change pays off later).
    """
    gui: list[Step] = []
    tool: list[Step] = []
    view = start_view
    for goal in subgoals:
        steps, view = goal.gui(view)
        gui += steps
    view = start_view
    for goal in subgoals:
        steps = goal.tool(view)
        if steps is None:
            steps, view = goal.gui(view)
        tool += steps

    best = cost_to_go(subgoals)
    oracle: list[Step] = []
    decisions: list[dict[str, Any]] = []
    view = start_view
    for i, goal in enumerate(subgoals):
        gui_steps, after = goal.gui(view)
        tool_steps = goal.tool(view)
        choice = best(i, view)[1]
        n_gui, n_tool = len(gui_steps), None if tool_steps is None else len(tool_steps)
        shorter = "gui" if n_tool is None or n_gui < n_tool else "tool" if n_tool < n_gui else "tie"
        decisions.append({"subgoal": i, "gui_steps": n_gui, "tool_steps": n_tool, "shorter": shorter,
                          "oracle": choice})
        if choice == "gui":
            oracle += gui_steps
            view = after
        else:
            oracle += tool_steps
    return Plans(gui, tool, oracle, decisions)


def cost_to_go(subgoals: list[Subgoal]) -> Callable[[int, int], tuple[int, str]]:
    """``best(i, view)`` -> (fewest steps to finish subgoals ``i..`` from ``view``, the first
    choice on such a path: ``gui`` on a tie)."""

    @functools.lru_cache(maxsize=None)
    def best(i: int, v: int) -> tuple[int, str]:
        if i == len(subgoals):
            return 0, ""
        steps, after = subgoals[i].gui(v)
        options = [(len(steps) + best(i + 1, after)[0], "gui")]
        tool_steps = subgoals[i].tool(v)
        if tool_steps is not None:
            options.append((len(tool_steps) + best(i + 1, v)[0], "tool"))
        return min(options, key=lambda o: (o[0], o[1] != "gui"))

    return best


def decision_table(subgoals: list[Subgoal], start_view: int) -> list[dict[int, dict[str, Any]]]:
    """What each decision offers from every view a sequence of choices can reach it in (the T/G
    menu's per-step options, ``verl_ext.envs.menu.DecisionMenu``).

    ``table[i][view]`` = ``{"gui": steps, "after": view after them, "tool": steps or None (no
    tool does this subgoal), "better": label}``; ``better`` compares the fewest total steps to the
    end of the task after each choice: ``tool``/``gui`` when one is strictly shorter, ``tie``,
    or ``none`` when there is no tool.
    """
    best = cost_to_go(subgoals)
    table: list[dict[int, dict[str, Any]]] = []
    views = {start_view}
    for i, goal in enumerate(subgoals):
        row: dict[int, dict[str, Any]] = {}
        for view in sorted(views):
            gui_steps, after = goal.gui(view)
            tool_steps = goal.tool(view)
            if tool_steps is None:
                better = "none"
            else:
                by_gui = len(gui_steps) + best(i + 1, after)[0]
                by_tool = len(tool_steps) + best(i + 1, view)[0]
                better = "tool" if by_tool < by_gui else "gui" if by_gui < by_tool else "tie"
            row[view] = {"gui": gui_steps, "after": after, "tool": tool_steps, "better": better}
        table.append(row)
        views = {option["after"] for option in row.values()} | set(row)  # after GUI, or unchanged by a tool
    return table


def summary(plans: Plans) -> dict[str, Any]:
    """``tool_beneficial`` (the oracle calls a tool) and ``ref_steps`` (each plan's length)."""
    return {"tool_beneficial": any(d["oracle"] == "tool" for d in plans.decisions),
            "ref_steps": {"gui": len(plans.gui), "tool": len(plans.tool), "oracle": len(plans.oracle)}}


def variant_of(template: str, seed: int) -> str:
    """``mixed`` or ``gui``: what the task of this seed is drawn to be (see the module doc)."""
    return "mixed" if random.Random(f"text_hybrid/{template}/{seed}/variant").random() < MIXED_SHARE else "gui"


def _satisfies(plans: Plans, variant: str) -> bool:
    oracle = len(plans.oracle)
    if variant == "mixed":
        return oracle < len(plans.gui) and oracle < len(plans.tool)
    return all(d["oracle"] == "gui" for d in plans.decisions)


def make_task(template: str, seed: int) -> tuple[App, Plans, str]:
    """The app of task (``template``, ``seed``) in its initial state, its plans and its variant.

    Deterministic; raises ``ValueError`` for an unknown template and ``RuntimeError`` when no draw
    satisfies the variant (a generator bug)."""
    if template not in APPS:
        raise ValueError(f"unknown text_hybrid task {template!r}; known: {', '.join(APPS)}")
    variant = variant_of(template, seed)
    for draw in range(_MAX_DRAWS):
        app = APPS[template](random.Random(f"text_hybrid/{template}/{seed}/{draw}"), variant)
        plans = plan_task(app.subgoals, app.view)
        if _satisfies(plans, variant):
            return app, plans, variant
    raise RuntimeError(f"text_hybrid {template!r} seed {seed}: no {variant} task in {_MAX_DRAWS} draws")


def questions_of(app: App) -> list[tuple[str, str, list[int], Any]]:
    """(text, kind, global parent indices, predicate) of every question: subgoals in order, then
    the app's quality questions (semantic before quality, as the DVReward record orders them)."""
    out: list[tuple[str, str, list[int], Any]] = []
    for goal in app.subgoals:
        base = len(out)
        out += [(q.text, q.kind, [base + p for p in q.parents], q.holds) for q in goal.questions]
    out += [(q.text, q.kind, [], q.holds) for q in app.quality()]
    return out


def dv_questions(template: str, app: App) -> dict[str, Any] | None:
    """The task's DVReward question record (``verl_ext.rewards.dvreward.question_set`` schema)."""
    from verl_ext.envs.minidesk.env import dv_questions_record

    raw = [{"text": t, "kind": k, "parents": p} for t, k, p, _ in questions_of(app)]
    record = dv_questions_record(template, app.instruction(), raw)
    return None if record is None else {**record, "version": DV_QUESTIONS_VERSION}


def subgoal_done(goal: Subgoal, app: App) -> bool:
    """Every question of ``goal`` holds on the app's state."""
    return all(q.holds(app) for q in goal.questions)


def todo_items(app: App) -> tuple[str, ...]:
    """The instruction's items (numbered as in it) whose questions do not all hold on the app's state."""
    return tuple(f"({i}) {goal.text}" for i, goal in enumerate(app.subgoals, 1) if not subgoal_done(goal, app))


def decision_state(app: App) -> tuple[int, int] | None:
    """Where the app stands in ``decision_table``: ``(decision, view)`` when the first ``decision``
    subgoals are done and nothing of the later ones is (none of their questions holds), else None
    (a subgoal done out of the instruction's order, or half done: no row of the table describes it).
    Every task starts with no question holding, so the start is ``(0, start view)``."""
    done = 0
    while done < len(app.subgoals) and subgoal_done(app.subgoals[done], app):
        done += 1
    untouched = not any(q.holds(app) for goal in app.subgoals[done:] for q in goal.questions)
    return (done, app.view) if untouched else None


def check(app: App) -> bool:
    """The verifier: every question about the final state answers yes."""
    return all(holds(app) for _, _, _, holds in questions_of(app))


# --- the screen -------------------------------------------------------------------------------
class TextScreen:
    """A :class:`~verl_ext.envs.screen.Screen` over an in-process :class:`App` (the browser is the
    other one).

    ``crash_after``: the observation count after which the screen dies (set by ``InjectScreenCrash``:
    the next observation raises a ``browser_crash`` :class:`EnvFault`, as a dead Chromium would).
    """

    def __init__(self) -> None:
        self.driver: Any = None
        self.app: App | None = None
        self.crash_after: int | None = None
        self._observations = 0
        self._keys: dict[int, str] = {}

    def start(self) -> TextScreen:
        self.driver = self
        return self

    def alive(self) -> bool:
        return self.driver is not None

    def close(self) -> None:
        self.driver = None

    def load(self, app: App) -> None:
        self.app, self.crash_after, self._observations = app, None, 0

    def observe(self, root_selector: str = "body", status_js: str = "") -> dict[str, Any]:
        if self.driver is None or self.app is None:
            raise EnvFault("browser_crash", "the text screen is not running")
        self._observations += 1
        if self.crash_after is not None and self._observations > self.crash_after:
            self.close()
            raise EnvFault("browser_crash", "injected fault (text_hybrid fault_rate)")
        elements = [{**w, "id": i} for i, w in enumerate(self.app.widgets(), 1)]
        self._keys = {e["id"]: e["key"] for e in elements}
        return {"title": self.app.title(), "elements": elements, "status": {"ok": check(self.app)}}

    def _key(self, element: int | None) -> str:
        if element not in self._keys:
            raise ActionError(f"no element [{element}] on the page; use an id from the latest observation")
        return self._keys[element]

    def click(self, element: int) -> None:
        self.app.click(self._key(element))

    def type(self, element: int, text: str) -> None:
        self.app.type(self._key(element), text)

    def select(self, element: int, option: str) -> None:
        self.app.select(self._key(element), option)

    def scroll(self, direction: str, element: int | None = None) -> None:
        self.app.scroll(direction)

    def key(self, name: str) -> None:
        """No element keeps focus on a text screen: keys do nothing."""

    def click_at(self, x: int, y: int) -> None:
        raise ActionError("click_at needs pixels; this text screen has none: click an element id")

    def screenshot(self) -> bytes:
        raise ActionError("text_hybrid renders text only; there is no screenshot")


# --- the env ----------------------------------------------------------------------------------
def make_text_hybrid_env(fault_rate: float = 0.0, show_todo: bool = False, **options: Any) -> Any:
    """The ``text_hybrid`` backend: a ``TextHybridEnv(**options)``, wrapped in ``InjectScreenCrash``
    when ``fault_rate`` > 0 and in ``ShowTodo`` when ``show_todo``."""
    env: Any = TextHybridEnv(**options)
    if fault_rate > 0:
        env = InjectScreenCrash(env, fault_rate)
    if show_todo:
        env = ShowTodo(env)
    return env


class TextHybridEnv(ScreenEnv):
    """Hybrid GUI + tool env over the TextHybrid apps; no browser.

    Args:
        n_distractors: distractor tools (MiniDesk's) added to each episode's tool list (seeded per task).
        max_steps: actions per episode before ``truncated``. ``screenshots`` must stay False.
    """

    name = "text_hybrid"

    def __init__(self, n_distractors: int = 2, max_steps: int = 30, screenshots: bool = False):
        if screenshots:
            raise ValueError("text_hybrid has no screenshots: set the agent loop's screenshots=false "
                             "(or use the minidesk backend for a VL model)")
        super().__init__(TextScreen(), max_steps=max_steps)
        self.n_distractors = n_distractors
        self.app: App | None = None

    def _load(self, task: TaskSpec) -> dict[str, Any]:
        app, plans, variant = make_task(task.template, task.seed)
        self.app = app
        self.screen.load(app)
        self.instruction = app.instruction()
        return {
            **summary(plans),
            "plans": {"gui": plans.gui, "tool": plans.tool, "oracle": plans.oracle},
            "decisions": plans.decisions,
            "decision_table": decision_table(app.subgoals, app.view),  # the T/G menu's per-step options
            "variant": variant,
            "apps": [app.name],
            "dv_questions": dv_questions(task.template, app),
        }

    def _episode_tools(self, task: TaskSpec) -> list[ToolDef]:
        from verl_ext.envs.minidesk.catalog import DISTRACTORS

        rng = random.Random(f"{task.template}#{task.seed}")
        return [*self.app.tools, *rng.sample(DISTRACTORS, min(self.n_distractors, len(DISTRACTORS)))]

    def _run_tool(self, tool: ToolDef, arguments: dict[str, Any]) -> dict[str, Any]:
        if tool.group == "distractor":
            from verl_ext.envs.minidesk.catalog import distractor_result

            return distractor_result(tool, arguments)
        return self.app.call(tool.name, arguments)

    def _answer(self, text: str) -> None:
        raise ActionError("this task asks no question: make the changes, they end the task when all are done")

    def _verdict(self, status: dict[str, Any]) -> tuple[bool, float, dict[str, Any]]:
        success = bool(status["ok"])
        return success, float(success), {"success": success}

    def decision_state(self) -> tuple[int, int] | None:
        """``(decision, view)`` of the current state in ``decision_table``, or None (``decision_state``)."""
        return decision_state(self.app)

    def state_dump(self) -> dict[str, Any]:
        return {"template": self.app.name, "seed": self.task.seed, **self.app.dump()}


# --- wrappers ---------------------------------------------------------------------------------
class InjectScreenCrash(EnvWrapper):
    """Fault injection, for testing the fault path (never in training): with probability ``rate``
    an episode's text screen dies at a step drawn, like the choice itself, from the task."""

    def __init__(self, env: TextHybridEnv, rate: float):
        super().__init__(env)
        self.rate = rate

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        task = self.env.task
        rng = random.Random(f"text_hybrid/{task.template}/{task.seed}/fault")
        oracle_steps = len(info["plans"]["oracle"])
        self.env.screen.crash_after = rng.randint(1, max(1, oracle_steps)) if rng.random() < self.rate else None
        return obs, info


class ShowTodo(EnvWrapper):
    """Ends every observation with the task's items still to do (``todo_items``): which subgoal is
    next becomes one line of the latest observation instead of something the policy must work out
    by counting the subgoals its earlier calls did. It shows the verifier's per-subgoal state, so it
    makes the task easier."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        obs.todo = todo_items(self.env.app)
        return obs, info

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("fault") is None:  # a faulted step returns the last observation, as it was
            obs.todo = todo_items(self.env.app)
        return obs, reward, terminated, truncated, info


def template_catalog() -> dict[str, dict[str, Any]]:
    """``{template: {"apps": [...]}}`` (whether tools help depends on the seed: see ``make_task``)."""
    return {name: {"apps": [name]} for name in APPS}


def text_hybrid_rows(n: int, seed: int, split: str, templates: list[str] | None = None) -> list[dict[str, Any]]:
    """``n`` dataset rows for ``hybrid_gui_tool`` (the layout of ``verl_ext.envs.dataset.minidesk_rows``),
    with the task's ``tool_beneficial``, ``variant``, ``ref_steps`` and DVReward questions
    (``dv_questions``, read by DVReward's default ``questions_key``) in ``extra_info``."""
    from verl_ext.envs.dataset import AGENT_NAME, choose_templates, spread_tasks
    from verl_ext.envs.policies import SYSTEM_PROMPT

    chosen = choose_templates("text_hybrid", templates, list(APPS))
    rows = []
    for index, (template, task_seed) in enumerate(spread_tasks("text_hybrid", chosen, n, seed, split)):
        app, plans, variant = make_task(template, task_seed)
        rows.append({
            "data_source": "verl_ext/text_hybrid",
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": "Complete the task in the app below."}],
            "ability": "computer_use",
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {
                "split": split, "index": index, **summary(plans), "variant": variant,
                "dv_questions": dv_questions(template, app),
                "env": {"backend": "text_hybrid", "task": template, "seed": task_seed},
            },
        })
    return rows
