"""GPU tests sharing a card take turns (``tests/gpu/conftest.py``): which xdist workers share cards,
and the card lock, contended by two real processes (the second waits until the first lets go)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

GPU_CONFTEST = Path(__file__).resolve().parent / "gpu" / "conftest.py"

# Holds card "0" until the file argv[3] exists; prints "held" once it has the lock.
HOLDER = f"""
import importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("gpu_conftest", {str(GPU_CONFTEST)!r})
gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu)
with gpu.card_lock("0", Path(sys.argv[1])):
    print("held", flush=True)
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("gpu_conftest", GPU_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workers_share_cards_only_when_they_outnumber_the_card_sets(gpu):
    assert gpu.card_assignment(1, 4, 1, 0) == (None, False)  # no xdist: the run sees every card
    assert [gpu.card_assignment(1, 4, 4, w) for w in range(4)] == [("0", False), ("1", False), ("2", False), ("3", False)]
    assert [gpu.card_assignment(1, 1, 3, w) for w in range(3)] == [("0", True)] * 3  # -n 3 on one H200
    assert [gpu.card_assignment(2, 4, 4, w) for w in range(4)] == [("0,1", True), ("2,3", True)] * 2


def _wait_for(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}: {path.read_text()!r}"
        time.sleep(0.05)


def test_a_second_process_waits_for_the_card_until_the_first_lets_go(tmp_path: Path):
    def holder(name: str) -> tuple[subprocess.Popen, Path]:
        out = tmp_path / f"{name}.out"
        with open(out, "w") as log:  # stdout, then stderr: "held" and the waiting message
            proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(tmp_path / f"release-{name}")],
                                    stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        return proc, out

    (tmp_path / "release-second").touch()  # the second lets go as soon as it has the card
    first, first_out = holder("first")
    second = None
    try:
        _wait_for(first_out, "held")
        second, second_out = holder("second")
        _wait_for(second_out, "GPU(s) 0 busy with another xdist worker's run; waiting")
        time.sleep(0.5)
        assert second.poll() is None and "held" not in second_out.read_text(), "both held the card at once"
        (tmp_path / "release-first").touch()
        assert first.wait(timeout=60) == 0
        assert second.wait(timeout=60) == 0
        assert second_out.read_text().splitlines()[-1] == "held"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_the_lock_is_reentrant_within_a_process_and_released_after(gpu, tmp_path: Path):
    """The dvreward test's judge fixture holds the card and its run takes it again: no deadlock."""
    with gpu.card_lock("0", tmp_path), gpu.card_lock("0", tmp_path):
        pass
    assert gpu._HELD == {}
    release = tmp_path / "release"
    release.touch()
    other = subprocess.run([sys.executable, "-c", HOLDER, str(tmp_path), str(release)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert other.stdout.strip() == "held" and "waiting" not in other.stderr


def test_a_resumed_run_keeps_the_first_runs_log_and_metrics(gpu, tmp_path, monkeypatch):
    """A test that resumes in its own folder rewrites run.log and metrics.jsonl: the collected copy of
    the first run must survive next to the second's."""
    monkeypatch.setenv("VERL_EXT_GPU_LOG_DIR", str(tmp_path / "logs"))
    out = tmp_path / "pytest-3" / "test_resume0"
    out.mkdir(parents=True)
    for step in (1, 2):
        (out / "run.log").write_text(f"run {step}")
        (out / "metrics.jsonl").write_text(f'{{"step": {step}}}')
        gpu._collect(out)
    logs = tmp_path / "logs"
    assert (logs / "pytest-3_test_resume0.log").read_text() == "run 1"
    assert (logs / "pytest-3_test_resume0_2.log").read_text() == "run 2"
    assert (logs / "pytest-3_test_resume0_2.jsonl").read_text() == '{"step": 2}'
