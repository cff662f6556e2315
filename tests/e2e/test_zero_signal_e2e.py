"""A step whose advantages are 0 on every token stops the run with the cause
(``verl_ext.advantages.signal``). The quickstart (verl's GRPO, groups of 4) with a reward that gives
every response the same score: every group's rewards are equal, so GRPO's advantages are all 0.
(The opt-out, ``stop_on_zero_signal=false``, is what every cpu recipe runs with; the decision per
local update is tested in tests/advantages/test_signal_on_cpu.py.)"""

from __future__ import annotations

import pytest

from .conftest import run_recipe

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


# the quickstart opts out (a random model has steps without signal): the default is put back here
STOP = "trainer.v1.verl_ext.stop_on_zero_signal=true"


def test_a_step_without_signal_stops_the_run_with_the_cause(tmp_path, constant_reward):
    proc = run_recipe("quickstart/run_cpu.sh", tmp_path, *constant_reward, STOP, steps=2, must_fail=True)
    log = proc.stdout + proc.stderr
    assert "NoSignalError" in log, log[-6000:]
    assert "algorithm.adv_estimator=grpo gave advantage 0 to every token of all 32 trainable rows of this step" in log
    assert "trainer.v1.verl_ext.stop_on_zero_signal=false" in log  # the opt-out is named
