"""The gate between SFT and the RFT stage (``verl-ext eval-sft --min-tool-turn-rate``, the recipe's
``SFT_MIN_TOOL_RATE``): pure checks on a rates dict, no model."""

from __future__ import annotations

import argparse

import pytest

from verl_ext.cli_args import unit_rate
from verl_ext.datasets.demos import check_tool_turn_rate
from verl_ext.errors import UserError

RATES = {"valid_call_rate": 1.0, "exact_call_rate": 0.18, "tool_turns": 9, "tool_turn_call_rate": 0.0}


def test_gate_passes_when_unset_or_met():
    check_tool_turn_rate(RATES, None)
    check_tool_turn_rate({**RATES, "tool_turn_call_rate": 0.5}, 0.5)


def test_gate_names_the_key_and_the_fix():
    with pytest.raises(UserError, match=r"tool_turn_call_rate 0\.00 .*9 held-out tool turns.*SFT_MIN_TOOL_RATE.*"
                                        r"--min-tool-turn-rate=0\.3.*Train SFT longer"):
        check_tool_turn_rate(RATES, 0.3)


def test_rate_argument_must_be_a_rate():
    assert unit_rate("0.25") == 0.25
    with pytest.raises(argparse.ArgumentTypeError, match="not a rate"):
        unit_rate("1.5")
