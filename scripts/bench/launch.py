"""Running the benchmarks' trainer runs: one run spec, one resumable launcher (retries, parallel slots, thread caps)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[2]
Runs = dict[int, dict[int, dict[str, float]]]  # seed -> step -> metrics


def load_steps(path: Path) -> dict[int, dict[str, float]]:
    """verl's ``file`` logger (one ``{"step", "data"}`` JSON object per line) -> {step: metrics}."""
    steps: dict[int, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def thread_caps(parallel: int, cpus: int) -> dict[str, str]:
    """Each run's share of the host's cores for its BLAS / OpenMP / torch thread pools. Left
    unset, every process of every run sizes them to the whole machine: 20 runs on a 64-core host
    (each a Ray cluster of tens of processes) reached the host's thread limit, and runs failed
    with "can't start new thread" / OpenBLAS "pthread_create failed" (2026-11-28)."""
    n = str(max(1, cpus // max(1, parallel)))
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def card_slots(cards: Sequence[int], runs: int | None = None) -> list[dict[str, str]]:
    """``runs`` launcher slots spread round-robin over ``cards`` (one ``CUDA_VISIBLE_DEVICES`` each),
    so the cards carry equal numbers of runs; ``runs`` None: one slot per card; no cards: ``runs``
    slots that see every card."""
    n = runs or len(cards) or 1
    return [{"CUDA_VISIBLE_DEVICES": str(cards[i % len(cards)])} if cards else {} for i in range(n)]


def available_host_gb() -> float:
    """The host memory available to new processes, in GB."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def finished_walls(root: Path) -> list[float]:
    """Wall times of the finished runs under ``root`` (their ``run.json``, as ``run`` writes it)."""
    return [json.loads(f.read_text())["wall_s"] for f in sorted(root.rglob("run.json")) if f.stat().st_size]


def gpu_environment() -> dict:
    """Card and versions, recorded with every GPU run."""
    import importlib.metadata as md

    cards = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().splitlines()
    card = "; ".join(f"{cards.count(c)} x {c}" if cards.count(c) > 1 else c for c in dict.fromkeys(cards))
    versions = {}
    for name in ("torch", "vllm", "verl", "transformers"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {"card": card, **versions}


def kill_leftovers(folder: Path) -> int:
    """Kills what a killed run left behind: Ray's daemons and workers leave the run's process group,
    and an orphaned vLLM worker would hold the GPU memory the next run needs. They inherit the run's
    environment, so its ``OUT`` (``folder``) names them; other runs on the machine (other Ray
    clusters included) are left alone. Returns how many processes were killed."""
    import psutil

    killed = 0
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("OUT") == str(folder):
                proc.kill()
                killed += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return killed


@dataclass
class RunSpec:
    """One trainer run: ``bash recipes/<script> [args]`` with ``env`` + ``OUT``/``STEPS``, done once its
    ``metrics.jsonl`` reaches ``steps``. ``info`` (e.g. the card) goes into ``run.json``."""

    label: str
    script: str
    out: Path
    steps: int
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    timeout_s: float | None = None  # kill the run (and what it left behind) after this long

    def done(self) -> bool:
        return self.steps in load_steps(self.out / "metrics.jsonl")

    def command(self) -> str:
        """The run as one shell line (dry runs print it)."""
        env = {**self.env, "OUT": self.out, "STEPS": self.steps}
        return " ".join([*(f"{k}={shlex.quote(str(v))}" for k, v in env.items()), "bash", f"recipes/{self.script}",
                         *map(shlex.quote, self.args)])


class RunFailed(RuntimeError):
    """A run that failed every attempt: its last exit code (negative: killed by that signal), whether
    it ran out of time, its wall time and its log."""

    def __init__(self, spec: RunSpec, attempts: int, returncode: int, timed_out: bool, wall_s: float, log: Path):
        super().__init__(f"{spec.label} failed {attempts} times; logs in {spec.out}")
        self.returncode, self.timed_out, self.wall_s, self.log = returncode, timed_out, wall_s, log


def run(spec: RunSpec, attempts: int = 2, extra_env: dict[str, str] | None = None,
        timeout_s: float | None = None) -> float | None:
    """Run ``spec`` unless it is done; returns the wall time of the run that finished, or None if a
    finished run was reused. A crashed run is started again from scratch, up to ``attempts`` times:
    on a shared machine another job's ``ray stop`` or a stalled heartbeat can kill Ray under us. A
    run past ``timeout_s`` (default: the spec's) is killed with what it left behind (``kill_leftovers``).
    Raises ``RunFailed`` when no attempt finished."""
    timeout_s = spec.timeout_s if timeout_s is None else timeout_s
    if spec.done():
        return None
    env = {**os.environ, **(extra_env or {}), **spec.env, "OUT": str(spec.out), "STEPS": str(spec.steps),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    spec.out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        (spec.out / "metrics.jsonl").unlink(missing_ok=True)  # verl's file logger appends
        start, timed_out, log_path = time.perf_counter(), False, spec.out / f"run{attempt}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(["bash", str(REPO / "recipes" / spec.script), *spec.args], cwd=REPO, env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group
                proc.wait()
                kill_leftovers(spec.out)
        wall = time.perf_counter() - start
        if proc.returncode == 0 and spec.done():
            # the machine is shared: keep the load next to the time so the numbers can be read fairly
            (spec.out / "run.json").write_text(json.dumps({"wall_s": wall, "load_avg_5min": os.getloadavg()[1],
                                                           "attempt": attempt, **spec.info}))
            return wall
        print(f"{spec.label}: attempt {attempt} failed (exit {proc.returncode}), see {log_path}", flush=True)
    raise RunFailed(spec, attempts, proc.returncode, timed_out, wall, log_path)


def run_and_report(spec: RunSpec, attempts: int, env: dict[str, str]) -> None:
    """``run``, then a line with the run's wall time (``launch``'s default)."""
    print(f"{spec.label}: {run(spec, attempts, env):.0f} s", flush=True)


def launch(specs: Iterable[RunSpec], slots: Iterable[dict[str, str]] = ({},), attempts: int = 2,
           execute: Callable[[RunSpec, int, dict[str, str]], object] | None = None, cpus: int | None = None, *,
           ready: Callable[[RunSpec], bool] | None = None, start_gap_s: float = 0.0, min_free_gb: float = 0.0,
           budget_s: float | None = None, expected_s: Callable[[RunSpec], float] | None = None,
           poll_s: float = 5.0) -> list[RunSpec]:
    """Run the specs that are not done, in order, one per slot at a time: ``slots`` holds each slot's
    environment (e.g. ``card_slots``), and with several slots each run's thread pools get its share of
    the cores (``thread_caps``). ``execute(spec, attempts, env)`` replaces ``run``; a failed run is
    reported and the others go on. Returns the specs still not done, so that the same command resumes them.

    A slot takes the first spec that is ``ready`` (a later stage waits for an earlier run's output),
    no sooner than ``start_gap_s`` after the last start (start-ups that profile memory or load the
    CPU must not overlap) and only while the host has ``min_free_gb`` available (Ray's memory monitor
    kills workers of every run when it runs short). With ``budget_s``, no run starts that would end
    after it (``expected_s(spec)``: its expected wall time), and each run is killed when it is spent."""
    specs, slots = list(specs), list(slots)
    todo = [s for s in specs if not s.done()]
    caps = thread_caps(len(slots), cpus or os.cpu_count() or 1) if len(slots) > 1 else {}
    lock = threading.Lock()
    began, last_start = time.monotonic(), [float("-inf")]

    def take() -> RunSpec | bool:
        """The next spec to start, True to wait and look again, False when nothing more will start."""
        if not todo:
            return False
        now = time.monotonic()
        spec = next((s for s in todo if ready is None or ready(s)), None)
        if spec is None or now - last_start[0] < start_gap_s or (min_free_gb and available_host_gb() < min_free_gb):
            return True
        todo.remove(spec)
        last_start[0] = now
        if budget_s is not None and budget_s < float("inf"):
            left = budget_s - (now - began)
            if left < (expected_s(spec) if expected_s else 0.0):
                print(f"budget: {len(todo) + 1} runs not started (the same command continues them)", flush=True)
                todo.clear()
                return False
            spec = replace(spec, timeout_s=min(spec.timeout_s or left, left))
        return spec

    def worker(slot: dict[str, str]) -> None:
        while True:
            with lock:
                spec = take()
            if spec is False:
                return
            if spec is True:
                time.sleep(poll_s)
                continue
            try:
                (execute or run_and_report)(spec, attempts, {**caps, **slot})
            except RuntimeError as error:
                print(f"{spec.label}: {error}", flush=True)

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [s for s in specs if not s.done()]
