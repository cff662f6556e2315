"""The hybrid GUI + tool agent loop inside verl's real trainer: MiniDesk in headless Chromium,
`hybrid_gui_tool`, HGPO through the verl-ext trainer, cpu backend. The random tiny model solves
nothing; this checks the plumbing (episodes played in the browser, step metadata reaching the
advantage hook), not learning."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, read_metrics, run_hybrid_env_job

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_minidesk_episodes_train_through_verl_with_hgpo(tmp_path, tiny_model_dir):
    run_hybrid_env_job("minidesk", tmp_path, tiny_model_dir, train_size=8, batch=4, response_length=1024)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/score/mean", "critic/advantages/mean", "timing_s/adv", "actor/pg_loss"])
        assert metrics[step]["num_turns/min"] >= 2  # at least one model turn after the env's first observation
