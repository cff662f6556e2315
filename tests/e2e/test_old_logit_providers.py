"""Old-logit providers inside verl's real colocated-async trainer on the cpu backend.

On this backend trainer and rollout share numerics (fp32, same model code), so the only source
of a rollout-vs-old log-prob gap is staleness. verl's default recomputes "old" with the current
weights, so stale tokens show a gap (test_separate_async_e2e.py, ``current``); an exact provider
must close it (rho == 1 up to float rounding) on every step."""

from __future__ import annotations

import pytest

from verl_ext.checkpoint_files import MANIFEST

from .conftest import assert_finite, assert_hook_metrics, assert_restored_from, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

ASYNC = ("trainer.v1.trainer_mode=verl_ext_colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1")


def test_snapshot_provider_recovers_exact_old_logits_for_stale_samples_and_survives_a_kill(tmp_path):
    """Checkpoints at steps 2 and 4; the trainer is SIGKILLed inside verl's save of step 4, after
    verl-ext's state and the actor's files are written and before verl marks the checkpoint
    complete. The resumed run must load step 2's snapshots, bit for bit, and score exactly."""
    snapshot = ("+algorithm.old_logits.provider=snapshot", "trainer.save_freq=2")
    run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *snapshot, steps=4, crash_at="verl_checkpoint@4")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]  # a step's metrics are logged after its checkpoint
    stale_steps = [s for s in (1, 2, 3) if metrics[s]["training/off_policy/trajectory_staleness/max"] >= 1]
    assert stale_steps, "no stale samples: the async path was not exercised"
    for step in (1, 2, 3):
        m = metrics[step]
        assert m["training/rollout_probs_diff_max"] < 1e-6, (step, m["training/rollout_probs_diff_max"])
        assert m["old_logits/snapshot/missing_frac"] == 0.0
        # the copy starts with the actor update; the optimizer step waits for what is left of it
        assert_hook_metrics(m, ("old_logits", "snapshot_save", "snapshot_save_wait", "version_bookkeeping"),
                            memory=("snapshots",))
    for step in stale_steps:  # the versions the tokens came from were seen and scored
        assert metrics[step]["old_logits/stale/version_gap_max"] >= 1
        assert_hook_metrics(metrics[step], ("weight_swap",))  # snapshots swapped in for stale tokens
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "global_step_4" / "verl_ext_old_logits" / MANIFEST).exists()  # written before verl's save
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"  # ... which never ended

    resumed = run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *snapshot, "trainer.resume_mode=auto", steps=3)
    assert_restored_from(resumed, checkpoints / "global_step_2")
    m = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(m) == [3]
    assert m[3]["training/rollout_probs_diff_max"] < 1e-6 and m[3]["old_logits/snapshot/missing_frac"] == 0.0


EWMA_HOOKS = ("old_logits", "ewma_update", "version_bookkeeping")


def assert_ewma_hook_metrics(metrics: dict) -> None:
    """The EWMA provider's hooks; the swap only in steps whose stale tokens it scored (fresh tokens
    are exact under ``fresh_exact``, the default: no swap)."""
    if "old_logits/token_age_steps/stale_mean" in metrics:  # logged where the batch has stale tokens
        assert_hook_metrics(metrics, (*EWMA_HOOKS, "weight_swap"), memory=("ewma_shadow", "swap_backup"))
    else:
        assert_hook_metrics(metrics, EWMA_HOOKS, memory=("ewma_shadow",))


PPO_EWMA = ("+plugins/old_logits=ewma", "+plugins/loss=ppo_ewma")


def test_ppo_ewma_with_the_ewma_provider_trains_and_resumes_after_a_kill_mid_step(tmp_path):
    """Four steps and a checkpoint, then the trainer is SIGKILLed in step 5's actor update; the
    resumed run must load step 4's EWMA state, bit for bit, and train step 5."""
    run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *PPO_EWMA, "trainer.save_freq=4", steps=5,
               crash_at="update@5")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
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
    proc = run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *PPO_EWMA, "trainer.resume_mode=auto", steps=5)
    assert_restored_from(proc, tmp_path / "checkpoints" / "global_step_4")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {5}
    assert resumed[5]["old_logits/ewma/forward_rows"] > 0
    assert_ewma_hook_metrics(resumed[5])
    # the EWMA's age came back with the checkpoint (a restart would report 0)
    assert resumed[5]["old_logits/ewma/age_steps"] > 0.5

