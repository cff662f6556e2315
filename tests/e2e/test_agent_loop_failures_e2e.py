"""A run whose agent loops all fail stops at the first batch with the first error and the count
(verl_ext.agent_loops.failures), not later with TransferQueue's "Received an empty list as keys".
The quickstart's arithmetic rows carry no env seed, so the ``text_env`` agent loop raises on each."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.e2e


def test_a_run_whose_agent_loops_all_fail_stops_with_the_first_error(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "STEPS": "2", "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(REPO / "recipes/quickstart/run_cpu.sh"), "actor_rollout_ref.rollout.agent.default_agent_loop=text_env"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    log = proc.stdout + proc.stderr
    (tmp_path / "run.log").write_text(log)
    assert proc.returncode != 0
    assert "AgentLoopFailuresError" in log and "agent-loop runs failed (val batch)" in log, log[-6000:]
    assert "text_env needs the env seed in the dataset row" in log
    assert "Received an empty list as keys" not in log
