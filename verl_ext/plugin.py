"""The ``verl.plugins`` entry point: registers every verl-ext plugin into verl's registries.

verl imports this module in every process (driver, TaskRunner, workers, inference servers) and
swallows its errors at DEBUG level, so this module (1) does no heavy work itself: each plugin's
module is imported by a post-import hook when verl imports the registry it belongs to; (2)
records every failure in ``verl_ext.registry.LOAD_ERRORS`` and logs it at WARNING, so ``verl-ext doctor`` and the
start-up checks can name what is missing; and (3) has ``main_ppo``'s ``validate_config`` run
verl-ext's start-up checks (``verl_ext.validation``) in the driver, whatever the trainer mode.

The plugin table is ``verl_ext.registry``.
"""

from __future__ import annotations

import sys

from verl_ext import patches
from verl_ext._post_import import when_imported
from verl_ext.losses import behaviour
from verl_ext.registry import KIND_TRIGGERS, load_module, plugin_specs


def install_hooks() -> None:
    for spec in plugin_specs():
        when_imported(KIND_TRIGGERS[spec.kind], lambda module=spec.module: load_module(module))
    # the driver's start-up validation, under every trainer mode (verl_ext.validation)
    when_imported(VALIDATE_CONFIG_MODULE, _validate_in_the_driver)
    # the rows' rollout log-probs for OPSM's loss call (verl_ext.losses.behaviour; a no-op without opsm_delta)
    when_imported(behaviour.TARGET_MODULE, lambda: behaviour.install(sys.modules[behaviour.TARGET_MODULE]))


VALIDATE_CONFIG_MODULE = "verl.utils.config"  # main_ppo calls its validate_config before Ray starts


def _validate_in_the_driver() -> None:
    from verl_ext import validation

    validation.wrap_verl_validate_config(sys.modules[VALIDATE_CONFIG_MODULE])


install_hooks()
patches.install()
# The root logger is left alone: with no handler configured anywhere, Python's last-resort handler
# still prints verl-ext's warnings to stderr.
