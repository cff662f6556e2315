"""What SFT trains on is what RL feeds the model, and how the SFT model's calls are counted
(``verl_ext.datasets.demos``: ``call_rates``, ``held_out_call_rates``, ``verl-ext eval-sft``).

The first test replays a demonstration through verl's Continuous-Token builder exactly as the
``hybrid_gui_tool`` loop builds its tokens (initial prompt with the tool schemas, each generated turn
up to ``<|im_end|>``, each observation merged as a ``tool`` message) and checks that these tokens are
the tokens verl's SFT dataset trains on, turn by turn, and that the eval's prompts are the loop's."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoTokenizer
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

from verl_ext.cli import main as cli_main
from verl_ext.data import write_parquet
from verl_ext.datasets.demos import JsonMultiTurnSFTDataset, call_rates, text_hybrid_sft_rows, turns_of


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return text_hybrid_sft_rows(2, seed=0, split="val")


def _sft_item(rows: list[dict], tokenizer, tmp_path) -> list[dict]:
    path = write_parquet(rows, str(tmp_path / "sft.parquet"))
    config = OmegaConf.create({"max_length": 32768, "truncation": "error", "pad_mode": "no_padding"})
    dataset = JsonMultiTurnSFTDataset([path], tokenizer, config)
    return [dataset[i] for i in range(len(rows))]


def _replies(item: dict, tokenizer) -> list[list[int]]:
    """The trained-on span of each assistant turn without its final newline: what a model that
    learned the demonstration generates there (generation stops at ``<|im_end|>``)."""
    ids, mask, replies, start = item["input_ids"].tolist(), item["loss_mask"].tolist() + [0], [], None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            assert tokenizer.decode(ids[i - 2:i]) == "<|im_end|>\n"
            replies.append(ids[start:i - 1])
            start = None
    return replies


def test_sft_tokens_are_the_agent_loops_tokens(rows, tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    builder = create_continuous_token_builder(tokenizer, hf_model_type=AutoConfig.from_pretrained(tiny_model_dir).model_type)
    for row, item in zip(rows, _sft_item(rows, tokenizer, tmp_path)):
        messages, tools = json.loads(row["messages"]), json.loads(row["tools"])
        turns, replies = turns_of(messages), _replies(item, tokenizer)
        assert len(turns) == len(replies) == row["extra_info"]["num_calls"]
        first = len(turns[0][0])
        ids = list(builder.build_initial_tokens(messages[:first], tools=tools))
        for k, ((before, _), reply) in enumerate(zip(turns, replies)):
            if k:  # the observation after the previous call, merged as the loop merges it
                previous = messages[:len(turns[k - 1][0]) + 1]  # through the previous assistant turn
                ids = list(builder.merge_context_tokens(previous, before, ids, tools=tools).token_ids)
            # the eval's prompt for this turn is the loop's token prefix
            assert ids == tokenizer.apply_chat_template(before, tools=tools, add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
            ids = list(builder.merge_assistant_tokens(ids, reply).token_ids)
        sft_ids = item["input_ids"].tolist()
        assert ids == sft_ids[:-1] and tokenizer.decode(sft_ids[-1:]) == "\n"  # SFT also trains the newline after <|im_end|>


def test_call_rates_count_one_parseable_call_and_the_oracles_call(rows, tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    oracle = {}  # prompt -> the oracle's reply at that turn
    for row, item in zip(rows, _sft_item(rows, tokenizer, tmp_path)):
        tools = json.loads(row["tools"])
        for (before, _), reply in zip(turns_of(json.loads(row["messages"])), _replies(item, tokenizer)):
            prompt = tokenizer.apply_chat_template(before, tools=tools, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
            oracle[tuple(prompt)] = reply
    turns = len(oracle)
    tool_turns = sum(call["name"] != "computer_use" for row in rows
                     for _, call in turns_of(json.loads(row["messages"])))
    assert tool_turns > 0  # the oracle calls app tools in these transcripts

    assert call_rates(tokenizer, rows, lambda p: oracle[tuple(p)]) == {
        "turns": turns, "valid_call_rate": 1.0, "exact_call_rate": 1.0,
        "tool_turns": tool_turns, "tool_turn_call_rate": 1.0, "gui_turns": turns - tool_turns, "gui_turn_call_rate": 1.0}

    # the 128-wide model's greedy reply after too little SFT: keys repeat, the JSON never closes
    looping = tokenizer.encode('\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", '
                               '"element": 9, "element": 9, "text": "text": "text"</tool_call><|im_end|>')
    assert call_rates(tokenizer, rows, lambda p: looping)["valid_call_rate"] == 0.0

    # a well-formed call that is not the oracle's counts as valid, not exact; two calls are not valid
    click = '\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", "element": 999}}\n</tool_call>'
    rates = call_rates(tokenizer, rows, lambda p: tokenizer.encode(click + "<|im_end|>"))
    assert (rates["valid_call_rate"], rates["exact_call_rate"]) == (1.0, 0.0)
    assert rates["tool_turn_call_rate"] == 0.0  # only GUI calls: never the oracle's tool at its tool turns
    assert rates["gui_turn_call_rate"] == 1.0  # ... and computer_use at every GUI turn, whatever its arguments
    # the opposite habit: a tool call everywhere scores at the tool turns of that tool and at none of the GUI turns
    tool = '\n<tool_call>\n{"name": "settings_set", "arguments": {"key": "volume", "value": "Low"}}\n</tool_call>'
    rates = call_rates(tokenizer, rows, lambda p: tokenizer.encode(tool + "<|im_end|>"))
    settings_turns = sum(call["name"] == "settings_set" for row in rows for _, call in turns_of(json.loads(row["messages"])))
    assert settings_turns > 0
    assert rates["valid_call_rate"] == 1.0 and rates["gui_turn_call_rate"] == 0.0
    assert rates["tool_turn_call_rate"] == settings_turns / tool_turns  # the oracle's tool, not any tool
    assert call_rates(tokenizer, rows, lambda p: tokenizer.encode(click + click + "<|im_end|>"))["valid_call_rate"] == 0.0


def test_eval_sft_command_on_an_untrained_model(rows, tiny_model_dir, tmp_path):
    path = write_parquet(rows[:1], str(tmp_path / "val.parquet"))
    out = tmp_path / "rates.json"
    torch.manual_seed(0)
    assert cli_main(["eval-sft", tiny_model_dir, path, "--max-new-tokens", "8", "--out", str(out)]) == 0
    rates = json.loads(out.read_text())
    assert rates == {"turns": rows[0]["extra_info"]["num_calls"], "valid_call_rate": 0.0, "exact_call_rate": 0.0,
                     "tool_turns": rates["tool_turns"], "tool_turn_call_rate": 0.0,
                     "gui_turns": rates["gui_turns"], "gui_turn_call_rate": 0.0}
