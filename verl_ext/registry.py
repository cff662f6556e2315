"""What verl-ext registers into verl, and the names a verl config selects plugins by.

A side-effect-free table: importing this module imports nothing heavy and changes nothing. The
``verl.plugins`` entry point (``verl_ext.plugin``) installs the post-import hooks that load each
plugin's module from it; ``verl-ext doctor``, the start-up checks (``verl_ext.validation``) and
``verl-ext list`` read it.

To add a plugin: write a module that registers on import and add a ``PluginSpec`` row below. An
advantage estimator needs no row: its rows are derived from the registered estimators
(``verl_ext.advantages.register_estimator``), so read the table through :func:`plugin_specs`.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from verl_ext.gpu_checks import select
from verl_ext.trainer_modes import VERL_EXT_TRAINERS

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

ESTIMATOR_REGISTRATION = "verl_ext.advantages.registration"  # registers every estimator in verl

# Every plugin but the advantage estimators (see plugin_specs).
PLUGINS: tuple[PluginSpec, ...] = (
    PluginSpec("cpu", "platform", "verl_ext.backends.cpu.platform"),
    PluginSpec("fsdp2@cpu", "engine", "verl_ext.backends.cpu.engines"),
    PluginSpec("hf", "rollout", "verl_ext.backends.hf.registration"),
    PluginSpec("host_memory", "checkpoint_engine", "verl_ext.backends.host_memory"),
    *(PluginSpec(name, "trainer", "verl_ext.trainer") for name in VERL_EXT_TRAINERS),
    PluginSpec("dvreward", "reward_manager", "verl_ext.rewards.dvreward.registration", extra="judge"),
    PluginSpec("ppo_ewma", "policy_loss", "verl_ext.losses.registration"),
    PluginSpec("opsm", "policy_loss", "verl_ext.losses.registration"),
    # its browser backends (verl_ext.envs): selenium + psutil drive Chromium, miniwob holds MiniWoB++'s
    # tasks, PIL turns screenshots into images for VL models; text_hybrid needs none of them
    PluginSpec("hybrid_gui_tool", "agent_loop", "verl_ext.agent_loops.registration", extra="gui",
               backend_requires={"minidesk": ("selenium", "psutil", "PIL"),
                                 "miniwob": ("selenium", "psutil", "miniwob", "PIL")}),
    PluginSpec("decision_turn", "agent_loop", "verl_ext.agent_loops.registration"),  # text prompts only
    PluginSpec("text_env", "agent_loop", "verl_ext.agent_loops.text_env"),
)


def plugin_specs() -> tuple[PluginSpec, ...]:
    """One row per name a verl config can select: the registered advantage estimators, then ``PLUGINS``."""
    from verl_ext.advantages import ESTIMATORS  # numpy only; imports the built-in estimators

    return (*(PluginSpec(name, "adv_estimator", ESTIMATOR_REGISTRATION) for name in ESTIMATORS), *PLUGINS)


LOAD_ERRORS: dict[str, BaseException] = {}
LOADED: set[str] = set()


def load_module(module: str) -> None:
    """Import a plugin's module once; a failure is kept in ``LOAD_ERRORS`` and logged, never raised."""
    if module in LOADED or module in LOAD_ERRORS:
        return
    try:
        importlib.import_module(module)
        LOADED.add(module)
    except Exception as exc:  # noqa: BLE001 - recorded and reported, never swallowed silently
        LOAD_ERRORS[module] = exc
        logger.warning("verl-ext: plugin module %s failed to import: %r (run `verl-ext doctor`)", module, exc)


def load_all() -> None:
    """Import every registry verl-ext targets (and so every plugin). For doctor and tests."""
    for trigger in dict.fromkeys(KIND_TRIGGERS.values()):
        try:
            importlib.import_module(trigger)
        except Exception as exc:  # noqa: BLE001
            LOAD_ERRORS[trigger] = exc
    for spec in plugin_specs():  # also covers hooks that could not fire because a trigger failed
        load_module(spec.module)


def importable(module: str) -> bool:
    """Whether ``import module`` can succeed here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[name] is None
        return False


def registered_names(kind: str) -> set[str]:
    """The names verl (or verl-ext) currently has registered for ``kind``."""
    if kind == "platform":
        from verl.plugin.platform import PlatformRegistry

        return set(PlatformRegistry.registered_names())
    if kind == "engine":
        from verl.workers.engine.base import EngineRegistry

        return {
            f"{backend}@{device}"
            for backend, devices in EngineRegistry._engines.get("language_model", {}).items()
            for device in devices
            if isinstance(device, str)
        }
    if kind == "rollout":
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        return set(RolloutReplicaRegistry._registry)
    if kind == "adv_estimator":
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

        return set(ADV_ESTIMATOR_REGISTRY)
    if kind == "policy_loss":
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

        return set(POLICY_LOSS_REGISTRY)
    if kind == "agent_loop":
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        return set(_agent_loop_registry)
    if kind == "reward_manager":
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

        return set(REWARD_MANAGER)
    if kind == "trainer":
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        return set(TRAINER_REGISTRY)
    if kind == "old_logits":
        from verl_ext.old_logits import registered_providers

        return set(registered_providers())
    raise ValueError(f"unknown plugin kind {kind!r}")


# (kind, config key) pairs whose values name a registered plugin.
CONFIG_KEYS: tuple[tuple[str, str], ...] = (
    ("rollout", "actor_rollout_ref.rollout.name"),
    ("adv_estimator", "algorithm.adv_estimator"),
    ("policy_loss", "actor_rollout_ref.actor.policy_loss.loss_mode"),
    ("agent_loop", "actor_rollout_ref.rollout.agent.default_agent_loop"),
    ("trainer", "trainer.v1.trainer_mode"),
    ("old_logits", "algorithm.old_logits.provider"),
)


def named_plugins(config: Any) -> Iterator[tuple[str, str, str]]:
    """Yield ``(kind, name, config_key)`` for every plugin the config selects."""
    for kind, key in CONFIG_KEYS:
        value = select(config, key)
        if value:
            yield kind, str(value), key
    reward_manager = select(config, "reward.reward_manager")
    if reward_manager is not None and select(reward_manager, "source") in (None, "register"):
        if select(reward_manager, "name"):
            yield "reward_manager", str(reward_manager.name), "reward.reward_manager.name"
    platform = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if platform:
        yield "platform", platform, "VERL_PLATFORM"
