"""``step_grouped`` (UI-S1) trained by verl's real ``main_ppo`` on the cpu backend, fed by
``hybrid_gui_tool``'s ``semi_online`` rollout, which records ``action_match`` per step
(``tests/e2e/step_aware_runs.py`` says what is checked)."""

from __future__ import annotations

import pytest

from .step_aware_runs import check_advantages, train

pytestmark = pytest.mark.e2e
STEPS = 2


def test_step_grouped_advantages_on_real_rows_are_the_pure_function_of_their_metadata(tmp_path):
    check_advantages("step_grouped", train("step_grouped", tmp_path, STEPS), STEPS)
