"""What each stage of ToolCUA's pipeline (SFT -> RFT -> online RL) earns in when the tiny model switches between GUI and tools.

Arms of ``recipes/toolcua_sft_rl/run_cpu.sh`` (function calls on TextHybrid), paired by seed (one SFT per
seed, shared by every arm of that seed):

- ``full pipeline``: SFT -> RFT -> online RL, path reward with ToolCUA's per-task tool term;
- ``no RFT``: online RL from the SFT checkpoint;
- ``no online RL``: the RFT checkpoint itself (the full pipeline's validation before its online stage);
- ``per-decision tool term``: online RL from the same RFT checkpoint with ``TOOL_TERM=decision``.

Metrics on held-out task instances (greedy validation, ``val-aux/verl_ext/text_hybrid/*``): the tool rate
per decision where tools / the GUI are strictly shorter, per-task tool use, success, env steps per success,
and the RFT stage's own held-out decisions. Each ablation is compared with the full pipeline seed by seed
(mean paired difference against two standard errors). Goal: T >= 0.8 where tools are shorter, <= 0.2 where
the GUI is; the table says by how much it is missed.

``--set KEY=VALUE`` sets a recipe knob of every run, ``--override`` adds a ``main_ppo`` override of stages 2
and 3. ``--backend gpu`` runs ``run_gpu.sh`` (FSDP2 + vLLM), and ``--parallel`` starts every seed at once
(``--stagger-s`` apart, at most ``--max-runs``), each later arm once the full pipeline's stage it starts
from has finished.

    python -m scripts.bench.toolcua_pipeline_study --steps 20 --seeds 0 1 2
    python -m scripts.bench.toolcua_pipeline_study --dry-run      # the runs it would make, and the report of what exists

Docs section (``--write``; printed otherwise): docs/results.md, "## ToolCUA pipeline study: ..." (one heading per backend, or ``--section``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from scripts.bench.launch import REPO, RunSpec, Runs, card_slots, gpu_environment, launch, load_steps, run
from scripts.bench.learning_runs import machine_line, series, study_command, study_parser
from scripts.bench.report import publish, table, target
from scripts.bench.stats import fmt_mean_se, last_finite, paired_mean_and_se, two_se_verdict
from scripts.bench.text_hybrid_study import derived, goal_gap, ratio

HEADINGS = {"cpu": "## ToolCUA pipeline study: SFT -> RFT -> online RL",  # each backend's runs keep their own section
            "gpu": "## GPU: ToolCUA pipeline study: SFT -> RFT -> online RL"}
SCRIPTS = {"cpu": "toolcua_sft_rl/run_cpu.sh", "gpu": "toolcua_sft_rl/run_gpu.sh"}
START_MODEL = {"cpu": "INIT_MODEL", "gpu": "MODEL"}  # each script's variable for the model stage 1 starts from
VAL = "val-aux/verl_ext/text_hybrid/{}/mean@1"
RFT_VAL = "val-aux/verl_ext/text_hybrid_decisions/{}/mean@1"
POLL_S = 10.0  # how often a waiting arm looks for the checkpoint it starts from
MAX_STEPS = 30  # S_max of the path reward (plugins/reward/tool_path.yaml): len_gain = success * (1 - s/S_max)
FULL, NO_RFT, NO_RL, PER_DECISION = "full pipeline", "no RFT", "no online RL", "per-decision tool term"
# the runs of a seed, by their --arms name ("no online RL" is the full pipeline's RFT checkpoint, no run of its own)
RUN_ARMS = {"full": FULL, "no_rft": NO_RFT, "per_decision": PER_DECISION}
METRICS = {  # derived() name -> column title
    "decision_tool_when_shorter": "T where tools shorter (decision)",
    "decision_tool_when_gui_shorter": "T where GUI shorter (decision)",
    "tool_when_beneficial": "tool use, tools help (task)",
    "tool_when_not": "tool use, tools do not help (task)",
    "success": "success",
    "steps_per_success": "env steps per success",
}


def settings(args) -> dict[str, str]:
    """Environment of every run: the budget, the held-out validation and the ``--set`` knobs
    (``RunSpec`` adds STEPS and OUT). REUSE_STAGES=1: a run's second attempt (``--attempts``) resumes
    at the stage that failed (on a shared card vLLM's start-up can fail when another run frees memory)."""
    return {"REUSE_STAGES": "1", "RL_TEST_FREQ": str(args.steps), "RL_VAL_SIZE": str(args.val_size),
            "RFT_STEPS": str(args.rft_steps), "SFT_STEPS": str(args.sft_steps), "TEMPLATES": args.templates,
            **dict(kv.split("=", 1) for kv in args.set)}


def plan(args, seed: int) -> list[tuple[str, Path, dict[str, str]]]:
    """The runs of one seed, in order: ``(arm, OUT, environment)``. The full pipeline runs every
    stage from the seed's fresh model; the other runs start from its checkpoints (so the arms of a
    seed share one SFT run)."""
    full = args.out / f"seed{seed}" / "full"
    base = {**settings(args), "SEED": str(seed)}
    start = START_MODEL[args.backend]
    sft_model = full / "sft" / f"global_step_{args.sft_steps}" / "huggingface"
    rft_model = full / "rft" / f"global_step_{args.rft_steps}" / "actor" / "huggingface"
    from_sft = {"SKIP_SFT": "1", "SKIP_RFT": "1", start: str(sft_model)}
    from_rft = {"SKIP_SFT": "1", "SKIP_RFT": "1", start: str(rft_model)}
    return [
        (FULL, full, {**base, start: str(fresh_model(args, seed))}),
        (NO_RFT, args.out / f"seed{seed}" / "no_rft", {**base, **from_sft}),
        (PER_DECISION, args.out / f"seed{seed}" / "per_decision", {**base, **from_rft, "TOOL_TERM": "decision"}),
    ]


def fresh_model(args, seed: int) -> Path:
    return args.out / f"seed{seed}" / "model"


def make_fresh_model(args, seed: int) -> None:
    """The random tiny model the seed's full pipeline starts from (what run_cpu.sh would make)."""
    path = fresh_model(args, seed)
    if not (path / "config.json").exists():
        subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(path), "--seed", str(seed),
                        "--hidden-size", str(args.width), "--layers", str(args.layers)], check=True)


