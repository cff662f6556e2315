"""Does the tiny model learn when to use tools? The flagship cpu recipe through verl's trainer, per estimator and loss.

Runs ``recipes/toolcua_hybrid/run_cpu.sh`` once per (config, seed), one at a time: grpo vs gigpo vs hgpo
(all with PPO-EWMA), and hgpo with verl's vanilla PPO loss vs PPO-EWMA, same seeds and budget; plots
``docs/img/toolcua_hybrid_learning.png``. Each run's initial model and final checkpoint are played with
``verl-ext eval``'s engine on unseen task instances (``--eval-seeds``), split by whether tools help. A
hand-written reading of one run is kept in ``recipes/toolcua_hybrid/learning_notes.md`` and only linked.
Finished runs are reused; ``--report-only`` runs nothing. Shared machinery: ``learning_runs.py``.

    python -m scripts.bench.toolcua_hybrid_learning --steps 30 --seeds 0 1

Docs section (``--write``; printed otherwise): docs/results.md, "## Hybrid GUI + tool agent: toolcua_hybrid learning".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from scripts.bench.launch import REPO, Runs
from scripts.bench.learning_runs import (before_after, cell, logged_steps, machine_line, plot_curves, series, step_table,
                                         study_parser, sweep, wall_times)
from scripts.bench.report import publish, table, target

HEADING = "## Hybrid GUI + tool agent: toolcua_hybrid learning"
VAL = "val-aux/verl_ext/minidesk/{}/mean@1"
VAL_SUCCESS, VAL_TIR, VAL_FORMAT = VAL.format("success"), VAL.format("tool_ok"), VAL.format("format_ok")
VAL_STEPS, VAL_TOOL = VAL.format("num_steps"), VAL.format("used_tool")
TRAIN_SUCCESS, TRAIN_TIR = "verl_ext/episode/accuracy", "verl_ext/episode/tir"
SMOOTH = 5
TEMPLATES = {  # template -> tool_beneficial (the run script's default TEMPLATES)
    "mail_send": True, "files_rename": True, "calendar_add": True, "sheet_sort": True,
    "settings_theme": False, "settings_toggle": False, "sheet_set_cell": False, "calendar_delete_title": False,
}
EVAL_SEED0 = 2_000_000  # above the training (< 1e6) and validation (1e6-2e6) task seeds
# name -> the recipe script's environment: estimator and loss
CONFIGS = {
    "grpo + ppo_ewma": {"ADV": "grpo", "LOSS": "ppo_ewma"},
    "gigpo + ppo_ewma": {"ADV": "gigpo", "LOSS": "ppo_ewma"},
    "hgpo + ppo_ewma": {"ADV": "hgpo", "LOSS": "ppo_ewma"},
    "hgpo + vanilla": {"ADV": "hgpo", "LOSS": "vanilla"},
}


def evaluate_policy(model: Path, cache: Path, eval_seeds: int) -> dict[str, float]:
    """Success and tool use of a model (initial folder or verl checkpoint) on unseen instances of
    the recipe's templates, split by ``tool_beneficial``; cached in ``cache`` (JSON)."""
    if cache.exists():
        return json.loads(cache.read_text())
    from verl_ext.envs.eval_cli import evaluate

    records, _ = evaluate("minidesk", f"checkpoint:{model}", list(TEMPLATES), list(range(EVAL_SEED0, EVAL_SEED0 + eval_seeds)),
                          parallel=2, max_steps=8, progress=False, action_format="menu")
    summary = {}
    for label, helps in (("tools_help", True), ("tools_do_not_help", False)):
        rows = [r for r in records if TEMPLATES[r["task"]] == helps and r["valid"] > 0]
        summary[f"{label}/success"] = float(np.mean([r["success"] for r in rows]))
        summary[f"{label}/used_tool"] = float(np.mean([r["used_tool"] for r in rows]))
        summary[f"{label}/tool_ok"] = float(np.mean([r["tool_ok"] for r in rows]))
    summary["episodes"] = float(len(records))
    cache.write_text(json.dumps(summary))
    return summary


def _eval_table(evals: dict[str, list[dict[str, float]]], eval_seeds: int) -> list[str]:
    lines = [f"**Per task type** (`verl-ext eval` engine, {eval_seeds} unseen instances of each of the 8 templates "
             "per run, temperature 1; mean over seeds, per seed in brackets):", "",
             table(["policy", "success, tools help", "used a tool, tools help", "success, tools do not help",
                    "used a tool, tools do not help"],
                   [[name, *(cell(np.array([s[key] for s in summaries])) for key in (
                       "tools_help/success", "tools_help/used_tool", "tools_do_not_help/success",
                       "tools_do_not_help/used_tool"))] for name, summaries in evals.items()])]
    return lines


