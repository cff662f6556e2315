"""Tool definitions with flat JSON schemas, argument validation and OSWorld-MCP result shape.

verl's ``OpenAIFunctionPropertySchema`` keeps only ``type``, ``description`` and ``enum`` of each
parameter (``items``, nested ``properties`` and ``anyOf`` are dropped or rejected), so every tool
here has flat scalar parameters; lists travel as delimited strings and optional parameters say so
in their description. ``ToolDef.schema()`` is exactly what verl's schema model round-trips
(checked in ``tests/envs/test_tools_on_cpu.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl_ext.envs.core import GUI_ACTIONS, GUI_TOOL_NAME, KEYS, ActionError

JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


@dataclass(frozen=True)
class Param:
    """One flat parameter: a JSON scalar type, a description, an optional enum."""

    type: str
    description: str
    required: bool = True
    enum: tuple[Any, ...] | None = None

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.enum is not None:
            out["enum"] = list(self.enum)
        return out


@dataclass(frozen=True)
class ToolDef:
    """A callable tool: its name, what it does, its flat parameters and the app group it belongs to.

    ``group`` is the OSWorld-MCP-style app group (``mail``, ``files``, ... or ``distractor``); the
    env picks the tools of a task's apps plus a few distractors for each episode.
    """

    name: str
    description: str
    params: dict[str, Param] = field(default_factory=dict)
    group: str = ""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema (what chat templates render and verl parses)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {name: p.schema() for name, p in self.params.items()},
                    "required": [name for name, p in self.params.items() if p.required],
                },
            },
        }

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against the schema; return them coerced, or raise :class:`ActionError`.

        Lenient where models usually slip and the meaning is unambiguous: numbers given as
        strings, booleans given as "true"/"false", numbers where a string is wanted.
        """
        if not isinstance(arguments, dict):
            raise ActionError(f"{self.name}: arguments must be a JSON object")
        unknown = sorted(set(arguments) - set(self.params))
        if unknown:
            raise ActionError(f"{self.name}: unknown argument(s) {unknown}; expected {sorted(self.params)}")
        missing = [n for n, p in self.params.items() if p.required and arguments.get(n) is None]
        if missing:
            raise ActionError(f"{self.name}: missing required argument(s) {missing}")
        out = {}
        for name, value in arguments.items():
            if value is None:
                continue
            param = self.params[name]
            value = _coerce(value, param.type)
            if value is None:
                raise ActionError(f"{self.name}: {name!r} must be of type {param.type}, got {arguments[name]!r}")
            if param.enum is not None and value not in param.enum:
                raise ActionError(f"{self.name}: {name!r} must be one of {list(param.enum)}, got {value!r}")
            out[name] = value
        return out


def _coerce(value: Any, json_type: str) -> Any:
    if json_type == "string":
        return str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    if json_type == "boolean":
        if isinstance(value, bool):
            return value
        return {"true": True, "false": False}.get(str(value).strip().lower())
    if json_type in ("integer", "number"):
        if isinstance(value, bool):
            return None
        if isinstance(value, str):
            try:
                value = float(value) if json_type == "number" else int(value.strip())
            except ValueError:
                return None
        if json_type == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)
        return value if isinstance(value, JSON_TYPES[json_type]) else None
    return value  # array/object from external (OSWorld-MCP) tools: passed through as given


def flatten_property(name: str, prop: dict[str, Any]) -> Param:
    """One JSON-schema property of an external tool as a flat :class:`Param`.

    ``anyOf`` / ``oneOf`` (pydantic's Optional[...]) keep their first non-null type and become
    optional; arrays and objects keep their type and describe their shape in words, because verl
    drops ``items`` and nested ``properties``.
    """
    prop = dict(prop)
    required = True
    variants = prop.get("anyOf") or prop.get("oneOf")
    if variants:
        non_null = [v for v in variants if v.get("type") != "null"]
        required = len(non_null) == len(variants)
        prop = {**(non_null[0] if non_null else {"type": "string"}), "description": prop.get("description", "")}
    json_type = prop.get("type", "string")
    if isinstance(json_type, list):
        required = required and "null" not in json_type
        json_type = next((t for t in json_type if t != "null"), "string")
    description = prop.get("description") or prop.get("title") or name
    if json_type == "array":
        item_type = (prop.get("items") or {}).get("type", "any")
        description += f" (JSON array of {item_type})"
    elif json_type == "object" and prop.get("properties"):
        description += f" (JSON object with keys {sorted(prop['properties'])})"
    if not required:
        description += " (optional)"
    enum = tuple(prop["enum"]) if isinstance(prop.get("enum"), list) else None
    return Param(type=json_type, description=description, required=required, enum=enum)


COMPUTER_USE = ToolDef(
    name=GUI_TOOL_NAME,
    description=(
        "Act on the screen like a person. Elements are addressed by the [id] shown in the latest page "
        "observation. Actions: click(element), click_at(x, y), type(element, text) replaces the field's "
        "text, select(element, text) picks an option of a drop-down, key(key) presses a key, "
        "scroll(direction, element optional), answer(text) gives the answer to a question task, "
        "done() ends the task."
    ),
    params={
        "action": Param("string", "the GUI action", enum=GUI_ACTIONS),
        "element": Param("integer", "element id from the observation (click, type, select, scroll)", required=False),
        "text": Param("string", "text to type, option to select, or the answer", required=False),
        "key": Param("string", "key to press", required=False, enum=KEYS),
        "direction": Param("string", "scroll direction", required=False, enum=("up", "down")),
        "x": Param("integer", "x in CSS pixels of the viewport (click_at)", required=False),
        "y": Param("integer", "y in CSS pixels of the viewport (click_at)", required=False),
    },
    group="gui",
)
