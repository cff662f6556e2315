"""``verl-ext prepare-data``: write the parquet files the recipes train on.

Every dataset here is generated from a seed, so no download is ever needed. Rows follow verl's
``RLHFDataset`` layout: ``prompt`` (chat messages), ``data_source``, ``reward_model`` with the
ground truth, ``extra_info``, and optionally ``agent_name`` to pick the agent loop per row.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

from verl_ext.cli_args import command_parser, positive_int

ARITHMETIC_SOURCE = "verl_ext/arithmetic"
TEXT_CORRIDOR_SOURCE = "verl_ext/text_corridor"


def arithmetic_rows(n: int, seed: int, split: str) -> list[dict]:
    """Single-turn "What is a plus b?" prompts with the sum as ground truth."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(
            {
                "data_source": ARITHMETIC_SOURCE,
                "prompt": [{"role": "user", "content": f"What is {a} plus {b}? Answer with a number."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def text_corridor_rows(n: int, seed: int, split: str) -> list[dict]:
    """``TextCorridor`` episodes played by the ``text_env`` agent loop, one env seed per row.

    The seed decides the start cell; train and val draw their seeds from different streams, so
    val episodes are held out (the handful of cells is shared: the state space is tiny).
    """
    from verl_ext.envs.text_corridor import TextCorridor, instructions

    env = TextCorridor()
    rng = random.Random(f"text_corridor-{seed}-{split}")
    rows = []
    for index in range(n):
        env_seed = rng.randrange(2**31)
        rows.append(
            {
                "data_source": TEXT_CORRIDOR_SOURCE,
                "agent_name": "text_env",
                "prompt": [{"role": "user", "content": instructions(env.length)}],
                "ability": "agent",
                "reward_model": {"style": "rule", "ground_truth": str(env.goal)},
                "extra_info": {"split": split, "index": index, "seed": env_seed,
                               "env": {"length": env.length, "max_steps": env.max_steps}},
            }
        )
    return rows


def _minidesk_rows(n: int, seed: int, split: str, templates: list[str] | None = None) -> list[dict]:
    """MiniDesk hybrid GUI + tool tasks (imported lazily: the env package is heavier)."""
    from verl_ext.envs.dataset import minidesk_rows

    return minidesk_rows(n, seed, split, templates)


def _text_hybrid_rows(n: int, seed: int, split: str, templates: list[str] | None = None) -> list[dict]:
    """TextHybrid tasks: hybrid GUI + tool apps in pure Python, no browser (``verl_ext.envs.text_hybrid``)."""
    from verl_ext.envs.text_hybrid import text_hybrid_rows

    return text_hybrid_rows(n, seed, split, templates)


def _text_hybrid_sft_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                          show_todo: bool = False, tool_oversample: int = 1) -> list[dict]:
    """SFT demonstrations for ``verl.trainer.sft_trainer``: the ``text_hybrid`` tasks of the same seed played
    by the scripted oracle, as ``hybrid_gui_tool`` function-call transcripts (``verl_ext.datasets.demos``). In the
    train split each transcript with an app-tool call is written ``tool_oversample`` times (val: once each,
    so held-out rates stay those of the task distribution)."""
    from verl_ext.datasets.demos import oversample_tool_transcripts, text_hybrid_sft_rows

    rows = text_hybrid_sft_rows(n, seed, split, templates, show_todo=show_todo)
    return oversample_tool_transcripts(rows, tool_oversample) if split == "train" else rows


def _text_hybrid_decision_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                               show_todo: bool = False, balance_labels: bool = False) -> list[dict]:
    """Critical switching steps for the single-turn RL stage: ``n`` GUI-vs-tool decisions of the ``text_hybrid``
    tasks of the same seed, each prompt the ``hybrid_gui_tool`` transcript up to it (``verl_ext.datasets.decisions``).
    ``balance_labels``: the train split holds as many GUI-shorter as tools-shorter rows (val: the tasks' own mix,
    so held-out rates stay those of the task distribution)."""
    from verl_ext.datasets.decisions import decision_rows

    return decision_rows(n, seed, split, templates, show_todo=show_todo,
                         balance_labels=balance_labels and split == "train")


def _text_hybrid_switch_warmup_rows(n: int, seed: int, split: str, templates: list[str] | None = None,
                                    show_todo: bool = False, warmup_targets: str = "both") -> list[dict]:
    """Warm-up SFT rows of the RFT stage: the critical switching steps of ``text_hybrid_decisions`` with both
    options' first calls as targets, no preference, or the shorter way's only (``warmup_targets``;
    ``verl_ext.datasets.decisions.switch_warmup_rows``)."""
    from verl_ext.datasets.decisions import switch_warmup_rows

    return switch_warmup_rows(n, seed, split, templates, show_todo=show_todo, targets=warmup_targets)


def _dv_describe_rows(n: int, seed: int, split: str) -> list[dict]:
    """Templated description prompts with their DVReward questions (``recipes/dvreward_judge``)."""
    from verl_ext.rewards.dvreward.describe_task import describe_rows

    return describe_rows(n, seed, split)


DATASETS: dict[str, Callable[[int, int, str], list[dict]]] = {
    "arithmetic": arithmetic_rows,
    "text_corridor": text_corridor_rows,
    "minidesk": _minidesk_rows,
    "text_hybrid": _text_hybrid_rows,
    "text_hybrid_sft": _text_hybrid_sft_rows,
    "text_hybrid_decisions": _text_hybrid_decision_rows,
    "text_hybrid_switch_warmup": _text_hybrid_switch_warmup_rows,
    "dv_describe": _dv_describe_rows,
}
TEMPLATED = ("minidesk", "text_hybrid", "text_hybrid_sft", "text_hybrid_decisions", "text_hybrid_switch_warmup")  # take --templates
SHOWS_TODO = ("text_hybrid_sft", "text_hybrid_decisions", "text_hybrid_switch_warmup")  # take --show-todo
OVERSAMPLES_TOOLS = ("text_hybrid_sft",)  # take --tool-oversample
BALANCES_LABELS = ("text_hybrid_decisions",)  # take --balance-labels
WARMUP_TARGETED = ("text_hybrid_switch_warmup",)  # take --warmup-targets


def write_parquet(rows: list[dict], path: str) -> str:
    import pandas as pd

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def main(argv: list[str]) -> int:
    parser = command_parser("verl-ext prepare-data", __doc__.split("\n\n")[0])
    parser.add_argument("dataset", choices=sorted(DATASETS), help="which dataset to generate")
    parser.add_argument("out_dir", help="writes OUT_DIR/train.parquet and OUT_DIR/val.parquet")
    parser.add_argument("--train-size", type=positive_int, default=256, help="training rows")
    parser.add_argument("--val-size", type=positive_int, default=32, help="validation rows")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (same seed, same files)")
    parser.add_argument("--templates", default=None,
                        help=f"{', '.join(TEMPLATED)} only: comma-separated task templates (default: all)")
    parser.add_argument("--show-todo", action="store_true",
                        help=f"{', '.join(SHOWS_TODO)} only: observations end with the task's items still to do "
                             "(text_hybrid's show_todo; the online stage's agent loop must set it too)")
    parser.add_argument("--tool-oversample", type=positive_int, default=None, metavar="K",
                        help=f"{', '.join(OVERSAMPLES_TOOLS)} only: write each training transcript in which the "
                             "oracle calls an app tool K times (default 1: once; val is never oversampled); "
                             "--train-size still counts distinct tasks")
    parser.add_argument("--balance-labels", action="store_true",
                        help=f"{', '.join(BALANCES_LABELS)} only: half the training rows where the GUI is shorter, half "
                             "where tools are (--train-size even; val keeps the tasks' own mix)")
    parser.add_argument("--warmup-targets", choices=("both", "shorter"), default=None,
                        help=f"{', '.join(WARMUP_TARGETED)} only: the SFT targets at each decision, both options' first "
                             "calls (default: no preference; --train-size rows = half as many decisions) or the "
                             "shorter way's only (one row per decision)")
    args = parser.parse_args(argv)
    make_rows = DATASETS[args.dataset]
    options = {}
    if args.tool_oversample is not None:
        if args.dataset not in OVERSAMPLES_TOOLS:
            parser.error(f"--tool-oversample applies to the {', '.join(OVERSAMPLES_TOOLS)} dataset only")
        options["tool_oversample"] = args.tool_oversample
    if args.balance_labels:
        if args.dataset not in BALANCES_LABELS:
            parser.error(f"--balance-labels applies to the {', '.join(BALANCES_LABELS)} dataset only")
        if args.train_size % 2:
            parser.error(f"--balance-labels needs an even --train-size (half per label), got {args.train_size}")
        options["balance_labels"] = True
    if args.warmup_targets is not None:
        if args.dataset not in WARMUP_TARGETED:
            parser.error(f"--warmup-targets applies to the {', '.join(WARMUP_TARGETED)} dataset only")
        options["warmup_targets"] = args.warmup_targets
    if args.show_todo:
        if args.dataset not in SHOWS_TODO:
            parser.error(f"--show-todo applies to the {', '.join(SHOWS_TODO)} datasets only")
        options["show_todo"] = True
    if args.templates:
        if args.dataset not in TEMPLATED:
            parser.error(f"--templates applies to the {', '.join(TEMPLATED)} datasets only")
        options["templates"] = [t.strip() for t in args.templates.split(",") if t.strip()]
    for split, size in (("train", args.train_size), ("val", args.val_size)):
        print(f"{args.dataset} {split}: generating {size} rows ...", flush=True)  # minutes for the larger sets
        rows = make_rows(size, args.seed, split, **options)
        path = write_parquet(rows, os.path.join(args.out_dir, f"{split}.parquet"))
        print(f"{args.dataset} {split}: {len(rows)} rows -> {path}")
    return 0
