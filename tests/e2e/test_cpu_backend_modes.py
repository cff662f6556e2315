"""The cpu backend beyond plain GRPO: PPO with a critic and a reference policy (the patched paths).
verl's colocated async trainer runs in test_old_logit_mismatch.py and the provider tests."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

NO_VAL = ("trainer.val_before_train=false", "trainer.test_freq=-1")


def test_ppo_with_critic_and_reference_policy(tmp_path):
    run_recipe(
        "quickstart/run_cpu.sh", tmp_path,
        "algorithm.adv_estimator=gae",
        f"critic.model.path={tmp_path}/model",
        "critic.ppo_micro_batch_size_per_gpu=32",
        "critic.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        *NO_VAL,
        steps=2,
    )
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/vf_loss", "critic/values/mean", "actor/kl_loss", "actor/pg_loss"])
    # The reference policy ran: the KL to it is 0 before the first update and positive after.
    assert metrics[1]["actor/kl_loss"] == 0.0 and metrics[2]["actor/kl_loss"] > 0.0
