"""Can the model learn the GUI-vs-tool decision when it is told the answer? The RFT stage's
warm-up SFT with the shorter way's call as the only target at each training decision
(``RFT_WARMUP_TARGETS=shorter``), for many steps, then ``decision_probe.py`` on the held-out decisions
*and on the training decisions themselves*. If the tool share does not separate even on the rows it
was trained on, the model does not read the deciding feature at this size and budget, and no reward
(the RL half's included) can make it choose by the state.

Per seed, from that seed's SFT checkpoint (``--sft-root``/seed<s>/sft/global_step_<n>/huggingface, e.g.
``toolcua_rft_study.py``'s), ``recipes/toolcua_sft_rl/run_cpu.sh`` with ``SKIP_SFT=1 SKIP_RL=1`` runs the
warm-up and writes the decision rows; the RL half it would start next is stopped (its process group
is ended once the warm-up checkpoint and the rows exist).

    python scripts/bench/warmup_learnability.py --sft-root runs/toolcua_rft_study --seeds 0 1 2 --warmup-steps 512
    python scripts/bench/warmup_learnability.py --seeds 0 1 2 --report-only
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from learning_runs import REPO, mean_and_se, publish, study_command, study_parser
from text_hybrid_study import fmt

HEADING = "## ToolCUA pipeline: can the decision be learnt when it is taught? (warm-up on the shorter way only)"
SCRIPT = REPO / "recipes/toolcua_sft_rl/run_cpu.sh"
SPLITS = ("val", "train")
TRAIN_DECISIONS = 128  # RFT_ROWS: the training decisions the warm-up is taught (one row each)


def warmup_model(args, out: Path) -> Path:
    """The warm-up's HF checkpoint under ``out``."""
    return out / "rft_warmup" / f"global_step_{args.warmup_steps}" / "huggingface"


