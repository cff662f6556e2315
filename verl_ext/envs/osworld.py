"""Readers for the OSWorld-MCP tool JSON and the OSWorld task JSON formats (OSWorld, arXiv
2404.07972; OSWorld-MCP, arXiv 2510.24563).

verl-ext does not run OSWorld itself (QEMU images), but keeping its formats lets the same tools and tasks
flow into a backend that can: ``load_mcp_tools`` turns an OSWorld-MCP ``tools/apis/<group>.json``
(an OpenAI-style function list, or MCP ``tools/list`` entries with ``inputSchema``) into flat
:class:`ToolDef` s verl accepts, and ``ExternalToolset`` calls them through any backend callable with
OSWorld-MCP's result normalisation. ``OSWorldTask`` validates a task file and evaluates it with
caller-supplied getters and metrics and the agent's action history, the way OSWorld's
``DesktopEnv.evaluate`` does.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.tools import ToolDef, flatten_property

# The evaluator ``func`` of tasks the agent should declare impossible (by its last action, FAIL).
INFEASIBLE = "infeasible"
# OSWorld-MCP's wrapper marks a plain-string return as an error by these prefixes.
ERROR_PREFIXES = ("error", "failed", "failure", "exception")
_NAME_OK = re.compile(r"[^a-zA-Z0-9_-]")


def _read_json(source: str | Path | list | dict) -> Any:
    if isinstance(source, (list, dict)):
        return source
    return json.loads(Path(source).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class ExternalTool:
    """A flat tool definition plus the name the backend knows it by (``group.method``)."""

    definition: ToolDef
    remote_name: str


def load_mcp_tools(source: str | Path | list | dict, group: str | None = None) -> list[ExternalTool]:
    """Tools from an OSWorld-MCP API JSON file (or its parsed content, or an MCP ``tools/list``).

    Accepts ``[{"type": "function", "function": {...}}]``, ``[{"name", "description",
    "parameters"|"inputSchema"}]`` or ``{"tools": [...]}``. OSWorld-MCP's files
    (``mcp_server/tools/apis/<group>.json``) name each tool ``"<Class>.<method>"``
    (``CalcTools.save``) and its server registers it as ``"<group>.<method>"``
    (``libreoffice_calc.save``), the group being the file's name: with a group (by default the
    file's stem) the class prefix is replaced by the group. ``group=""`` keeps names as given, as
    an MCP server lists them. OpenAI function names allow only ``[a-zA-Z0-9_-]``, so the model sees
    ``{group}_{method}`` and the backend still gets the dotted name.
    """
    if group is None:
        group = Path(source).stem if isinstance(source, (str, Path)) else ""
    raw = _read_json(source)
    entries = raw.get("tools", []) if isinstance(raw, dict) else raw
    tools = []
    for entry in entries:
        fn = entry.get("function", entry)
        if "name" not in fn:
            raise ValueError(f"tool entry without a name: {entry!r}")
        schema = fn.get("parameters") or fn.get("inputSchema") or fn.get("input_schema") or {}
        required = set(schema.get("required", []))
        params = {}
        for name, prop in (schema.get("properties") or {}).items():
            param = flatten_property(name, prop)
            if name not in required and param.required:  # not listed as required: optional
                param = dataclasses.replace(param, description=param.description + " (optional)", required=False)
            params[name] = param
        remote = f"{group}.{fn['name'].rsplit('.', 1)[-1]}" if group else fn["name"]
        local = _NAME_OK.sub("_", remote)[:64]
        tools.append(ExternalTool(ToolDef(local, fn.get("description", ""), params, group=group), remote))
    return tools


def normalize_result(raw: Any) -> dict[str, Any]:
    """OSWorld-MCP's ``{success, result, error_message}`` from whatever a backend returned."""
    if isinstance(raw, dict) and "success" in raw:
        return tool_result(bool(raw["success"]), raw.get("result"), str(raw.get("error_message") or ""))
    if isinstance(raw, str):
        lowered = raw.strip().lower()
        if lowered.startswith(ERROR_PREFIXES) or "not found" in lowered:
            return tool_result(False, None, raw)
    return tool_result(True, raw, "")


class ExternalToolset:
    """Loaded tools bound to a backend ``call(remote_name, arguments) -> Any``.

    ``call`` never raises: bad arguments and backend exceptions come back as failed results.
    """

    def __init__(self, tools: list[ExternalTool], backend: Callable[[str, dict[str, Any]], Any]):
        self.tools = {t.definition.name: t for t in tools}
        self.backend = backend

    def schemas(self) -> list[dict[str, Any]]:
        return [t.definition.schema() for t in self.tools.values()]

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = self.tools.get(name)
        if tool is None:
            return tool_result(False, None, f"unknown tool {name!r}; available: {sorted(self.tools)}")
        try:
            arguments = tool.definition.validate(arguments)
            return normalize_result(self.backend(tool.remote_name, arguments))
        except ActionError as err:
            return tool_result(False, None, str(err))
        except Exception as exc:  # noqa: BLE001 - a backend failure is a failed call, not a crash
            return tool_result(False, None, f"{type(exc).__name__}: {exc}")


