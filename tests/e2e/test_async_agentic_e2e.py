"""recipes/async_agentic/run_cpu.sh for two steps: the toolcua_hybrid agent (MiniDesk in Chromium,
HGPO, path reward, PPO-EWMA) in verl's colocated async trainer, with the old-logit provider picked
by PROVIDER instead of the recipe's default, on the cpu backend."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_async_agentic_cpu_run_with_the_snapshot_provider(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVIDER", "snapshot")
    run_recipe("async_agentic/run_cpu.sh", tmp_path, "trainer.val_before_train=false", "trainer.test_freq=-1",
                      steps=2)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert set(metrics) >= {1, 2}
    for step in (1, 2):
        m = metrics[step]
        assert_finite(m, ["actor/pg_loss", "actor/ppo_ewma/approx_kl", "critic/score/mean",
                          "rollout_corr/rollout_rs_token_k1_masked_fraction",  # the band of async_agentic.yaml
                          "verl_ext/path_length_reward/mean"])
        assert m["old_logits/snapshot/forward_rows"] > 0 and m["old_logits/snapshot/missing_frac"] == 0.0
        # exact old logits through the multi-turn agent loop's per-token versions: on this fp32
        # backend rollout and trainer agree, so whatever the staleness, rho is 1 up to rounding
        assert m["training/rollout_probs_diff_max"] < 1e-6, (step, m["training/rollout_probs_diff_max"])
    # the second warm-up batch starts while the first is still playing: step 2 trains on tokens of
    # the weights before step 1's update, each scored with its own snapshot (stale tokens exist only
    # in verl-ext's colocated async mode: the sync trainer would have none)
    stale = metrics[2]
    assert stale["training/off_policy/trajectory_staleness/max"] >= 1, "no stale tokens: the async path was not exercised"
    assert stale["old_logits/snapshot/versions"] >= 2 and stale["old_logits/stale/version_gap_max"] >= 1
    # each version's forward covers the rows holding its tokens, not the whole batch again: the
    # forwards add up to less than a full pass per version (exact all the same, as asserted above)
    assert 1.0 <= stale["old_logits/forward_passes"] < stale["old_logits/snapshot/versions"], stale
