"""MiniDesk: the hybrid GUI + tool task suite on a local page (``static/index.html`` over file://).

One page holds five apps on a shared state; ``DESK.reset(template, seed)`` regenerates a task in
place (no reload, so a reset costs one script call), ``DESK.verify()`` is the in-page verifier.
The page's virtual file system is mirrored into a per-episode sandbox folder after every action
that changed it; ``files_*`` tools resolve their paths inside that folder first.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from verl_ext.envs.base import BrowserEnv
from verl_ext.envs.core import ActionError, EnvFault, TaskSpec, tool_result
from verl_ext.envs.minidesk.catalog import APP_TOOLS, DISTRACTORS, PATH_ARGS, distractor_result
from verl_ext.envs.sandbox import Sandbox
from verl_ext.envs.tools import ToolDef
from verl_ext.rewards.dvreward.question_set import clean_questions

STATIC = Path(__file__).parent / "static"
PAGE_URL = (STATIC / "index.html").as_uri()
DV_QUESTIONS_VERSION = "minidesk-v1"  # bump when a template's questions change


class MiniDeskEnv(BrowserEnv):
    """Hybrid GUI + tool env over the MiniDesk apps.

    Args:
        n_distractors: distractor tools added to each episode's tool list (seeded per task).
        reload_every: reload the page after this many episodes (bounds page-side leaks).
        See :class:`BrowserEnv` for the rest.

    ``reset`` info: ``tool_beneficial``, ``ref_steps`` ({gui, tool}), ``plans`` (reference GUI and
    tool paths, for scripted policies and tests; never shown to a model), ``apps``, ``dv_questions``
    (the task's DVReward yes/no questions about the final state, in the schema of
    ``verl_ext.rewards.dvreward.question_set``; never shown to a model; see ``dv_questions_record``).
    """

    name = "minidesk"
    root_selector = "body"
    status_js = "return {ok: DESK.verify(), answered: DESK.state().answer !== null, fs: DESK.fsVersion()};"

    def __init__(self, n_distractors: int = 3, reload_every: int = 200, **kwargs: Any):
        super().__init__(**kwargs)
        self.n_distractors = n_distractors
        self.reload_every = reload_every
        self.sandbox: Sandbox | None = None
        self._episodes = 0
        self._fs_version = -1
        self._apps: list[str] = []

    def _on_screen_start(self) -> None:
        self.browser.get(PAGE_URL)
        self._episodes = 0

    def _load(self, task: TaskSpec) -> dict[str, Any]:
        self._episodes += 1
        if self._episodes > self.reload_every:
            self._on_screen_start()
        reset_js = "return window.DESK ? DESK.reset(arguments[0], arguments[1]) : null;"
        info = self.browser.js(reset_js, task.template, task.seed)
        if info is None:  # the page was navigated away or reloaded badly: load it again once
            self._on_screen_start()
            info = self.browser.js(reset_js, task.template, task.seed)
        if info is None:
            raise EnvFault("page_error", f"MiniDesk page did not load from {PAGE_URL}")
        if "error" in info:
            raise ValueError(f"{info['error']}; known templates: {', '.join(list_templates())}")
        self.instruction = info["instruction"]
        self._apps = info["apps"]
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox = Sandbox()
        self._fs_version = -1
        self._after_action({"fs": self.browser.js("return DESK.fsVersion();")})
        out = {k: info[k] for k in ("tool_beneficial", "ref_steps", "plans", "apps")}
        out["dv_questions"] = dv_questions_record(task.template, info["instruction"], info.get("questions"))
        return out

    def _episode_tools(self, task: TaskSpec) -> list[ToolDef]:
        tools = [t for app in self._apps for t in APP_TOOLS[app]]
        rng = random.Random(f"{task.template}#{task.seed}")
        return tools + rng.sample(DISTRACTORS, min(self.n_distractors, len(DISTRACTORS)))

    def _run_tool(self, tool: ToolDef, arguments: dict[str, Any]) -> dict[str, Any]:
        if tool.group == "distractor":
            return distractor_result(tool, arguments)
        for arg in PATH_ARGS.get(tool.name, ()):
            arguments[arg] = self.sandbox.relative(arguments[arg])  # raises ActionError when it escapes
        if tool.name == "files_read":
            return tool_result(True, self.sandbox.read_text(arguments["path"]), "")
        return self.browser.js("return DESK.callTool(arguments[0], arguments[1]);", tool.name, arguments)

    def _answer(self, text: str) -> None:
        self.browser.js("DESK.answer(arguments[0]);", text)

    def _verdict(self, status: dict[str, Any]) -> tuple[bool, float, dict[str, Any]]:
        success = bool(status["ok"])
        # An answer ends a question task whether right or wrong; any other task ends on success.
        return success or status["answered"], float(success), {"success": success}

    def _after_action(self, status: dict[str, Any]) -> None:
        version = status["fs"]
        if version != self._fs_version:
            snapshot = self.browser.js("return DESK.fsSnapshot();")
            try:
                self.sandbox.mirror(snapshot["folders"], snapshot["files"])
            except ActionError as err:  # a page-side name that cannot exist on disk is a page bug
                raise EnvFault("page_error", f"file system mirror: {err}") from err
            self._fs_version = version

    def state_dump(self) -> dict[str, Any]:
        # ``view``: what is open on screen (mail_open / files_open_folder check it), for judges.
        state = self.browser.js("var S = DESK.state(), d = DESK.dump();"
                                "d.view = {open_email_id: S.mail.open, files_folder: S.files.cwd}; return d;")
        state["sandbox_files"] = self.sandbox.listing() if self.sandbox else []
        return json.loads(json.dumps(state))

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        super().close()


def dv_questions_record(template: str, instruction: str, questions: list[dict[str, Any]] | None) -> dict | None:
    """The DVReward question record of one task (``info["dv_questions"]``): the questions its
    template's ``gen()`` wrote (``tasks.js``), validated like ``verl-ext dv-questions`` output.

    Returns ``None`` for a template without questions (DVReward then flags the trajectory
    ``no_questions``). Raises ``ValueError`` naming the template when the validator would drop a
    question: a template bug, never a silently shorter set.
    """
    if not questions:
        return None
    raw = [(q["text"], q["kind"], list(q.get("parents") or [])) for q in questions]
    question_set, dropped = clean_questions(raw, max_semantic=len(raw), max_quality=len(raw))
    if dropped:
        raise ValueError(f"MiniDesk template {template!r} wrote invalid DVReward questions: {dropped}")
    meta = {"version": DV_QUESTIONS_VERSION, "model": "template",
            "prompt_sha": hashlib.sha256(instruction.encode()).hexdigest()[:16]}
    return {**question_set.to_record(), **meta}


def template_catalog() -> dict[str, dict[str, Any]]:
    """``{template: {"apps": [...], "tool_beneficial": bool}}`` read from ``tasks.js`` without a
    browser (data preparation runs where no Chromium is installed)."""
    import re

    source = (STATIC / "tasks.js").read_text(encoding="utf-8")
    pattern = r"^  ([a-z_]+): \{\n    apps: \[([^\]]*)\], tool_beneficial: (true|false),$"
    return {name: {"apps": re.findall(r"'(\w+)'", apps), "tool_beneficial": flag == "true"}
            for name, apps, flag in re.findall(pattern, source, flags=re.M)}


def list_templates() -> list[str]:
    """Every MiniDesk template id, in ``tasks.js`` order."""
    return list(template_catalog())
