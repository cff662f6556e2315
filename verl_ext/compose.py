"""The config ``python -m verl.trainer.main_ppo`` composes, composed in this process (Hydra), for
``verl-ext doctor``, the recipe checks and the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VERL_CONFIG = "pkg://verl.trainer.config"


def compose(overrides: list[str], config_dir: str | None = None, config_name: str = "ppo_trainer") -> Any:
    """The config ``python -m verl.trainer.main_ppo [--config-dir DIR] [--config-name NAME] overrides``
    composes, with Hydra's own section (``hydra.overrides.task`` is the command line)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    folder = Path(config_dir).resolve() if config_dir else None
    # as main_ppo's --config-dir: DIR and verl's own configs both on the search path; Hydra looks
    # for the primary config in the first one only
    if folder is not None and (folder / f"{config_name}.yaml").exists():
        context = initialize_config_dir(config_dir=str(folder), version_base=None)
        overrides = _with_search_path(overrides, VERL_CONFIG)
    else:
        context = initialize_config_module(config_module="verl.trainer.config", version_base=None)
        if folder is not None:
            overrides = _with_search_path(overrides, f"file://{folder}")
    with context:
        return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)


def _with_search_path(overrides: list[str], entry: str) -> list[str]:
    for i, override in enumerate(overrides):
        if override.startswith("hydra.searchpath="):
            listed = override.split("=", 1)[1].strip().removeprefix("[").removesuffix("]")
            return [*overrides[:i], f"hydra.searchpath=[{listed},{entry}]", *overrides[i + 1:]]
    return [*overrides, f"hydra.searchpath=[{entry}]"]
