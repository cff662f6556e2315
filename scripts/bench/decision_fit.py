"""Can the cpu recipe's tiny model learn the GUI-vs-tool choice at all, given a loss on the choice
alone and enough decisions? ``warmup_learnability.py`` taught it through the RFT warm-up's
SFT loss, where the choice is one token of a whole call, and it separated even its 128 training
decisions by 0.11 only. Here, per seed, from that seed's SFT checkpoint, plain PyTorch trains on the
choice token alone: at each training decision (``verl-ext prepare-data text_hybrid_decisions``,
``--show-todo``) the prompt as the ``decision_turn`` loop builds it, followed by the reply's opening
up to the function's name (``decision_probe.OPENING``), and the loss is -log P(the first token of the
shorter way's name: ``computer_use`` or, summed, the app tools'). Reported, every ``--eval-every``
steps, the tool share P(tool) / (P(tool) + P(computer_use)) of that token where tools are shorter
and where the GUI is, on 128 training decisions and on the held-out ones (task instances disjoint
from training). Two budgets of data tell memorising (the 128 decisions of the recipe's cpu default)
from reading the state (``--train-rows`` 2048).

    python scripts/bench/decision_fit.py --sft-root runs/toolcua_rft_study --seeds 0 1 --train-rows 2048
    python scripts/bench/decision_fit.py --seeds 0 1 --report-only
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from decision_probe import OPENING, continuation_ids, decision_prompt
from learning_runs import REPO, publish, study_parser
from text_hybrid_study import fmt

HEADING = "## ToolCUA pipeline: can the tiny model learn the choice with a loss on the choice alone?"
EVAL_TRAIN_ROWS = 128  # training decisions evaluated at each report (a fixed sample when there are more)


def choice_rows(tokenizer, path: Path) -> list[tuple[list[int], int, list[int], str]]:
    """Per decision row: the prompt's tokens up to the function name, the first token of
    ``computer_use``, the first tokens of the app tools' names, and which way is shorter."""
    import pandas as pd

    rows = []
    for _, row in pd.read_parquet(path).iterrows():
        decision = row["extra_info"]["decision"]
        opening = decision_prompt(tokenizer, json.loads(row["prompt"]), json.loads(row["extra_info"]["tools"]))
        opening += OPENING.format("")
        ids = tokenizer.encode(opening, add_special_tokens=False)

        def first_token(name: str) -> int:
            return continuation_ids(tokenizer, opening, ids, name)[0]

        gui, tools = first_token("computer_use"), sorted({first_token(n) for n in decision["app_tools"]})
        if gui in tools:
            raise ValueError(f"{path}: computer_use and an app tool open with the same token; the choice is not one token")
        rows.append((ids, gui, tools, decision["better"]))
    return rows


def choice_logprobs(model, row) -> tuple:
    """log P(an app tool's first token), log P(computer_use's) at the choice."""
    import torch

    ids, gui, tools, _ = row
    logp = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
    return torch.logsumexp(logp[tools], 0), logp[gui]


def tool_shares(model, rows) -> dict[str, float]:
    """Mean tool share where tools / the GUI are shorter, and their difference (the separation)."""
    import torch

    model.eval()
    shares: dict[str, list[float]] = {"tool": [], "gui": []}
    with torch.no_grad():
        for row in rows:
            p_tool, p_gui = choice_logprobs(model, row)
            shares[row[3]].append(float(torch.sigmoid(p_tool - p_gui)))
    model.train()
    out = {k: sum(v) / len(v) for k, v in shares.items() if v}
    out["separation"] = out.get("tool", float("nan")) - out.get("gui", float("nan"))
    return out


