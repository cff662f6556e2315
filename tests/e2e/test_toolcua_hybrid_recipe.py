"""The flagship cpu recipe end to end (the README quickstart): `recipes/toolcua_hybrid/run_cpu.sh`
runs verl's `main_ppo` with the recipe's config — MiniDesk in headless Chromium, the T/G menu,
HGPO, the Tool-Efficient Path Reward, and (a synchronous run) verl's own PPO loss — then
`verl-ext eval` plays the saved checkpoint. Slow: one trainer run of 2-4 minutes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, assert_finite, assert_hook_metrics, read_metrics, run_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.browser]  # no Chromium: skipped, or failed under CI (tests/conftest.py)

STEPS = 2
VAL = "val-aux/verl_ext/minidesk/{}/mean@1"


@pytest.fixture(scope="module")
def flagship_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("toolcua_hybrid")
    proc = run_recipe("toolcua_hybrid/run_cpu.sh", out, f"trainer.test_freq={STEPS}", steps=STEPS)
    return out, proc


def test_every_plugin_of_the_recipe_acts_in_the_training_step(flagship_run):
    out, _ = flagship_run
    metrics = read_metrics(out / "metrics.jsonl")
    for step in range(1, STEPS + 1):
        m = metrics[step]
        # episodes played in the browser and scored (env + reward), counted by the trainer hook
        assert_finite(m, ["verl_ext/episode/accuracy", "verl_ext/episode/tir", "critic/score/mean"])
        assert m["verl_ext/episode/episodes"] + m["verl_ext/episode/faults"] == 32
        # the path reward's group term ran (reward post-processor) ...
        assert_finite(m, ["verl_ext/path_length_reward/mean"])
        assert_hook_metrics(m, ("step_metadata", "advantages", "reward_postprocess"))
        # ... HGPO's step advantages (not all equal) and verl's PPO loss: PPO-EWMA and the EWMA
        # old logits are off in this synchronous run (LOSS=ppo_ewma; async_agentic runs them)
        assert m["critic/advantages/max"] > m["critic/advantages/min"]
        assert_finite(m, ["actor/pg_loss", "actor/pg_clipfrac"])
        assert not [key for key in m if key.startswith(("actor/ppo_ewma/", "old_logits/"))]
    for step in (0, STEPS):  # validation on held-out instances, with every reward component
        assert_finite(metrics[step], [VAL.format(k) for k in ("success", "tool_ok", "format_ok", "num_steps")])


def test_the_script_ends_with_paths_and_an_eval_command_that_works(flagship_run):
    out, proc = flagship_run
    checkpoint = out / "checkpoints" / f"global_step_{STEPS}"
    assert f"checkpoint:       {checkpoint}" in proc.stdout
    assert str(out / "metrics.jsonl") in proc.stdout
    command = next(line for line in proc.stdout.splitlines() if "verl-ext eval" in line)
    assert f"--policy checkpoint:{checkpoint}" in command
    bin_dir = Path(sys.executable).parent
    result = subprocess.run(
        [str(bin_dir / "verl-ext"), "eval", "--env", "minidesk", "--policy", f"checkpoint:{checkpoint}",
         "--action-format", "menu", "--max-steps", "8", "--tasks", "mail_send,settings_theme", "--seeds", "2",
         "--parallel", "1"],
        cwd=REPO, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, capture_output=True, text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "overall: episodes=4 faults=0" in result.stdout
    # verl's model merger turned the FSDP shards into a transformers folder next to them
    assert (checkpoint / "actor" / "huggingface_merged" / "model.safetensors").exists()
