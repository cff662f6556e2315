"""Critical switching steps as data (``verl_ext.datasets.decisions``, ``verl-ext prepare-data
text_hybrid_decisions``) and the ``decision_turn`` loop that rolls them out.

The prompts are checked against the real ``hybrid_gui_tool`` loop: a scripted server replays the
row's earlier calls through that loop on the env and records the tokens the loop feeds the model
at the decision; ``decision_turn`` must build the same tokens from the row. The costs are checked
against a brute-force search over ``decision_table`` (every choice sequence to the end)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from verl_ext.data import main as prepare_data
from verl_ext.datasets.decisions import DecisionDataset, decision_rows
from verl_ext.envs.text_hybrid import decision_table, make_task

from .test_agent_loop_on_cpu import make_loop


def tool_call(function: dict[str, Any]) -> str:
    """A hermes call as the SFT demonstrations teach the model to write it (the chat template's
    rendering of an assistant turn with an empty content: a newline, then the call)."""
    return "\n<tool_call>\n" + json.dumps({"name": function["name"], "arguments": function["arguments"]}) + "\n</tool_call>"


@pytest.fixture(scope="module", autouse=True)
def _close_pools():
    from verl_ext.envs.pool import close_all_pools

    yield
    close_all_pools()


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return decision_rows(24, seed=0, split="train")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class ReplayServer:
    """Replies with the given calls in order, then with no call (the loop stops); keeps every prompt."""

    def __init__(self, tokenizer: Any, calls: list[dict[str, Any]]):
        self.tokenizer, self.calls, self.prompts = tokenizer, list(calls), []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **kwargs: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        text = (tool_call(self.calls.pop(0)) if self.calls else "no call") + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed", extra_fields={})


def decision_loop(tokenizer: Any, server: Any):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from verl_ext.agent_loops.decision_turn import DecisionTurnAgentLoop

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 16384, "response_length": 256, "multi_turn": {"format": "hermes"}}}, "data": {}})
    return DecisionTurnAgentLoop(trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                 processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
                                 hf_model_type="qwen2")


def assert_prompts_are_the_loops(rows: list[dict], tokenizer: Any, **loop_kwargs: Any) -> None:
    """Two off-path rows and one on-path row: the multi-turn loop (``loop_kwargs``), replaying the row's
    earlier calls on the env, feeds the model the tokens ``decision_turn`` builds from the row."""
    off_path = [r for r in rows if not r["extra_info"]["decision"]["on_oracle_path"]][:2]
    on_path = [r for r in rows if r["extra_info"]["decision"]["on_oracle_path"] and r["extra_info"]["decision"]["prefix"]][:1]
    assert off_path and on_path
    for row in off_path + on_path:
        messages, spec = json.loads(row["prompt"]), row["extra_info"]["env"]
        earlier = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
        assert len(earlier) > 0
        server = ReplayServer(tokenizer, earlier)
        task_prompt = messages[:1] + [{"role": "user", "content": "Complete the task in the app below."}]

        async def play(server, task_prompt, spec, messages, extra_info):
            loop = make_loop(tokenizer, server, **loop_kwargs)
            loop.max_turns = 40
            await loop.run({"temperature": 1.0}, raw_prompt=task_prompt, extra_info={"env": spec})
            decision = decision_loop(tokenizer, server)
            return await decision.prompt_ids(messages, decision.tools_of(extra_info))

        ids = asyncio.run(play(server, task_prompt, spec, messages, row["extra_info"]))
        assert server.prompts[len(earlier)] == ids  # the multi-turn loop's tokens at the decision's turn


def test_decision_prompts_are_the_agent_loops_prompts(rows, tokenizer):
    assert_prompts_are_the_loops(rows, tokenizer)


def test_with_the_todo_list_the_decisions_subgoal_comes_first_in_the_last_observation(tokenizer):
    """show_todo (TextHybridEnv; prepare-data --show-todo; the loop's env_options): the rows are still the
    loop's prompts when the loop's env shows the to-do list, and the item that list starts with is the
    decision's subgoal (the rows' prefixes do the subgoals in the instruction's order)."""
    todo_rows = decision_rows(16, seed=0, split="train", show_todo=True)
    assert_prompts_are_the_loops(todo_rows, tokenizer, env_options={"show_todo": True})
    for row in todo_rows:
        spec, decision = row["extra_info"]["env"], row["extra_info"]["decision"]
        app, _, _ = make_task(spec["task"], spec["seed"])
        last = json.loads(row["prompt"])[-1]["content"]
        assert last.splitlines()[-1].startswith(f"To do: ({decision['index'] + 1}) {app.subgoals[decision['index']].text}")


def _fewest_steps(table: list[dict[int, dict]], i: int, view: int) -> int:
    """Brute force: every choice sequence from decision ``i`` in ``view`` to the end; the shortest."""
    lengths = []
    for modes in itertools.product(("gui", "tool"), repeat=len(table) - i):
        total, v = 0, view
        for j, mode in enumerate(modes, start=i):
            option = table[j][v]
            done_by = mode if option["tool"] is not None else "gui"
            total += len(option[done_by])
            v = option["after"] if done_by == "gui" else v
        lengths.append(total)
    return min(lengths)


def test_costs_match_the_decision_table(rows):
    for row in rows:
        spec, decision = row["extra_info"]["env"], row["extra_info"]["decision"]
        app, _, _ = make_task(spec["task"], spec["seed"])
        table = decision_table(app.subgoals, app.view)
        i, view = decision["index"], decision["view"]
        option = table[i][view]
        remaining = {"gui": len(option["gui"]) + _fewest_steps(table, i + 1, option["after"]),
                     "tool": len(option["tool"]) + _fewest_steps(table, i + 1, view)}
        assert decision["remaining"] == remaining and decision["best"] == min(remaining.values())
        assert decision["better"] == option["better"] == min(remaining, key=remaining.get) != "tie"
        assert row["reward_model"]["ground_truth"] == decision["better"]
        first = json.loads(decision["first_calls"])
        assert first["tool"]["name"] == option["tool"][0]["tool"] and first["gui"]["name"] == "computer_use"
    assert {r["extra_info"]["decision"]["better"] for r in rows} == {"gui", "tool"}


def test_prepare_data_splits_by_task_instance_and_the_dataset_decodes_prompts(tmp_path, tokenizer):
    assert prepare_data(["text_hybrid_decisions", str(tmp_path), "--train-size", "12", "--val-size", "6",
                         "--templates", "settings_panel,inventory_sheet"]) == 0
    frames = {split: pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "val")}
    instances = {split: {(e["env"]["task"], e["env"]["seed"]) for e in f.extra_info} for split, f in frames.items()}
    assert len(frames["train"]) == 12 and len(frames["val"]) == 6
    assert instances["train"] and instances["val"] and not instances["train"] & instances["val"]
    assert {t for t, _ in instances["train"] | instances["val"]} <= {"settings_panel", "inventory_sheet"}

    config = OmegaConf.create({"max_prompt_length": 16384, "filter_overlong_prompts": False})
    dataset = DecisionDataset([str(tmp_path / "val.parquet")], tokenizer, config)
    item = dataset[0]
    assert item["raw_prompt"] == json.loads(frames["val"].prompt[0]) and item["agent_name"] == "decision_turn"