def stage_done(full: Path, stage: str) -> bool:
    """Whether the full pipeline's run in ``full`` has finished ``stage`` (its ``stage_times.txt``)."""
    times = full / "stage_times.txt"
    return times.exists() and re.search(rf"\b{stage} took \d+ s", times.read_text()) is not None


def arm_values(results: dict[str, Runs], seeds: list[int]) -> dict[str, dict[str, np.ndarray]]:
    """Per arm and metric, shape (len(seeds),) in the order of ``seeds`` (NaN where a seed has no
    run, so arms pair by seed): the value at the online stage's last validation, and for ``no online
    RL`` the full pipeline's validation before its online stage (step 0)."""
    def by_seed(runs: Runs, rates: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.array([dict(zip(runs, rates[name])).get(s, np.nan) for s in seeds]) for name in METRICS}

    out = {}
    for arm, runs in results.items():
        if not runs:
            continue
        logged = sorted({s for run in runs.values() for s, m in run.items() if VAL.format("success") in m})
        rates = derived(runs, logged, MAX_STEPS, VAL)
        out[arm] = by_seed(runs, {name: last_finite(rates[name]) for name in METRICS})
        if arm == FULL:
            before = derived(runs, [0], MAX_STEPS, VAL)
            out[NO_RL] = by_seed(runs, {name: before[name][:, 0] for name in METRICS})
    return out


def rft_decisions(rft: Runs, step: int) -> dict[str, np.ndarray]:
    """The RFT stage's held-out decisions at ``step``: T rate where tools / the GUI are shorter, share
    of replies that took the shorter way, and of replies with one parseable call; shape (seeds,)."""
    get = {k: series(rft, RFT_VAL.format(k), [step])[:, 0] for k in (
        "tool_call_tool_shorter", "better_tool", "tool_call_gui_shorter", "better_gui", "chose_better", "format_ok")}
    return {"T where tools shorter": ratio(get["tool_call_tool_shorter"], get["better_tool"]),
            "T where GUI shorter": ratio(get["tool_call_gui_shorter"], get["better_gui"]),
            "shorter way taken": get["chose_better"], "one parseable call": get["format_ok"]}


