"""The ``hybrid_gui_tool`` loop's chat format in its function-call action format: the tools passed
to the chat template, the first user turn, the assistant's call and the ``tool`` observation.

SFT demonstrations (``verl_ext.datasets.demos``) and decision rows (``verl_ext.datasets.decisions``)
reuse these builders so that SFT and RL see the same transcripts.
"""

from __future__ import annotations

import json
from typing import Any

from verl_ext.agent_loops.env_tools import EnvTool
from verl_ext.envs.policies import SYSTEM_PROMPT
from verl_ext.envs.tools import ToolDef


def schemas_of(tools: dict[str, EnvTool]) -> list[dict[str, Any]]:
    """The ``tools`` the chat template gets for the loop's verl tools."""
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools.values()]


def tool_schemas(tool_defs: list[ToolDef]) -> list[dict[str, Any]]:
    """The ``tools`` the loop passes to the chat template for an env's tool definitions."""
    return schemas_of({t.name: EnvTool.from_def(t) for t in tool_defs})


def first_messages(raw_prompt: list[dict[str, Any]], text: str, images: list[Any] | None = None) -> list[dict[str, Any]]:
    """The dataset prompt with ``text`` (the observation) appended to its last user turn."""
    messages = raw_prompt or [{"role": "system", "content": SYSTEM_PROMPT}]
    if messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], str) and not images:
        return messages[:-1] + [{"role": "user", "content": messages[-1]["content"] + "\n\n" + text}]
    return messages + [{"role": "user", "content": _content(text, images)}]


def tool_message(text: str, images: list[Any] | None, call_id: str | None, max_length: int) -> dict[str, Any]:
    """An observation as the ``tool`` message after a call, cut to ``max_length`` characters."""
    if len(text) > max_length:
        text = text[:max_length] + "...(truncated)"
    message = {"role": "tool", "content": _content(text, images)}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def call_dict(call: Any) -> dict[str, Any]:
    """A parsed call (verl's ``FunctionCall``) as ``{name, arguments}``."""
    return {"name": call.name, "arguments": json.loads(call.arguments)}


def assistant_message(content: str, call: Any) -> dict[str, Any]:
    tool_call = {"type": "function", "function": call_dict(call)}
    if call.tool_call_id is not None:
        tool_call["id"] = call.tool_call_id
    return {"role": "assistant", "content": content or "", "tool_calls": [tool_call]}


def _content(text: str, images: list[Any] | None) -> Any:
    """Message content: plain text, or image parts + text for VL models (as verl's tool loop does)."""
    if not images:
        return text
    return [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": text}]
