"""GiGPO through verl's real `main_ppo` on the cpu backend, with the tiny model playing the
multi-step TextCorridor env (`recipes/text_corridor/run_cpu.sh`). Slow: one run of 2-4 minutes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .conftest import assert_finite, assert_hook_metrics, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

STEPS = 3
SOURCE = "verl_ext/text_corridor"
VAL_STEPS = f"val-aux/{SOURCE}/num_steps/mean@1"


@pytest.fixture(scope="module")
def gigpo_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text_corridor_gigpo")
    run_recipe("text_corridor/run_cpu.sh", out, f"trainer.test_freq={STEPS}", "algorithm.adv_estimator=gigpo",
               steps=STEPS)
    return out


def test_every_step_trains_with_finite_nonzero_step_advantages(gigpo_run: Path):
    # gigpo's advantages only exist if every row's StepMetadata reached the trainer's advantage
    # hook through TransferQueue (the glue raises MissingStepMetadataError otherwise).
    metrics = read_metrics(gigpo_run / "metrics.jsonl")
    assert set(range(1, STEPS + 1)) <= set(metrics), f"steps logged: {sorted(metrics)}"
    trained = []
    for step in range(1, STEPS + 1):
        m = metrics[step]
        assert_finite(m, ["critic/advantages/mean", "critic/advantages/max", "critic/advantages/min",
                          "actor/pg_loss", "actor/grad_norm", "critic/score/mean"])
        # A random model's rollouts of one prompt sometimes all score the same: that step's advantages
        # are all 0, and the signal metric must say so (every row without signal), not hide it.
        varied = m["critic/advantages/max"] > m["critic/advantages/min"]
        assert varied or m["verl_ext/signal/zero_advantage_row_share"] == 1.0, f"step {step}: {m}"
        trained.append(varied)
        assert_hook_metrics(m, ("step_metadata", "advantages"))  # the step-aware glue, timed
        assert 0.0 <= m["critic/score/mean"] <= 1.0  # the score is the episode success
    assert any(trained), "no step had advantages that differ between rows"


def test_episode_record_reaches_the_reward(gigpo_run: Path):
    # The reward reads the step count from the agent loop's StepMetadata; verl counts the turns of
    # the same AgentLoopOutput itself (user prompt + one assistant and one observation per step).
    metrics = read_metrics(gigpo_run / "metrics.jsonl")
    for step in (0, STEPS):
        m = metrics[step]
        assert_finite(m, [VAL_STEPS, f"val-aux/{SOURCE}/success/mean@1", "val-aux/num_turns/mean"])
        assert m[VAL_STEPS] >= 1
        assert math.isclose(m["val-aux/num_turns/mean"], 2 * m[VAL_STEPS] + 1, rel_tol=1e-9)


def test_the_episode_is_multi_turn(gigpo_run: Path):
    # One row per trajectory: the response holds several model turns and the observations between them.
    metrics = read_metrics(gigpo_run / "metrics.jsonl")
    assert max(metrics[s]["val-aux/num_turns/max"] for s in (0, STEPS)) > 3
