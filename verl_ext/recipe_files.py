"""Where the recipes are, and ``verl-ext recipes``: copy them out of an installed package.

A wheel carries ``recipes/`` as ``verl_ext/shipped_recipes`` (``setup.py`` copies it at build time);
an editable install or a clone reads the repository's own ``recipes/``. A recipe's scripts find their
config beside themselves, so a copied recipe runs from wherever it was copied to.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from verl_ext.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED = PACKAGE_DIR / "shipped_recipes"
CLONE = PACKAGE_DIR.parent / "recipes"


def recipes_root() -> Path | None:
    """The folder holding the recipes: the wheel's copy, else the clone's, else None."""
    for folder in (SHIPPED, CLONE):
        if folder.is_dir():
            return folder
    return None


def recipe_names() -> list[str]:
    """Every recipe (a sub-folder with a ``run_*.sh``), sorted."""
    root = recipes_root()
    if root is None:
        return []
    return sorted(d.name for d in root.iterdir() if d.is_dir() and any(d.glob("run_*.sh")))


def copy_recipes(out: Path, names: list[str]) -> list[Path]:
    """Copies the named recipes (all when ``names`` is empty) to ``out/<name>``; refuses to overwrite."""
    root = recipes_root()
    if root is None:
        raise UserError("this installation has no recipes (neither verl_ext/shipped_recipes nor a clone's recipes/)")
    known = recipe_names()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise UserError(f"no recipe named {', '.join(unknown)}; known: {', '.join(known)}")
    copied = []
    for name in names or known:
        target = out / name
        if target.exists():
            raise UserError(f"{target} exists; pass another --out or remove it")
        shutil.copytree(root / name, target, ignore=shutil.ignore_patterns("__pycache__"))
        copied.append(target)
    return copied


def main(argv: list[str]) -> int:
    from verl_ext.cli_args import command_parser

    parser = command_parser("verl-ext recipes", __doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help="recipes to copy (all when none is named)")
    parser.add_argument("--out", type=Path, default=Path("recipes"), help="folder to copy them into")
    args = parser.parse_args(argv)
    for target in copy_recipes(args.out, args.names):
        print(f"copied {target.name} -> {target}")
    print(f"run one with, e.g.: bash {args.out}/quickstart/run_cpu.sh")
    return 0
