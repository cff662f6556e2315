"""The install the README gives works as written: a wheel built with ``python -m build`` and a
plain ``pip install .`` of the clone each give a working ``verl-ext`` in a fresh venv, with the
plugin fragments and the recipes inside the installed files.

The fresh venvs sit on top of this test venv's packages (``tests/venvs.py``) and install verl-ext
with ``--no-deps``: what is checked is verl-ext's own package (its files, entry points, metadata),
without downloading torch and verl a second time."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import verl_ext

from .venvs import layered_venv, run_ok

REPO = Path(__file__).resolve().parents[1]

# `verl-ext doctor`, then the recipe composed from the installed files (the wheel's recipe copy and
# its Hydra fragments), in one process: each start imports verl, which takes most of a minute here.
DOCTOR_AND_COMPOSE = """
import sys, verl_ext
from verl_ext.cli import main
from verl_ext.compose import compose
assert main(["doctor"]) == 0
config = compose(["+recipe=toolcua_hybrid", "+plugins/backend=cpu"], sys.argv[1], "ppo_trainer")
print(verl_ext.__file__)
print(config.algorithm.adv_estimator, config.trainer.v1.trainer_mode, config.trainer.device)
"""


def _source_copy(tmp_path: Path) -> Path:
    """The tracked and untracked-but-not-ignored files of the clone (what a fresh clone holds)."""
    listed = run_ok(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO).stdout
    source = tmp_path / "source"
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    return source


def _install(tmp_path: Path, package: str) -> tuple[Path, Path]:
    """Installs ``package`` into a fresh layered venv; returns (venv, its site-packages)."""
    venv = tmp_path / "venv"
    site = layered_venv(venv)
    run_ok([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-deps", package])
    version = run_ok([str(venv / "bin/verl-ext"), "--version"], cwd=tmp_path).stdout.strip()
    assert version == f"verl-ext {verl_ext.__version__}"
    return venv, site


@pytest.mark.timeout(600)
def test_built_wheel_installs_and_carries_fragments_and_recipes(tmp_path: Path):
    source = _source_copy(tmp_path)
    run_ok([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(source)])
    wheel, = (tmp_path / "dist").glob("verl_ext-*.whl")
    venv, site = _install(tmp_path, str(wheel))
    cli = str(venv / "bin/verl-ext")
    copied = run_ok([cli, "recipes", "--out", "my_recipes", "toolcua_hybrid"], cwd=tmp_path).stdout
    assert "copied toolcua_hybrid" in copied
    recipe = tmp_path / "my_recipes/toolcua_hybrid"
    assert (recipe / "run_cpu.sh").is_file() and (recipe / "recipe/toolcua_hybrid.yaml").is_file()
    run = run_ok([str(venv / "bin/python"), "-c", DOCTOR_AND_COMPOSE, str(recipe)], cwd=tmp_path)
    where, composed = run.stdout.strip().split("\n")[-2:]
    assert where.startswith(str(site)), f"verl_ext came from {where}, not the fresh venv"
    assert composed == "hgpo verl_ext_sync cpu"


@pytest.mark.timeout(300)
def test_pip_install_from_a_clone_carries_the_recipes(tmp_path: Path):
    venv, _ = _install(tmp_path, str(_source_copy(tmp_path)))
    listed = run_ok([str(venv / "bin/verl-ext"), "list", "recipes"], cwd=tmp_path).stdout.split()
    assert listed[0] == "recipes:" and "toolcua_hybrid" in listed and "quickstart" in listed
