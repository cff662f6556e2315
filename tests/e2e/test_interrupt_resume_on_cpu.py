"""``interrupt`` across a checkpoint, in verl's real colocated-async trainer on the cpu backend:
2 steps with a checkpoint (its segment store next to it), then a resumed run for step 3.

verl restores the finished trajectories of the checkpoint from TransferQueue; their
``old_logit_segments`` must resolve against the restored store. With the default
``on_missing=error`` an unscored stale token would stop the run, so a run that ends is a run in
which every stale token was scored with its own weights. Step 2 also guards the sync's wait for
the servers' counts: without it, an aborted prefix still on its way to the client when the
trainer took the segments stopped this very run at step 2."""

from __future__ import annotations

import pytest

from .conftest import read_metrics, run_recipe

pytestmark = pytest.mark.e2e

RUN = ("trainer.v1.trainer_mode=verl_ext_colocate_async", "trainer.val_before_train=false", "trainer.test_freq=-1",
       # long responses decoded 8 at a time: the abort lands mid-decode, so aborted prefixes exist
       "actor_rollout_ref.rollout.max_num_seqs=8", "data.max_response_length=256", "+plugins/old_logits=interrupt")


def test_interrupt_restores_its_segment_store_on_resume(tmp_path):
    run_recipe("quickstart/run_cpu.sh", tmp_path, *RUN, steps=2)  # checkpoint at step 2 (save_freq = steps)
    first = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(first) == [1, 2]
    for step in (1, 2):
        assert first[step]["old_logits/interrupt/inexact_frac"] == 0.0
        assert first[step]["old_logits/interrupt/late_segments"] == 0
        assert first[step]["old_logits/interrupt/sync_timeouts"] == 0
    assert (tmp_path / "checkpoints" / "global_step_2" / "verl_ext_old_logits" / "rollout_side.pt").exists()

    run_recipe("quickstart/run_cpu.sh", tmp_path, *RUN, "trainer.resume_mode=auto", steps=3)
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(resumed) == [3], "the resumed run must start at step 3"
    m = resumed[3]
    # the store came back: it holds the checkpoint's segments besides the ones scored at this sync
    assert m["old_logits/interrupt/stored_segments"] > m["old_logits/interrupt/segments"] > 0
    assert m["old_logits/interrupt/inexact_frac"] == 0.0
    assert m["training/rollout_probs_diff_max"] < 1e-6  # fp32 rollout and trainer: rho == 1 on every token
