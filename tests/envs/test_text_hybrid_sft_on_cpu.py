"""SFT demonstrations for the ToolCUA SFT -> RL recipe (``verl_ext.datasets.demos``): TextHybrid episodes
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

from verl_ext.cli import main as cli_main
from verl_ext.data import write_parquet
from verl_ext.envs.core import ToolCall, action_from_call
from verl_ext.datasets.demos import (JsonMultiTurnSFTDataset, app_tool_calls, call_of, oversample_tool_transcripts,
                                 play_transcript, text_hybrid_sft_rows)
from verl_ext.errors import UserError
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


@pytest.fixture(scope="module")
def six_rows() -> list[dict]:
    rows = text_hybrid_sft_rows(6, seed=0, split="train", templates=["settings_panel"])
    kinds = {bool(row["extra_info"]["num_tool_calls"]) for row in rows}
    assert kinds == {True, False}  # transcripts with and without an app-tool call (the gui variant's)
    return rows


def test_num_tool_calls_counts_the_oracles_app_tool_turns(six_rows):
    for row in six_rows:
        messages = json.loads(row["messages"])
        calls = [m["tool_calls"][0]["function"]["name"] for m in messages if m["role"] == "assistant"]
        assert row["extra_info"]["num_tool_calls"] == app_tool_calls(messages) == sum(c != "computer_use" for c in calls)
    task = text_hybrid_rows(6, 0, "train", ["settings_panel"])[0]["extra_info"]["env"]
    demo = play_transcript(task["task"], task["seed"])
    assert app_tool_calls(demo["messages"]) == sum(isinstance(a, ToolCall) for a in demo["actions"])


def test_oversampling_repeats_only_the_transcripts_with_tool_calls(six_rows):
    assert oversample_tool_transcripts(six_rows, 1) == six_rows
    out = oversample_tool_transcripts(six_rows, 3)
    with_tools = [row for row in six_rows if row["extra_info"]["num_tool_calls"]]
    assert len(out) == len(six_rows) + 2 * len(with_tools)
    for row in six_rows:
        assert sum(o is row for o in out) == (3 if row in with_tools else 1)
    tool_turns = sum(row["extra_info"]["num_tool_calls"] for row in out)
    assert tool_turns == 3 * sum(row["extra_info"]["num_tool_calls"] for row in six_rows)


@pytest.mark.parametrize("factor", [0, -2, 1.5, True, "2"])
def test_oversampling_factor_names_the_key_and_the_fix(six_rows, factor):
    with pytest.raises(UserError, match=r"tool_oversample \(prepare-data --tool-oversample, SFT_TOOL_OVERSAMPLE\) "
                                        r"must be a whole number >= 1, got .*1 writes each transcript once"):
        oversample_tool_transcripts(six_rows, factor)


def test_prepare_data_oversamples_the_train_split_only(six_rows, tmp_path):
    import pandas as pd

    assert cli_main(["prepare-data", "text_hybrid_sft", str(tmp_path), "--train-size", "6", "--val-size", "3",
                     "--templates", "settings_panel", "--tool-oversample", "2"]) == 0
    train = pd.read_parquet(tmp_path / "train.parquet")
    assert list(train["messages"]) == [row["messages"] for row in oversample_tool_transcripts(six_rows, 2)]
    val = pd.read_parquet(tmp_path / "val.parquet")
    assert len(val) == 3 and val["messages"].nunique() == 3
