"""Where a GPU step of the tiny model goes, and what verl-ext's ``logprob_row_blocks`` patch changes:
``recipes/toolcua_sft_rl/run_gpu.sh``'s RFT stage (GRPO on critical switching steps) and SFT stage,
run side by side on one card with the patch on and off (``VERL_EXT_LOGPROB_ROW_BLOCKS``), then
verl's own per-phase timings (``timing_s/*``) and MFU tabulated.

    python scripts/bench/logprob_patch_gpu.py --run --out /tmp/logs      # on the GPU machine: 2 RFT + 2 SFT runs
    python scripts/bench/logprob_patch_gpu.py --rft "verl's loop=DIR" --rft "row blocks=DIR" \\
        --sft "verl's loop=DIR" --sft "row blocks=DIR"                   # the tables of runs that exist

Each DIR is a run's OUT (``rft_metrics.jsonl`` / ``sft_metrics.jsonl`` inside). The tiny model is
``verl-ext make-tiny-model --hidden-size 256 --layers 4`` (2.5M parameters), the data TextHybrid's
settings_panel decisions with the to-do line (prompts of 2.3k-5.7k tokens).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from learning_runs import load_steps

REPO = Path(__file__).resolve().parents[2]
SWITCH = "VERL_EXT_LOGPROB_ROW_BLOCKS"
ARMS = {"verl's loop": "0", "row blocks": "1"}
RFT_ENV = {"SEED": "0", "N_GPUS": "1", "TEMPLATES": "settings_panel", "SHOW_TODO": "1", "SKIP_SFT": "1", "SKIP_RL": "1",
           "RFT_ROWS": "256", "RFT_VAL_ROWS": "16", "RFT_BATCH": "32", "RFT_N": "8", "RFT_STEPS": "4", "RFT_LR": "3e-4",
           "RFT_RESPONSE_LENGTH": "128", "RFT_ARGS": "trainer.val_before_train=false"}
RFT_OVERRIDES = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.15", "actor_rollout_ref.rollout.enforce_eager=true"]
SFT_ENV = {"SEED": "0", "N_GPUS": "1", "TEMPLATES": "settings_panel", "SHOW_TODO": "1", "SKIP_RFT": "1", "SKIP_RL": "1",
           "SFT_STEPS": "12", "SFT_BATCH": "4", "SFT_ROWS": "64", "SFT_EVAL_ROWS": "0", "SFT_DECISION_WEIGHT": "10",
           "SFT_LR": "3e-3", "SFT_WARMUP": "2"}
PHASES = ("gen", "old_log_prob", "update_actor", "step")


def steps(path: Path) -> list[dict[str, float]]:
    """The metrics of each logged step, in step order (a step's training and validation lines merged)."""
    return [metrics for _, metrics in sorted(load_steps(path).items())]


def rft_table(runs: dict[str, Path]) -> list[str]:
    """Seconds per phase of the first GRPO step (start-up included) and the median of the later ones."""
    lines = ["| run | steps | " + " | ".join(f"{p}: step 1 / later (s)" for p in PHASES) + " |",
             "|---|---:|" + "---:|" * len(PHASES)]
    for name, out in runs.items():
        logged = [m for m in steps(out / "rft_metrics.jsonl") if "timing_s/step" in m]
        if not logged:
            lines.append(f"| {name} | 0 | " + " | ".join("not reached" for _ in PHASES) + " |")
            continue
        cells = []
        for phase in PHASES:
            first = logged[0][f"timing_s/{phase}"]
            later = [m[f"timing_s/{phase}"] for m in logged[1:]]
            cells.append(f"{first:.1f} / {statistics.median(later):.1f}" if later else f"{first:.1f} / -")
        lines.append(f"| {name} | {len(logged)} | " + " | ".join(cells) + " |")
    return lines


def sft_table(runs: dict[str, Path]) -> list[str]:
    """verl's ``train/mfu`` of each SFT step (median of steps 2 on): side by side, the ratio of two
    runs' MFU is the inverse ratio of their step times (same model, same rows)."""
    lines = ["| run | steps | median train/mfu (steps 2 on) | x first run |", "|---|---:|---:|---:|"]
    first = None
    for name, out in runs.items():
        mfu = [m["train/mfu"] for m in steps(out / "sft_metrics.jsonl") if m.get("train/mfu")][1:]
        if not mfu:
            lines.append(f"| {name} | 0 | - | - |")
            continue
        median = statistics.median(mfu)
        first = first or median
        lines.append(f"| {name} | {len(mfu) + 1} | {median:.2e} | {median / first:.1f} |")
    return lines


def launch(out: Path, stagger_s: float) -> tuple[dict[str, Path], dict[str, Path]]:
    """Both arms of the RFT stage, then of the SFT stage, at once on this machine's card."""
    model = out / "model"
    subprocess.run([sys.executable, "-m", "verl_ext.cli", "make-tiny-model", str(model), "--seed", "0",
                    "--hidden-size", "256", "--layers", "4"], check=True)
    procs, rft, sft = [], {}, {}
    script = str(REPO / "recipes" / "toolcua_sft_rl" / "run_gpu.sh")
    for stage, env, extra, runs in (("rft", RFT_ENV, RFT_OVERRIDES, rft), ("sft", SFT_ENV, [], sft)):
        for name, switch in ARMS.items():
            run_dir = out / f"{stage}_{'blocks' if switch == '1' else 'loop'}"
            runs[name] = run_dir
            run_dir.mkdir(parents=True, exist_ok=True)
            full_env = {**os.environ, **env, "MODEL": str(model), "OUT": str(run_dir), SWITCH: switch}
            print(f"[logprob_patch_gpu] start {stage} {name} -> {run_dir}", flush=True)
            with open(run_dir.with_suffix(".log"), "w") as log:
                procs.append(subprocess.Popen(["bash", script, *extra], env=full_env, stdout=log, stderr=subprocess.STDOUT))
            time.sleep(stagger_s)  # vLLM start-ups on a shared card must not overlap
    for proc in procs:
        proc.wait()
    return rft, sft


def named_dirs(pairs: list[str], option: str) -> dict[str, Path]:
    runs = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{option} takes NAME=DIR (a run's OUT folder), got {pair!r}")
        runs[name] = Path(path)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="launch both arms of both stages here (needs a GPU)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "logprob_patch_gpu")
    parser.add_argument("--stagger-s", type=float, default=30.0)
    parser.add_argument("--rft", action="append", default=[], metavar="NAME=DIR", help="an RFT run to tabulate")
    parser.add_argument("--sft", action="append", default=[], metavar="NAME=DIR", help="an SFT run to tabulate")
    args = parser.parse_args(argv)
    rft, sft = named_dirs(args.rft, "--rft"), named_dirs(args.sft, "--sft")
    if args.run:
        launched_rft, launched_sft = launch(args.out, args.stagger_s)
        rft, sft = {**launched_rft, **rft}, {**launched_sft, **sft}
    if not rft and not sft:
        parser.error("nothing to tabulate: give --run, or --rft/--sft NAME=DIR")
    if rft:
        print("\n".join(["", "GRPO steps of 32 decisions x 8 samples (verl's timing_s, seconds):", *rft_table(rft)]))
    if sft:
        print("\n".join(["", "SFT steps of 4 transcripts (verl's train/mfu):", *sft_table(sft)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
