"""The ``verl-ext`` front end: ``--version``, ``list`` read from the registries, ``recipes`` copying
the recipes out, and help that is plain text with each option's default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import verl_ext
from verl_ext import cli, cli_args, recipe_files
from verl_ext.errors import UserError

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"verl-ext {verl_ext.__version__}"


def test_list_names_what_the_registries_and_files_hold(capsys):
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from verl_ext.advantages import ESTIMATORS
    from verl_ext.old_logits import registered_providers

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    sections = dict(re.findall(r"^(\w[\w ]*):\n((?:  .*\n)*)", out, re.M))
    items = {name: body.split() for name, body in sections.items()}
    assert items["providers"] == registered_providers()
    assert items["estimators"] == sorted(ESTIMATORS)
    assert {"verl_ext_sync", "verl_ext_colocate_async", "sync"} <= set(items["trainer modes"])
    assert items["trainer modes"] == sorted(TRAINER_REGISTRY)
    fragments = {f"+plugins/{p.parent.name}={p.stem}" for p in (REPO / "verl_ext/plugins").glob("*/*.yaml")}
    assert set(items["fragments"]) == fragments
    assert set(items["recipes"]) == {d.name for d in (REPO / "recipes").iterdir() if any(d.glob("run_*.sh"))}


def test_recipes_copies_runnable_folders_and_refuses_to_overwrite(tmp_path: Path):
    copied = recipe_files.copy_recipes(tmp_path, ["quickstart"])
    assert copied == [tmp_path / "quickstart"] and (tmp_path / "quickstart/run_cpu.sh").is_file()
    with pytest.raises(UserError, match="exists; pass another --out"):
        recipe_files.copy_recipes(tmp_path, ["quickstart"])
    with pytest.raises(UserError, match="no recipe named nope; known: .*toolcua_hybrid"):
        recipe_files.copy_recipes(tmp_path, ["nope"])


@pytest.mark.parametrize("command", ["doctor", "list", "recipes", "prepare-data", "make-tiny-model",
                                     "dv-questions", "judge-server"])
def test_help_is_plain_text_with_defaults(command: str, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and not re.search(r":\w+:`", text), text
    assert "(default:" in text or command in ("list", "dv-questions"), text


def test_plain_text_removes_restructuredtext_markup():
    assert cli_args.plain_text("Runs ``main_ppo`` through :func:`verl_ext.compose.compose`.") == \
        "Runs main_ppo through verl_ext.compose.compose."

