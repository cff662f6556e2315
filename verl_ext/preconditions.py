"""Preconditions: when the output of an advantage estimator, a policy loss or an old-logit provider
carries a learning signal.

Each plugin declares its preconditions next to its code, in a ``PRECONDITIONS`` tuple
(``DECLARING_MODULES``). A :class:`Precondition` states its condition in user terms and, where the
config alone decides it, checks it: ``check(config)`` returns sentences that name the key, the value
and the fix. :func:`precondition_problems` runs the checks of the plugins the config selects (and
only those); ``verl_ext.validation.problems`` runs it at start-up. A condition that depends on the
data says where it is checked instead (``not_at_start_up``).

Importing this module imports nothing heavy and changes nothing; the declarations are imported on
first use. ``python -m verl_ext.preconditions --write`` regenerates the "Preconditions" section of
docs/reference/validation.md from the declarations.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_ext.doc_sections import DOCS, write_section
from verl_ext.gpu_checks import select
from verl_ext.trainer_modes import TRAINER_MODE_KEY, needs_verl_ext_trainer

# plugin kind -> the key whose value selects the plugin
SELECTORS: dict[str, str] = {
    "estimator": "algorithm.adv_estimator",
    "loss": "actor_rollout_ref.actor.policy_loss.loss_mode",
    "old_logit_provider": "algorithm.old_logits.provider",
}
DECLARING_MODULES = ("verl_ext.advantages.preconditions", "verl_ext.losses.preconditions",
                     "verl_ext.old_logits.preconditions")
DOCS_PAGE = DOCS / "reference" / "validation.md"
SECTION_HEADING = "## Preconditions"

Check = Callable[[Any], list[str]]


@dataclass(frozen=True)
class Precondition:
    """One condition a plugin's output needs to carry a learning signal.

    Attributes:
        kind: ``estimator``, ``loss`` or ``old_logit_provider`` (``SELECTORS``).
        plugin: the plugin's name (the value of its selector key).
        condition: one line, in user terms: what groups, turns, roles, per-step fields, critic,
            batch and trainer mode must be, and what happens otherwise.
        keys: the config keys the condition reads.
        check: the start-up check (sentences naming the key, the value and the fix), or None where
            the config alone does not decide it.
        not_at_start_up: with no ``check``: where it is checked instead, or why it is not refused.
    """

    kind: str
    plugin: str
    condition: str
    keys: tuple[str, ...]
    check: Check | None = None
    not_at_start_up: str = ""

    def __post_init__(self) -> None:
        if self.kind not in SELECTORS:
            raise ValueError(f"precondition kind {self.kind!r}; expected one of {tuple(SELECTORS)}")
        if (self.check is None) != bool(self.not_at_start_up):
            raise ValueError(f"precondition of {self.plugin!r}: give a check, or say where it is checked instead")


def declared() -> tuple[Precondition, ...]:
    """Every declared precondition, in declaration order."""
    return tuple(p for module in DECLARING_MODULES for p in importlib.import_module(module).PRECONDITIONS)


def selected(config: Any) -> set[tuple[str, str]]:
    """``(kind, name)`` of each plugin the config selects."""
    return {(kind, str(value)) for kind, key in SELECTORS.items() if (value := select(config, key)) is not None}


def precondition_problems(config: Any) -> list[str]:
    """The problems the preconditions of the selected plugins find (empty: none)."""
    chosen = selected(config)
    return [problem for p in declared() if p.check is not None and (p.kind, p.plugin) in chosen
            for problem in p.check(config)]


def verl_ext_trainer(kind: str, name: str, effect: str) -> Precondition:
    """The precondition of a plugin only the verl-ext trainers honour; ``effect``: what verl's own
    trainer does with it instead."""
    key = SELECTORS[kind]

    def check(config: Any) -> list[str]:
        return needs_verl_ext_trainer(config, key, name, effect)

    return Precondition(kind, name, f"a verl-ext trainer mode (`{TRAINER_MODE_KEY}=verl_ext_*`): verl's own trainer "
                        f"{effect}", (key, TRAINER_MODE_KEY, "trainer.use_v1"), check)


# ------------------------------------------------------------------------------------ the docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def preconditions_table() -> str:
    """The declarations as a markdown table: plugin, condition, keys checked at start-up."""
    rows = ["| plugin | condition | keys checked |", "|---|---|---|"]
    order = list(SELECTORS)
    for p in sorted(declared(), key=lambda p: (order.index(p.kind), p.plugin)):  # stable: declaration order within
        keys = ", ".join(f"`{key}`" for key in p.keys)
        checked = keys if p.check is not None else f"not at start-up: {p.not_at_start_up} (reads {keys})"
        rows.append(f"| {p.kind} `{p.plugin}` | {_cell(p.condition)} | {_cell(checked)} |")
    return "\n".join(rows) + "\n"


def render_section() -> str:
    """The "Preconditions" section of docs/reference/validation.md."""
    return (
        f"{SECTION_HEADING}\n\n"
        "When the output of an advantage estimator, a policy loss or an old-logit provider carries a learning\n"
        "signal. Each plugin declares these next to its code (a `PRECONDITIONS` tuple in\n"
        f"{', '.join(f'`{m}`' for m in DECLARING_MODULES)}); the start-up check `preconditions`\n"
        "runs those of the plugins the config selects, and `verl-ext doctor` shows what they refuse. This\n"
        "section is generated from the declarations: `python -m verl_ext.preconditions --write`.\n\n"
        + preconditions_table()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_ext.preconditions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the section in {DOCS_PAGE.name}")
    if parser.parse_args(argv).write:
        write_section(DOCS_PAGE, SECTION_HEADING, render_section())
    else:
        sys.stdout.write(render_section())
    return 0


if __name__ == "__main__":
    sys.exit(main())
