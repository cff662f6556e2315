"""A GPU script started on a machine without CUDA or vLLM (this one) stops at start-up, in the
verl-ext trainer's constructor, naming what is missing, the version verl 0.9.1 wants and the pip
extra, instead of failing minutes later inside a worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ..messages import assert_names

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_text_corridor_gpu_script_refuses_a_cpu_machine(tmp_path, tiny_model_dir):
    env = {**os.environ, "OUT": str(tmp_path), "MODEL": tiny_model_dir, "STEPS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # 2 cores: enough logical CPUs and one storage unit so that verl gets as far as the trainer
    proc = subprocess.run(
        ["bash", str(REPO / "recipes/text_corridor/run_gpu.sh"), "+ray_kwargs.ray_init.num_cpus=32",
         "transfer_queue.backend.SimpleStorage.num_data_storage_units=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "verl-ext: this config cannot train as asked" in log, log[-4000:]  # verl_ext.validation.ConfigError
    assert "trainer.device=cuda but torch sees no CUDA device" in log
    assert_names(log, "vllm==0.24.0", "pip install 'verl[vllm]==0.9.1' 'verl-ext[vllm]'")
    assert "Total available GPUs" not in log  # stopped by verl-ext before verl's resource check
