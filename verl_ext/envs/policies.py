"""Policies for evaluation and tests: scripted (GUI-only / tool-preferring), random, and any
OpenAI-compatible chat endpoint with function calling.

Scripted policies replay a MiniDesk template's reference plan (``info["plans"]``), turning each
step's element key into the id shown in the current observation; they prove that both paths solve
every template. They are oracles, not baselines.
"""

from __future__ import annotations

import json
import random
from typing import Any, Protocol

from verl_ext.envs.core import (
    GUI_ACTIONS,
    KEYS,
    Action,
    ActionError,
    GuiAction,
    Observation,
    ToolCall,
    action_from_call,
)


class Policy(Protocol):
    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None: ...

    def act(self, obs: Observation) -> Action: ...


class ScriptedPolicy:
    """Replays ``info["plans"][mode]`` with ``mode`` = ``gui`` (GUI primitives only) or ``tool``."""

    def __init__(self, mode: str):
        if mode not in ("gui", "tool"):
            raise ValueError(f"scripted mode must be 'gui' or 'tool', got {mode!r}")
        self.mode = mode
        self._plan: list[dict[str, Any]] = []

    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None:
        if "plans" not in info:
            raise ValueError("scripted policies need reference plans (minidesk only)")
        self._plan = list(info["plans"][self.mode])

    def act(self, obs: Observation) -> Action:
        if not self._plan:
            return GuiAction("done")
        step = self._plan.pop(0)
        if "tool" in step:
            return ToolCall(step["tool"], dict(step["args"]))
        if step["gui"] == "answer":
            return GuiAction("answer", text=step["text"])
        element = obs.find(step["k"])
        if element is None:
            raise LookupError(f"scripted step {step} targets an element that is not on the page")
        return GuiAction(step["gui"], element=element.id, text=step.get("text"))


class RandomPolicy:
    """Uniformly random GUI actions on visible elements, plus random tool calls with junk arguments."""

    def __init__(self, seed: int = 0, tool_prob: float = 0.3):
        self.rng = random.Random(seed)
        self.tool_prob = tool_prob
        self._tools: list[dict[str, Any]] = []

    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None:
        self._tools = [s for s in tool_schemas if s["function"]["name"] != "computer_use"]

    def act(self, obs: Observation) -> Action:
        rng = self.rng
        if self._tools and rng.random() < self.tool_prob:
            fn = rng.choice(self._tools)["function"]
            args = {name: rng.choice(["x", "1", "Documents/notes.txt"]) for name in fn["parameters"]["required"]}
            return ToolCall(fn["name"], args)
        kind = rng.choice([k for k in GUI_ACTIONS if k not in ("done", "click_at")])
        element = rng.choice(obs.elements).id if obs.elements else 1
        word = rng.choice(["yes", "3", "hello", "Archive"])
        return GuiAction(kind, element=element, text=word if kind in ("type", "select", "answer") else None,
                         key=rng.choice(KEYS) if kind == "key" else None,
                         direction=rng.choice(["up", "down"]) if kind == "scroll" else None)


SYSTEM_PROMPT = (
    "You operate a desktop through function calls. Each turn, call exactly one function: either "
    "computer_use for GUI actions on the element ids of the latest page observation, or an app tool "
    "when it does the job in fewer steps. Tools act on the same apps the screen shows."
)


class OpenAIChatPolicy:
    """A model behind an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang, ...).

    Keeps the whole conversation; reads ``tool_calls`` or, failing that, a hermes
    ``<tool_call>{json}</tool_call>`` in the text. A reply with no call becomes ``done``.
    """

    def __init__(self, base_url: str, model: str = "default", temperature: float = 0.0, timeout_s: float = 120.0):
        base = base_url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model, self.temperature, self.timeout_s = model, temperature, timeout_s
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self._call_id: str | None = None

    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None:
        self.tools = tool_schemas
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs.render()}]
        self._call_id = None

    def act(self, obs: Observation) -> Action:
        import httpx

        if self._call_id is not None:  # feed back the observation of the previous call
            self.messages.append({"role": "tool", "tool_call_id": self._call_id,
                                  "content": obs.render(include_instruction=False)})
        body = {"model": self.model, "messages": self.messages, "tools": self.tools, "temperature": self.temperature}
        response = httpx.post(self.url, json=body, timeout=self.timeout_s).raise_for_status()
        reply = response.json()["choices"][0]["message"]
        self.messages.append({k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")})
        call = _first_call(reply)
        if call is None:
            return GuiAction("done")
        self._call_id = call.get("id", "call_0")
        try:
            return action_from_call(call["name"], call["arguments"])
        except ActionError:  # pass it on as a call: the env reports the error to the model
            args = call["arguments"] if isinstance(call["arguments"], dict) else {"arguments": str(call["arguments"])}
            return ToolCall(call["name"], args)


def _first_call(message: dict[str, Any]) -> dict[str, Any] | None:
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        return {"id": call.get("id"), "name": fn.get("name", ""), "arguments": fn.get("arguments") or "{}"}
    text = message.get("content") or ""
    if "<tool_call>" in text:
        raw = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
        try:
            parsed = json.loads(raw)
            return {"id": "call_0", "name": parsed["name"], "arguments": parsed.get("arguments", {})}
        except (json.JSONDecodeError, KeyError, TypeError):
            return None
    return None


def make_policy(spec: str, seed: int = 0) -> Policy:
    """``scripted-gui`` | ``scripted-tool`` | ``random`` | an ``http(s)://`` OpenAI-compatible URL."""
    if spec == "scripted-gui":
        return ScriptedPolicy("gui")
    if spec == "scripted-tool":
        return ScriptedPolicy("tool")
    if spec == "random":
        return RandomPolicy(seed)
    if spec.startswith(("http://", "https://")):
        return OpenAIChatPolicy(spec)
    raise ValueError(f"unknown policy {spec!r}: use scripted-gui, scripted-tool, random or an http(s):// URL")
