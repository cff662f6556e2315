"""The same trainer on 2 and 4 GPUs of one host (FSDP2 shards every parameter across the GPUs):
EWMA and snapshot on real sharded parameters, per-rank old-logit state checkpointed and resumed,
and the async run that once stopped on verl's micro-batch rule (the recipe now scales the batch
with the GPU count). The 2-GPU runs keep FSDP2's gathered parameters after a forward
(``reshard_after_forward=false``): the weight swap must still reach the forward (verl-ext
reshards around every swap), which is where a swap could silently score with the wrong weights.
Skipped, with the count in the reason, on a machine with fewer GPUs."""

from __future__ import annotations

import pytest

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script

SCRIPT = "text_corridor/run_gpu.sh"


def _fsdp_overrides(gpus: int) -> list[str]:
    return ["actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false"] if gpus == 2 else []


@pytest.mark.parametrize("gpus", [2, 4])
def test_sync_ewma_sharded_checkpoint_and_resume(gpus, tmp_path):
    run_script(SCRIPT, tmp_path, *_fsdp_overrides(gpus), gpus=gpus, ADV="hgpo", LOSS="ppo_ewma",
               PROVIDER="ewma_bound", STEPS="3")  # sync: the default ewma would score with the live weights
    for rank in range(gpus):  # every rank holds the EWMA of its own shard
        assert (tmp_path / "checkpoints" / "global_step_3" / "verl_ext_old_logits" / f"rank_{rank}.pt").exists()
    first = read_metrics(tmp_path / "metrics.jsonl")
    assert first[3]["actor/ppo_ewma/prox_lag"] > 0.0
    run_script(SCRIPT, tmp_path, "trainer.resume_mode=auto", *_fsdp_overrides(gpus), gpus=gpus, ADV="hgpo",
               LOSS="ppo_ewma", PROVIDER="ewma_bound", STEPS="4")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {4}
    assert resumed[4]["actor/ppo_ewma/prox_lag"] > 0.0  # restored, not restarted from the weights
    assert_clean_end(tmp_path)


@pytest.mark.parametrize("gpus", [2, 4])
def test_async_snapshot_sharded_with_resume(gpus, tmp_path):
    """colocate_async + snapshot on sharded parameters; the 2-GPU setting of the first GPU probe
    (which stopped at the first log-prob forward) with the batch scaled per GPU."""
    common = dict(gpus=gpus, MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER="snapshot")
    run_script(SCRIPT, tmp_path, *_fsdp_overrides(gpus), **common, STEPS="3")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert max(metrics[s]["training/off_policy/trajectory_staleness/max"] for s in (1, 2, 3)) >= 1
    for step in (1, 2, 3):
        assert metrics[step]["old_logits/snapshot/missing_frac"] == 0.0
    run_script(SCRIPT, tmp_path, "trainer.resume_mode=auto", *_fsdp_overrides(gpus), **common, STEPS="5")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {4, 5}
    for step in (4, 5):  # the resumed version's snapshot exists: no missing scores, no error
        assert_finite(resumed[step], ["actor/pg_loss", "training/rollout_probs_diff_max"])
        assert resumed[step]["old_logits/snapshot/missing_frac"] == 0.0
    assert_clean_end(tmp_path)
