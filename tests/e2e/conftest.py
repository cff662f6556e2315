"""Helpers for end-to-end runs of verl's real trainer on the cpu backend."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_recipe(script: str, out: Path, *overrides: str, steps: int, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run ``recipes/<script>`` with OUT/STEPS set; returns the finished process (output captured)."""
    env = {**os.environ, "OUT": str(out), "STEPS": str(steps), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", str(REPO / "recipes" / script), *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    (out / "run.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"{script} exited with {proc.returncode}; log in {out / 'run.log'}\n{tail}")
    return proc


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger: one ``{"step": s, "data": {...}}`` per line -> {step: metrics}."""
    steps: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(record["data"])
    return steps


def assert_finite(metrics: dict, keys: list[str]) -> None:
    for key in keys:
        assert key in metrics, f"metric {key} missing; have {sorted(metrics)[:40]}"
        assert math.isfinite(float(metrics[key])), f"metric {key} = {metrics[key]}"
