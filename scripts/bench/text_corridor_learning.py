"""Does the tiny model learn TextCorridor? grpo vs gigpo vs hgpo through verl's real trainer.

Runs ``recipes/text_corridor/run_cpu.sh`` once per (estimator, seed), one at a time, with the same seeds
and budget, then tabulates verl's per-step metrics and plots validation and training success
(``docs/img/text_corridor_learning.png``). A hand-written reading of one run is kept in
``recipes/text_corridor/learning_notes.md`` and only linked. Finished runs are reused; ``--report-only``
runs nothing. Shared machinery: ``learning_runs.py``.

    python -m scripts.bench.text_corridor_learning --steps 30 --seeds 0 1

Docs section (``--write``; printed otherwise): docs/results.md, "## Stepwise advantages: text corridor learning".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from scripts.bench.launch import REPO, Runs
from scripts.bench.learning_runs import (before_after, cell, logged_steps, machine_line, plot_curves, series, step_table,
                                         study_parser, sweep, wall_times)
from scripts.bench.report import publish, table, target

HEADING = "## Stepwise advantages: text corridor learning"
VAL_SUCCESS = "val-aux/verl_ext/text_corridor/success/mean@1"
VAL_RIGHT = "val-aux/verl_ext/text_corridor/right_action_rate/mean@1"
VAL_INVALID = "val-aux/verl_ext/text_corridor/invalid_action_rate/mean@1"
TRAIN_SUCCESS = "critic/score/mean"  # the score is the episode success (verl_ext.rewards.text_env)
SMOOTH = 5  # steps in the moving average of the training success curve


def report(results: dict[str, Runs], steps: int, runs_info: dict[str, list[dict]], plot_path: Path) -> str:
    estimators = list(results)
    seeds = sorted(next(iter(results.values())))
    val_steps = logged_steps(results, VAL_SUCCESS)
    windows = [(lo, min(lo + 9, steps)) for lo in range(1, steps + 1, 10)]
    lines = [
        HEADING, "",
        machine_line(runs_info),
        # the recipe, the env and the budget are the page's own prose, above doc_sections.GENERATED
        f"`python -m scripts.bench.text_corridor_learning --steps {steps} --seeds {' '.join(map(str, seeds))}`.",
        "",
        "**Validation success rate** (64 held-out seeds, one sampled episode each at temperature 1; "
        "mean over seeds, per seed in brackets):", "",
        step_table(results, VAL_SUCCESS, val_steps),
        "", "**Training success rate** (32 episodes per step, averaged over the window):", "",
        table(["steps", *estimators], [
            [f"{lo}-{hi}", *(cell(np.nanmean(series(results[e], TRAIN_SUCCESS, list(range(lo, hi + 1))), axis=1))
                             for e in estimators)] for lo, hi in windows]),
        "", f"**What the policy does** (validation, step 0 -> step {val_steps[-1]}):", "",
        table(["metric", *estimators], [
            *(before_after(results, name, key, val_steps[-1]) for name, key in (
                ("share of R actions", VAL_RIGHT), ("share of invalid answers", VAL_INVALID))),
            ["wall time per run (s)", *wall_times(runs_info, estimators)]]),
    ]
    lines += ["", f"![text corridor learning curves]({os.path.relpath(plot_path, REPO / 'docs')})", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__, REPO / "runs/text_corridor_bench", steps=30, seeds=[0, 1])
    parser.add_argument("--estimators", nargs="+", default=["grpo", "gigpo", "hgpo"])
    parser.set_defaults(attempts=3)
    args = parser.parse_args(argv)
    plot = args.img / "text_corridor_learning.png"
    runs_info: dict[str, list[dict]] = {e: [] for e in args.estimators}
    results: dict[str, Runs] = {e: {} for e in args.estimators}
    for seed, estimator, info, steps in sweep("text_corridor/run_cpu.sh", args.out,
                                              [(e, e, {"ADV": e}) for e in args.estimators], args.seeds,
                                              args.steps, args.attempts, args.report_only):
        runs_info[estimator] += [info] if info else []
        results[estimator][seed] = steps
    plot_curves(results, args.steps, [(VAL_SUCCESS, "validation success (64 episodes)", False),
                                      (TRAIN_SUCCESS, f"training success ({SMOOTH}-step moving average)", True)],
                f"TextCorridor, tiny random Qwen2 on the cpu backend ({len(args.seeds)} seed(s))", plot, SMOOTH)
    publish(target(args), HEADING, report(results, args.steps, runs_info, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
