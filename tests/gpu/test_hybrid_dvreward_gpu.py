"""The flagship's GPU script, run unchanged on one GPU: ``recipes/toolcua_hybrid/run_fsdp_qwen25_1p5b.sh``
with ``+recipe=toolcua_hybrid_dvreward``: the ``hybrid_gui_tool`` agent loop in the function-call
format (hermes ``<tool_call>`` JSON parsed by verl's own parser), the text-only hybrid task family
(``text_hybrid``: no browser on the GPU machine), and DVReward asking a judge served by vLLM's
OpenAI-compatible server on 127.0.0.1. Only the model (random weights of Qwen2.5-0.5B's shapes),
the data, the batch and the step count are overridden."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ..e2e.conftest import assert_finite, read_metrics
from .conftest import assert_clean_end, run_script, worker_gpus


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vllm_judge(tmp_path):
    """vLLM's OpenAI-compatible server on loopback with a random-weight judge; yields its /v1 URL."""
    model = tmp_path / "judge_model"
    subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(model), "--arch", "qwen2.5-0.5b",
                    "--dtype", "bfloat16", "--seed", "7"], check=True)
    port = _free_port()
    env = dict(os.environ)
    with worker_gpus(1) as visible:  # held with the run, which takes the same cards: a shared card takes turns
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        log = open(tmp_path / "judge.log", "w")
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
             "judge", "--host", "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.12",
             "--enforce-eager", "--max-model-len", "4096"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            if server.poll() is not None:
                pytest.fail(f"vLLM judge server exited with {server.returncode}:\n{(tmp_path / 'judge.log').read_text()[-4000:]}")
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2)
                break
            except OSError:
                time.sleep(2)
        else:
            server.kill()
            pytest.fail("vLLM judge server did not answer in 10 minutes")
        yield f"{url}/v1"
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_toolcua_hybrid_dvreward_gpu_script_on_one_gpu(tmp_path, vllm_judge):
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "verl_ext.cli", "prepare-data", "text_hybrid", str(data),
                    "--train-size", "64", "--val-size", "8"], check=True)
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(model), "--arch", "qwen2.5-0.5b",
                    "--dtype", "bfloat16"], check=True)
    run_script(
        "toolcua_hybrid/run_fsdp_qwen25_1p5b.sh", tmp_path / "run",
        "recipe=toolcua_hybrid_dvreward",
        # 4 tasks x 4 rollouts: ~100k tokens a step at the script's n=8 made this the longest GPU test
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_prompt_length=6144", "data.max_response_length=4096",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "trainer.total_training_steps=3", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        MODEL=str(model), DATA_DIR=str(data), DVREWARD_JUDGE_URL=vllm_judge,
    )
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(metrics) == [1, 2, 3]
    for step in (1, 2, 3):
        assert_finite(metrics[step], ["actor/pg_loss", "verl_ext/episode/accuracy", "verl_ext/episode/tir"])
        dv = {k: v for k, v in metrics[step].items() if k.startswith("verl_ext/dvreward/")}
        assert dv, f"no DVReward metrics at step {step}"
        print(f"step {step}: " + ", ".join(f"{k}={v:.3g}" for k, v in sorted(dv.items())))
    assert_clean_end(tmp_path / "run")
