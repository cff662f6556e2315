"""``hiper`` (HiPER) trained by verl's real ``main_ppo`` on the cpu backend, fed by
``hybrid_gui_tool``'s ``plan_execute`` rollout, with verl's critic for its per-step values
(``tests/e2e/step_aware_runs.py`` says what is checked). The run also keeps verl's reference policy
(a KL loss), so the cpu backend's critic and reference workers run in verl's trainer here."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import assert_finite, read_metrics
from .step_aware_runs import check_advantages, train

pytestmark = pytest.mark.e2e
STEPS = 2
REFERENCE_POLICY = ("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return train("hiper", tmp_path_factory.mktemp("text_hybrid_hiper"), STEPS, *REFERENCE_POLICY)


def test_hiper_advantages_on_real_rows_are_the_pure_function_of_their_metadata(run):
    check_advantages("hiper", run, STEPS)


def test_hipers_run_trains_verls_critic_and_reference_policy(run):
    """The critic trains, and the KL to the reference is 0 before the first update and positive
    after it (one update per step here)."""
    metrics = read_metrics(run / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/vf_loss", "critic/values/mean", "actor/kl_loss", "actor/pg_loss"])
    assert metrics[1]["actor/kl_loss"] == 0.0 and metrics[2]["actor/kl_loss"] > 0.0
