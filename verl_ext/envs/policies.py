"""Policies for evaluation and tests: scripted (GUI-only / tool-preferring), random, and any
OpenAI-compatible chat endpoint with function calling.

Scripted policies replay a MiniDesk template's reference plan (``info["plans"]``), turning each
step's element key into the id shown in the current observation; they prove that both paths solve
every template. They are oracles, not baselines.
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
from typing import Any, Protocol

from verl_ext.envs import menu
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
from verl_ext.envs.plans import plan_step_action
from verl_ext.errors import UserError


class Policy(Protocol):
    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None: ...

    def act(self, obs: Observation) -> Action: ...


class ScriptedPolicy:
    """Replays ``info["plans"][mode]`` with ``mode`` = ``gui`` (GUI primitives only), ``tool``
    (tool-preferring) or ``oracle`` (the shortest GUI/tool mix; text_hybrid only)."""

    def __init__(self, mode: str):
        if mode not in ("gui", "tool", "oracle"):
            raise ValueError(f"scripted mode must be 'gui', 'tool' or 'oracle', got {mode!r}")
        self.mode = mode
        self._plan: list[dict[str, Any]] = []

    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None:
        plans = info.get("plans") or {}
        if self.mode not in plans:
            raise ValueError(f"scripted-{self.mode} needs a {self.mode!r} reference plan in the env's reset info "
                             "(minidesk has gui and tool plans, text_hybrid also an oracle plan)")
        self._plan = list(plans[self.mode])

    def act(self, obs: Observation) -> Action:
        if not self._plan:
            return GuiAction("done")
        step = self._plan.pop(0)
        action = plan_step_action(step, obs)
        if action is None:
            raise LookupError(f"scripted step {step} targets an element that is not on the page")
        return action


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


class LocalModelPolicy:
    """A transformers causal LM on this machine, e.g. a checkpoint of a verl-ext training run.

    Samples like the training rollout (temperature 1 by default) and speaks the agent loop's
    action format: ``menu`` (one T/G letter per turn, ``verl_ext.envs.menu``) or ``tool_call``
    (hermes ``<tool_call>`` JSON). A reply without a valid choice or call ends the episode.
    """

    def __init__(self, model_dir: str, action_format: str = "menu", temperature: float = 1.0,
                 max_new_tokens: int | None = None, seed: int = 0):
        if action_format not in ("menu", "tool_call"):
            raise ValueError(f"action_format must be menu or tool_call, got {action_format!r}")
        self.model, self.tokenizer = _load_local_model(model_dir)
        self.action_format, self.temperature = action_format, temperature
        self.max_new_tokens = max_new_tokens or (4 if action_format == "menu" else 256)
        self.seed = seed
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []
        self.menu: Any = None
        self.turns = 0

    def reset(self, obs: Observation, info: dict[str, Any], tool_schemas: list[dict[str, Any]]) -> None:
        import torch

        torch.manual_seed(self.seed)
        self.turns = 0
        if self.action_format == "menu":
            self.menu = menu.PlanMenu(info.get("plans") or {})
            self.messages = [{"role": "system", "content": menu.SYSTEM_PROMPT},
                             {"role": "user", "content": self.menu.first_message(obs)}]
        else:
            self.tools = tool_schemas
            self.messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs.render()}]

    def act(self, obs: Observation) -> Action:
        if self.action_format == "tool_call":
            if self.turns:
                self.messages.append({"role": "user", "content": obs.render(include_instruction=False)})
            text = self._reply()
            call = _first_call({"content": text})
            if call is None:
                return GuiAction("done")
            try:
                return action_from_call(call["name"], call["arguments"])
            except ActionError:
                args = call["arguments"] if isinstance(call["arguments"], dict) else {}
                return ToolCall(call["name"], args)
        if self.turns:
            self.messages.append({"role": "user", "content": self.menu.feedback(obs)})
        mode = menu.parse_choice(self._reply())
        action = self.menu.action(mode, obs) if mode else None
        if action is None:  # no available option named: the episode ends, as in training
            return GuiAction("done")
        self.menu.advance(mode)
        return action

    def _reply(self) -> str:
        import torch

        self.turns += 1
        prompt = self.tokenizer.apply_chat_template(self.messages, tools=self.tools or None,
                                                    add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
        with torch.no_grad():
            out = self.model.generate(**prompt, max_new_tokens=self.max_new_tokens, do_sample=self.temperature > 0,
                                      temperature=self.temperature or None, top_k=0, top_p=1.0,
                                      pad_token_id=self.tokenizer.pad_token_id)
        text = self.tokenizer.decode(out[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        return text


_LOAD_LOCK = threading.Lock()


def _load_local_model(model_dir: str) -> tuple[Any, Any]:
    # `verl-ext eval` plays episodes in threads; transformers' loading is not thread-safe (its
    # empty-weights init context is global), so load once, under a lock.
    with _LOAD_LOCK:
        return _load_local_model_cached(model_dir)


@functools.lru_cache(maxsize=2)
def _load_local_model_cached(model_dir: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_ext.checkpoint_merge import hf_model_dir

    path = hf_model_dir(model_dir)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def make_policy(spec: str, seed: int = 0, action_format: str = "tool_call") -> Policy:
    """``scripted-gui`` | ``scripted-tool`` | ``scripted-oracle`` | ``random`` | an ``http(s)://``
    OpenAI-compatible URL | ``checkpoint:<dir>`` (a local transformers model or verl checkpoint, in ``action_format``)."""
    check_policy_spec(spec)
    if spec.startswith("scripted-"):
        return ScriptedPolicy(spec.removeprefix("scripted-"))
    if spec == "random":
        return RandomPolicy(seed)
    if spec.startswith(("http://", "https://")):
        return OpenAIChatPolicy(spec)
    return LocalModelPolicy(spec.split(":", 1)[1], action_format=action_format, seed=seed)


def check_policy_spec(spec: str) -> None:
    """Raise ``UserError`` for a policy ``make_policy`` cannot build: an unknown name, or a
    ``checkpoint:<dir>`` whose folder does not exist."""
    if spec in ("scripted-gui", "scripted-tool", "scripted-oracle", "random"):
        return
    if spec.startswith(("http://", "https://")):
        return
    if not spec.startswith("checkpoint:"):
        raise UserError(f"--policy {spec!r} is unknown: use scripted-gui, scripted-tool, scripted-oracle, random, "
                        "an http(s):// URL or checkpoint:<dir>")
    path = spec.split(":", 1)[1]
    if not os.path.isdir(path):
        raise UserError(f"--policy {spec}: the path {path} does not exist (or is not a folder); give a transformers "
                        "model folder or a verl checkpoint global_step_N")
