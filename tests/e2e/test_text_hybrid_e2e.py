"""The hybrid GUI + tool agent loop inside verl's real trainer with no browser: TextHybrid
(``verl_ext.envs.text_hybrid``), ``hybrid_gui_tool`` in its function-call format (verl's hermes
parser), HGPO through the verl-ext trainer, cpu backend. The random tiny model writes no valid
call, so each episode is one model turn after the env's first observation; this checks the
plumbing (rows -> env backend -> agent loop -> step metadata -> advantage hook), not learning."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, read_metrics, run_hybrid_env_job

# hybrid_gui_tool's start-up check wants the gui extra, browserless TextHybrid or not
pytestmark = [pytest.mark.e2e, pytest.mark.needs_extra("gui")]


def test_text_hybrid_episodes_train_through_verl_with_function_calls(tmp_path, tiny_model_dir):
    log = run_hybrid_env_job("text_hybrid", tmp_path, tiny_model_dir, train_size=4, batch=2, response_length=512)
    assert "chromium" not in log.lower()  # no browser was started or looked for
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/score/mean", "critic/advantages/mean", "timing_s/adv", "actor/pg_loss"])
        assert metrics[step]["num_turns/min"] >= 2  # at least one model turn after the env's first observation
        # 2 prompts x 2 samples, each a TextHybrid episode with step metadata, none faulted.
        assert metrics[step]["verl_ext/episode/episodes"] == 4 and metrics[step]["verl_ext/episode/faults"] == 0
