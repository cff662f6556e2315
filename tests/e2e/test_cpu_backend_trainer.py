"""verl's real `main_ppo` (v1 trainer, Ray, Hydra, FSDP2, agent loop, TransferQueue) on the
cpu backend, through the quickstart recipe script. Slow: each run takes 1-2 minutes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .conftest import assert_finite, assert_hook_metrics, read_metrics, run_recipe

pytestmark = pytest.mark.e2e

SAVE_HF = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
CORE_METRICS = [
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "critic/score/mean",
    "critic/advantages/mean",
    "response_length/mean",
    "training/rollout_probs_diff_max",
    "timing_s/gen",
    "timing_s/update_actor",
    "timing_s/step",
]

# verl-ext's hooks in a GRPO run with verl's own old log-probs (verl_ext.timing)
SYNC_HOOKS = ("step_metadata", "reward_postprocess", "signal_check", "failure_check")


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("quickstart")
    run_recipe("quickstart/run_cpu.sh", out, SAVE_HF, "trainer.test_freq=2", steps=3)
    return out


def test_sync_run_completes_every_step_with_finite_metrics(sync_run: Path):
    metrics = read_metrics(sync_run / "metrics.jsonl")
    assert {1, 2, 3} <= set(metrics), f"steps logged: {sorted(metrics)}"
    for step in (1, 2, 3):
        assert_hook_metrics(metrics[step], SYNC_HOOKS)
    for step in (1, 2, 3):
        assert_finite(metrics[step], CORE_METRICS)
        # verl's GRPO had something to learn from (verl_ext.advantages.signal), and said how much
        assert 0 <= metrics[step]["verl_ext/signal/zero_advantage_row_share"] < 1
    # validation ran before training (step 0) and at the end
    assert any(k.startswith("val-core/") for k in metrics[0])
    assert any(k.startswith("val-core/") for k in metrics[3])


def test_a_good_run_prints_no_traceback(sync_run: Path):
    # e.g. verl leaving its DataLoader workers to be SIGKILLed at exit (verl_ext.trainer stops them)
    log = (sync_run / "run.log").read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 2000:][:6000]


def test_hf_rollout_log_probs_match_the_trainer(sync_run: Path):
    # fp32 on both sides: the rollout's log-probs are the trainer's up to float rounding, and
    # after each weight sync too (steps 2 and 3 sample from the updated weights).
    metrics = read_metrics(sync_run / "metrics.jsonl")
    for step in (1, 2, 3):
        assert metrics[step]["training/rollout_probs_diff_max"] < 1e-5


def test_training_changed_the_weights_and_wrote_a_checkpoint(sync_run: Path):
    ckpt = sync_run / "checkpoints" / "global_step_3" / "actor"
    assert (ckpt / "model_world_size_1_rank_0.pt").exists()
    assert (ckpt / "optim_world_size_1_rank_0.pt").exists()
    assert (sync_run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    before = load_file(sync_run / "model" / "model.safetensors")
    after = load_file(ckpt / "huggingface" / "model.safetensors")
    changed = [name for name in before if not torch.equal(before[name], after[name].to(before[name].dtype))]
    assert changed, "no weight changed after 3 optimizer steps"


def test_resume_continues_from_the_checkpoint(sync_run: Path):
    resumed = run_recipe(
        "quickstart/run_cpu.sh", sync_run, "trainer.resume_mode=auto", "trainer.val_before_train=false", steps=4
    )
    log = resumed.stdout + resumed.stderr
    assert "global_step_3" in log
    metrics = read_metrics(sync_run / "metrics.jsonl")  # the file logger rewrites the file per run
    assert set(metrics) == {4}, f"resumed run should only train step 4, logged {sorted(metrics)}"
    assert_finite(metrics[4], CORE_METRICS)
    assert_hook_metrics(metrics[4], SYNC_HOOKS)
    assert metrics[4]["training/rollout_probs_diff_max"] < 1e-5  # rollout got the restored weights
