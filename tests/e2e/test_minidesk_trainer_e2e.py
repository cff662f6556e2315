"""The hybrid GUI + tool agent loop inside verl's real trainer: MiniDesk in headless Chromium,
`hybrid_gui_tool`, HGPO through the verl-ext trainer, cpu backend. The random tiny model solves
nothing; this checks the plumbing (episodes played in the browser, step metadata reaching the
advantage hook), not learning."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO, assert_finite, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


def test_minidesk_episodes_train_through_verl_with_hgpo(tmp_path, tiny_model_dir):
    bin_dir = os.path.dirname(sys.executable)
    subprocess.run([f"{bin_dir}/verl-ext", "prepare-data", "minidesk", str(tmp_path / "data"),
                    "--train-size", "8", "--val-size", "2"], check=True, capture_output=True)
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl")}
    overrides = [
        "+plugins/backend=cpu", "+plugins/env=minidesk", "+plugins/advantage=hgpo",
        f"data.train_files={tmp_path}/data/train.parquet", f"data.val_files={tmp_path}/data/val.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=4096", "data.max_response_length=1024",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "trainer.logger=[console,file]", "trainer.total_training_steps=2", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", f"trainer.default_local_dir={tmp_path}/ckpt",
    ]
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    (tmp_path / "run.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        assert_finite(metrics[step], ["critic/score/mean", "critic/advantages/mean", "timing_s/adv", "actor/pg_loss"])
        assert metrics[step]["num_turns/min"] >= 2  # at least one model turn after the env's first observation
