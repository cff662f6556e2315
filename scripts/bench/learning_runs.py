"""Shared machinery of the learning benchmarks (``text_corridor_learning.py``,
``toolcua_hybrid_learning.py``): run a cpu recipe once per (config, seed) with the same seeds and
budget, read verl's per-step metrics from its JSONL file logger, tabulate, plot, and replace the
benchmark's section of ``docs/results.md``.

Runs are sequential (one trainer at a time on a 2-core machine). A run whose ``metrics.jsonl``
already reaches the last step is reused, so a sweep can be resumed or re-reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
Runs = dict[int, dict[int, dict[str, float]]]  # seed -> step -> metrics


def study_parser(description: str, out: Path, steps: int, seeds: list[int],
                 doc: Path = REPO / "docs/results.md") -> argparse.ArgumentParser:
    """The run arguments every study takes: budget (``--steps``), ``--seeds``, where runs go
    (``--out``), where the report goes (``--doc``, ``--img``), ``--attempts`` and ``--report-only``.
    A study adds its own options to the parser it gets back."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--doc", type=Path, default=doc)
    parser.add_argument("--img", type=Path, default=REPO / "docs/img")
    parser.add_argument("--attempts", type=int, default=2, help="tries per run before giving up")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs under --out")
    return parser


RUN_PLACES = ("out", "doc", "img", "attempts", "report_only", "section", "dry_run")  # where runs and reports go, not what ran


def study_command(script: str, parser: argparse.ArgumentParser, args: argparse.Namespace, always: tuple[str, ...]) -> str:
    """The command line that reproduces ``args``: the options named in ``always``, then every other
    option whose value differs from its default (``RUN_PLACES`` left out), so that a report's command
    cannot drop a setting it ran with."""
    def option(action: argparse.Action) -> str:
        value = getattr(args, action.dest)
        quoted = [f"'{v}'" if " " in str(v) else str(v) for v in (value if isinstance(value, list) else [value])]
        if action.nargs == 0:  # a flag
            return action.option_strings[0]
        if isinstance(action, argparse._AppendAction):  # given once per value
            return " ".join(f"{action.option_strings[0]} {v}" for v in quoted)
        return " ".join([action.option_strings[0], *quoted])

    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    shown = [actions[dest] for dest in always] + [
        a for dest, a in actions.items()
        if dest not in always and dest not in RUN_PLACES and getattr(args, dest) != a.default]
    return " ".join([f"python scripts/bench/{script}", *(option(a) for a in shown)])


