"""The ``verl-ext`` command line. Each sub-command lives in its own module and is imported only
when it runs, so ``verl-ext doctor`` does not pay for the browser stack and vice versa.

A sub-command reports a user's mistake (a bad flag, a missing or malformed file, a busy port) by
raising ``verl_ext.errors.UserError``; ``main`` prints it as one line, ``verl-ext <command>:
error: <message>``, and exits 2, as argparse does for a bad flag. Anything else keeps its traceback.
"""

from __future__ import annotations

import importlib
import sys

from verl_ext import __version__
from verl_ext.errors import UserError

# sub-command -> ("module:function", one-line help). The function takes argv (list[str]) and
# returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("verl_ext.listing:main", "list plugin fragments, recipes, providers, estimators and trainer modes"),
    "recipes": ("verl_ext.recipe_files:main", "copy the recipes out of the installed package"),
    "doctor": ("verl_ext.doctor:main", "check verl, registered plugins, optional dependencies, patches"),
    "make-tiny-model": ("verl_ext.tiny_model:main", "build a tiny random Qwen2 model + local tokenizer"),
    "prepare-data": ("verl_ext.data:main", "write the parquet files a recipe trains on"),
    "eval": ("verl_ext.envs.eval_cli:main", "evaluate a policy on minidesk / miniwob"),
    "eval-sft": ("verl_ext.datasets.demos:main", "greedy function-call rate of an SFT model on held-out transcripts"),
    "dv-questions": ("verl_ext.rewards.dvreward.questions:main", "decompose prompts into yes/no questions"),
    "judge-server": ("verl_ext.rewards.dvreward.judge_server:main", "serve a local OpenAI-compatible judge"),
    "bundle": ("verl_ext_bundle.bundle:main", "build (or install) an offline install bundle for another machine"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: verl-ext [--version] <command> [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "verl-ext <command> --help shows a command's options and their defaults."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        print(f"verl-ext {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"verl-ext: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[command][0].split(":")
    try:
        return int(getattr(importlib.import_module(module_name), func_name)(rest) or 0)
    except UserError as err:
        print(f"verl-ext {command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
