"""The tiny-model factory: deterministic, local, and speaks the tool-call format verl parses."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from transformers import AutoTokenizer
from verl.experimental.agent_loop.tool_parser import HermesToolParser

from verl_ext.tiny_model import make_tiny_model


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_files_other_seed_other_weights(tiny_model_dir, tmp_path):
    again = Path(make_tiny_model(str(tmp_path / "again"), seed=0))
    other = Path(make_tiny_model(str(tmp_path / "other"), seed=1))
    base = Path(tiny_model_dir)
    assert _digest(base / "model.safetensors") == _digest(again / "model.safetensors")
    assert _digest(base / "tokenizer.json") == _digest(again / "tokenizer.json")
    assert _digest(base / "model.safetensors") != _digest(other / "model.safetensors")


def test_chat_template_round_trips_tool_calls_through_verls_parser(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "click", "description": "click an element",
              "parameters": {"type": "object", "properties": {"element_id": {"type": "integer"}}}}}]
    messages = [
        {"role": "user", "content": "Open the inbox."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "click", "arguments": {"element_id": 3}}}]},
        {"role": "tool", "content": '{"success": true}'},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "click"' in text and "<tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    # The assistant turn, as the model would emit it, parses into the same call.
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    ids = tok(assistant)["input_ids"]
    assert tok.decode(ids) == assistant  # markup tokens survive decoding
    content, calls = asyncio.run(HermesToolParser(tok).extract_tool_calls(ids))
    assert [(c.name, c.arguments) for c in calls] == [("click", '{"element_id": 3}')]


def test_eos_is_the_chat_end_token(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
