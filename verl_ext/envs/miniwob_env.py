"""MiniWoB++ (the ``miniwob`` PyPI package, MIT) through the hybrid env API.

We drive MiniWoB's own task pages (``miniwob/html/miniwob/<task>.html`` over file://) with our
browser layer instead of its gymnasium wrapper, so both backends share one observation format, one
set of GUI primitives, one fault model and one pool. The in-page verifier is MiniWoB's own
(``core.endEpisode`` -> ``WOB_RAW_REWARD_GLOBAL``); the reward is binary (raw > 0).

MiniWoB ends an episode with raw reward -1 "timed out" after ``core.EPISODE_MAX_TIME`` (10-30 s),
far shorter than an LLM turn; we set it to one hour before every episode starts, which also re-arms the episode timer with that value.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from verl_ext.envs.base import BrowserEnv
from verl_ext.envs.core import ActionError, EnvFault, TaskSpec
from verl_ext.envs.tools import ToolDef

NO_TIMEOUT_MS = 3_600_000
_START_JS = """
Math.seedrandom(arguments[0]);
core.EPISODE_MAX_TIME = arguments[1];
core.startEpisodeReal();
return WOB_TASK_READY;
"""
_STATUS_JS = "return [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON, core.getUtterance()];"


def _html_dir() -> Path:
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


@lru_cache(maxsize=1)
def list_tasks() -> list[str]:
    """MiniWoB task names (every page that defines ``genProblem``)."""
    pages = _html_dir().glob("*.html")
    return sorted(p.stem for p in pages if "genProblem" in p.read_text(encoding="utf-8", errors="ignore"))


class MiniWoBEnv(BrowserEnv):
    """A MiniWoB++ task per episode (``reset(seed=seed, options={"task": "click-button"})``); GUI actions only, no app tools."""

    name = "miniwob"
    root_selector = "#wrap"
    status_js = _STATUS_JS

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_steps", 15)
        super().__init__(**kwargs)
        self._page: str | None = None
        self._raw_reward = 0.0

    def _on_screen_start(self) -> None:
        self._page = None

    def _load(self, task: TaskSpec) -> dict[str, Any]:
        name = task.template.removeprefix("miniwob/").removesuffix("-v1")
        if name not in list_tasks():
            raise ValueError(f"unknown MiniWoB task {task.template!r}; e.g. {', '.join(list_tasks()[:5])}, ...")
        if self._page != name:  # same task: start a new episode in place, as MiniWoB itself does
            self.browser.get((_html_dir() / f"{name}.html").as_uri())
            self._page = name
        ready = self.browser.js(_START_JS, str(task.seed), NO_TIMEOUT_MS)
        for _ in range(50):  # a few tasks build their problem asynchronously
            if ready:
                break
            ready = self.browser.js("return WOB_TASK_READY;")
        else:
            raise EnvFault("page_error", f"MiniWoB task {name} did not become ready")
        self.instruction = self.browser.js("return core.getUtterance();")
        self._raw_reward = 0.0
        return {"tool_beneficial": False, "episode_max_time_ms": NO_TIMEOUT_MS}

    def _episode_tools(self, task: TaskSpec) -> list[ToolDef]:
        return []

    def _run_tool(self, tool: ToolDef, arguments: dict[str, Any]) -> dict[str, Any]:
        raise ActionError(f"MiniWoB offers no app tools (only computer_use), got {tool.name!r}")

    def _answer(self, text: str) -> None:
        raise ActionError("MiniWoB tasks take no answer: type it into the page and submit")

    def _verdict(self, status: list[Any]) -> tuple[bool, float, dict[str, Any]]:
        done, raw, reason, _ = status
        self._raw_reward = float(raw or 0.0)
        success = bool(done) and self._raw_reward > 0
        return bool(done), float(success), {"success": success, "raw_reward": self._raw_reward, "reason": reason}

    def state_dump(self) -> dict[str, Any]:
        done, raw, reason, utterance = self.browser.js(_STATUS_JS)
        return {"task": self._page, "utterance": utterance, "done": bool(done), "raw_reward": raw, "reason": reason}