@dataclass
class OSWorldTask:
    """One OSWorld task file (``evaluation_examples/examples/<domain>/<uuid>.json``)."""

    id: str
    instruction: str
    evaluator: dict[str, Any]
    snapshot: str = ""
    source: str = ""
    config: list[dict[str, Any]] = field(default_factory=list)
    related_apps: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, source: str | Path | dict) -> OSWorldTask:
        raw = _read_json(source)
        missing = [k for k in ("id", "instruction", "evaluator") if k not in raw]
        if missing:
            raise ValueError(f"OSWorld task is missing {missing}")
        evaluator = raw["evaluator"]
        if "func" not in evaluator:
            raise ValueError(f"task {raw['id']}: evaluator has no 'func'")
        if isinstance(evaluator["func"], list):
            n = len(evaluator["func"])
            for key in ("result", "expected", "options"):
                if key == "expected" and not evaluator.get(key):  # OSWorld: no expected values at all
                    continue
                if key in evaluator and (not isinstance(evaluator[key], list) or len(evaluator[key]) != n):
                    raise ValueError(f"task {raw['id']}: evaluator.{key} must be a list of {n} (one per func)")
        if evaluator.get("conj", "and") not in ("and", "or"):
            raise ValueError(f"task {raw['id']}: evaluator.conj must be 'and' or 'or'")
        for step in raw.get("config", []):
            if "type" not in step:
                raise ValueError(f"task {raw['id']}: config step without 'type': {step!r}")
        return cls(id=raw["id"], instruction=raw["instruction"], evaluator=evaluator, snapshot=raw.get("snapshot", ""),
                   source=raw.get("source", ""), config=list(raw.get("config", [])),
                   related_apps=list(raw.get("related_apps", [])))

    def evaluate(self, env: Any, metrics: dict[str, Callable[..., float]],
                 getters: dict[str, Callable[[Any, dict], Any]], action_history: Sequence[Any] = ()) -> float:
        """Score in [0, 1], as OSWorld's ``DesktopEnv.evaluate`` computes it.

        ``getters["get_<type>"](env, spec)`` fetch the result and expected values;
        ``metrics[func](result, expected, **options)`` compares them, or ``metrics[func](result,
        **options)`` when the task gives no expected spec for that metric (null or empty). A result
        getter that raises ``FileNotFoundError`` (the agent never wrote the file) scores that
        metric 0. ``and``: 0 as soon as one metric is 0, else the mean; ``or``: 1 as soon as one is
        1, else the max. ``action_history`` is the agent's actions (``"FAIL"`` or
        ``{"action_type": "FAIL"}`` declares the task infeasible): ``func: "infeasible"`` scores 1
        exactly when the last action is FAIL; any other task scores 0 when it is.
        """
        ev = self.evaluator
        gave_up = bool(action_history) and _is_fail(action_history[-1])
        if ev["func"] == INFEASIBLE:
            return 1.0 if gave_up else 0.0
        if gave_up:
            return 0.0
        funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]

        def nth(key: str, i: int) -> Any:
            value = ev.get(key)
            return value[i] if isinstance(ev["func"], list) and value else value

        def fetch(spec: dict) -> Any:
            getter = getters.get(f"get_{spec['type']}")
            if getter is None:
                raise KeyError(f"no getter get_{spec['type']} (task {self.id})")
            return getter(env, spec)

        conj, scores = ev.get("conj", "and"), []
        for i, func in enumerate(funcs):
            if func not in metrics:
                raise KeyError(f"no metric {func!r} (task {self.id})")
            try:
                result = fetch(nth("result", i)) if nth("result", i) else None
            except FileNotFoundError:
                score = 0.0
            else:
                expected = nth("expected", i)
                args = (result, fetch(expected)) if expected else (result,)
                score = float(metrics[func](*args, **(nth("options", i) or {})))
            if conj == "and" and score == 0.0:
                return 0.0
            if conj == "or" and score == 1.0:
                return 1.0
            scores.append(score)
        return sum(scores) / len(scores) if conj == "and" else max(scores)


def _is_fail(action: Any) -> bool:
    """OSWorld's FAIL action: the string, or a dict action of that type."""
    return action == "FAIL" or (isinstance(action, dict) and action.get("action_type") == "FAIL")
