"""Helpers of the learning studies (study arguments, the reproducing command, per-seed series, plots); no docs section of its own."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Callable, Iterable
from pathlib import Path

import numpy as np

from scripts.bench.launch import REPO, RunSpec, Runs, launch, load_steps
from scripts.bench.report import RESULTS, figure, script_parser, table


def study_parser(module_doc: str, out: Path, steps: int, seeds: list[int],
                 doc: Path = RESULTS) -> argparse.ArgumentParser:
    """The run arguments every study takes: budget (``--steps``), ``--seeds``, where runs go
    (``--out``), where the report goes (``--write``/``--doc``, ``--img``), ``--attempts`` and ``--report-only``.
    A study adds its own options to the parser it gets back."""
    parser = script_parser(module_doc, doc)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--img", type=Path, default=REPO / "docs/img")
    parser.add_argument("--attempts", type=int, default=2, help="tries per run before giving up")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs under --out")
    return parser


RUN_PLACES = ("out", "write", "doc", "img", "attempts", "report_only", "section", "dry_run")  # where runs and reports go, not what ran


def study_command(module: str, parser: argparse.ArgumentParser, args: argparse.Namespace, always: tuple[str, ...]) -> str:
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
    return " ".join([f"python -m scripts.bench.{module}", *(option(a) for a in shown)])


def sweep(script: str, out: Path, arms: list[tuple[str, str, dict[str, str]]], seeds: list[int], steps: int,
          attempts: int, report_only: bool) -> list[tuple[int, str, dict | None, dict[int, dict]]]:
    """``recipes/<script>`` once per (seed, arm ``(label, folder, environment)``), seed-major so that a
    sweep cut short still compares every arm, each in ``out/<folder>-seed<seed>`` with ``SEED`` set;
    finished runs are reused, and with ``report_only`` nothing runs. Per run, in that order: (seed,
    label, its ``run.json`` or None, its metrics ``{step: metrics}``)."""
    places = [(seed, label, out / f"{folder}-seed{seed}", env) for seed in seeds for label, folder, env in arms]
    if not report_only:
        launch([RunSpec(f"{label} seed {seed}", script, place, steps, {**env, "SEED": str(seed)})
                for seed, label, place, env in places], attempts=attempts)
    return [(seed, label, json.loads((place / "run.json").read_text()) if (place / "run.json").exists() else None,
             load_steps(place / "metrics.jsonl")) for seed, label, place, _ in places]


def run_folder(label: str) -> str:
    """An arm's label as its run folder's name (``a, b + c d`` -> ``a-b_c_d``)."""
    return label.replace(", ", "-").replace(" + ", "_").replace(" ", "_")


def after_warmup(runs: Iterable[dict[int, dict]], warmup: int = 1) -> list[dict]:
    """Every logged step after the first ``warmup`` of each run (CUDA graphs, caches, the queue of
    stale batches filling up), pooled over the runs (repeats)."""
    return [m for steps in runs for s, m in sorted(steps.items()) if s > warmup]


def _over_steps(reduce: Callable, steps: list[dict], value: Callable[[dict], float | None] | str) -> float:
    get = (lambda m: m.get(value)) if isinstance(value, str) else value
    values = [v for v in (get(m) for m in steps) if v is not None]
    return reduce(values) if values else float("nan")


def median_of(steps: list[dict], value: Callable[[dict], float | None] | str) -> float:
    """Median of ``value`` (a metric key, or a function of a step's metrics) over the steps where it
    is defined (NaN if none)."""
    return _over_steps(statistics.median, steps, value)


def mean_of(steps: list[dict], value: Callable[[dict], float | None] | str) -> float:
    """Mean, as ``median_of``: a hook that runs on some steps only (extra forwards on the steps whose
    batch spans several weight versions) has a median of 0 but a real cost, which the mean keeps."""
    return _over_steps(statistics.fmean, steps, value)


def timing_phases(runs: Iterable[dict[int, dict]]) -> list[str]:
    """The phases of verl's ``timing_s/*`` that any step of ``runs`` logged, sorted, the total (``step``) last."""
    phases = {k.removeprefix("timing_s/") for steps in runs for m in steps.values() for k in m
              if k.startswith("timing_s/")}
    return sorted(phases, key=lambda phase: (phase == "step", phase))


def median_after_first(steps: dict[int, dict], key: str) -> float:
    """Median of ``key`` over one run's steps after the first (warm-up); NaN if never logged."""
    return median_of(after_warmup([steps]), key)


def series(runs: Runs, key: str, steps: list[int]) -> np.ndarray:
    """Shape (seeds, len(steps)): ``key`` at each step of each seed's run (NaN where not logged)."""
    return np.array([[run.get(s, {}).get(key, np.nan) for s in steps] for run in runs.values()], dtype=float)


def cell(values: np.ndarray) -> str:
    """Mean over seeds, with the per-seed values when there are several."""
    mean = f"{np.nanmean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ({' / '.join(f'{v:.2f}' for v in values)})"


def step_table(results: dict[str, Runs], key: str, steps: list[int]) -> str:
    """``key`` at each of ``steps``, one column per arm (``cell``: mean, per-seed values in brackets)."""
    return table(["step", *results], [[s, *(cell(series(runs, key, [s])[:, 0]) for runs in results.values())]
                                      for s in steps])


def before_after(results: dict[str, Runs], name: str, key: str, last: int) -> list[str]:
    """A table row: ``key`` at step 0 -> at ``last``, mean over seeds, one cell per arm."""
    return [name, *(f"{np.nanmean(series(runs, key, [0])):.2f} -> {np.nanmean(series(runs, key, [last])):.2f}"
                    for runs in results.values())]


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
    all_steps = list(range(steps + 1))
    with figure(path, 1, len(panels), (5.5 * len(panels), 4), 110, title, sharey=True) as axes:
        for ax, (key, panel_title, per_step) in zip(axes[0], panels):
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
        axes[0][0].set_ylabel("rate")
