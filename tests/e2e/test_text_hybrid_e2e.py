"""The hybrid GUI + tool agent loop inside verl's real trainer with no browser: TextHybrid
(``verl_ext.envs.text_hybrid``), ``hybrid_gui_tool`` in its function-call format (verl's hermes
parser), HGPO through the verl-ext trainer, cpu backend. The random tiny model writes no valid
call, so each episode is one model turn after the env's first observation; this checks the
plumbing (rows -> env backend -> agent loop -> step metadata -> advantage hook), not learning."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO, assert_finite, read_metrics

pytestmark = pytest.mark.e2e


def test_text_hybrid_episodes_train_through_verl_with_function_calls(tmp_path, tiny_model_dir):
    bin_dir = os.path.dirname(sys.executable)
    subprocess.run([f"{bin_dir}/verl-ext", "prepare-data", "text_hybrid", str(tmp_path / "data"),
                    "--train-size", "4", "--val-size", "2"], check=True, capture_output=True)
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl")}
    overrides = [
        # plugins/env=minidesk sets only what any hybrid env needs: hermes calls, hybrid_gui_tool, env rewards.
        "+plugins/backend=cpu", "+plugins/env=minidesk", "+plugins/advantage=hgpo",
        f"data.train_files={tmp_path}/data/train.parquet", f"data.val_files={tmp_path}/data/val.parquet",
        "data.train_batch_size=2", "data.max_prompt_length=4096", "data.max_response_length=512",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "trainer.logger=[console,file]", "trainer.total_training_steps=2", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", f"trainer.default_local_dir={tmp_path}/ckpt",
    ]
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    (tmp_path / "run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "chromium" not in (proc.stdout + proc.stderr).lower()  # no browser was started or looked for
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/score/mean", "critic/advantages/mean", "timing_s/adv", "actor/pg_loss"])
        assert metrics[step]["num_turns/min"] >= 2  # at least one model turn after the env's first observation
        # 2 prompts x 2 samples, each a TextHybrid episode with step metadata, none faulted.
        assert metrics[step]["verl_ext/episode/episodes"] == 4 and metrics[step]["verl_ext/episode/faults"] == 0
