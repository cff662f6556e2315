"""verl's trainer modes and the verl-ext trainers that extend them (``trainer.v1.trainer_mode``).

Importing this module imports nothing heavy and changes nothing; the old-logit providers, the
losses' and estimators' preconditions and the start-up checks read it.
"""

from __future__ import annotations

from typing import Any

from verl_ext.gpu_checks import select

TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
# verl's trainer mode -> the verl-ext trainer that extends it (verl_ext.trainer registers them)
VERL_EXT_TWIN = {"sync": "verl_ext_sync", "colocate_async": "verl_ext_colocate_async",
                 "separate_async": "verl_ext_separate_async"}
VERL_EXT_TWIN_BASE = {twin: base for base, twin in VERL_EXT_TWIN.items()}
VERL_EXT_TRAINERS = tuple(VERL_EXT_TWIN.values())


def base_trainer_mode(config: Any) -> str:
    """verl's trainer mode the configured one is or extends (``verl_ext_separate_async`` ->
    ``separate_async``)."""
    mode = str(select(config, TRAINER_MODE_KEY, "sync"))
    return VERL_EXT_TWIN_BASE.get(mode, mode)


def needs_verl_ext_trainer(config: Any, key: str, value: Any, effect: str) -> list[str]:
    """The problem of ``key=value``, which only a verl-ext trainer honours, under the configured
    trainer (none under a verl-ext one); ``effect``: what verl's own trainer does with it instead."""
    mode = str(select(config, TRAINER_MODE_KEY, "sync"))
    if not select(config, "trainer.use_v1", True):
        where, fix = "trainer.use_v1=false (verl's legacy trainer)", f"trainer.use_v1=true {TRAINER_MODE_KEY}=verl_ext_sync"
    elif mode in VERL_EXT_TRAINERS:
        return []
    else:
        where = f"{TRAINER_MODE_KEY}={mode} is verl's own trainer"
        fix = f"{TRAINER_MODE_KEY}={VERL_EXT_TWIN.get(mode, ' or '.join(VERL_EXT_TRAINERS))}"
    return [f"{key}={value} needs a verl-ext trainer, but {where}, which {effect}: set {fix}"]
