"""recipes/toolcua_sft_rl/run_cpu.sh, short: oracle demonstrations -> verl's SFT trainer (2 steps)
-> single-turn RL on critical switching steps with verl's main_ppo (RFT, 1 step) -> verl's main_ppo
from the RFT checkpoint (2 steps) with hybrid_gui_tool writing function calls.
Checks the pipeline's joints, not learning: the SFT checkpoint is written in HF format, its held-out
call rates are measured (``verl-ext eval-sft``), the RFT stage starts from it, scores decisions and
writes an HF checkpoint, the online RL run loads that, and the function-call and per-decision
metrics of the online stage are reported. (That the default SFT teaches the format is measured in
the recipe's README.)"""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from .conftest import assert_finite, read_metrics, run_recipe

# hybrid_gui_tool's start-up check wants the gui extra, browserless TextHybrid or not
pytestmark = [pytest.mark.e2e, pytest.mark.needs_extra("gui")]


def started_from(out, stage: str) -> str:
    """The model path main_ppo composed for ``stage`` (Hydra's record of the job's config, written in
    the launching process: the config main_ppo prints reaches stdout only through Ray's log monitor,
    which lost the online stage's copy in one CI run)."""
    config = OmegaConf.load(out / "hydra" / stage / ".hydra" / "config.yaml")
    return config.actor_rollout_ref.model.path


def test_sft_checkpoint_feeds_rl_with_function_call_metrics(tmp_path, monkeypatch):
    short = {"SFT_STEPS": "2", "SFT_BATCH": "2", "MAX_TURNS": "3", "SFT_EVAL_ROWS": "1",
             "RFT_STEPS": "1", "RFT_BATCH": "2", "RFT_N": "2", "RFT_ROWS": "4", "RFT_VAL_ROWS": "2",
             "RL_RESPONSE_LENGTH": "768", "RL_VAL_SIZE": "2"}
    for key, value in short.items():
        monkeypatch.setenv(key, value)
    run_recipe("toolcua_sft_rl/run_cpu.sh", tmp_path, steps=2, timeout=1500)
    sft_model = tmp_path / "sft" / "global_step_2" / "huggingface"
    assert (sft_model / "config.json").is_file() and list(sft_model.glob("*.safetensors"))
    sft_metrics = read_metrics(tmp_path / "sft_metrics.jsonl")
    assert_finite(sft_metrics[2], ["train/loss", "val/loss"])
    rates = json.loads((tmp_path / "sft_eval.json").read_text())
    assert rates["turns"] > 0 and 0.0 <= rates["exact_call_rate"] <= rates["valid_call_rate"] <= 1.0
    assert started_from(tmp_path, "rft") == str(sft_model)
    rft_model = tmp_path / "rft" / "global_step_1" / "actor" / "huggingface"
    assert (rft_model / "config.json").is_file() and (rft_model / "tokenizer_config.json").is_file()
    rft = read_metrics(tmp_path / "rft_metrics.jsonl")
    decision_val = "val-aux/verl_ext/text_hybrid_decisions/{}/mean@1"
    for step in (0, 1):  # held-out decisions, greedy, before and after the RFT step
        assert_finite(rft[step], [decision_val.format(k) for k in ("format_ok", "path", "chose_better", "better_tool")])
    assert_finite(rft[1], ["actor/pg_loss", "critic/score/mean"])
    # 2 decisions x 2 samples: the share of GRPO groups whose samples all scored the same (no signal)
    assert rft[1]["verl_ext/groups/count"] == 2 and rft[1]["verl_ext/groups/uniform_reward_share"] in (0.0, 0.5, 1.0)
    assert started_from(tmp_path, "rl") == str(rft_model)
    assert [line.split(":")[1].split()[0] for line in (tmp_path / "stage_times.txt").read_text().splitlines()] == [
        "sft", "rft", "rl"]
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(key.endswith("/valid_call_rate/mean@1") for key in metrics[0])  # greedy val of the RFT model
    assert any(key.endswith("/decisions_tool/mean@1") for key in metrics[0])  # per-decision counts of calls
    for step in (1, 2):
        assert_finite(metrics[step], ["verl_ext/episode/valid_call_rate", "verl_ext/episode/format_ok",
                                      "verl_ext/episode/accuracy", "actor/pg_loss"])
        assert metrics[step]["verl_ext/episode/episodes"] == 16 and metrics[step]["verl_ext/episode/faults"] == 0
