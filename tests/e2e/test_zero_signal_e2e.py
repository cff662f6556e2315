"""With ``trainer.v1.verl_ext.stop_on_zero_signal=true`` a step whose advantages are 0 on every
token stops the run with the cause (``verl_ext.advantages.signal``); with ``false`` it trains on.
The quickstart (verl's GRPO, groups of 4) with a reward that gives every response the same score:
every group's rewards are equal, so GRPO's advantages are all 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

CONSTANT_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 0.5
'''


@pytest.fixture
def constant_reward(tmp_path) -> list[str]:
    path = tmp_path / "constant_reward.py"
    path.write_text(CONSTANT_REWARD)
    return [f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=compute_score",
            "trainer.val_before_train=false", "trainer.test_freq=-1"]


# the quickstart trains on through steps without signal (a random model); the stop is switched on here
STOP = "trainer.v1.verl_ext.stop_on_zero_signal=true"


def test_a_step_without_signal_stops_the_run_with_the_cause(tmp_path, constant_reward):
    env = {**os.environ, "OUT": str(tmp_path), "STEPS": "2", "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(REPO / "recipes/quickstart/run_cpu.sh"), *constant_reward, STOP],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    (tmp_path / "run.log").write_text(log)
    assert proc.returncode != 0
    assert "NoSignalError" in log, log[-6000:]
    assert "algorithm.adv_estimator=grpo gave advantage 0 to every token of all 32 trainable rows of this step" in log
    assert "trainer.v1.verl_ext.stop_on_zero_signal=false" in log  # the opt-out is named


def test_the_opt_out_trains_on_and_logs_the_zero_share(tmp_path, constant_reward):
    run_recipe("quickstart/run_cpu.sh", tmp_path, *constant_reward, "trainer.v1.verl_ext.stop_on_zero_signal=false",
               steps=1)
    m = read_metrics(tmp_path / "metrics.jsonl")[1]
    assert m["verl_ext/signal/zero_advantage_row_share"] == 1.0
    assert m["verl_ext/signal/zero_advantage_token_share"] == 1.0
    assert m["verl_ext/signal/single_member_group_share"] == 0.0  # groups of 4: equal rewards, not size
