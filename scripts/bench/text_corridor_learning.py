"""Does the tiny model learn TextCorridor? grpo vs gigpo vs hgpo through verl's real trainer.

Runs ``recipes/text_corridor/run_cpu.sh`` once per (estimator, seed), sequentially (one trainer
at a time on a 2-core machine), with the same seeds and the same budget, then reads verl's per-step
metrics from each run's JSONL file logger and writes:

- the section ``## Stepwise advantages: text corridor learning`` of ``docs/benchmarks.md``
  (replaced in place; the rest of the file is left alone);
- ``docs/img/text_corridor_learning.png``: validation and training success over steps.

The tables are generated; the reading of them is kept in ``recipes/text_corridor/learning_notes.md``
(``--notes``) and appended to the section, so a re-run does not drop it.

A run whose ``metrics.jsonl`` already reaches the last step is reused, so the script can be
re-run to add seeds or to redraw the table (``--report-only`` runs nothing).

    python scripts/bench/text_corridor_learning.py --steps 30 --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
HEADING = "## Stepwise advantages: text corridor learning"
VAL_SUCCESS = "val-aux/verl_ext/text_corridor/success/mean@1"
VAL_RIGHT = "val-aux/verl_ext/text_corridor/right_action_rate/mean@1"
VAL_INVALID = "val-aux/verl_ext/text_corridor/invalid_action_rate/mean@1"
TRAIN_SUCCESS = "critic/score/mean"  # the score is the episode success (verl_ext.rewards.text_env)
SMOOTH = 5  # steps in the moving average of the training success curve


def load_steps(path: Path) -> dict[int, dict[str, float]]:
    """verl's ``file`` logger (one ``{"step", "data"}`` JSON object per line) -> {step: metrics}."""
    steps: dict[int, dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def run_once(estimator: str, seed: int, steps: int, out: Path, attempts: int) -> float | None:
    """Train one (estimator, seed); returns the wall time of the run that finished, or None if a
    finished run was reused. A crashed run is started again from scratch, up to ``attempts`` times:
    on a shared machine another job's ``ray stop`` or a stalled heartbeat can kill Ray under us."""
    if steps in load_steps(out / "metrics.jsonl"):
        return None
    env = {**os.environ, "ADV": estimator, "SEED": str(seed), "OUT": str(out), "STEPS": str(steps),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, attempts + 1):
        start = time.perf_counter()
        with open(out / f"run{attempt}.log", "w") as log:
            proc = subprocess.run(["bash", str(REPO / "recipes/text_corridor/run_cpu.sh")], cwd=REPO, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        if proc.returncode == 0 and steps in load_steps(out / "metrics.jsonl"):
            # the machine is shared: keep the load next to the time so the numbers can be read fairly
            (out / "run.json").write_text(json.dumps({"wall_s": wall, "load_avg_5min": os.getloadavg()[1],
                                                      "attempt": attempt}))
            return wall
        print(f"{estimator} seed {seed}: attempt {attempt} failed (exit {proc.returncode}), "
              f"see {out / f'run{attempt}.log'}", flush=True)
    raise RuntimeError(f"{estimator} seed {seed} failed {attempts} times; logs in {out}")


def series(runs: dict[int, dict[int, dict[str, float]]], key: str, steps: list[int]) -> np.ndarray:
    """Shape (seeds, len(steps)): ``key`` at each step of each seed's run (NaN where not logged)."""
    return np.array([[run.get(s, {}).get(key, np.nan) for s in steps] for run in runs.values()], dtype=float)


def _cell(values: np.ndarray) -> str:
    """Mean over seeds, with the per-seed values when there are several."""
    mean = f"{np.nanmean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ({' / '.join(f'{v:.2f}' for v in values)})"


def report(results: dict[str, dict[int, dict[int, dict[str, float]]]], steps: int, runs_info: dict[str, list[dict]],
           plot_path: Path, notes: str) -> str:
    estimators = list(results)
    seeds = sorted(next(iter(results.values())))
    val_steps = sorted({s for runs in results.values() for run in runs.values() for s, m in run.items()
                        if VAL_SUCCESS in m})
    windows = [(lo, min(lo + 9, steps)) for lo in range(1, steps + 1, 10)]
    header = "| " + " | ".join(estimators) + " |"
    rule = "|---" * (len(estimators) + 1) + "|"
    loads = [info["load_avg_5min"] for infos in runs_info.values() for info in infos]
    load = f"5-minute load average {min(loads):.0f}-{max(loads):.0f} at the end of the runs" if loads else "load not recorded"
    lines = [
        HEADING, "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores visible, shared with other engineers' jobs "
        f"({load}), Python {platform.python_version()}; no GPU.",
        f"`python scripts/bench/text_corridor_learning.py --steps {steps} --seeds {' '.join(map(str, seeds))}`: "
        "`recipes/text_corridor/run_cpu.sh` (verl's `main_ppo`, v1 `verl_ext_sync` trainer, cpu backend) "
        "with the 107k-parameter random tiny Qwen2, for each estimator with the same seeds (model init, data, "
        f"dataloader) and the same budget: {steps} steps x 8 prompts x 4 rollouts, lr 3e-3, two optimizer steps "
        "per training step. Env: `TextCorridor` (cells 0-4, exit 4, start 1-3 from the row's seed, 6 turns, "
        "action = first L/R letter in up to 6 generated tokens, invalid text = no move). gigpo and hgpo use "
        "gamma 0.95 and the reference defaults otherwise (gigpo `mean_norm`, hgpo `mean_std_norm`, "
        "history 2); grpo is verl's own.",
        "",
        "**Validation success rate** (64 held-out seeds, one sampled episode each at temperature 1; "
        "mean over seeds, per seed in brackets):", "",
        "| step " + header, rule,
    ]
    for s in val_steps:
        cells = [_cell(series(results[e], VAL_SUCCESS, [s])[:, 0]) for e in estimators]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines += ["", "**Training success rate** (32 episodes per step, averaged over the window):", "",
              "| steps " + header, rule]
    for lo, hi in windows:
        cells = [_cell(np.nanmean(series(results[e], TRAIN_SUCCESS, list(range(lo, hi + 1))), axis=1))
                 for e in estimators]
        lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    last = val_steps[-1]
    lines += ["", f"**What the policy does** (validation, step 0 -> step {last}):", "",
              "| metric " + header, rule]
    for name, key in (("share of R actions", VAL_RIGHT), ("share of invalid answers", VAL_INVALID)):
        cells = [f"{np.nanmean(series(results[e], key, [0])):.2f} -> "
                 f"{np.nanmean(series(results[e], key, [last])):.2f}" for e in estimators]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if loads:
        cells = [f"{np.mean([i['wall_s'] for i in runs_info[e]]):.0f}" if runs_info[e] else "not recorded"
                 for e in estimators]
        lines.append("| wall time per run (s) | " + " | ".join(cells) + " |")
    lines += ["", f"![text corridor learning curves]({os.path.relpath(plot_path, REPO / 'docs')})", ""]
    return "\n".join(lines) + (f"\n{notes.strip()}\n" if notes.strip() else "")


def plot(results: dict[str, dict[int, dict[int, dict[str, float]]]], steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (val_ax, train_ax) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    all_steps = list(range(steps + 1))
    for i, (estimator, runs) in enumerate(results.items()):
        color = f"C{i}"
        val = series(runs, VAL_SUCCESS, all_steps)
        logged = ~np.isnan(val).all(axis=0)
        val_ax.plot(np.array(all_steps)[logged], np.nanmean(val[:, logged], axis=0), "o-", color=color, label=estimator)
        train = series(runs, TRAIN_SUCCESS, all_steps[1:])
        # moving average of the mean over seeds: one step is only 32 episodes
        window = min(SMOOTH, steps)
        smooth = np.convolve(np.nanmean(train, axis=0), np.ones(window) / window, mode="valid")
        train_ax.plot(all_steps[window:], smooth, color=color, label=estimator)
    val_ax.set(title="validation success (64 episodes)", xlabel="training step", ylabel="success rate", ylim=(0, 1))
    train_ax.set(title=f"training success ({SMOOTH}-step moving average)", xlabel="training step")
    for ax in (val_ax, train_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"TextCorridor, tiny random Qwen2 on the cpu backend ({len(next(iter(results.values())))} seed(s))")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def write_section(doc: Path, section: str) -> None:
    """Replace this benchmark's section of ``doc`` (up to the next ``## `` heading), or append it."""
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    doc.write_text(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--estimators", nargs="+", default=["grpo", "gigpo", "hgpo"])
    parser.add_argument("--out", type=Path, default=REPO / "runs/text_corridor_bench")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/benchmarks.md")
    parser.add_argument("--plot", type=Path, default=REPO / "docs/img/text_corridor_learning.png")
    parser.add_argument("--attempts", type=int, default=3, help="tries per run before giving up")
    parser.add_argument("--notes", type=Path, default=REPO / "recipes/text_corridor/learning_notes.md")
    parser.add_argument("--report-only", action="store_true", help="run nothing; report the runs under --out")
    args = parser.parse_args(argv)
    runs_info: dict[str, list[dict]] = {e: [] for e in args.estimators}
    results: dict[str, dict[int, dict[int, dict[str, float]]]] = {e: {} for e in args.estimators}
    for seed in args.seeds:  # seed-major: a partial sweep still compares every estimator
        for estimator in args.estimators:
            out = args.out / f"{estimator}-seed{seed}"
            if not args.report_only:
                wall = run_once(estimator, seed, args.steps, out, args.attempts)
                print(f"{estimator} seed {seed}: " + ("reused" if wall is None else f"{wall:.0f} s"), flush=True)
            if (out / "run.json").exists():
                runs_info[estimator].append(json.loads((out / "run.json").read_text()))
            results[estimator][seed] = load_steps(out / "metrics.jsonl")
    plot(results, args.steps, args.plot)
    write_section(args.doc, report(results, args.steps, runs_info, args.plot,
                                       args.notes.read_text() if args.notes.exists() else ""))
    print(f"wrote {args.doc} ({HEADING!r}) and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
