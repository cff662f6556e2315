"""The exact providers scored on the rollout side (`dedicated`, `interrupt`) with the `hf` rollout
(verl-ext's transformers server) next to an FSDP2 trainer on CUDA (with vLLM:
`test_exact_providers_vllm.py`). The hf server runs on the host CPU, so the model is a small Qwen2
(hidden 256, 4 layers) rather than 0.5B shapes; the `dedicated` scorer runs on the trainer's GPU."""

from __future__ import annotations

import pytest

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script


@pytest.mark.parametrize("provider", ["dedicated", "interrupt"])
def test_exact_provider_on_hf_rollout_with_cuda_trainer(provider, tmp_path):
    model = tmp_path / "model"
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(model), "--hidden-size", "256",
                    "--layers", "4"], check=True)
    run_script("text_corridor/run_gpu.sh", tmp_path, MODEL=str(model), ROLLOUT="hf", MODE="colocate_async",
               ADV="gigpo", LOSS="ppo_ewma", PROVIDER=provider, STEPS="3")
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]
    for step in (1, 2, 3):
        # fp32 server vs bf16 FSDP2 trainer: the provider's old log-probs come from the version that
        # produced each token, so only bf16 numerics remain in the gap
        assert_finite(metrics[step], ["actor/pg_loss", "training/rollout_probs_diff_max"])
        assert metrics[step]["training/rollout_probs_diff_max"] < 0.5
    assert_clean_end(tmp_path)
