"""SFT demonstrations: TextHybrid episodes played by a scripted policy, written as the chat
transcripts the ``hybrid_gui_tool`` agent loop builds for a real model in its function-call format.

The messages come from the loop's own builders (``first_messages``, ``assistant_message``,
``tool_message``, ``tool_schemas``), so a model fine-tuned on these rows sees at RL time exactly
the prompt, tool schemas, ``<tool_call>`` turns and ``tool`` observations it was trained on.
Rows follow verl's ``MultiTurnSFTDataset`` layout, ``messages`` and ``tools``, stored as JSON text:
parquet would merge the differently shaped tool schemas and call arguments into one struct type and
hand every missing key back as ``null``, which the chat template then renders into the prompt.
:class:`JsonMultiTurnSFTDataset` (``data.custom_cls``) decodes them before verl's dataset tokenises.
"""

from __future__ import annotations

import json
from typing import Any

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

from verl_ext.envs.core import GUI_TOOL_NAME, Action, ToolCall

# The RL recipes' multi_turn.max_tool_response_length (plugins/env/minidesk.yaml).
MAX_TOOL_RESPONSE_LENGTH = 12000


def call_of(action: Action) -> dict[str, Any]:
    """The function call (``name``, ``arguments``) that ``action_from_call`` turns back into ``action``."""
    if isinstance(action, ToolCall):
        return {"name": action.name, "arguments": dict(action.arguments)}
    fields = {"element": action.element, "text": action.text, "key": action.key,
              "direction": action.direction, "x": action.x, "y": action.y}
    return {"name": GUI_TOOL_NAME,
            "arguments": {"action": action.kind, **{k: v for k, v in fields.items() if v is not None}}}


class _Call:
    """The attributes of verl's ``FunctionCall`` that ``assistant_message`` reads."""

    def __init__(self, name: str, arguments: dict[str, Any]):
        self.name, self.arguments, self.tool_call_id = name, json.dumps(arguments, ensure_ascii=False), None


def play_transcript(task: str, seed: int, policy: str = "oracle", prompt: list[dict[str, Any]] | None = None,
                    max_steps: int = 30,
                    max_tool_response_length: int = MAX_TOOL_RESPONSE_LENGTH) -> dict[str, Any]:
    """Play one TextHybrid episode with ``scripted-<policy>``; return ``messages``, ``tools``,
    ``actions`` (the policy's) and ``success``. ``prompt`` is the dataset row's prompt
    (``text_hybrid_rows``); the transcript ends with the call that finished the episode."""
    import verl.experimental.agent_loop  # noqa: F401  (first: its plugin hook imports the agent loop module)
    from verl_ext.agent_loops.hybrid_gui_tool import assistant_message, first_messages, tool_message, tool_schemas
    from verl_ext.envs.policies import ScriptedPolicy
    from verl_ext.envs.pool import make_env

    env = make_env("text_hybrid", max_steps=max_steps)
    scripted = ScriptedPolicy(policy)
    try:
        obs, info = env.reset(task, seed)
        scripted.reset(obs, info, env.tool_schemas())
        tools = tool_schemas(env.tool_defs())
        messages = first_messages(list(prompt or []), obs.render())
        actions: list[Action] = []
        success = False
        for _ in range(max_steps):
            action = scripted.act(obs)
            actions.append(action)
            call = call_of(action)
            messages.append(assistant_message("", _Call(call["name"], call["arguments"])))
            obs, _, terminated, truncated, step_info = env.step(action)
            success = bool(step_info.get("success", False))
            if terminated or truncated:
                break
            messages.append(tool_message(obs.render(include_instruction=False), None, None, max_tool_response_length))
    finally:
        env.close()
    return {"messages": messages, "tools": tools, "actions": actions, "success": success}


def text_hybrid_sft_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                         policy: str = "oracle") -> list[dict[str, Any]]:
    """``n`` SFT rows: the tasks of ``text_hybrid_rows(n, seed, split)`` played by ``scripted-<policy>``."""
    from verl_ext.envs.text_hybrid import text_hybrid_rows

    rows = []
    for row in text_hybrid_rows(n, seed, split, templates):
        env = row["extra_info"]["env"]
        demo = play_transcript(env["task"], env["seed"], policy, row["prompt"])
        if not demo["success"]:
            raise RuntimeError(f"scripted-{policy} failed text_hybrid {env['task']} seed {env['seed']}: "
                               "a demonstration must solve its task")
        rows.append({"messages": json.dumps(demo["messages"]), "tools": json.dumps(demo["tools"]),
                     "extra_info": {**row["extra_info"], "policy": policy, "num_calls": len(demo["actions"])}})
    return rows


class JsonMultiTurnSFTDataset(MultiTurnSFTDataset):
    """verl's multi-turn SFT dataset over rows whose ``messages`` / ``tools`` are JSON text
    (``text_hybrid_sft_rows``). Select it with ``data.custom_cls.path=pkg://verl_ext.envs.demos``
    ``data.custom_cls.name=JsonMultiTurnSFTDataset``."""

    def _read_files_and_process(self) -> None:
        super()._read_files_and_process()
        self.messages = [_decoded(m) for m in self.messages]
        if self.tools is not None:
            self.tools = [_decoded(t) for t in self.tools]

    def _build_messages(self, example: dict) -> list:
        return super()._build_messages({**example, self.messages_key: _decoded(example[self.messages_key])})


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