def paired_bullet(title: str, a: np.ndarray, b: np.ndarray) -> tuple[str, int]:
    """``- title: mean (2 SE = .., n seeds): verdict`` of the per-seed differences ``a - b``, and n."""
    mean, se, n = paired_mean_and_se(a, b)
    return f"- {title}: {two_se_verdict(mean, se, n=n)}", n


def verdict_lines(values: dict[str, dict[str, np.ndarray]]) -> list[str]:
    """One bullet per ablation and metric: paired difference to the full pipeline vs 2 SE."""
    lines = []
    for arm in (NO_RFT, NO_RL, PER_DECISION):
        if arm not in values or FULL not in values:
            continue
        for name, title in METRICS.items():
            line, n = paired_bullet(f"{title}, {arm} - {FULL}", values[arm][name], values[FULL][name])
            if n > 0:
                lines.append(line)
    return lines


def sft_lines(args) -> list[str]:
    """Per seed, what the SFT checkpoint every arm starts from writes on held-out transcripts
    (``verl-ext eval-sft``, ``sft_eval.json``): the later stages can only sharpen calls it can write."""
    rows = []
    for seed in args.seeds:
        path = args.out / f"seed{seed}" / "full" / "sft_eval.json"
        if path.exists():
            sft = json.loads(path.read_text())
            gui = sft.get("gui_turn_call_rate")  # absent from evaluations older than the column
            rows.append([seed, sft["turns"], *(f"{sft[k]:.2f}" for k in ("valid_call_rate", "exact_call_rate",
                                                                          "tool_turn_call_rate")),
                         "n/a" if gui is None else f"{gui:.2f}"])
    if not rows:
        return []
    return ["**SFT checkpoint, held-out transcripts**:", "", table(["seed", "turns", "one parseable call", "the oracle's call", "the oracle's call "
                                    "where it is a tool", "`computer_use` where the oracle's call is"], rows), ""]


def report(results: dict[str, Runs], rft: Runs, args, command: str, runs_info: list[dict]) -> str:
    values = arm_values(results, args.seeds)
    arms = [arm for arm in (FULL, NO_RFT, NO_RL, PER_DECISION) if arm in values]
    walls = [info["wall_s"] for info in runs_info if "wall_s" in info]
    cards = sorted({info["card"] for info in runs_info if info.get("card")})
    versions = next((info for info in runs_info if info.get("card")), {})
    where = (f"Card: **{'; '.join(cards)}** (torch {versions.get('torch')}, vLLM {versions.get('vllm')}, verl "
             f"{versions.get('verl')}; the runs of all seeds shared it)." if cards else machine_line({"all": runs_info}))
    knobs = ", ".join(f"`{kv}`" for kv in args.set)
    seeds = ("; ".join(f"{arm}: {', '.join(map(str, sorted(runs))) or 'none'}" for arm, runs in results.items())
             if arms else f"RFT stage: {', '.join(map(str, sorted(rft))) or 'none'}; online stage: none")
    lines = [
        args.section, "",
        f"{where} `{command}`: "
        f"`recipes/{SCRIPTS[args.backend]}` from a random {args.layers}-layer, {args.width}-wide tiny model, with SFT "
        f"{args.sft_steps} steps, RFT {args.rft_steps} steps, online "
        f"RL {args.steps} steps, templates {args.templates}" + (f"; recipe knobs {knobs}" if knobs else "")
        + f"; held-out: {args.val_size} task instances. Seeds: {seeds}. "
        + (f"Wall time per run {np.mean(walls):.0f} s ({len(walls)} runs timed here)." if walls else
           "Wall times not recorded (runs reused or none yet)."),
        "",
    ]
    if arms:
        lines.append(table(["arm", *METRICS.values(), "goal (decision)"], [
            [arm, *(fmt_mean_se(values[arm][n], 1 if n == "steps_per_success" else 2) for n in METRICS),
             goal_gap(values[arm]["decision_tool_when_shorter"], values[arm]["decision_tool_when_gui_shorter"])]
            for arm in arms]))
        lines += ["", "Paired differences to the full pipeline:", "",
                  *verdict_lines(values), ""]
    else:  # e.g. runs cut during the RFT stage: its held-out decisions below are all there is
        lines += [f"Online stage: no run reached its validation at step {args.steps} (nothing to tabulate per arm).", ""]
    lines += sft_lines(args)
    notes = args.out / "notes.md"  # what the runs' own files cannot say (a run restarted by hand, runs cut short)
    return "\n".join(lines + rft_lines(rft) + ([notes.read_text().strip(), ""] if notes.exists() else []))


