"""Helpers of the learning studies (study arguments, the reproducing command, per-seed series, step medians); no docs section of its own."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Callable, Iterable
from pathlib import Path

import numpy as np

from scripts.bench.launch import REPO, RunSpec, Runs, launch, load_steps
from scripts.bench.report import RESULTS, script_parser


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
