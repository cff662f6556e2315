"""verl's Megatron engine on one GPU and with tensor parallelism over two (``[2]``: skipped, with the
count, on a one-GPU machine): TransformerEngine, Megatron-Core and Megatron-Bridge, vLLM rollout.

Every run is ``recipes/text_corridor/run_gpu.sh`` with ``STRATEGY=megatron`` (``TP`` 1 or 2, PP=1; random
weights of Qwen2.5-0.5B's shapes, built locally), as in ``test_vllm_fsdp2.py``. A missing or
unloadable Megatron stack fails here with the start-up check's sentence (package, cause, the
bundle command that fixes it), never skips. Install it offline with ``verl-ext bundle --extras
megatron`` (README "Offline install bundle"; docs/howto/megatron.md).

What the EWMA and snapshot providers track under Megatron's distributed optimizer: the bf16 model
parameters (the views into DDP's contiguous buffer that the forward reads), never the
optimizer's fp32 main parameters; ``megatron_swap_worker.py`` checks that on a real Megatron-Core
model with a real optimizer step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext.gpu_checks import installed_version
from verl_ext.megatron_checks import cublas_version, megatron_stack_problems
from verl_ext_bundle.megatron_stack import te_version_for_cublas

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script, worker_gpus

pytestmark = pytest.mark.megatron
SCRIPT = "text_corridor/run_gpu.sh"
MEGATRON = {"STRATEGY": "megatron"}


@pytest.fixture(scope="module", autouse=True)
def megatron_stack():
    problems = megatron_stack_problems()
    if problems:
        pytest.fail("the Megatron GPU tests need the Megatron stack:\n  - " + "\n  - ".join(problems))


def test_transformer_engine_is_the_release_that_pairs_with_this_cublas():
    """The bundle's rule chose the TransformerEngine release whose core loads with this machine's
    cuBLAS, and it loads (the fixture imported ``transformer_engine.pytorch`` in a child process)."""
    wanted, why = te_version_for_cublas(cublas_version())
    assert installed_version("transformer-engine") == wanted, why
    assert installed_version("transformer-engine-torch") == wanted  # compiled here by the bundle installer
    import transformer_engine.pytorch as te  # noqa: F401 - loads the core library and the extension


@pytest.mark.parametrize("tp", [1, 2])
def test_swapped_weights_are_what_the_megatron_forward_uses(tp):
    """TP=1: one process; TP=2: ``torchrun`` over 2 GPUs, each rank checking its own shards."""
    worker = str(Path(__file__).with_name("megatron_swap_worker.py"))
    command = [sys.executable, worker] if tp == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                        f"--nproc-per-node={tp}", worker]
    with worker_gpus(tp) as visible:
        env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})}
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    for rank in range(tp):
        assert f"rank {rank}: snapshot: forward under snapshot:0 = expected bit for bit" in proc.stdout
        assert f"rank {rank}: ewma: forward under ewma = expected bit for bit" in proc.stdout


@pytest.mark.parametrize("tp", [1, 2])
def test_sync_hgpo_ppo_ewma_ewma_checkpoint_and_resume(tp, tmp_path):
    """Sync trainer on Megatron: hgpo + ppo_ewma + the EWMA provider (``ewma_bound``: under the sync
    trainer the calibrated ``ewma`` scores every fresh token with the live weights) for 2 steps (checkpoint at
    step 2), then resumed for step 3 with the per-rank EWMA state restored (TP=2: one file per rank,
    each holding the EWMA of that rank's shards)."""
    run = dict(gpus=tp, ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma_bound", TP=str(tp), **MEGATRON)
    run_script(SCRIPT, tmp_path, **run, STEPS="2")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2]
    for step in (1, 2):
        assert_finite(metrics[step], ["actor/pg_loss", "actor/ppo_ewma/prox_lag", "old_logits/ewma/forward_rows",
                                      "training/rollout_probs_diff_max", "critic/advantages/mean"])
        assert metrics[step]["training/rollout_probs_diff_max"] < 0.5  # bf16 vLLM vs bf16 Megatron
    assert metrics[2]["actor/ppo_ewma/prox_lag"] > 0.0
    for rank in range(tp):
        assert (tmp_path / "checkpoints" / "global_step_2" / "verl_ext_old_logits" / f"rank_{rank}.pt").exists()
    assert_clean_end(tmp_path)
    run_script(SCRIPT, tmp_path, "trainer.resume_mode=auto", **run, STEPS="3")
    resumed = read_metrics(tmp_path / "metrics.jsonl")
    assert set(resumed) == {3}, "the resumed run must start at step 3"
    assert_finite(resumed[3], ["actor/ppo_ewma/prox_lag", "old_logits/ewma/forward_rows"])
    assert resumed[3]["actor/ppo_ewma/prox_lag"] > 0.0  # restored: a fresh EWMA would lag by 0
    assert_clean_end(tmp_path)


@pytest.mark.parametrize("tp", [1, 2])
def test_colocate_async_snapshot_on_megatron(tp, tmp_path):
    """colocate_async on Megatron with the snapshot provider: stale tokens (1-2 versions) are scored
    under the snapshots of their own versions, so only bf16 numerics separate pi_old from vLLM's."""
    run_script(SCRIPT, tmp_path, gpus=tp, MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER="snapshot",
               STEPS="4", TP=str(tp), **MEGATRON)  # fmt: skip
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    staleness = [metrics[s]["training/off_policy/trajectory_staleness/max"] for s in (1, 2, 3, 4)]
    diff = [metrics[s]["training/rollout_probs_diff_max"] for s in (1, 2, 3, 4)]
    print(f"megatron TP={tp} snapshot: staleness={staleness} rollout_probs_diff_max={diff}")
    assert max(staleness) >= 1, f"no stale samples: {staleness}"
    stale = [s for s in (1, 2, 3, 4) if metrics[s]["training/off_policy/trajectory_staleness/max"] >= 1]
    assert any(metrics[s]["old_logits/stale/version_gap_max"] >= 1 for s in stale)
    for step in (1, 2, 3, 4):
        assert_finite(metrics[step], ["actor/pg_loss", "training/rollout_probs_diff_max"])
        assert metrics[step]["old_logits/snapshot/missing_frac"] == 0.0
    assert max(diff) < 1e-2
    assert_clean_end(tmp_path)


@pytest.mark.parametrize("provider", ["current", "rollout", "ewma", "loglinear", "dedicated", "interrupt"])
def test_colocate_async_provider_on_megatron(provider, tmp_path):
    """Every other provider on verl's Megatron engine (TP=1), as ``snapshot`` above: stale tokens reach
    it, and the exact ones (``dedicated``: its scorer fed the Megatron engine's exported weights;
    ``interrupt``: segments scored by the Megatron forward) leave bf16 numerics alone."""
    run_script(SCRIPT, tmp_path, MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=provider, STEPS="4",
               **MEGATRON)
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3, 4]
    assert max(metrics[s]["training/off_policy/trajectory_staleness/max"] for s in metrics) >= 1, "no stale samples"
    for m in metrics.values():
        assert_finite(m, ["actor/pg_loss", "training/rollout_probs_diff_max", "old_logits/exact_token_share"])
    if provider in ("dedicated", "interrupt"):
        assert all(m["old_logits/exact_token_share"] == 1.0 for m in metrics.values())
        assert max(m["training/rollout_probs_diff_max"] for m in metrics.values()) < 1e-2
    assert_clean_end(tmp_path)
