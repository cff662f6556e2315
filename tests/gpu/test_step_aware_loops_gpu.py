"""The three estimators that need a special rollout, each trained by verl's ``main_ppo`` with vLLM:
``recipes/text_hybrid/run_gpu.sh ADV=<name>`` (FSDP2 + vLLM, the tiny random model answering the T/G
menu) runs two steps of UI-S1's semi-online rollout (``step_grouped``) or of the planner/executor
rollout (``himac``, ``hiper`` with verl's critic), and every step's advantages on the dumped rows are
the pure estimator of their metadata, as on the cpu backend (``tests/e2e/step_aware_runs.py``).
Three runs share one card when ``KV_CACHE_BYTES`` is set (``tests/gpu/conftest.py``)."""

from __future__ import annotations

import pytest

from ..e2e.step_aware_runs import check_advantages
from .conftest import assert_clean_end, run_script

STEPS = 2


@pytest.mark.parametrize("name", ["step_grouped", "himac", "hiper"])
def test_the_estimators_rollout_and_advantages_on_vllm(name, tmp_path):
    run_script("text_hybrid/run_gpu.sh", tmp_path, "trainer.test_freq=-1", "trainer.val_before_train=false",
               f"+trainer.v1.verl_ext.dump_advantages_dir={tmp_path}/advantages", ADV=name, STEPS=str(STEPS))
    check_advantages(name, tmp_path, STEPS)
    assert_clean_end(tmp_path)
