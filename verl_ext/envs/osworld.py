"""Readers for the OSWorld-MCP tool JSON and the OSWorld task JSON formats (research notes §4-5).

We cannot run OSWorld here (QEMU images), but keeping its formats lets the same tools and tasks
flow into a backend that can: ``load_mcp_tools`` turns an OSWorld-MCP ``tools/apis/<group>.json``
(an OpenAI-style function list, or MCP ``tools/list`` entries with ``inputSchema``) into flat
:class:`ToolDef` s verl accepts, and ``ExternalToolset`` calls them through any backend callable with
OSWorld-MCP's result normalisation. ``OSWorldTask`` validates a task file and evaluates it with
caller-supplied getters and metrics, combining them the way OSWorld's ``DesktopEnv.evaluate`` does.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ext.envs.core import ActionError, tool_result
from verl_ext.envs.tools import ToolDef, flatten_property

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


def load_mcp_tools(source: str | Path | list | dict, group: str = "") -> list[ExternalTool]:
    """Tools from an OSWorld-MCP API JSON file (or its parsed content).

    Accepts ``[{"type": "function", "function": {...}}]``, ``[{"name", "description",
    "parameters"|"inputSchema"}]`` or ``{"tools": [...]}``. OSWorld-MCP registers tools as
    ``"{group}.{method}"``; OpenAI function names allow only ``[a-zA-Z0-9_-]``, so the model sees
    ``{group}_{method}`` and the backend still gets the dotted name.
    """
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
        remote = f"{group}.{fn['name']}" if group else fn["name"]
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
                 getters: dict[str, Callable[[Any, dict], Any]]) -> float:
        """Score in [0, 1]. ``getters["get_<type>"](env, spec)`` fetch result/expected values;
        ``metrics[func](result, expected?, **options)`` compare them. ``and``: 0 as soon as one
        metric is 0, else the mean; ``or``: 1 as soon as one is 1, else the max (as OSWorld)."""
        ev = self.evaluator
        funcs = ev["func"] if isinstance(ev["func"], list) else [ev["func"]]

        def nth(key: str, i: int) -> Any:
            value = ev.get(key)
            return value[i] if isinstance(ev["func"], list) and value is not None else value

        conj, scores = ev.get("conj", "and"), []
        for i, func in enumerate(funcs):
            if func not in metrics:
                raise KeyError(f"no metric {func!r} (task {self.id})")
            args = []
            for key in ("result", "expected"):
                spec = nth(key, i)
                if spec is not None:
                    getter = getters.get(f"get_{spec['type']}")
                    if getter is None:
                        raise KeyError(f"no getter get_{spec['type']} (task {self.id})")
                    args.append(getter(env, spec))
            score = float(metrics[func](*args, **(nth("options", i) or {})))
            if conj == "and" and score == 0.0:
                return 0.0
            if conj == "or" and score == 1.0:
                return 1.0
            scores.append(score)
        return sum(scores) / len(scores) if conj == "and" else max(scores)
