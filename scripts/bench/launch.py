"""Running the benchmarks' trainer runs: one run spec, one resumable launcher (retries, parallel slots, thread caps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

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

    def done(self) -> bool:
        return self.steps in load_steps(self.out / "metrics.jsonl")

    def command(self) -> str:
        """The run as one shell line (dry runs print it)."""
        env = " ".join(f"{k}={v}" for k, v in {**self.env, "OUT": self.out, "STEPS": self.steps}.items())
        return " ".join([env, "bash", f"recipes/{self.script}", *self.args])


def run(spec: RunSpec, attempts: int = 2, extra_env: dict[str, str] | None = None,
        timeout_s: float | None = None) -> float | None:
    """Run ``spec`` unless it is done; returns the wall time of the run that finished, or None if a
    finished run was reused. A crashed run is started again from scratch, up to ``attempts`` times:
    on a shared machine another job's ``ray stop`` or a stalled heartbeat can kill Ray under us. A
    run past ``timeout_s`` is killed with what it left behind (``kill_leftovers``)."""
    if spec.done():
        return None
    env = {**os.environ, **(extra_env or {}), **spec.env, "OUT": str(spec.out), "STEPS": str(spec.steps),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    spec.out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        (spec.out / "metrics.jsonl").unlink(missing_ok=True)  # verl's file logger appends
        start = time.perf_counter()
        with open(spec.out / f"run{attempt}.log", "w") as log:
            proc = subprocess.Popen(["bash", str(REPO / "recipes" / spec.script), *spec.args], cwd=REPO, env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group
                proc.wait()
                kill_leftovers(spec.out)
        wall = time.perf_counter() - start
        if proc.returncode == 0 and spec.done():
            # the machine is shared: keep the load next to the time so the numbers can be read fairly
            (spec.out / "run.json").write_text(json.dumps({"wall_s": wall, "load_avg_5min": os.getloadavg()[1],
                                                           "attempt": attempt, **spec.info}))
            return wall
        print(f"{spec.label}: attempt {attempt} failed (exit {proc.returncode}), see {spec.out / f'run{attempt}.log'}",
              flush=True)
    raise RuntimeError(f"{spec.label} failed {attempts} times; logs in {spec.out}")


def run_once(script: str, env_vars: dict[str, str], steps: int, out: Path, attempts: int, label: str,
             script_args: list[str] | None = None, info: dict | None = None) -> float | None:
    """``run`` of the spec these arguments name (the learning studies' call)."""
    return run(RunSpec(label, script, out, steps, env_vars, script_args or [], info or {}), attempts)


def launch(specs: Iterable[RunSpec], slots: Iterable[dict[str, str]] = ({},), attempts: int = 2,
           execute: Callable[[RunSpec, int, dict[str, str]], object] | None = None,
           cpus: int | None = None) -> list[RunSpec]:
    """Run the specs that are not done, in order, one per slot at a time: ``slots`` holds each slot's
    environment (e.g. ``{"CUDA_VISIBLE_DEVICES": "0"}``), and with several slots each run's thread
    pools get its share of the cores (``thread_caps``). ``execute(spec, attempts, env)`` replaces
    ``run``; a failed run is reported and the others go on. Returns the specs still not done, so
    that the same command resumes them."""
    specs, slots = list(specs), list(slots)
    todo = deque(s for s in specs if not s.done())
    caps = thread_caps(len(slots), cpus or os.cpu_count() or 1) if len(slots) > 1 else {}
    lock = threading.Lock()

    def worker(slot: dict[str, str]) -> None:
        while True:
            with lock:
                if not todo:
                    return
                spec = todo.popleft()
            try:
                (execute or (lambda s, a, e: run(s, a, e)))(spec, attempts, {**caps, **slot})
            except RuntimeError as error:
                print(f"{spec.label}: {error}", flush=True)

    threads = [threading.Thread(target=worker, args=(slot,)) for slot in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [s for s in specs if not s.done()]
