"""The exact old-logit providers whose old log-probs are scored on the rollout side, in verl's
real colocated-async trainer on the cpu backend (partial rollouts aborted and resumed at every
weight sync, samples trained one version late).

On this backend trainer, rollout and the ``dedicated`` scorer share numerics (fp32, same model
code), so an exact provider must give rho == 1: verl's rollout-vs-old diagnostics, recomputed
against the provider's old log-probs, stay at float rounding on every step, stale steps
included; verl's default (``current``) does not there (test_separate_async_e2e.py)."""

from __future__ import annotations

import pytest

from verl_ext.checkpoint_files import MANIFEST

from .conftest import assert_hook_metrics, assert_restored_from, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

ASYNC = ("trainer.v1.trainer_mode=verl_ext_colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1")
# Partial rollouts (rows with tokens of two versions) in the trained batches by construction, not by timing luck:
# - step 1 has 16 prompt groups x 4 requests in flight (one warmup batch + the step's batch) and the hf server
#   decodes 8 requests at a time, one batch after the other. Before the batch that completes the 8th group, 9 or
#   more groups were open; 8 requests cannot close them all, so at least one group still has requests queued, and
#   the server starts their batch 10 ms later, well before the sampler (RPCs and a 50 ms poll away) aborts at the
#   sync: the abort cuts requests mid-decode.
# - verl's dropless staleness control (`wait`, threshold 2): step s samples only once every prompt submitted
#   before step s has finished, oldest first, so it trains exactly the groups step s-1 left in flight, the rows
#   cut mid-decode included. With verl's default (`drop`, 8) the sampler takes the first 8 groups to finish, and
#   the cut rows, re-sent by verl's FullyAsyncLLMServerClient 1 s after the abort (often after the sync here),
#   queue behind the next step's prompts and are cut again at the next sync: in 3 steps they were often never
#   trained, which made these tests flaky.
PARTIAL_ROLLOUTS = (
    "actor_rollout_ref.rollout.max_num_seqs=8", "data.max_response_length=256",
    "trainer.v1.colocate_async.num_warmup_batches=1",
    "trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=2",
)
STEPS = (1, 2, 3)


def _run(tmp_path, provider: str, *overrides: str, crash_at: str | None = None) -> dict[int, dict]:
    run_recipe(
        "quickstart/run_cpu.sh", tmp_path, *ASYNC, *PARTIAL_ROLLOUTS, f"+plugins/old_logits={provider}", *overrides,
        steps=len(STEPS), crash_at=crash_at,
    )
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(metrics[s]["old_logits/stale/version_gap_max"] >= 1 for s in metrics), "no stale tokens"
    assert any(metrics[s]["old_logits/stale/partial_frac"] > 0 for s in metrics), "no rows spanning two versions"
    for step in metrics:
        m = metrics[step]
        # rho == 1 on every token: |p_old - p_rollout| and the per-sequence log-ppl gap at float rounding
        assert m["training/rollout_probs_diff_max"] < 1e-6, (step, m["training/rollout_probs_diff_max"])
        assert max(abs(m["rollout_corr/log_ppl_diff_max"]), abs(m["rollout_corr/log_ppl_diff_min"])) < 1e-5
        assert m[f"old_logits/{provider}/inexact_frac"] == 0.0
        assert_hook_metrics(m, ("old_logits", "segment_scoring"))
    return metrics


def test_dedicated_scorer_gives_exact_old_logits_for_stale_tokens(tmp_path):
    metrics = _run(tmp_path, "dedicated")
    for step in STEPS:
        m = metrics[step]
        assert m["old_logits/dedicated/filled_by_current_frac"] == 0.0  # every token came scored
        assert m["old_logits/dedicated/forward_rows"] == 0  # so the trainer ran no old-log-prob forward
        assert m["old_logits/dedicated/scorer_refused"] == 0
        assert m["old_logits/dedicated/scorer_sync_timeouts"] == 0
    assert sum(metrics[s]["old_logits/dedicated/scorer_segments"] for s in STEPS) > 0


def test_interrupt_scores_segments_at_the_sync_for_exact_old_logits_and_resumes_after_a_kill(tmp_path):
    """Checkpoints at steps 2 and 3; the trainer is SIGKILLed inside verl-ext's save of step 3,
    before the segment store and the manifest are written. verl never marked step 3
    complete, so the resumed run loads step 2, bit for bit: verl restores the checkpoint's finished
    trajectories from TransferQueue, and their ``old_logit_segments`` must resolve against the
    segment store restored beside it (with the default ``on_missing=error`` an unscored stale token
    would stop the run)."""
    metrics = _run(tmp_path, "interrupt", "trainer.save_freq=2", crash_at="verl_ext_checkpoint@3")
    assert sorted(metrics) == [1, 2]  # a step's metrics are logged after its checkpoint
    for m in metrics.values():
        assert m["old_logits/interrupt/filled_by_current_frac"] == 0.0  # every segment scored at a sync
        assert m["old_logits/interrupt/unscorable_segments"] == 0
        assert m["old_logits/interrupt/late_segments"] == 0
        assert m["old_logits/interrupt/sync_timeouts"] == 0
    # each sync scores what was served since the one before; whether a given step's interval served any
    # request depends on timing (a CI run with a second job on the machine saw none at one step)
    assert sum(m["old_logits/interrupt/segments"] for m in metrics.values()) > 0
    torn = tmp_path / "checkpoints" / "global_step_3" / "verl_ext_old_logits"
    assert not (torn / MANIFEST).exists() and not (torn / "rollout_side.pt").exists()

    proc = run_recipe("quickstart/run_cpu.sh", tmp_path, *ASYNC, *PARTIAL_ROLLOUTS, "+plugins/old_logits=interrupt",
                      "trainer.resume_mode=auto", steps=len(STEPS) + 1)
    assert_restored_from(proc, tmp_path / "checkpoints" / "global_step_2")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(resumed) == [3, 4], "the resumed run must start after the last complete checkpoint"
    m = resumed[3]
    # the store came back: it holds the checkpoint's segments besides the ones scored at this sync
    assert m["old_logits/interrupt/stored_segments"] > m["old_logits/interrupt/segments"]
    for m in resumed.values():
        assert m["old_logits/interrupt/inexact_frac"] == 0.0
        assert m["training/rollout_probs_diff_max"] < 1e-6  # fp32 rollout and trainer: rho == 1 on every token
