"""The exact old-logit providers whose old log-probs are scored on the rollout side, in verl's
real colocated-async trainer on the cpu backend (partial rollouts aborted and resumed at every
weight sync, samples trained one version late).

On this backend trainer, rollout and the ``dedicated`` scorer share numerics (fp32, same model
code), so an exact provider must give rho == 1: verl's rollout-vs-old diagnostics, recomputed
against the provider's old log-probs, stay at float rounding on every step, stale steps
included; verl's default (``current``) shows ~1e-3 there (test_cpu_backend_modes.py)."""

from __future__ import annotations

import pytest

from .conftest import assert_hook_metrics, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

ASYNC = ("trainer.v1.trainer_mode=verl_ext_colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1")
# Long responses decoded 8 at a time: the trainer's abort lands while requests are mid-decode,
# so resumed partial rollouts (tokens of two versions in one row) reach the training batches.
PARTIAL_ROLLOUTS = ("actor_rollout_ref.rollout.max_num_seqs=8", "data.max_response_length=256")
STEPS = (1, 2, 3)


def _run(tmp_path, provider: str) -> dict[int, dict]:
    run_recipe(
        "quickstart/run_cpu.sh", tmp_path, *ASYNC, *PARTIAL_ROLLOUTS, f"+plugins/old_logits={provider}",
        steps=len(STEPS),
    )
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(metrics[s]["old_logits/stale/version_gap_max"] >= 1 for s in STEPS), "no stale tokens"
    assert any(metrics[s]["old_logits/stale/partial_frac"] > 0 for s in STEPS), "no rows spanning two versions"
    for step in STEPS:
        m = metrics[step]
        # rho == 1 on every token: |p_old - p_rollout| and the per-sequence log-ppl gap at float rounding
        assert m["training/rollout_probs_diff_max"] < 1e-6, (step, m["training/rollout_probs_diff_max"])
        assert max(abs(m["rollout_corr/log_ppl_diff_max"]), abs(m["rollout_corr/log_ppl_diff_min"])) < 1e-5
        assert m[f"old_logits/{provider}/inexact_frac"] == 0.0
        assert_hook_metrics(m, ("old_logits", "segment_scoring"))
    return metrics


@pytest.mark.xfail(strict=False, reason=(
    "timing-dependent set-up (2026-11-26): in 3 steps the dedicated rows often carry no stale or no two-version "
    "tokens (verl's trajectory_staleness_worst says 1); it failed 2 of 3 runs alone at commit 52445df too, so it "
    "predates this change. Until the run is made to produce partial rollouts reliably, dedicated's stale-token "
    "exactness is not guarded by CI"))
def test_dedicated_scorer_gives_exact_old_logits_for_stale_tokens(tmp_path):
    metrics = _run(tmp_path, "dedicated")
    for step in STEPS:
        m = metrics[step]
        assert m["old_logits/dedicated/filled_by_current_frac"] == 0.0  # every token came scored
        assert m["old_logits/dedicated/forward_rows"] == 0  # so the trainer ran no old-log-prob forward
        assert m["old_logits/dedicated/scorer_refused"] == 0
        assert m["old_logits/dedicated/scorer_sync_timeouts"] == 0
    assert sum(metrics[s]["old_logits/dedicated/scorer_segments"] for s in STEPS) > 0


def test_interrupt_scores_segments_at_the_sync_for_exact_old_logits(tmp_path):
    metrics = _run(tmp_path, "interrupt")
    for step in STEPS:
        m = metrics[step]
        assert m["old_logits/interrupt/filled_by_current_frac"] == 0.0  # every segment scored at a sync
        assert m["old_logits/interrupt/unscorable_segments"] == 0
        assert m["old_logits/interrupt/segments"] > 0
