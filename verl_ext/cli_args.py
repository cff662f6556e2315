"""What every ``verl-ext`` sub-command's argument parser is built from: the parser, its help format and
the argparse types for counts and rates. A leaf module, so the sub-commands (which live in their
families: data, envs, rewards) never import the command-line dispatcher (``verl_ext.cli``)."""

from __future__ import annotations

import argparse
import re


def plain_text(docstring: str) -> str:
    """A docstring as terminal help: reStructuredText markup (``code``, :role:`name`) removed."""
    text = re.sub(r":\w+:`([^`]*)`", r"\1", docstring)
    return text.replace("``", "").strip()


class PlainHelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default and keeps the description's line breaks."""


def command_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser every sub-command starts from: plain-text description, defaults in the help."""
    return argparse.ArgumentParser(prog=prog, description=plain_text(description), formatter_class=PlainHelpFormatter)


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts that must be at least 1 (sizes, seeds, workers, steps)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def unit_rate(text: str) -> float:
    """An argparse ``type`` for rates in [0, 1] (``eval-sft --min-tool-turn-rate``)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a rate in [0, 1]")
    return value
