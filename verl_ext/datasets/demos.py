"""SFT demonstrations: TextHybrid episodes played by a scripted policy, written as the chat
transcripts the ``hybrid_gui_tool`` agent loop builds for a real model in its function-call format.

The messages come from the loop's own builders (``first_messages``, ``assistant_message``,
``tool_message``, ``tool_schemas``), so a model fine-tuned on these rows sees at RL time exactly
the prompt, tool schemas, ``<tool_call>`` turns and ``tool`` observations it was trained on.
Rows follow verl's ``MultiTurnSFTDataset`` layout, ``messages`` and ``tools``, stored as JSON text:
parquet would merge the differently shaped tool schemas and call arguments into one struct type and
hand every missing key back as ``null``, which the chat template then renders into the prompt.
:class:`JsonMultiTurnSFTDataset` (``data.custom_cls``) decodes them before verl's dataset tokenises;
:class:`DecisionWeightedSFTDataset` also weights the function-name (GUI-vs-tool decision) tokens in the loss.

:func:`held_out_call_rates` (``verl-ext eval-sft``) measures what SFT taught: greedy replies of a model at
every assistant turn of held-out transcripts, parsed with verl's hermes parser as the loop parses them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from collections.abc import Callable
from typing import Any

import torch
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

from verl_ext.cli_args import positive_int, unit_rate
from verl_ext.envs.core import GUI_TOOL_NAME, Action, ToolCall
from verl_ext.errors import UserError

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


def take_turn(env: Any, action: Action, messages: list[dict[str, Any]],
              max_tool_response_length: int = MAX_TOOL_RESPONSE_LENGTH) -> tuple[Any, bool, dict[str, Any]]:
    """Take ``action`` on ``env`` as one model turn of the ``hybrid_gui_tool`` loop: append the call
    (the loop's ``assistant_message``) to ``messages`` and, unless the episode ended, the observation
    (its ``tool_message``). Returns ``(observation, episode over, step info)``."""
    from verl_ext.agent_loops.tool_call_messages import assistant_message, tool_message

    call = call_of(action)
    messages.append(assistant_message("", _Call(call["name"], call["arguments"])))
    obs, _, terminated, truncated, info = env.step(action)
    done = terminated or truncated
    if not done:
        messages.append(tool_message(obs.render(include_instruction=False), None, None, max_tool_response_length))
    return obs, done, info


def play_transcript(task: str, seed: int, policy: str = "oracle", prompt: list[dict[str, Any]] | None = None,
                    max_steps: int = 30,
                    max_tool_response_length: int = MAX_TOOL_RESPONSE_LENGTH,
                    show_todo: bool = False) -> dict[str, Any]:
    """Play one TextHybrid episode with ``scripted-<policy>``; return ``messages``, ``tools``,
    ``actions`` (the policy's) and ``success``. ``prompt`` is the dataset row's prompt
    (``text_hybrid_rows``); the transcript ends with the call that finished the episode.
    ``show_todo``: the env's option (observations end with the items still to do)."""
    import verl.experimental.agent_loop  # noqa: F401  (first: its plugin hook imports the agent loop module)
    from verl_ext.agent_loops.tool_call_messages import first_messages, tool_schemas
    from verl_ext.envs.policies import ScriptedPolicy
    from verl_ext.envs.pool import make_env

    env = make_env("text_hybrid", max_steps=max_steps, show_todo=show_todo)
    scripted = ScriptedPolicy(policy)
    try:
        obs, info = env.reset(seed=seed, options={"task": task})
        scripted.reset(obs, info, env.tool_schemas())
        tools = tool_schemas(env.tool_defs())
        messages = first_messages(list(prompt or []), obs.render())
        actions: list[Action] = []
        success = False
        for _ in range(max_steps):
            action = scripted.act(obs)
            actions.append(action)
            obs, done, step_info = take_turn(env, action, messages, max_tool_response_length)
            success = bool(step_info.get("success", False))
            if done:
                break
    finally:
        env.close()
    return {"messages": messages, "tools": tools, "actions": actions, "success": success}


def app_tool_calls(messages: list[dict[str, Any]]) -> int:
    """How many assistant turns of a transcript call an app tool (any function but ``computer_use``)."""
    return sum(m["tool_calls"][0]["function"]["name"] != GUI_TOOL_NAME for m in messages if m["role"] == "assistant")


def oversample_tool_transcripts(rows: list[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
    """``rows`` (``text_hybrid_sft_rows``) with every transcript that calls an app tool repeated ``factor``
    times in a row (``factor`` 1: ``rows`` unchanged); transcripts of GUI calls only stay once.

    The scripted oracle calls an app tool at about a quarter of its turns (none in the ``gui`` variant's
    tasks), and verl's SFT dataset trains on every assistant turn of a row, so repeating whole transcripts
    is how the SFT data can show the tool turns more often without cutting an episode short."""
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise UserError(f"tool_oversample (prepare-data --tool-oversample, SFT_TOOL_OVERSAMPLE) must be a whole "
                        f"number >= 1, got {factor!r}: 1 writes each transcript once, K writes the ones with an "
                        "app-tool call K times")
    out: list[dict[str, Any]] = []
    for row in rows:
        out += [row] * (factor if app_tool_calls(_decoded(row["messages"])) else 1)
    return out


def text_hybrid_sft_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                         policy: str = "oracle", show_todo: bool = False) -> list[dict[str, Any]]:
    """``n`` SFT rows: the tasks of ``text_hybrid_rows(n, seed, split)`` played by ``scripted-<policy>``
    (``show_todo``: the env's option, as the agent loop's ``env_options`` must then set it).
    ``extra_info`` adds ``num_calls`` and ``num_tool_calls`` (the turns that call an app tool)."""
    from verl_ext.envs.text_hybrid import text_hybrid_rows

    rows = []
    for row in text_hybrid_rows(n, seed, split, templates):
        env = row["extra_info"]["env"]
        demo = play_transcript(env["task"], env["seed"], policy, row["prompt"], show_todo=show_todo)
        if not demo["success"]:
            raise RuntimeError(f"scripted-{policy} failed text_hybrid {env['task']} seed {env['seed']}: "
                               "a demonstration must solve its task")
        rows.append({"messages": json.dumps(demo["messages"]), "tools": json.dumps(demo["tools"]),
                     "extra_info": {**row["extra_info"], "policy": policy, "num_calls": len(demo["actions"]),
                                    "num_tool_calls": app_tool_calls(demo["messages"])}})
    return rows


class JsonMultiTurnSFTDataset(MultiTurnSFTDataset):
    """verl's multi-turn SFT dataset over rows whose ``messages`` / ``tools`` are JSON text
    (``text_hybrid_sft_rows``). Select it with ``data.custom_cls.path=pkg://verl_ext.datasets.demos``
    ``data.custom_cls.name=JsonMultiTurnSFTDataset``."""

    def _read_files_and_process(self) -> None:
        super()._read_files_and_process()
        self.messages = [_decoded(m) for m in self.messages]
        if self.tools is not None:
            self.tools = [_decoded(t) for t in self.tools]

    def _build_messages(self, example: dict) -> list:
        return super()._build_messages({**example, self.messages_key: _decoded(example[self.messages_key])})


class DecisionWeightedSFTDataset(JsonMultiTurnSFTDataset):
    """:class:`JsonMultiTurnSFTDataset` whose ``loss_mask`` is ``data.decision_weight`` (W, default 1)
    instead of 1 at the decision tokens of every assistant call, app tool and ``computer_use`` alike:
    the function name's tokens up to the one where it parts from the other way's names (an app
    tool's from ``computer_use``; ``computer_use`` from every app tool offered), with the tiny
    tokenizer the name's first piece (``s`` of ``settings_set`` against ``c`` of ``computer_use``).

    How the weight reaches the loss without forking verl (0.9.1): with ``data.pad_mode=no_padding``
    (the SFT config's default) ``verl.workers.utils.losses.sft_loss`` is
    ``-sum(log_prob * loss_mask) / batch_num_tokens`` and the engine sets ``batch_num_tokens`` to
    ``loss_mask.sum()``, so a float mask makes the loss a weighted token mean: each decision token
    counts W times, the others once. The padded path casts the mask to bool, so W != 1 is refused
    there. W = 1 returns verl's mask unchanged (same values, same integer dtype). Select it with
    ``data.custom_cls.name=DecisionWeightedSFTDataset +data.decision_weight=W``."""

    def __init__(self, parquet_files: Any, tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int = -1) -> None:
        weight = (config or {}).get("decision_weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise UserError(f"data.decision_weight must be a number > 0 (1: no weighting), got {weight!r}")
        if weight != 1 and (config or {}).get("pad_mode", "right") != "no_padding":
            raise UserError("data.decision_weight != 1 needs data.pad_mode=no_padding: verl's sft_loss reads the "
                            "loss mask as bool in the padded path, which would drop the weight")
        self.decision_weight = float(weight)
        self._offered: list[str] = []
        super().__init__(parquet_files, tokenizer, config, processor=processor, max_samples=max_samples)

    def __getitem__(self, item):
        # the row's function names, read by _process_single_message for each of its assistant turns
        self._offered = [t["function"]["name"] for t in (self.tools[item] if self.tools is not None else None) or []]
        return super().__getitem__(item)

    def _process_single_message(self, index: int, message: dict, full_message: list, tools: Any = None,
                                enable_thinking: Any = None) -> tuple:
        input_ids, loss_mask, attention_mask, inputs = super()._process_single_message(
            index, message, full_message, tools=tools, enable_thinking=enable_thinking)
        if self.decision_weight == 1 or message["role"] != "assistant" or not message.get("tool_calls"):
            return input_ids, loss_mask, attention_mask, inputs
        calls = []
        for call in message["tool_calls"]:
            name = call["function"]["name"]
            others = [GUI_TOOL_NAME] if name != GUI_TOOL_NAME else [n for n in self._offered if n != GUI_TOOL_NAME]
            calls.append((name, others))
        weights = loss_mask.to(torch.float32)
        for position in decision_token_positions(self.tokenizer, input_ids.tolist(), calls):
            if loss_mask[position]:  # only trained-on tokens (never the generation prompt)
                weights[position] = self.decision_weight
        return input_ids, weights, attention_mask, inputs


def decision_token_positions(tokenizer: Any, ids: list[int], calls: list[tuple[str, list[str]]]) -> list[int]:
    """Indices into ``ids`` (one rendered assistant turn) of each call's decision tokens, the calls
    (``(name, the other way's names)``) in order: the tokens overlapping the function name in the
    hermes ``{"name": "<name>"`` JSON, from its first through the first one after which the name
    written so far is a prefix of none of the other names. A name not found in the decoded turn is an
    error (a chat template that writes calls otherwise)."""
    # Character offset where each token ends, from decoding growing prefixes (exact for a tokenizer whose
    # pieces decode to the text they came from; a turn is ~50 tokens).
    ends = [len(tokenizer.decode(ids[:k + 1], skip_special_tokens=False)) for k in range(len(ids))]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    positions: list[int] = []
    cursor = 0
    for name, others in calls:
        match = re.compile(r'"name":\s*"(' + re.escape(name) + r')"').search(text, cursor)
        if match is None:
            raise ValueError(f"function name {name!r} not found in the rendered assistant turn {text!r}")
        start, end = match.span(1)
        for k in range(len(ids)):
            if (ends[k - 1] if k else 0) < end and ends[k] > start:  # the token overlaps the name
                positions.append(k)
                written = text[start:min(ends[k], end)]
                if not any(other.startswith(written) for other in others):
                    break
        cursor = match.end()
    return positions


def _decoded(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# --- what SFT taught: greedy function calls on held-out transcripts ---------------------------------
def turns_of(messages: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Each assistant turn of a transcript: (the messages before it, the call the oracle made there)."""
    return [(messages[:i], m["tool_calls"][0]["function"]) for i, m in enumerate(messages) if m["role"] == "assistant"]


def score_reply(parser: Any, reply_ids: list[int], expected: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(valid, exact, same_function) for one model reply: it holds exactly one call that ``parser``
    (verl's ``ToolParser``) parses -- the loop's ``valid_call_rate`` rule --, that call is
    ``expected``, and it calls ``expected``'s function (any arguments)."""
    _, calls = asyncio.run(parser.extract_tool_calls(reply_ids))
    if len(calls) != 1:
        return False, False, False
    same_function = calls[0].name == expected["name"]
    return True, same_function and json.loads(calls[0].arguments) == expected["arguments"], same_function


def call_rates(tokenizer: Any, rows: list[dict[str, Any]], generate: Callable[[list[int]], list[int]],
               parser_format: str = "hermes") -> dict[str, float]:
    """Share of the assistant turns of ``rows`` (``text_hybrid_sft_rows``) where ``generate`` (prompt
    ids -> reply ids) writes one parseable call (``valid_call_rate``) and the oracle's call
    (``exact_call_rate``); of the turns where the oracle calls an app tool (``tool_turns``), the share
    where the reply is one parseable call of that tool (``tool_turn_call_rate``): a model that only
    ever writes ``computer_use`` calls scores 0 there, whatever its ``valid_call_rate``; of the other turns
    (``gui_turns``), the share where it is one parseable ``computer_use`` call (``gui_turn_call_rate``): a
    model that calls a tool everywhere scores 0 there. The prompt of a
    turn is the chat template over the oracle's earlier turns with the generation prompt: the tokens
    the ``hybrid_gui_tool`` loop feeds the model there."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    parser = ToolParser.get_tool_parser(parser_format, tokenizer)
    valid = exact = turns = tool_turns = tool_hits = gui_hits = 0
    for row in rows:
        tools = _decoded(row["tools"])
        for before, call in turns_of(_decoded(row["messages"])):
            prompt = tokenizer.apply_chat_template(before, tools=tools, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
            ok, same, same_function = score_reply(parser, generate(list(prompt)), call)
            valid, exact, turns = valid + ok, exact + same, turns + 1
            if call["name"] != GUI_TOOL_NAME:
                tool_turns, tool_hits = tool_turns + 1, tool_hits + same_function
            else:
                gui_hits += same_function
    gui_turns = turns - tool_turns
    return {"turns": turns, "valid_call_rate": valid / max(turns, 1), "exact_call_rate": exact / max(turns, 1),
            "tool_turns": tool_turns, "tool_turn_call_rate": tool_hits / max(tool_turns, 1),
            "gui_turns": gui_turns, "gui_turn_call_rate": gui_hits / max(gui_turns, 1)}


def held_out_call_rates(model_path: str, data_file: str, max_new_tokens: int = 128,
                        max_rows: int | None = None) -> dict[str, float]:
    """:func:`call_rates` of the HF model at ``model_path`` decoding greedily on the rows of ``data_file``.

    The model is loaded in fp32 whatever its config says: verl's SFT checkpoint declares bf16, but the
    cpu backend trains and rolls out in fp32 (plugins/backend/cpu.yaml), so this is the model RL starts from.
    It decodes on the first CUDA device where there is one.
    """
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    frame = pd.read_parquet(data_file)  # before the model loads: a wrong file fails at once
    missing = sorted({"messages", "tools"} - set(frame.columns))
    if missing:
        raise UserError(
            f"{data_file} has no {missing} column: not SFT transcripts (verl-ext prepare-data text_hybrid_sft)"
        )
    rows = frame.to_dict("records")[:max_rows]
    if not any(turns_of(_decoded(row["messages"])) for row in rows):
        raise UserError(f"{data_file} holds no assistant turn to score: there is no call rate to report")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # greedy decoding of long transcripts: minutes on a CPU
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()

    def generate(prompt: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt], device=device),
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return out[0, len(prompt):].tolist()

    return call_rates(tokenizer, rows, generate)


def check_tool_turn_rate(rates: dict[str, Any], min_rate: float | None) -> None:
    """The gate before the RFT stage: raise ``UserError`` when the SFT model calls the oracle's tool at
    fewer than ``min_rate`` of the held-out tool turns (``tool_turn_call_rate``); None: no gate."""
    if min_rate is None or rates["tool_turn_call_rate"] >= min_rate:
        return
    raise UserError(
        f"SFT gate: tool_turn_call_rate {rates['tool_turn_call_rate']:.2f} (one parseable call of the oracle's tool at "
        f"{rates['tool_turns']} held-out tool turns) is below SFT_MIN_TOOL_RATE / --min-tool-turn-rate={min_rate}: "
        "the SFT model cannot yet write the tool calls the RFT stage would rank. Train SFT longer (raise SFT_STEPS, "
        "or continue this checkpoint with INIT_MODEL=<it> SFT_STEPS=150 SFT_LR=3e-3), or lower SFT_MIN_TOOL_RATE "
        "(unset: no gate; the RFT stage's choice term, RFT_CHOICE_WEIGHT, scores the choice of a tool whose "
        "arguments do not parse)")


def main(argv: list[str]) -> int:
    """``verl-ext eval-sft MODEL DATA.parquet``: print (and with ``--out`` write) the held-out call rates."""
    parser = argparse.ArgumentParser(prog="verl-ext eval-sft", description=held_out_call_rates.__doc__)
    parser.add_argument("model", help="HF model dir (e.g. sft/global_step_N/huggingface)")
    parser.add_argument("data", help="SFT parquet of held-out transcripts (prepare-data text_hybrid_sft .../val.parquet)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-rows", type=positive_int, default=None)
    parser.add_argument("--out", default=None, help="also write the rates to this JSON file")
    parser.add_argument("--min-tool-turn-rate", type=unit_rate, default=None,
                        help="fail (after writing the rates) when tool_turn_call_rate is below this: the gate "
                             "before the RFT stage (recipes/toolcua_sft_rl: SFT_MIN_TOOL_RATE)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.data):
        raise UserError(f"DATA {args.data}: the file does not exist (verl-ext prepare-data text_hybrid_sft writes one)")
    rates = held_out_call_rates(args.model, args.data, args.max_new_tokens, args.max_rows)
    text = json.dumps(rates)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    check_tool_turn_rate(rates, args.min_tool_turn_rate)
    return 0