def fit(seed: int, args, out: Path) -> None:
    """Train seed ``seed``'s SFT model on the choice token; one JSON line per report in ``out/fit.jsonl``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log = out / "fit.jsonl"
    if log.exists() and any(json.loads(line)["step"] == args.steps for line in log.read_text().splitlines()):
        return
    data = out / "data"
    if not (data / "val.parquet").exists():
        subprocess.run([sys.executable, "-m", "verl_ext.cli", "prepare-data", "text_hybrid_decisions", str(data),
                        "--train-size", str(args.train_rows), "--val-size", str(args.val_rows), "--seed", str(seed),
                        "--templates", args.templates, "--show-todo"], check=True, cwd=REPO)
    sft = args.sft_root / f"seed{seed}" / "sft" / f"global_step_{args.sft_steps}" / "huggingface"
    if not (sft / "config.json").exists():
        raise FileNotFoundError(f"no SFT checkpoint {sft}: run toolcua_rft_study.py for seed {seed} first, or set --sft-root")
    sampler = random.Random(0)  # the same batch order for every seed: seeds differ in their data and SFT model
    tokenizer = AutoTokenizer.from_pretrained(sft)
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    train, val = choice_rows(tokenizer, data / "train.parquet"), choice_rows(tokenizer, data / "val.parquet")
    train_eval = random.Random(1).sample(train, min(EVAL_TRAIN_ROWS, len(train)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    start = time.time()
    with open(log, "w") as f:
        def report(step: int, loss: float | None) -> None:
            line = {"step": step, "loss": loss, "train": tool_shares(model, train_eval), "val": tool_shares(model, val),
                    "elapsed_s": round(time.time() - start, 1)}
            f.write(json.dumps(line) + "\n")
            f.flush()
            print(f"[decision_fit] seed {seed} {json.dumps(line)}", flush=True)

        report(0, None)
        for step in range(1, args.steps + 1):
            optimizer.zero_grad()
            total = 0.0
            for row in sampler.sample(train, args.batch):
                p_tool, p_gui = choice_logprobs(model, row)
                loss = -(p_tool if row[3] == "tool" else p_gui) / args.batch
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            if step % args.eval_every == 0 or step == args.steps:
                report(step, total)


def report_section(args) -> str:
    logs = {s: [json.loads(line) for line in (args.out / f"seed{s}" / "fit.jsonl").read_text().splitlines()]
            for s in args.seeds if (args.out / f"seed{s}" / "fit.jsonl").exists()}
    if not logs:
        raise FileNotFoundError(f"no fit.jsonl under {args.out}")
    steps = sorted(set.intersection(*({line["step"] for line in lines} for lines in logs.values())))
    lines = [HEADING, "",
             f"`python scripts/bench/decision_fit.py --seeds {' '.join(map(str, logs))} --steps {args.steps} "
             f"--train-rows {args.train_rows} --val-rows {args.val_rows} --batch {args.batch} --lr {args.lr}` "
             f"(one core a seed: `taskset -c K`, `OMP_NUM_THREADS=1`). Per seed, from that seed's SFT checkpoint "
             f"(cpu recipe, {args.sft_steps} steps, the to-do line on), AdamW on the choice token alone "
             f"(the first token of the shorter way's function name), {args.batch} of {args.train_rows} training "
             f"decisions a step (templates {args.templates}); held out: {args.val_rows} decisions of other task "
             f"instances. Tool share = P(app tool's first token) / (that + P(computer_use's)); separation = its "
             f"mean where tools are shorter minus where the GUI is. Training: the same {EVAL_TRAIN_ROWS} training "
             f"decisions at every report. Seeds: {', '.join(map(str, logs))}; mean ± SE over seeds.", "",
             "| step | training: share where tools shorter | training: where GUI shorter | training separation "
             "| held-out: share where tools shorter | held-out: where GUI shorter | held-out separation "
             "| held-out separation by seed |",
             "|---|---|---|---|---|---|---|---|"]
    for step in steps:
        at = {s: next(line for line in lines_ if line["step"] == step) for s, lines_ in logs.items()}
        cells = [str(step)]
        for split in ("train", "val"):
            for key in ("tool", "gui", "separation"):
                cells.append(fmt([at[s][split].get(key, float("nan")) for s in at], 3))
        cells.append(", ".join(f"{at[s]['val']['separation']:+.3f}" for s in at))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = study_parser(__doc__.split("\n\n")[0], REPO / "runs/decision_fit", steps=200, seeds=[0, 1],
                          doc=REPO / "docs/experiments/toolcua_decision_studies.md")
    parser.add_argument("--sft-root", type=Path, default=REPO / "runs/toolcua_rft_study")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--train-rows", type=int, default=2048)
    parser.add_argument("--val-rows", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--templates", default="settings_panel")
    parser.add_argument("--section", default=HEADING, help="docs heading the report replaces (a new one is appended)")
    args = parser.parse_args(argv)
    if not args.report_only:
        for seed in args.seeds:
            out = args.out / f"seed{seed}"
            out.mkdir(parents=True, exist_ok=True)
            fit(seed, args, out)
    publish(args.doc, args.section, report_section(args).replace(HEADING, args.section, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