def run_warmup(seed: int, args, out: Path) -> None:
    """The warm-up of ``seed`` into ``out``; returns once its checkpoint and the decision rows exist."""
    model = warmup_model(args, out)
    if (model / "config.json").exists() and (out / "rft_data" / "val.parquet").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    sft = args.sft_root / f"seed{seed}" / "sft" / f"global_step_{args.sft_steps}" / "huggingface"
    if not (sft / "config.json").exists():
        raise FileNotFoundError(f"no SFT checkpoint {sft}: run toolcua_rft_study.py for seed {seed} first, or set --sft-root")
    env = {**os.environ, "SHOW_TODO": "1", "SEED": str(seed), "TEMPLATES": args.templates, "SKIP_SFT": "1",
           "SKIP_RL": "1", "INIT_MODEL": str(sft), "RFT_WARMUP_STEPS": str(args.warmup_steps),
           "RFT_WARMUP_LR": args.warmup_lr, "RFT_WARMUP_TARGETS": "shorter", "RFT_ROWS": str(TRAIN_DECISIONS),
           "RFT_VAL_ROWS": str(args.val_rows),
           "OUT": str(out), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with open(out / "run.log", "w") as log:
        proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while not ((model / "config.json").exists() and (out / "rft_data" / "val.parquet").exists()):
                if proc.poll() is not None:
                    raise RuntimeError(f"seed {seed}: the warm-up stopped (exit {proc.returncode}); log {out / 'run.log'}")
                time.sleep(5)
        finally:
            if proc.poll() is None:  # the RL half would start next: not part of this measurement
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()


def probed(seed: int, args, out: Path) -> dict[str, dict] | None:
    """``decision_probe.py``'s summary of the warm-up model on each split (cached in ``out``)."""
    model = warmup_model(args, out)
    summaries = {}
    for split in SPLITS:
        cache = out / f"probe_{split}.json"
        if not cache.exists():
            if args.report_only or not (model / "config.json").exists():
                return None
            from decision_probe import probe

            cache.write_text(json.dumps(probe(str(model), str(out / "rft_data" / f"{split}.parquet"))))
            print(f"seed {seed}: probed {split}", flush=True)
        summaries[split] = json.loads(cache.read_text())["summary"]
    return summaries


def report(by_seed: dict[int, dict[str, dict]], args, command: str) -> str:
    seeds = sorted(by_seed)
    lines = [args.section, "",
             f"`{command}` (one core each: `taskset -c K`, `OMP_NUM_THREADS=1`). Per seed, from that seed's SFT "
             f"checkpoint ({args.sft_steps} steps, the to-do line on), the RFT stage's warm-up SFT on the shorter way's "
             f"first call only at each of the {TRAIN_DECISIONS} training decisions (`RFT_WARMUP_TARGETS=shorter`), "
             f"{args.warmup_steps} steps of one row at lr {args.warmup_lr} (cosine to 0), i.e. "
             f"{args.warmup_steps / TRAIN_DECISIONS:.0f} epochs; then the "
             "exact decision probe (`scripts/bench/decision_probe.py`: tool share = P(app tool name) / (P(tool) + "
             "P(`computer_use`)) at the reply's first call) on the held-out decisions (task instances disjoint "
             "from training) and on the training decisions the warm-up was taught. Seeds: "
             f"{', '.join(map(str, seeds)) or 'none'}; mean ± SE over seeds.", "",
             "| decisions | n (tools shorter / GUI shorter) | tool share where tools shorter | tool share where GUI shorter "
             "| separation (difference) | separation by seed |",
             "|---|---|---|---|---|---|"]
    separations = {}
    for split, label in (("train", "training (taught)"), ("val", "held-out")):
        rows = [by_seed[s][split] for s in seeds]
        if not rows:
            continue
        tools = np.array([r["tool_share_tool_shorter"] for r in rows])
        gui = np.array([r["tool_share_gui_shorter"] for r in rows])
        seps = separations[split] = tools - gui
        counts = f"{rows[0]['n_tool_shorter']} / {rows[0]['n_gui_shorter']}"
        lines.append(f"| {label} | {counts} | {fmt(tools, 3)} | {fmt(gui, 3)} | {fmt(seps, 3)} | "
                     + ", ".join(f"{v:+.3f}" for v in seps) + " |")
    if seeds:
        train_sep = mean_and_se(separations["train"])
        lines += ["", f"Taught the answer on {args.warmup_steps / TRAIN_DECISIONS:.0f} passes over its training decisions, the model "
                  f"separates them by {train_sep[0]:+.3f} in tool share: a goal of T >= 0.8 where tools are shorter and "
                  "<= 0.2 where the GUI is needs a separation of at least 0.6."]
    return "\n".join(lines + [""])


def main(argv: list[str]) -> int:
    parser = study_parser(__doc__.split("\n\n")[0], REPO / "runs/warmup_learnability", steps=0, seeds=[0, 1, 2],
                          doc=REPO / "docs/experiments/toolcua_decision_studies.md")
    parser.add_argument("--sft-root", type=Path, default=REPO / "runs/toolcua_rft_study",
                        help="folder with seed<s>/sft/global_step_<n>/huggingface (toolcua_rft_study.py --show-todo's)")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--warmup-steps", type=int, default=512)
    parser.add_argument("--warmup-lr", default="3e-3")
    parser.add_argument("--val-rows", type=int, default=32)
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--section", default=HEADING, help="docs heading the report replaces (a new one is appended)")
    args = parser.parse_args(argv)
    command = study_command("warmup_learnability.py", parser, args, always=("seeds", "warmup_steps", "warmup_lr"))
    by_seed = {}
    for seed in args.seeds:
        out = args.out / f"seed{seed}"
        if not args.report_only:
            run_warmup(seed, args, out)
        summaries = probed(seed, args, out)
        if summaries:
            by_seed[seed] = summaries
    text = report(by_seed, args, command)
    publish(args.doc, args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
