"""The per-decision reward of the single-turn RL stage (``verl_ext.rewards.decision_reward``) on
calls parsed by verl's hermes parser inside the ``decision_turn`` loop, at real decision rows.

Expected numbers follow the formula ``R = R_fmt + best / remaining`` with ``remaining`` from the
row (checked against ``decision_table`` in ``tests/envs/test_decisions_on_cpu.py``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from verl_ext.datasets.decisions import decision_rows
from verl_ext.rewards.decision_reward import compute_score


@pytest.fixture(scope="module")
def row() -> dict:
    """A decision of inventory_sheet where the two options differ by several steps."""
    rows = decision_rows(40, seed=0, split="train", templates=["inventory_sheet"])
    return max(rows, key=lambda r: abs(r["extra_info"]["decision"]["remaining"]["gui"]
                                       - r["extra_info"]["decision"]["remaining"]["tool"]))


class OneReply:
    def __init__(self, tokenizer: Any, text: str):
        self.tokenizer, self.text = tokenizer, text

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.text + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def score(tiny_model_dir: str, row: dict, reply: str) -> tuple[dict, Any]:
    """Roll ``reply`` out through ``decision_turn`` and score it as verl's reward loop does
    (the loop's ``extra_fields`` merged into the row's ``extra_info``)."""
    from transformers import AutoTokenizer

    from tests.envs.test_decisions_on_cpu import decision_loop

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def rollout():
        return await decision_loop(tokenizer, OneReply(tokenizer, reply)).run(
            {"temperature": 1.0}, raw_prompt=row["prompt"], extra_info=row["extra_info"])

    out = asyncio.run(rollout())
    result = compute_score(row["data_source"], reply, row["reward_model"]["ground_truth"],
                           {**row["extra_info"], **out.extra_fields})
    return result, out


def hermes(name: str, arguments: dict) -> str:
    return "\n<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_best_and_worse_choices_and_malformed_replies(tiny_model_dir, row):
    decision = row["extra_info"]["decision"]
    first, remaining, best = json.loads(decision["first_calls"]), decision["remaining"], decision["best"]
    better = decision["better"]
    worse = "gui" if better == "tool" else "tool"
    assert remaining[worse] > best

    result, out = score(tiny_model_dir, row, hermes(**first[better]))
    assert out.extra_fields["decision_calls"][0]["name"] == first[better]["name"]
    assert sum(out.response_mask) == len(out.response_ids) > 0
    assert result["score"] == 2.0 and result["chose_better"] == 1.0 and result["exact"] == 1.0
    assert result["tool_call"] == float(better == "tool") and result["extra_steps"] == 0.0
    assert result["tool_call_tool_shorter"] == float(better == "tool") and result["tool_call_gui_shorter"] == 0.0

    result, _ = score(tiny_model_dir, row, hermes(**first[worse]))
    assert result["score"] == pytest.approx(1 + best / remaining[worse]) and result["chose_better"] == 0.0
    assert result["extra_steps"] == remaining[worse] - best

    # the right tool with other arguments: one wasted call, then the tool path
    tool_name = first["tool"]["name"]
    result, _ = score(tiny_model_dir, row, hermes(tool_name, {"nothing": "here"}))
    assert result["score"] == pytest.approx(1 + best / (1 + remaining["tool"])) and result["exact"] == 0.0
    # a distractor: one wasted call, then the longer path
    distractor = next(t["function"]["name"] for t in json.loads(row["extra_info"]["tools"])
                      if t["function"]["name"] not in decision["app_tools"] + ["computer_use"])
    result, _ = score(tiny_model_dir, row, hermes(distractor, {}))
    assert result["score"] == pytest.approx(1 + best / (1 + max(remaining.values())))
    assert result["tool_call"] == 0.0

    # a function the row does not offer (the GUI tool's first piece, a tool's last): no valid call
    result, _ = score(tiny_model_dir, row, hermes("computer_set", first[better]["arguments"]))
    assert result["score"] == 0.0 and result["format_ok"] == 0.0 and result["choice"] == 0.0

    # malformed: keys loop and the JSON never closes; two calls; no call at all
    looping = '\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", "element": 9, "text": "text"</tool_call>'
    for reply in (looping, hermes(**first[better]) + hermes(**first[better]), "Action: click the cell."):
        result, _ = score(tiny_model_dir, row, reply)
        assert result["score"] == 0.0 and result["format_ok"] == 0.0


def test_reward_names_what_is_missing():
    with pytest.raises(KeyError, match="decision_turn"):
        compute_score("verl_ext/text_hybrid_decisions", "", "tool", {"decision": {}})
