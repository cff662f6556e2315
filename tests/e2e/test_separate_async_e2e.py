"""Every old-logit provider in verl's real ``separate_async`` trainer on the cpu backend
(``trainer.v1.trainer_mode=verl_ext_separate_async``).

Trainer and rollout run on separate pools: a standalone ``hf`` replica on the host CPU generates
without pausing, verl's ``host_memory`` checkpoint engine (``verl_ext.backends.host_memory``) moves
the weights at the end of each step, where verl aborts the partial generations and resumes them
under the new version. Each step is two local updates (``parameter_sync_step=2``), so from the
second one on the trainer's live weights have left the version its window started from.

On this backend trainer and rollout share numerics (fp32, same model code), so |log π_old − log μ|
is 0 up to rounding exactly where π_old is the training log-prob under the token's own version:
``old_logits/correction/abs_log_ratio_max_{fresh,stale}`` measures exactness per token group.
Partial rollouts that span windows come from responses of up to 128 tokens decoded 8 at a time (the sync lands
mid-decode) and verl's dropless staleness control (``wait``, bound 2). Here they depend on timing
(whether the rollout is still decoding when the trainer syncs; a loaded machine can finish every
request first), so the exactness checks cover them where they occur; the colocate_async tests
(``test_exact_providers_rollout_side.py``) have them by construction."""

from __future__ import annotations

import pytest

from .conftest import assert_finite, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

SEPARATE_ASYNC = (
    "trainer.v1.trainer_mode=verl_ext_separate_async", "trainer.val_before_train=false", "trainer.test_freq=-1",
    # two local updates of 4 prompts per step: the old log-probs of the second are computed after the first
    # optimizer step moved the live weights
    "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    # the standalone pool alone (no colocated replica: verl's v0 fully-async layout): one hf replica on a
    # fake GPU of its own, weights through host memory
    "actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1", "ray_kwargs.ray_init.num_gpus=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=host_memory",
    "actor_rollout_ref.rollout.max_num_seqs=8", "data.max_response_length=128",
    "trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=2",
    # every update moves the weights, also when a batch's rewards are all equal (no policy gradient; the
    # quickstart trains on through such steps), so that a version's tokens always differ from a later version's
    # log-probs
    "actor_rollout_ref.actor.entropy_coeff=0.01",
)
STEPS = (1, 2, 3)
EXACT = 1e-6  # |π_old − μ| (probabilities) of an exact old log-prob here: float rounding
EXACT_LOG = 1e-5  # |log π_old − log μ|, likewise (fp32 log-softmax rounding on long responses)
FRESH, STALE = "old_logits/correction/abs_log_ratio_max_fresh", "old_logits/correction/abs_log_ratio_max_stale"


def _run(tmp_path, provider: str, *overrides: str, steps: int = len(STEPS)) -> dict[int, dict]:
    run_recipe("quickstart/run_cpu.sh", tmp_path, *SEPARATE_ASYNC, f"+plugins/old_logits={provider}", *overrides,
               steps=steps)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert any(metrics[s]["old_logits/stale/version_gap_max"] >= 1 for s in metrics), "no stale tokens"
    for step, m in metrics.items():  # every step trained, on the tokens of the window's own version exactly
        assert_finite(m, ["actor/pg_loss", "old_logits/exact_token_share", "verl_ext/time/share_of_step"])
        if FRESH in m and provider not in ("rollout", "loglinear"):  # those two never use the trainer's log-probs
            assert m[FRESH] < EXACT_LOG, (step, m[FRESH])
    return metrics


def _assert_exact(metrics: dict[int, dict]) -> None:
    """Every token, stale ones and rows spanning two versions included, scored under its own version."""
    for step, m in metrics.items():
        assert m["training/rollout_probs_diff_max"] < EXACT, (step, m["training/rollout_probs_diff_max"])
        assert m["old_logits/exact_token_share"] == 1.0, step
        assert m.get(STALE, 0.0) < EXACT_LOG, (step, m.get(STALE))


