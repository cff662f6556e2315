"""Old-logit providers inside verl's real colocated-async trainer on the cpu backend.

On this backend trainer and rollout share numerics (fp32, same model code), so the only source
of a rollout-vs-old log-prob gap is staleness. verl's default recomputes "old" with the current
weights, so stale steps show a gap (tests/e2e/test_cpu_backend_modes.py); an exact provider
must close it (rho == 1 up to float rounding) on every step."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, assert_hook_metrics, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

ASYNC = ("trainer.v1.trainer_mode=verl_ext_colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1")


def test_snapshot_provider_recovers_exact_old_logits_for_stale_samples(tmp_path):
    run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, "+algorithm.old_logits.provider=snapshot", steps=4)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    stale_steps = [s for s in (1, 2, 3, 4) if metrics[s]["training/off_policy/trajectory_staleness/max"] >= 1]
    assert stale_steps, "no stale samples: the async path was not exercised"
    for step in (1, 2, 3, 4):
        m = metrics[step]
        assert m["training/rollout_probs_diff_max"] < 1e-6, (step, m["training/rollout_probs_diff_max"])
        assert m["old_logits/snapshot/missing_frac"] == 0.0
        # the copy starts with the actor update; the optimizer step waits for what is left of it
        assert_hook_metrics(m, ("old_logits", "snapshot_save", "snapshot_save_wait", "version_bookkeeping"),
                            memory=("snapshots",))
    for step in stale_steps:  # the versions the tokens came from were seen and scored
        assert metrics[step]["old_logits/stale/version_gap_max"] >= 1
        assert_hook_metrics(metrics[step], ("weight_swap",))  # snapshots swapped in for stale tokens


EWMA_HOOKS = ("old_logits", "ewma_update", "version_bookkeeping")


def assert_ewma_hook_metrics(metrics: dict) -> None:
    """The EWMA provider's hooks; the swap only in steps whose stale tokens it scored (fresh tokens
    are exact under ``fresh_exact``, the default: no swap)."""
    if "old_logits/token_age_steps/stale_mean" in metrics:  # logged where the batch has stale tokens
        assert_hook_metrics(metrics, (*EWMA_HOOKS, "weight_swap"), memory=("ewma_shadow", "swap_backup"))
    else:
        assert_hook_metrics(metrics, EWMA_HOOKS, memory=("ewma_shadow",))


PPO_EWMA = ("+plugins/old_logits=ewma", "+plugins/loss=ppo_ewma")


def test_ppo_ewma_with_the_ewma_provider_trains_and_resumes(tmp_path):
    run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *PPO_EWMA, steps=4)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3, 4):
        assert_finite(metrics[step], ["actor/pg_loss", "actor/ppo_ewma/approx_kl", "actor/ppo_ewma/prox_lag",
                                      "actor/ppo_ewma/is_weight_mean", "old_logits/ewma/forward_rows",
                                      "old_logits/ewma/beta", "old_logits/ewma/age_steps",
                                      "old_logits/token_age_steps/mean", "old_logits/token_age_steps/max"])
        assert_ewma_hook_metrics(metrics[step])
    # before any update the EWMA equals the weights (bias-corrected): the proximal policy lags by 0
    assert metrics[1]["actor/ppo_ewma/prox_lag"] == 0.0
    assert metrics[1]["old_logits/ewma/age_steps"] == 0.0
    # calibrated decay (the default): after warm-up the EWMA lags the live weights as far as the
    # tokens it stands in for (with fresh_exact, the stale ones) lag them, in optimizer steps
    stale = [s for s in (3, 4) if "old_logits/token_age_steps/stale_mean" in metrics[s]]
    assert stale, "no stale step after warm-up: the async path was not exercised"
    for step in stale:
        m = metrics[step]
        assert abs(m["old_logits/ewma/age_steps"] - m["old_logits/token_age_steps/stale_mean"]) <= 0.5, (step, m)
    state = tmp_path / "checkpoints" / "global_step_4" / "verl_ext_old_logits" / "rank_0.pt"
    assert state.exists()
    run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *PPO_EWMA, "trainer.resume_mode=auto", steps=5)
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {5}
    assert resumed[5]["old_logits/ewma/forward_rows"] > 0
    assert_ewma_hook_metrics(resumed[5])
    # the EWMA's age came back with the checkpoint (a restart would report 0)
    assert resumed[5]["old_logits/ewma/age_steps"] > 0.5
