"""recipes/toolcua_sft_rl/run_cpu.sh, short: oracle demonstrations -> verl's SFT trainer (2 steps)
-> verl's main_ppo from the SFT checkpoint (2 steps) with hybrid_gui_tool writing function calls.
Checks the pipeline's joints, not learning: the SFT checkpoint is written in HF format, its held-out
call rates are measured (``verl-ext eval-sft``), the RL run loads it, and the function-call metrics of
the RL stage are reported. (That the default SFT teaches the format is measured in the recipe's README.)"""

from __future__ import annotations

import json

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

# hybrid_gui_tool's start-up check wants the gui extra, browserless TextHybrid or not
pytestmark = [pytest.mark.e2e, pytest.mark.needs_extra("gui")]


def test_sft_checkpoint_feeds_rl_with_function_call_metrics(tmp_path, monkeypatch):
    for key, value in {"SFT_STEPS": "2", "SFT_BATCH": "2", "MAX_TURNS": "3", "SFT_EVAL_ROWS": "1"}.items():
        monkeypatch.setenv(key, value)
    proc = run_recipe("toolcua_sft_rl/run_cpu.sh", tmp_path, "data.max_response_length=768",
                      "data.val_max_samples=2", steps=2, timeout=600)
    sft_model = tmp_path / "sft" / "global_step_2" / "huggingface"
    assert (sft_model / "config.json").is_file() and list(sft_model.glob("*.safetensors"))
    sft_metrics = read_metrics(tmp_path / "sft_metrics.jsonl")
    assert_finite(sft_metrics[2], ["train/loss", "val/loss"])
    rates = json.loads((tmp_path / "sft_eval.json").read_text())
    assert rates["turns"] > 0 and 0.0 <= rates["exact_call_rate"] <= rates["valid_call_rate"] <= 1.0
    assert f"'path': '{sft_model}'" in proc.stdout  # main_ppo's printed config: the actor starts from it
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(key.endswith("/valid_call_rate/mean@1") for key in metrics[0])  # greedy val of the SFT model
    for step in (1, 2):
        assert_finite(metrics[step], ["verl_ext/episode/valid_call_rate", "verl_ext/episode/format_ok",
                                      "verl_ext/episode/accuracy", "actor/pg_loss"])
        assert metrics[step]["verl_ext/episode/episodes"] == 16 and metrics[step]["verl_ext/episode/faults"] == 0