def test_verls_own_window_anchor_is_exact_on_its_window_and_wrong_on_earlier_ones(tmp_path):
    """``current`` is verl's own separate_async anchor (its host copy of the window's starting
    weights): exact for the tokens of the window's version, from every local update (the copy
    survives the first optimizer step), but the tokens of earlier windows get the wrong anchor."""
    metrics = _run(tmp_path, "current")
    stale = [m for m in metrics.values() if m["old_logits/stale/version_gap_max"] >= 1]
    for m in stale:
        assert m["old_logits/exact_token_share"] < 1.0
        assert m[STALE] > 10 * EXACT_LOG, m[STALE]  # scored under the window's weights, not their own


def test_snapshot_scores_every_token_under_its_own_version(tmp_path):
    metrics = _run(tmp_path, "snapshot")
    _assert_exact(metrics)
    for m in metrics.values():
        assert m["old_logits/snapshot/missing_frac"] == 0.0


def test_ewma_is_exact_on_fresh_tokens_after_the_live_weights_moved(tmp_path):
    """Fresh tokens under ``fresh_exact`` need the window's starting weights after the first local
    update: the workers' copy of them (the EWMA stands in for the stale ones only)."""
    metrics = _run(tmp_path, "ewma", "+plugins/loss=ppo_ewma")
    for m in metrics.values():
        assert m["old_logits/exact_token_share"] == pytest.approx(1.0 - m["old_logits/correction/stale_token_frac"])
        assert_finite(m, ["actor/ppo_ewma/prox_lag", "old_logits/ewma/age_steps"])


@pytest.mark.parametrize("provider", ["rollout", "loglinear"])
def test_the_approximate_providers_train_with_no_exact_token(tmp_path, provider):
    """``rollout`` (π_old = μ, verl's bypass mode) and ``loglinear`` (a widened clip) never give the
    training engine's log-prob: their exact share is 0."""
    metrics = _run(tmp_path, provider, steps=2)  # step 2 trains stale tokens
    for m in metrics.values():
        assert m["old_logits/exact_token_share"] == 0.0
    if provider == "rollout":  # old log-probs are μ itself
        assert all(m["training/rollout_probs_diff_max"] == 0.0 for m in metrics.values())
    else:
        assert_finite(metrics[2], ["old_logits/loglinear/alpha_mean"])


def test_dedicated_scorer_gets_every_version_while_trainer_gpus_are_lent_to_rollout(tmp_path):
    """``hybrid_rollout.enable_switch``: between steps the trainer's own replica generates too (verl
    lends it when the buffer runs low), so both pools sync each version; the scorer must hold every
    version before either pool generates with it, and score what both pools generate."""
    metrics = _run(tmp_path, "dedicated", "actor_rollout_ref.hybrid_engine=true",
                   "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
                   "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio=1.0")
    _assert_exact(metrics)
    for m in metrics.values():
        assert m["old_logits/dedicated/filled_by_current_frac"] == 0.0  # every token came scored
        assert m["old_logits/dedicated/scorer_sync_timeouts"] == 0
    assert any("separate_async/switch/threshold_ratio" in m for m in metrics.values()), "switching was not on"


def test_interrupt_scores_each_ended_version_after_its_sync(tmp_path):
    """``interrupt`` with separate pools scores a version's segments right after the sync that ends
    it, under the workers' copy of its weights; at a checkpoint it scores the running version's
    segments recorded so far and saves them with the segment store (a resume from such a store, after
    a kill inside verl-ext's save: ``test_exact_providers_rollout_side.py``)."""
    metrics = _run(tmp_path, "interrupt")
    _assert_exact(metrics)
    # scored after each sync and reported with the next step's first local update
    assert sum(m.get("old_logits/interrupt/segments", 0) for m in metrics.values()) > 0
    assert (tmp_path / "checkpoints" / f"global_step_{len(STEPS)}" / "verl_ext_old_logits" / "rollout_side.pt").exists()
