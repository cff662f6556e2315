"""verl-ext on one GPU: FSDP2 training, vLLM rollout, verl's sync and colocate_async trainers.

Every run: ``recipes/text_corridor/run_gpu.sh`` (the text corridor, a 6-turn text env, through the
``text_env`` agent loop), random weights of Qwen2.5-0.5B's architecture, bf16 vLLM vs the FSDP2
trainer. The async runs queue two batches ahead of the trainer, so tokens 1-2 versions old reach
every old-logit provider."""

from __future__ import annotations

import pytest

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script

SCRIPT = "text_corridor/run_gpu.sh"


@pytest.mark.parametrize("adv", ["gigpo", "hgpo"])
def test_sync_step_advantages_with_ppo_ewma_and_ewma(adv, tmp_path):
    """Sync trainer, step-aware advantages + PPO-EWMA + the EWMA provider; checkpoint at step 3,
    resume for step 4 with the EWMA state restored from the per-rank file. ``ewma_bound`` (fixed
    decay, no fresh_exact): under the sync trainer no token is stale, so the default ``ewma``
    scores every token with the live weights and its average would never reach the forward."""
    run_script(SCRIPT, tmp_path, ADV=adv, LOSS="ppo_ewma", PROVIDER="ewma_bound", STEPS="3")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]
    for step in (1, 2, 3):
        assert_finite(metrics[step], ["actor/pg_loss", "actor/ppo_ewma/prox_lag", "old_logits/ewma/forward_rows",
                                      "training/rollout_probs_diff_max", "critic/advantages/mean"])
        # bf16 vLLM vs the bf16 FSDP2 trainer on the same weights: numerics, not a wrong policy
        assert metrics[step]["training/rollout_probs_diff_max"] < 0.5
    # two optimizer steps per training step (ppo_mini_batch_size = half the batch): the EWMA lags
    # the weights from the second mini-batch of step 1 on
    assert metrics[3]["actor/ppo_ewma/prox_lag"] > 0.0
    state = tmp_path / "checkpoints" / "global_step_3" / "verl_ext_old_logits" / "rank_0.pt"
    assert state.exists()
    assert_clean_end(tmp_path)
    if adv != "hgpo":
        return
    run_script(SCRIPT, tmp_path, "trainer.resume_mode=auto", ADV=adv, LOSS="ppo_ewma", PROVIDER="ewma_bound",
               STEPS="4")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {4}, "the resumed run must start at step 4"
    # restored, not reset: a fresh EWMA would lag by 0 again
    assert_finite(resumed[4], ["actor/ppo_ewma/prox_lag", "old_logits/ewma/forward_rows"])
    assert resumed[4]["actor/ppo_ewma/prox_lag"] > 0.0
    assert_clean_end(tmp_path)


ASYNC_PROVIDERS = ["current", "rollout", "snapshot", "ewma", "loglinear"]


@pytest.mark.parametrize("provider", ASYNC_PROVIDERS)
def test_colocate_async_old_logit_provider_on_vllm(provider, tmp_path):
    """colocate_async with each provider that works on vLLM: stale tokens appear, per-token versions
    reach the provider, and the rollout-vs-old gap is reported on every step."""
    run_script(SCRIPT, tmp_path, MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=provider, STEPS="4")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    staleness = [metrics[s]["training/off_policy/trajectory_staleness/max"] for s in (1, 2, 3, 4)]
    assert max(staleness) >= 1, f"no stale samples: {staleness}"
    for step in (1, 2, 3, 4):
        assert_finite(metrics[step], ["actor/pg_loss", "training/rollout_probs_diff_max"])
    diff = [metrics[s]["training/rollout_probs_diff_max"] for s in (1, 2, 3, 4)]
    print(f"provider={provider} staleness={staleness} rollout_probs_diff_max={diff}")
    if provider == "rollout":  # pi_old = mu exactly
        assert max(diff) == 0.0
    if provider == "snapshot":
        for step in (1, 2, 3, 4):
            assert metrics[step]["old_logits/snapshot/missing_frac"] == 0.0
    if provider in ("snapshot", "loglinear"):  # the providers that read per-token versions
        stale = [s for s in (1, 2, 3, 4) if metrics[s]["training/off_policy/trajectory_staleness/max"] >= 1]
        assert any(metrics[s]["old_logits/stale/version_gap_max"] >= 1 for s in stale)
    if provider == "snapshot":  # exact: on stale steps only bf16 numerics remain, unlike `current`
        assert max(diff) < 1e-2
    assert_clean_end(tmp_path)
