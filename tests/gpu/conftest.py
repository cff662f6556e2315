"""GPU tests: verl's real ``main_ppo`` on CUDA with vLLM (or the ``hf`` rollout) and FSDP2.

Collected only on a machine with CUDA (or with ``VERL_EXT_GPU_TESTS=1``): see ``tests/conftest.py``.
On such a machine nothing is skipped for a missing dependency: a missing vLLM, Ray or verl is a
failure naming the package. Tests that need more GPUs than the machine has are skipped with the
count in the reason (run them on a 2- or 4-GPU machine).

Each test runs a recipe script (``recipes/text_corridor/run_gpu.sh``, ...) as a user would, with a
random-weight model of Qwen2.5-0.5B's architecture built locally (no hub download). Runs are
independent processes with their own Ray cluster, so ``pytest -n <k>`` (pytest-xdist) runs them
side by side; each worker then gets GPUs of its own (``CUDA_VISIBLE_DEVICES``). With more workers
than GPU sets the workers that share a card take turns on it (``worker_gpus``): vLLM's start-up
memory profiling fails when another process on the card frees memory meanwhile ("other processes
sharing the same container release GPU memory"), and a colocated vLLM frees its memory every step,
so runs on one card cannot safely overlap under xdist. Use ``-n`` up to the number of GPUs. (With
``KV_CACHE_BYTES`` set, vLLM skips that profiling: separate pytest processes then can share a card,
docs/howto/share_a_gpu_host.md.)

Expected time per run (start-up to the first step is about 2.5 minutes: FSDP workers ~95 s, vLLM
~50 s). On an H200, alone on the card, ``test_vllm_fsdp2.py`` ``[snapshot]`` took 4 min 26 s and
``test_hybrid_dvreward_gpu.py`` over 8 minutes; all 10 single-GPU tests took 14 min 31 s with ``-n 4``
on 4 H100s. Set ``VERL_EXT_GPU_LOG_DIR`` to collect every run's log and metrics there.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"torch": "torch==2.11.0 (CUDA build)", "vllm": "verl-ext[vllm]", "ray": "verl", "verl": "verl==0.9.1",
            "transfer_queue": "verl[verl-core]"}


def pytest_collection_modifyitems(items):
    # a conftest's hook sees every collected item, not only this folder's
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def gpu_machine():
    """Fail (never skip) when this CUDA machine lacks what the GPU tests need."""
    missing = [f"{module} (pip install {extra})" for module, extra in REQUIRED.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        pytest.fail("GPU tests need: " + ", ".join(missing))
    import torch

    if not torch.cuda.is_available():
        pytest.fail("GPU tests need CUDA: torch.cuda.is_available() is False")
    return torch.cuda.device_count()


def card_assignment(needed: int, total: int, workers: int, worker: int) -> tuple[str | None, bool]:
    """(GPU indices for xdist worker number ``worker`` as a CUDA_VISIBLE_DEVICES-style list relative to
    what this process sees, or None for all of them; whether other workers get the same cards)."""
    slots = total // needed
    if workers <= 1:
        return None, False
    first = (worker % slots) * needed
    return ",".join(str(i) for i in range(first, first + needed)), workers > slots


# lock file -> (open file holding the flock, nesting depth) for the card locks this process holds
_HELD: dict[Path, tuple[IO[str], int]] = {}


@contextlib.contextmanager
def card_lock(cards: str, lock_dir: Path | None = None) -> Iterator[None]:
    """Hold ``cards`` (a CUDA_VISIBLE_DEVICES value) alone among this machine's processes: a second
    process waits here until the first leaves. Re-entrant within a process (a test's vLLM judge
    fixture and its run both hold it)."""
    path = (lock_dir or Path(tempfile.gettempdir())) / f"verl-ext-gpu-{cards.replace(',', '-')}.lock"
    if path in _HELD:
        file, depth = _HELD[path]
        _HELD[path] = (file, depth + 1)
    else:
        file = open(path, "w")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[gpu tests] GPU(s) {cards} busy with another xdist worker's run; waiting for it ({path})",
                  file=sys.stderr, flush=True)
            fcntl.flock(file, fcntl.LOCK_EX)
        _HELD[path] = (file, 1)
    try:
        yield
    finally:
        file, depth = _HELD[path]
        if depth > 1:
            _HELD[path] = (file, depth - 1)
        else:
            del _HELD[path]
            file.close()  # releases the flock


@contextlib.contextmanager
def worker_gpus(needed: int) -> Iterator[str | None]:
    """CUDA_VISIBLE_DEVICES for this xdist worker's run (None: leave it as it is), held alone for the
    block when other workers share those cards (module docstring: runs on one card take turns)."""
    import torch

    total = torch.cuda.device_count()
    if total < needed:
        pytest.skip(f"needs {needed} GPUs, this machine has {total}")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    cards, shared = card_assignment(needed, total, workers, worker)
    if cards is not None and os.environ.get("CUDA_VISIBLE_DEVICES"):
        # indices relative to what this process sees; CUDA_VISIBLE_DEVICES takes physical ones
        visible = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        cards = ",".join(visible[int(i)] for i in cards.split(","))
    with card_lock(cards) if shared else contextlib.nullcontext():
        yield cards


def run_script(script: str, out: Path, *overrides: str, timeout: int = 900, gpus: int = 1,
               **env: str) -> subprocess.CompletedProcess:
    """Run ``recipes/<script>`` with OUT set and ``env`` on top; fails the test with the log tail."""
    full_env = {**os.environ, "OUT": str(out), "N_GPUS": str(gpus), "PYTHONUNBUFFERED": "1",
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    out.mkdir(parents=True, exist_ok=True)
    with worker_gpus(gpus) as visible:
        if visible is not None:
            full_env["CUDA_VISIBLE_DEVICES"] = visible
        try:
            proc = subprocess.run(["bash", str(REPO / "recipes" / script), *overrides], cwd=REPO, env=full_env,
                                  capture_output=True, text=True, timeout=timeout)
            log, code = proc.stdout + "\n--- stderr ---\n" + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            log, code, proc = f"{exc.stdout or ''}\n--- stderr ---\n{exc.stderr or ''}\nTIMEOUT after {timeout} s", -1, None
            log = log if isinstance(log, str) else log.decode(errors="replace")
    (out / "run.log").write_text(log)
    _collect(out)
    if code != 0:
        pytest.fail(f"{script} exited with {code}; log in {out / 'run.log'}\n{log[-8000:]}")
    return proc


def assert_clean_end(out: Path) -> None:
    """A good run prints no traceback (checked last, after the test's own assertions), except verl's
    colocate_async exit race (``run_logs.is_teardown_race``; seen once, H200, 2026-11-28)."""
    from ..run_logs import unexplained_tracebacks  # here: tests load this file on its own too

    found = unexplained_tracebacks((out / "run.log").read_text())
    assert not found, f"the run exited 0 but printed {len(found)} traceback(s); the first:\n{found[0]}"


def _collect(out: Path) -> None:
    """Copy the run's log and metrics to VERL_EXT_GPU_LOG_DIR (one flat name per run; a test's second
    run in the same folder, a resume, gets ``_2``: it rewrites both files)."""
    target = os.environ.get("VERL_EXT_GPU_LOG_DIR")
    if not target:
        return
    name = "_".join(out.parts[-2:]).replace("[", "-").replace("]", "").replace("/", "-")
    run, k = name, 1
    while (Path(target) / f"{run}.log").exists():
        k += 1
        run = f"{name}_{k}"
    for source, suffix in ((out / "run.log", "log"), (out / "metrics.jsonl", "jsonl")):
        if source.exists():
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(source, Path(target) / f"{run}.{suffix}")