def report(results: dict[str, Runs], steps: int, runs_info: dict[str, list[dict]], plot_path: Path,
           evals: dict[str, list[dict[str, float]]], eval_seeds: int) -> str:
    configs = list(results)
    seeds = sorted(next(iter(results.values())))
    val_steps = logged_steps(results, VAL_SUCCESS)
    lines = [
        HEADING, "",
        machine_line(runs_info),
        # the recipe, the env and the budget are the page's own prose, above doc_sections.GENERATED
        f"`python -m scripts.bench.toolcua_hybrid_learning --steps {steps} --seeds {' '.join(map(str, seeds))}`.",
        "",
        "**Validation success rate** (64 held-out task instances, one sampled episode each at temperature 1; "
        "mean over seeds, per seed in brackets):", "",
        step_table(results, VAL_SUCCESS, val_steps),
        "",
        "**Validation tool-invocation rate** (TIR, ToolCUA's definition: success with a tool where tools help, "
        "success without tools where they do not):", "",
        step_table(results, VAL_TIR, val_steps),
        "",
        "**Training** (32 episodes per step, averaged over the window; success / TIR):", "",
        table(["steps", *configs], [
            [f"{w[0]}-{w[-1]}", *(f"{cell(np.nanmean(series(results[c], TRAIN_SUCCESS, w), axis=1))} / "
                                  f"{np.nanmean(series(results[c], TRAIN_TIR, w)):.2f}" for c in configs)]
            for w in (list(range(lo, min(lo + 9, steps) + 1)) for lo in range(1, steps + 1, 10))]),
        "", f"**What the policy does** (validation, step 0 -> step {val_steps[-1]}, mean over seeds):", "",
        table(["metric", *configs], [
            *(before_after(results, name, key, val_steps[-1]) for name, key in (
                ("well-formed answers (all turns)", VAL_FORMAT), ("episodes that used a tool", VAL_TOOL),
                ("env steps per episode", VAL_STEPS))),
            ["wall time per run (s)", *wall_times(runs_info, configs)]]),
    ]
    if evals:
        lines += ["", *_eval_table(evals, eval_seeds)]
    lines += ["", f"![toolcua_hybrid learning curves]({os.path.relpath(plot_path, REPO / 'docs')})", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__, REPO / "runs/toolcua_hybrid_bench", steps=30, seeds=[0, 1])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--eval-seeds", type=int, default=8, help="unseen instances per template in the final eval; 0: skip")
    args = parser.parse_args(argv)
    plot = args.img / "toolcua_hybrid_learning.png"
    runs_info: dict[str, list[dict]] = {c: [] for c in args.configs}
    results: dict[str, Runs] = {c: {} for c in args.configs}
    evals: dict[str, list[dict[str, float]]] = {"initial model (step 0)": []} if args.eval_seeds else {}
    folder = {c: f"{CONFIGS[c]['ADV']}-{CONFIGS[c]['LOSS']}" for c in args.configs}
    for seed, config, info, steps in sweep("toolcua_hybrid/run_cpu.sh", args.out,
                                           [(c, folder[c], CONFIGS[c]) for c in args.configs], args.seeds,
                                           args.steps, args.attempts, args.report_only):
        runs_info[config] += [info] if info else []
        results[config][seed] = steps
        out = args.out / f"{folder[config]}-seed{seed}"
        if args.eval_seeds:
            if config == args.configs[0]:  # same seed, same initial model in every config
                evals["initial model (step 0)"].append(
                    evaluate_policy(out / "model", out / "eval_initial.json", args.eval_seeds))
            final = out / "checkpoints" / f"global_step_{args.steps}"
            evals.setdefault(f"{config}, step {args.steps}", []).append(
                evaluate_policy(final, out / "eval_final.json", args.eval_seeds))
    plot_curves(results, args.steps, [(VAL_SUCCESS, "validation success (64 episodes)", False),
                                      (VAL_TIR, "validation TIR (64 episodes)", False),
                                      (TRAIN_TIR, f"training TIR ({SMOOTH}-step moving average)", True)],
                f"toolcua_hybrid: MiniDesk, tiny random Qwen2 on the cpu backend ({len(args.seeds)} seed(s))",
                plot, SMOOTH)
    publish(target(args), HEADING, report(results, args.steps, runs_info, plot, evals, args.eval_seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
