"""Helpers for end-to-end runs of verl's real trainer on the cpu backend."""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# a recipe's "make the model unless OUT has one" line, with the default seed
_MAKES_TINY_MODEL = re.compile(r'^\[ -f "\$OUT/model/config\.json" \] \|\| verl-ext make-tiny-model "\$OUT/model" --seed (0|"\$SEED")$',
                               re.MULTILINE)


def _makes_the_seed0_tiny_model(script: str, env: dict) -> bool:
    return env.get("SEED", "0") == "0" and bool(_MAKES_TINY_MODEL.search((REPO / "recipes" / script).read_text()))


@functools.cache
def _seed0_tiny_model() -> Path:
    """``verl-ext make-tiny-model --seed 0``, once per test session (a process start and ~5 s a run)."""
    folder = Path(tempfile.mkdtemp(prefix="verl_ext_tiny_model_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    subprocess.run([str(Path(sys.executable).parent / "verl-ext"), "make-tiny-model", str(folder / "model"), "--seed", "0"],
                   check=True, capture_output=True)
    return folder / "model"


def run_recipe(script: str, out: Path, *overrides: str, steps: int, timeout: int = 900,
               crash_at: str | None = None, must_fail: bool = False) -> subprocess.CompletedProcess:
    """Run ``recipes/<script>`` with OUT/STEPS set; returns the finished process (output captured).
    With ``crash_at`` (``<point>@<step>``, ``verl_ext.faults``) the trainer must kill itself there;
    with ``must_fail`` the run must exit non-zero (the caller checks why)."""
    from verl_ext.faults import CRASH_ENV

    env = {**os.environ, "OUT": str(out), "STEPS": str(steps), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    if _makes_the_seed0_tiny_model(script, env) and not (out / "model").exists():
        shutil.copytree(_seed0_tiny_model(), out / "model")  # the model the recipe would make, made once
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    proc = subprocess.run(
        ["bash", str(REPO / "recipes" / script), *overrides],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    log = proc.stdout + proc.stderr
    (out / ("crashed_run.log" if crash_at else "run.log")).write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if crash_at is not None:
        if proc.returncode == 0 or f"{CRASH_ENV}={crash_at}: killing the trainer process" not in log:
            pytest.fail(f"{script} did not crash at {crash_at} (exit {proc.returncode}); log in {out}\n{log[-6000:]}")
    elif must_fail:
        if proc.returncode == 0:
            pytest.fail(f"{script} should have failed but exited with 0; log in {out / 'run.log'}\n{log[-6000:]}")
    elif proc.returncode != 0:
        pytest.fail(f"{script} exited with {proc.returncode}; log in {out / 'run.log'}\n{log[-6000:]}")
    return proc


def assert_restored_from(proc: subprocess.CompletedProcess, checkpoint: Path) -> None:
    """The resumed run loaded verl-ext's state of ``checkpoint`` (a ``global_step_<n>`` folder) and
    every file it loaded is, byte for byte, the file that checkpoint's manifest lists."""
    import json

    from verl_ext.checkpoint_files import MANIFEST, sha256_of

    folder = checkpoint / "verl_ext_old_logits"
    manifest = json.loads((folder / MANIFEST).read_text())
    line = next((x for x in proc.stdout.splitlines() if f"restored the state of {checkpoint.name}," in x), None)
    assert line is not None, f"no restore of {checkpoint.name} logged:\n{proc.stdout[-4000:]}"
    for name, entry in manifest["files"].items():
        assert sha256_of(str(folder / name)) == entry["sha256"]  # the manifest describes the files on disk
        assert f"{name} {entry['sha256'][:12]}" in line, (name, line)  # ... and the run loaded exactly those


def run_hybrid_env_job(kind: str, out: Path, model: Path, train_size: int, batch: int, response_length: int) -> str:
    """``verl-ext prepare-data <kind>`` then verl's ``main_ppo`` (module entry, cpu backend) with the
    ``hybrid_gui_tool`` loop (``plugins/env=minidesk`` sets only what any hybrid env needs: hermes
    calls, the agent loop, env rewards) and HGPO for 2 steps of ``batch`` prompts x 2 samples.
    Metrics go to ``out/metrics.jsonl``; fails with the log tail on a non-zero exit; returns the log."""
    bin_dir = Path(sys.executable).parent
    data = out / "data"
    subprocess.run([str(bin_dir / "verl-ext"), "prepare-data", kind, str(data), "--train-size", str(train_size),
                    "--val-size", "2"], check=True, capture_output=True)
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")}
    micro = 2 * batch  # one micro-batch holds every row of a step
    overrides = [
        "+plugins/backend=cpu", "+plugins/env=minidesk", "+plugins/advantage=hgpo", "trainer.v1.trainer_mode=verl_ext_sync",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet",
        f"data.train_batch_size={batch}", "data.max_prompt_length=4096", f"data.max_response_length={response_length}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.n=2", f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "trainer.logger=[console,file]", "trainer.total_training_steps=2", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", f"trainer.default_local_dir={out}/ckpt",
        "+trainer.v1.verl_ext.stop_on_zero_signal=false",  # a random model: steps where every rollout scores the same
    ]
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    (out / "run.log").write_text(log)
    assert proc.returncode == 0, log[-6000:]
    return log


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


def assert_hook_metrics(metrics: dict, hooks: tuple[str, ...] = (), memory: tuple[str, ...] = ()) -> None:
    """verl-ext's own cost on one logged step (``verl_ext.timing``): each named hook timed, the
    total the sum of every hook's time and its share of verl's ``timing_s/step``, and each named
    piece of state holding bytes."""
    from verl_ext.timing import SHARE_OF_STEP, TIME_PREFIX, TOTAL

    assert_finite(metrics, [TOTAL, SHARE_OF_STEP, "timing_s/step", *(TIME_PREFIX + h for h in hooks)])
    times = {k: v for k, v in metrics.items() if k.startswith(TIME_PREFIX) and k not in (TOTAL, SHARE_OF_STEP)}
    assert all(v >= 0 for v in times.values()), times
    assert math.isclose(metrics[TOTAL], sum(times.values()), rel_tol=1e-9, abs_tol=1e-12), times
    assert 0 < metrics[TOTAL] < metrics["timing_s/step"], (metrics[TOTAL], metrics["timing_s/step"])
    assert math.isclose(metrics[SHARE_OF_STEP], metrics[TOTAL] / metrics["timing_s/step"], rel_tol=1e-9)
    for what in memory:
        held = sum(metrics.get(f"verl_ext/mem/{what}/{where}_bytes", 0.0) for where in ("gpu", "host"))
        assert held > 0, f"verl_ext/mem/{what}/*_bytes missing or 0 in {sorted(k for k in metrics if 'mem' in k)}"