def thread_caps(parallel: int, cpus: int) -> dict[str, str]:
    """Each run's share of the host's cores for its BLAS / OpenMP / torch thread pools. Left
    unset, every process of every run sizes them to the whole machine: 20 runs on a 64-core host
    (each a Ray cluster of tens of processes) reached the host's thread limit, and runs failed
    with "can't start new thread" / OpenBLAS "pthread_create failed" (2026-11-28)."""
    n = str(max(1, cpus // max(1, parallel)))
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def load_steps(path: Path) -> dict[int, dict[str, float]]:
    """verl's ``file`` logger (one ``{"step", "data"}`` JSON object per line) -> {step: metrics}."""
    steps: dict[int, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def run_once(script: str, env_vars: dict[str, str], steps: int, out: Path, attempts: int, label: str,
             script_args: list[str] | None = None, info: dict | None = None) -> float | None:
    """Run ``recipes/<script> [script_args]`` with ``env_vars`` + ``OUT``/``STEPS``; returns the wall
    time of the run that finished, or None if a finished run was reused. A crashed run is started
    again from scratch, up to ``attempts`` times: on a shared machine another job's ``ray stop`` or a
    stalled heartbeat can kill Ray under us. ``info`` (e.g. the card) goes into ``run.json``."""
    if steps in load_steps(out / "metrics.jsonl"):
        return None
    env = {**os.environ, **env_vars, "OUT": str(out), "STEPS": str(steps),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        (out / "metrics.jsonl").unlink(missing_ok=True)  # verl's file logger appends
        start = time.perf_counter()
        with open(out / f"run{attempt}.log", "w") as log:
            proc = subprocess.run(["bash", str(REPO / "recipes" / script), *(script_args or [])], cwd=REPO, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        if proc.returncode == 0 and steps in load_steps(out / "metrics.jsonl"):
            # the machine is shared: keep the load next to the time so the numbers can be read fairly
            (out / "run.json").write_text(json.dumps({"wall_s": wall, "load_avg_5min": os.getloadavg()[1],
                                                      "attempt": attempt, **(info or {})}))
            return wall
        print(f"{label}: attempt {attempt} failed (exit {proc.returncode}), see {out / f'run{attempt}.log'}",
              flush=True)
    raise RuntimeError(f"{label} failed {attempts} times; logs in {out}")


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


def series(runs: Runs, key: str, steps: list[int]) -> np.ndarray:
    """Shape (seeds, len(steps)): ``key`` at each step of each seed's run (NaN where not logged)."""
    return np.array([[run.get(s, {}).get(key, np.nan) for s in steps] for run in runs.values()], dtype=float)


def cell(values: np.ndarray) -> str:
    """Mean over seeds, with the per-seed values when there are several."""
    mean = f"{np.nanmean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ({' / '.join(f'{v:.2f}' for v in values)})"


def logged_steps(results: dict[str, Runs], key: str) -> list[int]:
    return sorted({s for runs in results.values() for run in runs.values() for s, m in run.items() if key in m})


def load_note(runs_info: dict[str, list[dict]]) -> str:
    loads = [info["load_avg_5min"] for infos in runs_info.values() for info in infos]
    return f"5-minute load average {min(loads):.0f}-{max(loads):.0f} at the end of the runs" if loads else "load not recorded"


def machine_line(runs_info: dict[str, list[dict]]) -> str:
    """The report's first line: this machine, its load while the runs ran, Python; no GPU."""
    import platform

    return (f"Machine: {platform.machine()}, {os.cpu_count()} cores visible, shared with other jobs "
            f"({load_note(runs_info)}), Python {platform.python_version()}; no GPU.")


def wall_times(runs_info: dict[str, list[dict]], configs: list[str]) -> list[str]:
    return [f"{np.mean([i['wall_s'] for i in runs_info[c]]):.0f}" if runs_info[c] else "not recorded" for c in configs]


def plot_curves(results: dict[str, Runs], steps: int, panels: list[tuple[str, str, bool]], title: str,
                path: Path, smooth: int = 5) -> None:
    """One panel per ``(metric key, panel title, per_step)``: validation keys (``per_step``
    False) as points at the logged steps, training keys as a ``smooth``-step moving average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), sharey=True)
    all_steps = list(range(steps + 1))
    for ax, (key, panel_title, per_step) in zip(np.atleast_1d(axes), panels):
        for i, (config, runs) in enumerate(results.items()):
            if per_step:  # moving average of the mean over seeds: one step is only a few dozen episodes
                window = min(smooth, steps)
                values = np.nanmean(series(runs, key, all_steps[1:]), axis=0)
                ax.plot(all_steps[window:], np.convolve(values, np.ones(window) / window, mode="valid"),
                        color=f"C{i}", label=config)
            else:
                values = series(runs, key, all_steps)
                logged = ~np.isnan(values).all(axis=0)
                ax.plot(np.array(all_steps)[logged], np.nanmean(values[:, logged], axis=0), "o-", color=f"C{i}",
                        label=config)
        ax.set(title=panel_title, xlabel="training step", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    np.atleast_1d(axes)[0].set_ylabel("rate")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def publish(doc: Path, heading: str, section: str) -> None:
    """``write_section``, then the section and where it went on stdout."""
    write_section(doc, heading, section)
    print(section)
    print(f"wrote {doc} ({heading!r})")


def write_section(doc: Path, heading: str, section: str) -> None:
    """Replace the section under ``heading`` in ``doc`` (up to the next ``## `` heading), or append it."""
    text = doc.read_text() if doc.exists() else "# Results\n"
    section = section.rstrip("\n") + "\n\n"  # one blank line before the next section
    start = text.find(heading + "\n")  # the whole heading line: one heading may begin another
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    doc.write_text(text)


def mean_and_se(values) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt(n); NaN for fewer than 2) and n over the finite values."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan"), len(v)


def paired_mean_and_se(a, b) -> tuple[float, float, int]:
    """``mean_and_se`` of the per-seed differences ``a - b`` (same index = same seed), over the seeds
    where both are finite."""
    return mean_and_se(np.asarray(a, float) - np.asarray(b, float))


def paired_verdict(a, b, digits: int = 3) -> str:
    """``a - b`` over paired seeds (same index = same seed): mean ± SE of the per-seed differences
    and whether |mean| exceeds two standard errors."""
    mean, se, n = paired_mean_and_se(a, b)
    if n < 2:
        return "n/a"
    verdict = "**exceeds 2 SE**" if abs(mean) > 2 * se else "within 2 SE"
    return f"{mean:+.{digits}f} ± {se:.{digits}f} ({verdict})"
