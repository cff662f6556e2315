"""SFT demonstrations for the ToolCUA SFT -> RL recipe (``verl_ext.envs.demos``): TextHybrid episodes
of the scripted oracle as ``hybrid_gui_tool`` function-call transcripts, read by verl's own
multi-turn SFT dataset. The trained-on (loss-masked) tokens of each assistant turn must parse,
with verl's hermes parser, back into the oracle's action, and the tokens must be those the tiny
tokenizer's chat template gives for the transcript (no parquet artefacts in the prompt)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.tool_parser import ToolParser

from verl_ext.data import write_parquet
from verl_ext.envs.core import action_from_call
from verl_ext.envs.demos import JsonMultiTurnSFTDataset, call_of, play_transcript, text_hybrid_sft_rows
from verl_ext.envs.text_hybrid import text_hybrid_rows


@pytest.fixture(scope="module")
def demo_rows() -> list[dict]:
    return text_hybrid_sft_rows(3, seed=0, split="train")


def _spans(mask: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) runs of ones in a 0/1 mask."""
    spans, start = [], None
    for i, bit in enumerate(mask.tolist() + [0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_transcript_is_the_agent_loops_format(demo_rows):
    row = text_hybrid_rows(3, 0, "train")[0]
    demo = play_transcript(row["extra_info"]["env"]["task"], row["extra_info"]["env"]["seed"], "oracle", row["prompt"])
    assert demo["success"]
    messages = demo["messages"]
    assert messages[0] == row["prompt"][0]  # the dataset's system prompt, as the loop sends it
    assert messages[1]["content"].startswith(row["prompt"][1]["content"] + "\n\nTask: ")
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool"] * (len(demo["actions"]) - 1) + ["assistant"]
    for message, action in zip(messages[2::2], demo["actions"]):
        assert message["tool_calls"] == [{"type": "function", "function": call_of(action)}]
    assert {t["function"]["name"] for t in demo["tools"]} >= {"computer_use"}
    assert json.loads(demo_rows[0]["messages"]) == messages and json.loads(demo_rows[0]["tools"]) == demo["tools"]


def test_verl_sft_dataset_tokens_round_trip_to_the_oracles_actions(demo_rows, tiny_model_dir, tmp_path):
    path = write_parquet(demo_rows, str(tmp_path / "train.parquet"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = OmegaConf.create({"messages_key": "messages", "tools_key": "tools", "max_length": 32768,
                               "truncation": "error", "pad_mode": "no_padding"})
    dataset = JsonMultiTurnSFTDataset([path], tokenizer, config)
    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    for index, row in enumerate(demo_rows):
        messages, tools = json.loads(row["messages"]), json.loads(row["tools"])
        item = dataset[index]
        expected = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
        assert item["input_ids"].tolist() == list(expected)
        calls = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
        spans = _spans(item["loss_mask"])
        assert len(spans) == len(calls) == row["extra_info"]["num_calls"]
        for (start, end), call in zip(spans, calls):
            _, parsed = asyncio.run(parser.extract_tool_calls(item["input_ids"][start:end].tolist()))
            assert len(parsed) == 1
            assert action_from_call(parsed[0].name, parsed[0].arguments) == action_from_call(call["name"], call["arguments"])


def test_valid_call_rate_is_the_share_of_turns_with_one_parseable_call():
    # What the RL stage reports for the SFT model (verl_ext/episode/valid_call_rate, val-aux/...).
    from verl_ext.rewards.env_rewards import episode_metrics, reward_components

    cut_short = reward_components({"actions": ["settings_set", "computer_use", ""], "valid_calls": 2}, valid=True)
    clean = reward_components({"actions": ["settings_set"], "valid_calls": 1, "format_ok": True}, valid=True)
    silent = reward_components({"actions": [""], "valid_calls": 0}, valid=True)
    assert (cut_short["valid_call_rate"], clean["valid_call_rate"], silent["valid_call_rate"]) == (2 / 3, 1.0, 0.0)
    metrics = episode_metrics([cut_short, clean, silent])
    assert metrics["valid_call_rate"] == pytest.approx(5 / 9) and metrics["format_ok"] == pytest.approx(1 / 3)
