"""``himac`` (HiMAC) trained by verl's real ``main_ppo`` on the cpu backend, fed by
``hybrid_gui_tool``'s ``plan_execute`` rollout, which records ``role`` and ``subgoal`` per step
(``tests/e2e/step_aware_runs.py`` says what is checked). One step: a plan_execute episode runs about
twenty turns, and one step of them shows the estimator on real rows."""

from __future__ import annotations

import pytest

from .step_aware_runs import check_advantages, train

pytestmark = pytest.mark.e2e
STEPS = 1


def test_himac_advantages_on_real_rows_are_the_pure_function_of_their_metadata(tmp_path):
    check_advantages("himac", train("himac", tmp_path, STEPS), STEPS)
