"""The ``verl.plugins`` entry point: registers every verl-ext plugin into verl's registries.

verl imports this module in every process (driver, TaskRunner, workers, inference servers) and
swallows its errors at DEBUG level, so this module (1) does no heavy work itself: each plugin's
module is imported by a post-import hook when verl imports the registry it belongs to; (2)
records every failure in ``LOAD_ERRORS`` and logs it at WARNING, so ``verl-ext doctor`` and the
start-up checks can name what is missing; and (3) has ``main_ppo``'s ``validate_config`` run
verl-ext's start-up checks (``verl_ext.validation``) in the driver, whatever the trainer mode.

To add a plugin: write a module that registers on import and add a ``PluginSpec`` row below.
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass, field

from verl_ext import patches
from verl_ext._post_import import when_imported

logger = logging.getLogger("verl_ext")


@dataclass(frozen=True)
class PluginSpec:
    """One name a verl config can select, and where it comes from.

    Attributes:
        name: the value a config uses (``algorithm.adv_estimator=gigpo``, ``rollout.name=hf``).
        kind: which verl registry the name lives in (see ``KIND_TRIGGERS``).
        module: the verl-ext module that registers ``name`` when imported.
        extra: the ``pip install verl-ext[<extra>]`` that provides its optional dependencies.
        backend_requires: env backend -> the modules an agent loop imports only once it runs rows of
            that backend (``extra_info.env.backend``; e.g. the browser driver it starts per episode):
            importing ``module`` does not check them, so the start-up checks (``verl_ext.validation``)
            do, for the backends the training rows name.
    """

    name: str
    kind: str
    module: str
    extra: str | None = None
    backend_requires: dict[str, tuple[str, ...]] = field(default_factory=dict)


# kind -> verl module whose import makes that registry available (the hook fires after it).
KIND_TRIGGERS: dict[str, str] = {
    "platform": "verl.plugin.platform",
    "engine": "verl.workers.engine.fsdp.transformer_impl",
    "rollout": "verl.workers.rollout.base",
    "adv_estimator": "verl.trainer.ppo.core_algos",
    "policy_loss": "verl.trainer.ppo.core_algos",
    "agent_loop": "verl.experimental.agent_loop",
    "reward_manager": "verl.experimental.reward_loop.reward_manager",
    "trainer": "verl.trainer.ppo.v1",
    "old_logits": "verl.trainer.ppo.v1",
    "checkpoint_engine": "verl.checkpoint_engine.base",
}

PLUGINS: tuple[PluginSpec, ...] = (
    PluginSpec("gigpo", "adv_estimator", "verl_ext.advantages.registration"),
    PluginSpec("hgpo", "adv_estimator", "verl_ext.advantages.registration"),
    PluginSpec("step_grouped", "adv_estimator", "verl_ext.advantages.registration"),
    PluginSpec("himac", "adv_estimator", "verl_ext.advantages.registration"),
    PluginSpec("hiper", "adv_estimator", "verl_ext.advantages.registration"),
    PluginSpec("cpu", "platform", "verl_ext.backends.cpu.platform"),
    PluginSpec("fsdp2@cpu", "engine", "verl_ext.backends.cpu.engines"),
    PluginSpec("hf", "rollout", "verl_ext.backends.cpu.registration"),
    PluginSpec("host_memory", "checkpoint_engine", "verl_ext.backends.host_memory"),
    PluginSpec("verl_ext_sync", "trainer", "verl_ext.trainer"),
    PluginSpec("verl_ext_colocate_async", "trainer", "verl_ext.trainer"),
    PluginSpec("verl_ext_separate_async", "trainer", "verl_ext.trainer"),
    PluginSpec("dvreward", "reward_manager", "verl_ext.rewards.dvreward.registration", extra="judge"),
    PluginSpec("ppo_ewma", "policy_loss", "verl_ext.losses.registration"),
    # its browser backends (verl_ext.envs): selenium + psutil drive Chromium, miniwob holds MiniWoB++'s
    # tasks, PIL turns screenshots into images for VL models; text_hybrid needs none of them
    PluginSpec("hybrid_gui_tool", "agent_loop", "verl_ext.agent_loops.registration", extra="gui",
               backend_requires={"minidesk": ("selenium", "psutil", "PIL"),
                                 "miniwob": ("selenium", "psutil", "miniwob", "PIL")}),
    PluginSpec("decision_turn", "agent_loop", "verl_ext.agent_loops.registration"),  # text prompts only
    PluginSpec("text_env", "agent_loop", "verl_ext.agent_loops.text_env"),
)

LOAD_ERRORS: dict[str, BaseException] = {}
LOADED: set[str] = set()


def _load(module: str) -> None:
    if module in LOADED or module in LOAD_ERRORS:
        return
    try:
        importlib.import_module(module)
        LOADED.add(module)
    except Exception as exc:  # noqa: BLE001 - recorded and reported, never swallowed silently
        LOAD_ERRORS[module] = exc
        logger.warning("verl-ext: plugin module %s failed to import: %r (run `verl-ext doctor`)", module, exc)


def install_hooks() -> None:
    for spec in PLUGINS:
        when_imported(KIND_TRIGGERS[spec.kind], lambda module=spec.module: _load(module))
    # the driver's start-up validation, under every trainer mode (verl_ext.validation)
    when_imported(VALIDATE_CONFIG_MODULE, _validate_in_the_driver)


VALIDATE_CONFIG_MODULE = "verl.utils.config"  # main_ppo calls its validate_config before Ray starts


def _validate_in_the_driver() -> None:
    from verl_ext import validation

    validation.wrap_verl_validate_config(sys.modules[VALIDATE_CONFIG_MODULE])


def load_all() -> None:
    """Import every registry verl-ext targets (and so every plugin). For doctor and tests."""
    for trigger in dict.fromkeys(KIND_TRIGGERS.values()):
        try:
            importlib.import_module(trigger)
        except Exception as exc:  # noqa: BLE001
            LOAD_ERRORS[trigger] = exc
    for spec in PLUGINS:  # also covers hooks that could not fire because a trigger failed
        _load(spec.module)


install_hooks()
patches.install()
# verl-ext's own modules use `logger.warning` for failures; make sure they are visible even when
# verl set the root logger to WARNING before any handler existed.
if not logger.handlers and not logging.getLogger().handlers:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