def test_balanced_training_rows_hold_half_of_each_label_and_val_keeps_the_tasks_mix(tmp_path):
    """--balance-labels: the train split half GUI-shorter, half tools-shorter (settings_panel's own mix is
    about 70% tools); the held-out split is the one written without the flag."""
    args = ["text_hybrid_decisions", "--train-size", "16", "--val-size", "8", "--templates", "settings_panel"]
    assert prepare_data([args[0], str(tmp_path / "bal"), *args[1:], "--balance-labels"]) == 0
    assert prepare_data([args[0], str(tmp_path / "mix"), *args[1:]]) == 0
    frames = {(kind, split): pd.read_parquet(tmp_path / kind / f"{split}.parquet")
              for kind in ("bal", "mix") for split in ("train", "val")}
    labels = {key: [e["decision"]["better"] for e in f.extra_info] for key, f in frames.items()}
    assert sorted(labels["bal", "train"]) == ["gui"] * 8 + ["tool"] * 8
    assert labels["mix", "train"].count("tool") > labels["mix", "train"].count("gui")  # the skew it removes
    assert list(frames["bal", "val"].prompt) == list(frames["mix", "val"].prompt) and labels["bal", "val"] == labels["mix", "val"]
    # the same states as unbalanced rows, in the same order, the surplus label's skipped
    mixed_prompts = list(pd.read_parquet(tmp_path / "mix" / "train.parquet").prompt)
    balanced = [p for p in frames["bal", "train"].prompt if p in mixed_prompts]
    assert balanced == [p for p in mixed_prompts if p in set(balanced)]
    with pytest.raises(ValueError, match="even number of rows"):
        decision_rows(15, seed=0, split="train", templates=["settings_panel"], balance_labels=True)


