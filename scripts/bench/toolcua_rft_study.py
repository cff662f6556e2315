"""Does the RFT stage of ToolCUA's pipeline (warm-up SFT + single-turn RL on critical switching
steps) move the GUI-vs-tool decision of the tiny cpu model? The RFT stage alone, arms
paired by seed (one SFT run per seed shared by every arm; one warm-up shared by the two RL arms):

- ``warm-up + choice``: ``RFT_WARMUP_STEPS`` steps of SFT on both options of each training decision
  (no preference), then single-turn RL with ``R = choice_weight * R_choice + R_fmt + R_path``: the
  way the reply takes is read from the function it names, parseable or not
  (``verl_ext.rewards.decision_reward``);
- ``warm-up + format-gated``: the same warm-up checkpoint, RL with ``choice_weight`` 0 (``R = R_fmt +
  R_path``: a reply whose call does not parse scores 0 whatever it chose);
- ``choice, no warm-up`` (``--arms`` lists it): RL with the choice term straight from SFT.

Each run is ``recipes/toolcua_sft_rl/run_cpu.sh`` with ``SKIP_RL=1`` (verl's ``main_ppo``, GRPO, the
``decision_turn`` loop). Two measurements on held-out decisions (task instances disjoint from
training): verl's greedy validation before the RL half (step 0) and after its last step
(``val-aux/verl_ext/text_hybrid_decisions/*``; T = the reply names an app tool, parseable or not),
and ``decision_probe.py``: the probability the model gives to opening its reply with an app tool's
name against ``computer_use``'s (``tool_share``), exact, for the SFT model, the warm-up model and each
arm's RL model.

    python scripts/bench/toolcua_rft_study.py --seeds 0 1 2                 # runs, then writes docs/results.md
    python scripts/bench/toolcua_rft_study.py --seeds 0 1 2 --report-only   # report the runs under --out
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from learning_runs import (REPO, Runs, load_steps, machine_line, paired_mean_and_se, series, publish, study_command,
                           study_parser)
from text_hybrid_study import fmt, goal_gap, ratio

HEADING = "## ToolCUA pipeline: the RFT stage alone (critical switching steps)"
SCRIPT = REPO / "recipes/toolcua_sft_rl/run_cpu.sh"
RFT_VAL = "val-aux/verl_ext/text_hybrid_decisions/{}/mean@1"
CHOICE, GATED, NO_WARMUP = "warm-up + choice", "warm-up + format-gated", "choice, no warm-up"
ARMS = {CHOICE: "warm_choice", GATED: "warm_gated", NO_WARMUP: "choice2"}  # arm -> run folder under OUT/seed<s>/
GREEDY = {  # name -> column title
    "T_tools_shorter": "T where tools shorter",
    "T_gui_shorter": "T where GUI shorter",
    "shorter_named": "shorter way named",
    "format_ok": "one parseable call",
}
PROBE = {  # decision_probe summary key -> column title
    "tool_share_tool_shorter": "tool share where tools shorter",
    "tool_share_gui_shorter": "tool share where GUI shorter",
    "separation": "separation (difference)",
    "p_tool_tool_shorter": "P(tool name) where tools shorter",
    "p_gui_gui_shorter": "P(computer_use) where GUI shorter",
}


def greedy(runs: Runs, step: int) -> dict[str, np.ndarray]:
    """Greedy held-out decision rates at ``step``, shape (seeds,)."""
    get = {k: series(runs, RFT_VAL.format(k), [step])[:, 0] for k in (
        "named_tool_tool_shorter", "named_tool_gui_shorter", "better_tool", "better_gui", "choice", "format_ok")}
    return {"T_tools_shorter": ratio(get["named_tool_tool_shorter"], get["better_tool"]),
            "T_gui_shorter": ratio(get["named_tool_gui_shorter"], get["better_gui"]),
            "shorter_named": get["choice"], "format_ok": get["format_ok"]}


def paired_cell(a: np.ndarray, b: np.ndarray) -> str:
    """Mean ± SE of the per-seed differences ``a - b``, and whether it exceeds 2 SE."""
    mean, se, n = paired_mean_and_se(a, b)
    if n == 0:
        return "n/a"
    if n < 2:
        return f"{mean:+.2f} (1 seed)"
    return f"{mean:+.2f} ± {se:.2f}" + (" (> 2 SE)" if abs(mean) > 2 * se else "")


def probe_values(probes: dict[str, dict[int, dict]], seeds: list[int]) -> dict[str, dict[str, np.ndarray]]:
    """Per probed model and key, shape (len(seeds),) (NaN where a seed has no probe)."""
    out = {}
    for model, by_seed in probes.items():
        if not by_seed:
            continue
        rows = [by_seed.get(s) for s in seeds]
        values = {k: np.array([r[k] if r else np.nan for r in rows], float) for k in PROBE if k != "separation"}
        values["separation"] = values["tool_share_tool_shorter"] - values["tool_share_gui_shorter"]
        out[model] = values
    return out


def report(results: dict[str, Runs], probes: dict[str, dict[int, dict]], args, command: str,
           runs_info: list[dict]) -> str:
    walls = [info["wall_s"] for info in runs_info]
    lines = [
        args.section, "",
        f"{machine_line({'all': [i for i in runs_info if 'load_avg_5min' in i]})} `{command}` (one core per "
        f"run: `taskset -c K`, `OMP_NUM_THREADS=1`). Per seed one SFT run (`recipes/toolcua_sft_rl/run_cpu.sh`, "
        f"{args.sft_steps} steps, the recipe's defaults), then the RFT stage alone (`SKIP_SFT=1 SKIP_RL=1`): "
        f"warm-up SFT of {args.warmup_steps} steps of {args.warmup_batch} rows (lr {args.warmup_lr}"
        + (f", loss weight {args.warmup_decision_weight} at the choice tokens" if args.warmup_decision_weight != "1" else "")
        + ") on "
        + ("both options" if args.warmup_targets == "both" else "the shorter way's call only (`RFT_WARMUP_TARGETS=shorter`)")
        + f" of the {args.rows} training decisions, then {args.rft_steps} GRPO steps of {args.rft_batch} training decisions x {args.rft_n} "
        f"samples, lr {args.rft_lr}, choice weight {args.choice_weight} (`{CHOICE}`)"
        + (f", the RL half's {args.rows} training decisions half GUI-shorter and half tools-shorter (`RFT_BALANCE=1`; the "
           "warm-up and held-out rows keep the tasks' own mix)" if args.balance else "")
        + (f" or 0 (`{GATED}`, from the same warm-up checkpoint, so its step 0 is `{CHOICE}`'s)" if GATED in args.arms else "")
        + f". Held-out: {args.val_rows} decisions of task instances disjoint from training "
        f"(templates {args.templates}). Observations "
        + ("end with the task's items still to do (`SHOW_TODO=1`, in the SFT demonstrations, the warm-up and the "
           "decision rows alike)" if args.show_todo else "as the env renders them by default (`SHOW_TODO=0`)")
        + ". Seeds: "
        + "; ".join(f"{arm}: {', '.join(map(str, sorted(runs))) or 'none'}" for arm, runs in results.items())
        + ". " + (f"Wall time per RFT stage {np.mean(walls):.0f} s on average ({len(walls)} runs)." if walls else
                  "Wall times not recorded."),
        "",
        "**Greedy replies** (verl's validation; T = the reply names an app tool, parseable or not; mean ± SE "
        "over seeds):", "",
        "| arm | step | " + " | ".join(GREEDY.values()) + " | goal |",
        "|---" * (len(GREEDY) + 3) + "|",
    ]
    values = {}
    for arm, runs in results.items():
        if not runs:
            continue
        before, after = greedy(runs, 0), greedy(runs, args.rft_steps)
        values[arm] = (before, after)
        for step, rates in ((0, before), (args.rft_steps, after)):
            label = "0 (before RL)" if step == 0 else str(step)
            gap = goal_gap(rates["T_tools_shorter"], rates["T_gui_shorter"])
            lines.append(f"| {arm} | {label} | " + " | ".join(fmt(rates[m]) for m in GREEDY) + f" | {gap} |")
    lines += ["", "| paired difference | " + " | ".join(GREEDY.values()) + " |", "|---" * (len(GREEDY) + 1) + "|"]
    for arm, (before, after) in values.items():
        lines.append(f"| {arm}: after - before | " + " | ".join(paired_cell(after[m], before[m]) for m in GREEDY) + " |")
    if CHOICE in values and GATED in values:
        lines.append(f"| after: {CHOICE} - {GATED} | " + " | ".join(
            paired_cell(values[CHOICE][1][m], values[GATED][1][m]) for m in GREEDY) + " |")
    pv = probe_values(probes, args.seeds)
    if pv:
        lines += ["", "**Decision probability** (`scripts/bench/decision_probe.py`: the probability of opening the "
                  "reply with an app tool's name vs `computer_use`'s; tool share = P(tool) / (P(tool) + "
                  "P(computer_use)), averaged over the held-out decisions where tools / the GUI are shorter; "
                  "separation = the first minus the second):", "",
                  "| model | " + " | ".join(PROBE.values()) + " |", "|---" * (len(PROBE) + 1) + "|"]
        for model, vals in pv.items():
            lines.append(f"| {model} | " + " | ".join(fmt(vals[k], 3) for k in PROBE) + " |")
        lines += ["", "| paired difference | " + " | ".join(PROBE.values()) + " |", "|---" * (len(PROBE) + 1) + "|"]
        for a, b in ((CHOICE, "after warm-up"), (GATED, "after warm-up"), (CHOICE, GATED), ("after warm-up", "SFT model"),
                     (NO_WARMUP, "SFT model")):
            if a in pv and b in pv:
                lines.append(f"| {a} - {b} | " + " | ".join(paired_cell(pv[a][k], pv[b][k]) for k in PROBE) + " |")
        lines += ["", "| separation by seed | " + " | ".join(f"seed {seed}" for seed in args.seeds) + " |",
                  "|---" * (len(args.seeds) + 1) + "|"]
        lines += [f"| {model} | " + " | ".join("n/a" if np.isnan(v) else f"{v:+.3f}" for v in vals["separation"]) + " |"
                  for model, vals in pv.items()]
    return "\n".join(lines + [""])


def run_stage(env_vars: dict[str, str], out: Path, done: Path, label: str) -> float | None:
    """``run_cpu.sh`` with ``env_vars`` and ``OUT``; None when ``done`` exists (reused)."""
    if done.exists():
        return None
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **env_vars, "OUT": str(out), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    start = time.perf_counter()
    with open(out / f"{label}.log", "w") as log:
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not done.exists():
        raise RuntimeError(f"{label} failed (exit {proc.returncode}); log {out / f'{label}.log'}")
    wall = time.perf_counter() - start
    (out / "run.json").write_text(json.dumps({"load_avg_5min": os.getloadavg()[1]}))
    return wall


def stage_time(out: Path) -> dict | None:
    """``{"wall_s"}`` of the run's RFT stage (the recipe's ``stage_times.txt``) and the load average
    recorded when it ended (``run.json``, where this script ran it)."""
    times = out / "stage_times.txt"
    walls = [int(m.group(1)) for m in re.finditer(r"rft took (\d+) s", times.read_text())] if times.exists() else []
    if not walls:
        return None
    info = {"wall_s": walls[-1]}
    if (out / "run.json").exists():
        info.update(json.loads((out / "run.json").read_text()))
    return info


def probed(model: Path, rows: Path, cache: Path) -> dict | None:
    """``decision_probe.py``'s summary for ``model`` on ``rows`` (cached in ``cache``); None if missing."""
    if cache.exists():
        return json.loads(cache.read_text())["summary"]
    if not (model / "config.json").exists() or not rows.exists():
        return None
    from decision_probe import probe

    result = probe(str(model), str(rows))
    cache.write_text(json.dumps(result))
    return result["summary"]


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__.split("\n\n")[0], REPO / "runs/toolcua_rft_study", steps=6, seeds=[0, 1, 2],
                          doc=REPO / "docs/experiments/toolcua_decision_studies.md")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--warmup-steps", type=int, default=64)
    parser.add_argument("--warmup-lr", default="3e-3")
    parser.add_argument("--rft-batch", type=int, default=4)
    parser.add_argument("--rft-n", type=int, default=4)
    parser.add_argument("--rft-lr", default="3e-4")
    parser.add_argument("--choice-weight", default="2")
    parser.add_argument("--val-rows", type=int, default=32)
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=[CHOICE, GATED],
                        help="arms to run (the others are only reported where their runs exist under --out)")
    parser.add_argument("--show-todo", action="store_true",
                        help="SHOW_TODO=1 in every stage: observations end with the task's items still to do")
    parser.add_argument("--balance", action="store_true",
                        help="RFT_BALANCE=1: the RL half's training decisions half GUI-shorter, half tools-shorter")
    parser.add_argument("--warmup-targets", choices=("both", "shorter"), default="both",
                        help="RFT_WARMUP_TARGETS: the warm-up's targets, both options of each decision or the shorter way's")
    parser.add_argument("--rows", type=int, default=128, help="RFT_ROWS: training decisions (warm-up and RL half)")
    parser.add_argument("--warmup-batch", type=int, default=1, help="SFT_BATCH of the warm-up (rows a step)")
    parser.add_argument("--warmup-decision-weight", default="1",
                        help="RFT_WARMUP_DECISION_WEIGHT: the warm-up's loss weight at the choice tokens")
    parser.add_argument("--section", default=HEADING, help="docs heading the report replaces (a new one is appended)")
    args = parser.parse_args(argv)
    args.rft_steps = args.steps
    command = study_command("toolcua_rft_study.py", parser, args,
                            always=("seeds", "steps", "warmup_steps", "rft_lr", "choice_weight", "arms"))
    results: dict[str, Runs] = {arm: {} for arm in ARMS}
    probes: dict[str, dict[int, dict]] = {"SFT model": {}, NO_WARMUP: {}, "after warm-up": {}, CHOICE: {}, GATED: {}}
    runs_info: list[dict] = []
    for seed in args.seeds:
        base = args.out / f"seed{seed}"
        sft_model = base / "sft" / f"global_step_{args.sft_steps}" / "huggingface"
        warm_model = base / ARMS[CHOICE] / "rft_warmup" / f"global_step_{args.warmup_steps}" / "huggingface"
        todo = {"SHOW_TODO": "1" if args.show_todo else "0"}
        common = {**todo, "SEED": str(seed), "TEMPLATES": args.templates, "SKIP_SFT": "1", "SKIP_RL": "1",
                  "RFT_STEPS": str(args.rft_steps), "RFT_BATCH": str(args.rft_batch), "RFT_N": str(args.rft_n),
                  "RFT_LR": args.rft_lr, "RFT_VAL_ROWS": str(args.val_rows), "RFT_WARMUP_LR": args.warmup_lr,
                  "RFT_BALANCE": "1" if args.balance else "0", "RFT_WARMUP_TARGETS": args.warmup_targets,
                  "RFT_ROWS": str(args.rows), "SFT_BATCH": str(args.warmup_batch),
                  "RFT_WARMUP_DECISION_WEIGHT": args.warmup_decision_weight}
        envs = {CHOICE: {**common, "INIT_MODEL": str(sft_model), "RFT_WARMUP_STEPS": str(args.warmup_steps),
                         "RFT_CHOICE_WEIGHT": args.choice_weight},
                # its step 0 is the choice arm's (same warm-up checkpoint, same held-out rows, greedy): not rerun
                GATED: {**common, "INIT_MODEL": str(warm_model), "RFT_WARMUP_STEPS": "0", "RFT_CHOICE_WEIGHT": "0",
                        "RFT_ARGS": "trainer.val_before_train=false"},
                NO_WARMUP: {**common, "INIT_MODEL": str(sft_model), "RFT_WARMUP_STEPS": "0",
                            "RFT_CHOICE_WEIGHT": args.choice_weight}}
        if not args.report_only:
            run_stage({**todo, "SEED": str(seed), "TEMPLATES": args.templates, "SFT_STEPS": str(args.sft_steps),
                       "SKIP_RFT": "1", "SKIP_RL": "1", "SFT_EVAL_ROWS": "0"}, base, sft_model / "config.json", "sft")
        finals = {}
        for arm, folder in ARMS.items():
            out = base / folder
            finals[arm] = out / "rft" / f"global_step_{args.rft_steps}" / "actor" / "huggingface"
            if not args.report_only and arm in args.arms:
                wall = run_stage(envs[arm], out, finals[arm] / "config.json", "rft")
                print(f"{arm} seed {seed}: " + ("reused" if wall is None else f"{wall:.0f} s"), flush=True)
            info = stage_time(out)
            if info:
                runs_info.append(info)
            steps = load_steps(out / "rft_metrics.jsonl")
            if arm == GATED and 0 not in steps and seed in results[CHOICE]:
                steps[0] = results[CHOICE][seed][0]
            if 0 in steps and args.rft_steps in steps and RFT_VAL.format("choice") in steps[args.rft_steps]:
                results[arm][seed] = steps
        rows = base / ARMS[CHOICE] / "rft_data" / "val.parquet"
        for name, model in (("SFT model", sft_model), (NO_WARMUP, finals[NO_WARMUP]), ("after warm-up", warm_model),
                            (CHOICE, finals[CHOICE]), (GATED, finals[GATED])):
            summary = probed(model, rows, base / f"probe_{ARMS.get(name, name.replace(' ', '_'))}.json")
            if summary:
                probes[name][seed] = summary
    text = report(results, probes, args, command, runs_info)
    publish(args.doc, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