def rft_lines(rft: Runs) -> list[str]:
    """The RFT stage's held-out decisions before and after single-turn RL: mean over seeds, each seed,
    and the paired change (last validation - first) against two standard errors."""
    logged = sorted({s for run in rft.values() for s, m in run.items() if RFT_VAL.format("format_ok") in m})
    if not logged:
        return []
    first, last = rft_decisions(rft, logged[0]), rft_decisions(rft, logged[-1])
    rows = []
    for step, rates in ((logged[0], first), (logged[-1], last)):
        tool, gui = rates["T where tools shorter"], rates["T where GUI shorter"]
        measured = int(np.isfinite(tool).sum())  # a seed whose run was cut before this validation has none
        rows.append([step, "mean" if measured == len(rft) else f"mean of {measured}",
                     *map(fmt_mean_se, rates.values()), goal_gap(tool, gui)])
        rows += [[step, seed, *(fmt_mean_se(v[i:i + 1]) for v in rates.values()), goal_gap(tool[i:i + 1], gui[i:i + 1])]
                 for i, seed in enumerate(rft)]
    lines = ["**RFT stage, held-out decisions** (before and after single-turn RL; seeds "
             f"{', '.join(map(str, rft))}):", "", table(["step", "seed", *first, "goal (decision)"], rows), "",
             f"Paired change over the RFT stage (step {logged[-1]} - step {logged[0]}, per seed):", ""]
    for name in first:
        line, n = paired_bullet(name, last[name], first[name])
        if n >= 2:
            lines.append(line)
    return lines + [""]


