"""The choice term of the per-decision reward (``R_choice``, ``verl_ext.rewards.decision_reward``):
which way the reply takes is read from the function it names, parseable or not, and scored apart
from the format, so a right choice with broken arguments beats a wrong choice written perfectly.
Pure reward math on a hand-written decision (no model, no env)."""

from __future__ import annotations

import json

import pytest

from verl_ext.rewards.decision_reward import compute_score, decision_reward, mode_of_name, named_function

FIRST = {"gui": {"name": "computer_use", "arguments": {"action": "click", "element": 2}},
         "tool": {"name": "settings_set", "arguments": {"key": "volume", "value": "High"}}}


def decision(better: str) -> dict:
    remaining = {"gui": 3, "tool": 2} if better == "tool" else {"gui": 5, "tool": 6}
    return {"remaining": remaining, "best": min(remaining.values()), "better": better,
            "first_calls": json.dumps(FIRST), "app_tools": ["settings_set", "settings_get"]}


def call(mode: str) -> dict:
    return {"name": FIRST[mode]["name"], "arguments": json.dumps(FIRST[mode]["arguments"])}


BROKEN_TOOL = '<tool_call>\n{"name": "settings_set", "arguments": "click", "click", "click"'
BROKEN_GUI = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", "element": 9, "text": "text"'


def test_named_function_reads_the_first_name_parseable_or_not():
    assert named_function(BROKEN_TOOL) == "settings_set"
    assert named_function('{"name": "computer_use", "arguments": {}} {"name": "settings_set"}') == "computer_use"
    assert named_function("Action: click the cell.") is None
    assert named_function('{"name": "arguments": "click"') == "arguments"  # a key where the name should be
    app_tools = ["settings_set"]
    assert [mode_of_name(n, app_tools) for n in ("computer_use", "settings_set", "web_search", None)] == [
        "gui", "tool", "other", "other"]


@pytest.mark.parametrize("better", ["tool", "gui"])
def test_right_choice_with_broken_arguments_beats_a_wrong_exact_call(better):
    worse = "gui" if better == "tool" else "tool"
    d = decision(better)
    broken = {"tool": BROKEN_TOOL, "gui": BROKEN_GUI}
    right_broken = decision_reward([], d, reply=broken[better], choice_weight=2.0)
    wrong_exact = decision_reward([call(worse)], d, reply=None, choice_weight=2.0)
    right_exact = decision_reward([call(better)], d, reply=None, choice_weight=2.0)
    assert right_broken["score"] == 2.0 and right_broken["format_ok"] == 0.0 and right_broken["choice"] == 1.0
    assert wrong_exact["score"] == pytest.approx(1 + d["best"] / d["remaining"][worse]) and wrong_exact["choice"] == 0.0
    assert right_exact["score"] == 4.0
    assert right_exact["score"] > right_broken["score"] > wrong_exact["score"]
    # named-tool rates count the broken tool reply; parsed-tool rates do not
    tool_reply = decision_reward([], d, reply=BROKEN_TOOL, choice_weight=2.0)
    assert tool_reply["named_tool"] == 1.0 and tool_reply["tool_call"] == 0.0
    assert tool_reply["named_tool_tool_shorter"] == float(better == "tool")
    assert tool_reply["named_tool_gui_shorter"] == float(better == "gui")


def test_choice_weight_zero_is_the_format_gated_reward():
    d = decision("tool")
    assert decision_reward([], d, reply=BROKEN_TOOL)["score"] == 0.0
    assert decision_reward([call("gui")], d)["score"] == pytest.approx(1 + 2 / 3)
    assert decision_reward([], d, reply="no call at all", choice_weight=2.0)["score"] == 0.0  # no name: no choice
    distractor = '<tool_call>\n{"name": "web_search", "arguments": {"query": "volume"}}\n</tool_call>'
    assert decision_reward([], d, reply=distractor, choice_weight=2.0)["choice"] == 0.0


def test_compute_score_passes_the_reply_text_and_weights():
    d = decision("tool")
    result = compute_score("verl_ext/text_hybrid_decisions", BROKEN_TOOL, "tool",
                           {"decision_calls": [], "decision": d}, choice_weight=2.0)
    assert result["score"] == 2.0 and result["choice"] == 1.0


@pytest.mark.parametrize("key,value", [("choice_weight", -1.0), ("format_weight", float("nan")), ("choice_weight", "2")])
def test_bad_weights_name_the_key_and_the_fix(key, value):
    with pytest.raises(ValueError, match=rf"reward_kwargs\.{key}=.*must be a finite number >= 0; set it to"):
        compute_score("verl_ext/text_hybrid_decisions", BROKEN_TOOL, "tool",
                      {"decision_calls": [], "decision": decision("tool")}, **{key: value})


def _reward_config(**reward_kwargs):
    from omegaconf import OmegaConf

    return OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://verl_ext.rewards.decision_reward", "name": "compute_score", "reward_kwargs": reward_kwargs}}})


def test_start_up_check_names_a_misspelt_or_bad_weight():
    from verl_ext.validation import decision_reward_settings

    assert decision_reward_settings(_reward_config(choice_weight=2, format_weight=1.0)) == []
    assert decision_reward_settings(_reward_config()) == []
    [problem] = decision_reward_settings(_reward_config(choise_weight=2))
    assert "reward.custom_reward_function.reward_kwargs.choise_weight" in problem and "choice_weight" in problem
    [problem] = decision_reward_settings(_reward_config(choice_weight=-2))
    assert "reward_kwargs.choice_weight=-2 must be a finite number >= 0" in problem
    other = _reward_config(bogus=1)
    other.reward.custom_reward_function.path = "pkg://verl_ext.rewards.other"
    assert decision_reward_settings(other) == []
