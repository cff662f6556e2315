"""Everything is in pyproject.toml except this: the wheel carries the repository's ``recipes/`` as
``verl_ext/shipped_recipes`` (package data can only name files inside a package), so a user who
installed the wheel gets the recipes with ``verl-ext recipes``."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RECIPES = Path(__file__).resolve().parent / "recipes"


class BuildPyWithRecipes(build_py):
    def run(self) -> None:
        super().run()
        # An editable install reads the clone's recipes/ directly (verl_ext.recipe_files).
        if not self.editable_mode and RECIPES.is_dir():
            shutil.copytree(RECIPES, Path(self.build_lib) / "verl_ext" / "shipped_recipes", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "runs", "outputs"))


setup(cmdclass={"build_py": BuildPyWithRecipes})