def run_all(args, selected: set[str], info: dict) -> None:
    """The selected runs through ``launch``, seed-major: one at a time, or with ``--parallel`` up to
    ``--max-runs`` at once, ``--stagger-s`` apart (vLLM start-ups on a shared card must not overlap).
    A later arm starts once the full pipeline's stage it starts from has finished (``no RFT``: SFT,
    ``per-decision tool term``: RFT), or once that run has ended without it."""
    specs, needs, ended = [], {}, set()
    for seed in args.seeds:
        runs = plan(args, seed)
        for (arm, out, env), stage in zip(runs, (None, "sft", "rft")):
            if arm in selected:
                specs.append(RunSpec(f"{arm} seed {seed}", SCRIPTS[args.backend], out, args.steps, env, args.override,
                                     info))
                if stage:
                    needs[out] = (runs[0][1], stage)
    running_full = {s.out for s in specs if s.out not in needs and not s.done()}

    def ready(spec: RunSpec) -> bool:
        full, stage = needs.get(spec.out, (None, ""))
        return full is None or full not in running_full or full in ended or stage_done(full, stage)

    def execute(spec: RunSpec, attempts: int, env: dict[str, str]) -> None:
        try:
            start = spec.env[START_MODEL[args.backend]]
            if spec.out in needs and not Path(start).is_dir():
                print(f"{spec.label}: not run: no full-pipeline checkpoint {start} (run --arms full first)", flush=True)
                return
            if spec.out not in needs:
                make_fresh_model(args, int(spec.env["SEED"]))
            if info:  # the card, kept from the start: a run cut short still names it
                spec.out.mkdir(parents=True, exist_ok=True)
                (spec.out / "card.json").write_text(json.dumps(info))
            print(f"{spec.label}: {run(spec, attempts, env):.0f} s", flush=True)
        finally:
            ended.add(spec.out)

    at_once = min(len(specs), args.max_runs or len(specs)) if args.parallel else 1
    launch(specs, card_slots([], max(1, at_once)), args.attempts, execute, ready=ready,
           start_gap_s=args.stagger_s if args.parallel else 0.0, poll_s=POLL_S)


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__, REPO / "runs/toolcua_pipeline_study", steps=20, seeds=[0, 1, 2])
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--rft-steps", type=int, default=10)
    parser.add_argument("--val-size", type=int, default=32, help="held-out task instances of the online stage")
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--arms", nargs="+", choices=list(RUN_ARMS), default=list(RUN_ARMS),
                        help="the arms to run (no_rft and per_decision start from the full pipeline's checkpoints, "
                        "which must exist); the report reads every arm found")
    parser.add_argument("--backend", choices=list(SCRIPTS), default="cpu", help="which recipe script runs the stages")
    parser.add_argument("--width", type=int, default=128, help="hidden size of the tiny model each seed starts from")
    parser.add_argument("--layers", type=int, default=2, help="layers of the tiny model each seed starts from")
    parser.add_argument("--set", type=knob, action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe knob of every run (the script's environment), e.g. RFT_WARMUP_STEPS=300")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a main_ppo override of stages 2 and 3 (the script's arguments)")
    parser.add_argument("--parallel", action="store_true",
                        help="start every seed at once, and each later arm when its checkpoint exists")
    parser.add_argument("--stagger-s", type=float, default=30.0, help="seconds between starts with --parallel")
    parser.add_argument("--max-runs", type=int, default=None,
                        help="with --parallel: at most this many runs at once, the others wait for a free slot "
                        "(each run is a Ray cluster with its own vLLM engine: eight at once exhausted a 128 GB "
                        "host's memory, 2026-11-30)")
    parser.add_argument("--section", help="docs heading the report replaces (a new one is appended; default: the "
                        "backend's own, " + " or ".join(map(repr, HEADINGS.values())) + ")")
    parser.add_argument("--dry-run", action="store_true",
                        help="run nothing: print the runs (arm, OUT, environment) and the report of what exists")
    args = parser.parse_args(argv)
    args.section = args.section or HEADINGS[args.backend]
    if args.max_runs is not None and (args.max_runs < 1 or not args.parallel):
        parser.error(f"--max-runs {args.max_runs}: give a number >= 1, together with --parallel "
                     "(without it the runs go one at a time)")
    owned = {"SFT_STEPS": "--sft-steps", "RFT_STEPS": "--rft-steps", "STEPS": "--steps", "RL_TEST_FREQ": "--steps",
             "RL_VAL_SIZE": "--val-size", "TEMPLATES": "--templates", "SEED": "--seeds", "OUT": "--out",
             "MODEL": "--width/--layers", "INIT_MODEL": "--width/--layers", "SKIP_SFT": "--arms", "SKIP_RFT": "--arms",
             "SKIP_RL": "--arms", "TOOL_TERM": "--arms", "REUSE_STAGES": "--attempts"}
    for kv in args.set:  # the arms' checkpoint paths and pairing depend on these: the study sets them itself
        key = kv.split("=", 1)[0]
        if key in owned:
            parser.error(f"--set {key}=...: the study sets {key} itself; use {owned[key]}")
    command = study_command("toolcua_pipeline_study", parser, args,
                            always=("steps", "seeds", "sft_steps", "rft_steps"))
    selected = {RUN_ARMS[name] for name in args.arms}
    if not (args.report_only or args.dry_run):
        run_all(args, selected, gpu_environment() if args.backend == "gpu" else {})
    results: dict[str, Runs] = {FULL: {}, NO_RFT: {}, PER_DECISION: {}}
    rft: Runs = {}
    runs_info: list[dict] = []
    for seed in args.seeds:
        for arm, out, env in plan(args, seed):
            if args.dry_run and arm in selected:
                print(f"{arm} seed {seed}: OUT={out} STEPS={args.steps} "
                      + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
            for record in ("run.json", "card.json"):  # wall time and card of a finished run; the card of any
                if (out / record).exists():
                    runs_info.append(json.loads((out / record).read_text()))
            steps = load_steps(out / "metrics.jsonl")
            if args.steps in steps:
                results[arm][seed] = steps
            if arm == FULL and load_steps(out / "rft_metrics.jsonl"):
                rft[seed] = load_steps(out / "rft_metrics.jsonl")
    text = report(results, rft, args, command, runs_info)
    publish(None if args.dry_run else target(args), args.section, text)
    return 0


def knob(text: str) -> str:
    """``KEY=VALUE`` of ``--set``: KEY a recipe variable (upper case), VALUE anything."""
    key, sep, _ = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
        raise argparse.ArgumentTypeError(
            f"--set takes KEY=VALUE with KEY a recipe variable in upper case (e.g. RFT_WARMUP_STEPS=300), got {text!r}")
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
