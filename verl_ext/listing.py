"""``verl-ext list``: what this installation offers, read from the registries and the installed files.

Plugin fragments come from the package's ``plugins/`` folder (what ``+plugins/<group>=<name>`` can
name), recipes from ``verl_ext.recipe_files``, providers and estimators from their registries, and
trainer modes from verl's trainer registry after verl-ext's plugins are loaded.
"""

from __future__ import annotations

from pathlib import Path

from verl_ext import recipe_files

FRAGMENTS = Path(__file__).resolve().parent / "plugins"


def fragments() -> list[str]:
    """Every Hydra fragment as the override that composes it: ``+plugins/<group>=<name>``."""
    return sorted(f"+plugins/{path.parent.name}={path.stem}" for path in FRAGMENTS.glob("*/*.yaml"))


def providers() -> list[str]:
    from verl_ext.old_logits import registered_providers

    return registered_providers()


def estimators() -> list[str]:
    from verl_ext.advantages import ESTIMATORS

    return sorted(ESTIMATORS)


def trainer_modes() -> list[str]:
    """Values ``trainer.v1.trainer_mode`` accepts here: verl's own and verl-ext's."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_ext import registry

    registry.load_all()
    return sorted(TRAINER_REGISTRY)


SECTIONS = {
    "fragments": fragments,
    "recipes": recipe_files.recipe_names,
    "providers": providers,
    "estimators": estimators,
    "trainer modes": trainer_modes,
}


def main(argv: list[str]) -> int:
    from verl_ext.cli_args import command_parser

    parser = command_parser("verl-ext list", __doc__)
    parser.add_argument("what", nargs="?", choices=[name.replace(" ", "-") for name in SECTIONS],
                        help="one section only (all when omitted)")
    args = parser.parse_args(argv)
    for name, read in SECTIONS.items():
        if args.what in (None, name.replace(" ", "-")):
            print(f"{name}:")
            print("\n".join(f"  {item}" for item in read()))
    return 0
