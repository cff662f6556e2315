"""The ``dvreward`` reward manager inside verl's real trainer on the cpu backend
(``recipes/dvreward_judge/run_cpu.sh``): GRPO on templated prompts, every reward from DVReward with a
judge served by ``verl-ext judge-server`` on 127.0.0.1, 2 steps. The judge fails every question about
kites with HTTP 503, so those trajectories are flagged (``dv_valid=0``) and must be kept out of
training. Slow: one run of 2-4 minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

STEPS = 2
DV = "verl_ext/dvreward"
EXCLUDED = "verl_ext/invalid_reward/excluded_rows"
JUDGE_METRICS = [f"{DV}/judge_latency_s/mean", f"{DV}/failure_rate", f"{DV}/cache_hit_rate",
                 f"{DV}/questions_per_sample", f"{DV}/score/mean", f"{DV}/semantic/mean", f"{DV}/quality/mean",
                 f"{DV}/valid_fraction", EXCLUDED, "verl_ext/invalid_reward/excluded_fraction"]


@pytest.fixture(scope="module")
def dv_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dvreward_judge")
    run_recipe("dvreward_judge/run_cpu.sh", out, steps=STEPS)
    return out


def test_every_step_trains_and_logs_the_judge_metrics(dv_run: Path):
    metrics = read_metrics(dv_run / "metrics.jsonl")
    assert set(range(1, STEPS + 1)) <= set(metrics), f"steps logged: {sorted(metrics)}"
    for step in range(1, STEPS + 1):
        m = metrics[step]
        assert_finite(m, JUDGE_METRICS + ["actor/pg_loss", "actor/grad_norm", "critic/advantages/mean"])
        assert m[f"{DV}/questions_per_sample"] == 4  # the dv_describe template asks 4 questions
        assert 0.0 < m[f"{DV}/judge_latency_s/mean"] < 30.0
        assert 0.0 <= m[f"{DV}/score/mean"] <= 1.0 and 0.0 <= m[f"{DV}/cache_hit_rate"] <= 1.0


def test_judge_failures_are_flagged_and_kept_out_of_training(dv_run: Path):
    metrics = read_metrics(dv_run / "metrics.jsonl")
    excluded = 0.0
    for step in range(1, STEPS + 1):
        m = metrics[step]
        flagged = 1.0 - m[f"{DV}/valid_fraction"]
        # exactly the flagged rows left training (verl_ext.advantages.validity) ...
        assert m["verl_ext/invalid_reward/excluded_fraction"] == pytest.approx(flagged)
        # ... and they are the kite rows: 2 of their 4 questions fail, every other question is answered
        assert m[f"{DV}/failure_rate"] == pytest.approx(0.5 * flagged)
        # a prompt's 4 rollouts share its questions, so whole groups are flagged
        assert m[EXCLUDED] % 4 == 0
        excluded += m[EXCLUDED]
    assert excluded > 0, "no kite prompt in the first steps: the fault path was not exercised"


def test_validation_reports_dvreward_fields(dv_run: Path):
    # verl's own validation logs every reward_extra_info key (val-aux/<data source>/<key>/mean@1)
    m = read_metrics(dv_run / "metrics.jsonl")[STEPS]
    assert_finite(m, ["val-aux/verl_ext/dv_describe/dv_n_questions/mean@1"])