def test_too_many_rows_for_the_tasks_is_an_error(monkeypatch):
    from verl_ext.datasets import decisions

    monkeypatch.setattr(decisions, "SPARE_TASKS", -39)  # 40 rows asked of 1 task (it has at most 6 decisions)
    with pytest.raises(RuntimeError, match="ask for fewer rows"):
        decision_rows(40, seed=0, split="val", templates=["settings_panel"])


def test_switch_warmup_rows_teach_both_options_of_each_decision():
    """``prepare-data text_hybrid_switch_warmup``: per decision, the transcript up to it plus one
    option's first call, once for the GUI and once for the tool (no preference), as SFT rows."""
    from verl_ext.datasets.decisions import switch_warmup_rows

    rows = switch_warmup_rows(6, seed=0, split="train", templates=["settings_panel"])
    decisions = decision_rows(3, seed=0, split="train", templates=["settings_panel"])
    assert len(rows) == 6 and [r["extra_info"]["mode"] for r in rows] == ["gui", "tool"] * 3
    for pair, decision in zip((rows[0:2], rows[2:4], rows[4:6]), decisions):
        first_calls = json.loads(decision["extra_info"]["decision"]["first_calls"])
        for row in pair:
            messages = json.loads(row["messages"])
            assert messages[:-1] == json.loads(decision["prompt"]) and row["tools"] == decision["extra_info"]["tools"]
            call = messages[-1]["tool_calls"][0]["function"]
            expected = first_calls[row["extra_info"]["mode"]]
            assert messages[-1]["role"] == "assistant" and call["name"] == expected["name"]
            assert call["arguments"] == expected["arguments"]


def test_switch_warmup_rows_shorter_targets_teach_the_shorter_way_of_each_decision():
    """``--warmup-targets shorter``: one row per decision, in ``decision_rows``' order, the transcript up to
    it plus the first call of the shorter way (the label the RL half's reward pays for)."""
    from verl_ext.datasets.decisions import switch_warmup_rows

    rows = switch_warmup_rows(8, seed=0, split="train", templates=["settings_panel"], targets="shorter")
    decisions = decision_rows(8, seed=0, split="train", templates=["settings_panel"])
    assert len(rows) == 8
    for row, decision in zip(rows, decisions):
        better = decision["extra_info"]["decision"]["better"]
        assert row["extra_info"]["mode"] == row["extra_info"]["better"] == better
        messages = json.loads(row["messages"])
        assert messages[:-1] == json.loads(decision["prompt"])
        expected = json.loads(decision["extra_info"]["decision"]["first_calls"])[better]
        call = messages[-1]["tool_calls"][0]["function"]
        assert (call["name"], call["arguments"]) == (expected["name"], expected["arguments"])
    assert {r["extra_info"]["mode"] for r in rows} == {"gui", "tool"}  # both labels occur: not one way taught
    with pytest.raises(ValueError, match="targets must be one of"):
        switch_warmup_rows(2, seed=0, split="train", templates=["settings_panel"], targets="better")
