"""``verl-ext doctor``, and the start-up check that everything a config names is registered.

verl logs a plugin's import error at DEBUG and carries on, so a missing optional dependency
shows up much later as "Unknown adv estimator" or a KeyError deep in a worker. This module
turns that into one clear error naming the plugin, the import that failed and the pip extra
that provides it. With overrides (or ``--config-dir``/``--config-name``, as ``main_ppo`` takes them)
doctor composes the config and runs every start-up check (``verl_ext.validation``), the same the
training driver and the verl-ext trainers run, and exits 1 when any fails.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import open_dict
from packaging.requirements import Requirement

from verl_ext import gpu_checks, plugin
from verl_ext.cli import command_parser
from verl_ext.gpu_checks import installed_version, select
from verl_ext.megatron_checks import megatron_report

DISTRIBUTION = "verl-ext"


def extras() -> dict[str, list[Requirement]]:
    """``pip install verl-ext[<extra>]`` -> its requirements, read from the installed package's
    metadata (pyproject's ``optional-dependencies``), so this never drifts from pyproject."""
    names = importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    requirements = [Requirement(line) for line in importlib.metadata.requires(DISTRIBUTION) or []]
    return {extra: [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]
            for extra in names}


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


def _explain_missing(kind: str, name: str, key: str) -> str:
    spec = next((s for s in plugin.PLUGINS if s.name == name and s.kind == kind), None)
    if spec is None:
        return f"{key}={name}: no {kind} named {name!r} is registered (not a verl-ext plugin either; check the spelling)"
    error = plugin.LOAD_ERRORS.get(spec.module)
    message = f"{key}={name}: the verl-ext {kind} plugin did not register"
    if error is not None:
        missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
        message += f" because importing {spec.module} failed: {error!r}"
        if missing:
            message += f". The missing module is {missing!r}"
    if spec.extra:
        message += f". Install it with: pip install 'verl-ext[{spec.extra}]'"
    return message


def plugin_problems(config: Any) -> list[str]:
    """Every plugin named in ``config`` that is not registered, explained."""
    plugin.load_all()
    problems = []
    for kind, name, key in named_plugins(config):
        try:
            names = registered_names(kind)
        except Exception as exc:  # noqa: BLE001 - a registry that cannot even be imported is a problem too
            problems.append(f"{key}={name}: cannot read verl's {kind} registry: {exc!r}")
            continue
        if name not in names:
            problems.append(_explain_missing(kind, name, key))
    return problems


def dependency_problems(config: Any) -> list[str]:
    """Every module a selected agent loop imports only once it runs rows of the env backends the
    training rows name (``PluginSpec.backend_requires``) that is not installed, naming the pip
    extra: without this check such a run starts and every agent loop fails deep inside it."""
    from verl_ext.validation import env_backends  # validation imports this module

    problems = []
    for kind, name, key in named_plugins(config):
        spec = next((s for s in plugin.PLUGINS if s.name == name and s.kind == kind), None)
        if spec is None or not spec.backend_requires:
            continue
        backends = sorted(env_backends(config) & spec.backend_requires.keys())
        required = dict.fromkeys(m for b in backends for m in spec.backend_requires[b])
        missing = [m for m in required if not importable(m)]
        if missing:
            fix = f"pip install 'verl-ext[{spec.extra}]'" if spec.extra else "install them"
            problems.append(f"{key}={name} on env backend {', '.join(backends)} needs "
                            f"{', '.join(repr(m) for m in missing)}, not installed here: {fix}")
    return problems


def check_requirements(config: Any) -> list[str]:
    """Every plugin ``config`` names that is not registered or not installed here, each naming the
    config key and the fix; one of ``verl_ext.validation``'s checks (add config checks there)."""
    return plugin_problems(config) + dependency_problems(config)


VERL_CONFIG = "pkg://verl.trainer.config"


def print_megatron_report() -> None:
    """Print ``megatron_checks.megatron_report``'s lines (a missing stack fails only Megatron configs)."""
    for line in megatron_report()[0]:
        print(f"  {line}")


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


def verl_problems(config: Any) -> list[str]:
    """What verl's own ``validate_config`` (``main_ppo``'s first check) refuses, as one problem."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as verl_config
    from verl.utils.device import auto_set_device

    validate = getattr(verl_config.validate_config, "__wrapped__", verl_config.validate_config)  # verl's alone
    try:
        auto_set_device(config)
        validate(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except Exception as exc:  # noqa: BLE001 - verl raises AssertionError, ValueError, KeyError, ...
        return [f"verl's validate_config: {type(exc).__name__}: {exc}"]
    return []


def main(argv: list[str]) -> int:
    parser = command_parser(
        "verl-ext doctor",
        "Report verl, verl-ext plugins, optional dependencies and patches; with overrides, also compose "
        "the config and run every start-up check on it (exit 1 when one fails).",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as passed to verl.trainer.main_ppo")
    parser.add_argument("--config-dir", help="as main_ppo's --config-dir (a recipe folder: recipes/toolcua_hybrid)")
    parser.add_argument("--config-name", default="ppo_trainer", help="as main_ppo's --config-name")
    parser.add_argument("--gpu", action="store_true",
                        help="also fail when this machine is not ready for a GPU run (CUDA, vLLM, transformers)")
    args = parser.parse_args(argv)

    import verl

    import verl_ext
    from verl_ext import patches

    plugin.load_all()
    print(f"verl {verl.__version__} (verl-ext {verl_ext.__version__} is built for verl {verl_ext.VERL_VERSION})")
    ok = verl.__version__ == verl_ext.VERL_VERSION
    print("\nplugins:")
    for spec in plugin.PLUGINS:
        error = plugin.LOAD_ERRORS.get(spec.module)
        try:
            registered = spec.name in registered_names(spec.kind)
        except Exception:  # noqa: BLE001
            registered = False
        status = "registered" if registered else f"MISSING ({error!r})" if error else "MISSING"
        print(f"  {spec.kind:<15} {spec.name:<26} {status}")
    try:
        providers = ", ".join(sorted(registered_names("old_logits")))
    except Exception as exc:  # noqa: BLE001
        providers, ok = f"MISSING ({exc!r})", False
    print(f"  {'old_logits':<15} {providers}")
    print("\noptional dependencies (pip install 'verl-ext[<extra>]'):")
    for extra, requirements in extras().items():
        for requirement in requirements:
            version = installed_version(requirement.name)
            state = "missing" if version is None else version
            if version is not None and version not in requirement.specifier:
                state += f" (wants {requirement.specifier})"
            print(f"  [{extra}] {requirement.name:<16} {state}")
    print("\npatches (the first ones on the cpu backend only, logprob_row_blocks and separate_async_log_flush"
          " everywhere, weight_socket_* wherever vLLM runs; 'applied' counts this process only):")
    for patch in (*patches.PATCHES, *patches.ENGINE_PATCHES, *patches.TRAINER_PATCHES, *patches.VLLM_PATCHES):
        state = "applied" if patch.name in patches.APPLIED else patches.SKIPPED.get(patch.name, "not applied")
        try:
            needed = "still needed" if patch.snippet_in_module_file() else "target changed: review the patch"
        except Exception as exc:  # noqa: BLE001
            needed = f"target missing: {exc!r}"
        print(f"  {patch.name:<34} {state:<12} {needed}")
    print("\nGPU readiness (vLLM + FSDP):")
    lines, gpu_ready = gpu_checks.readiness_report()
    for line in lines:
        print(f"  {line}")
    if args.gpu:
        ok = ok and gpu_ready
    print("\nMegatron readiness (verl's Megatron engine: TransformerEngine, megatron-core, Megatron-Bridge):")
    print_megatron_report()
    if args.overrides or args.config_dir or args.config_name != "ppo_trainer":
        from verl_ext import validation

        config = compose(args.overrides, args.config_dir, args.config_name)
        command_line = list(config.hydra.overrides.task)
        with open_dict(config):
            del config["hydra"]
        problems = verl_problems(config) + validation.problems(config, command_line)  # what the driver refuses
        if args.gpu:
            problems += validation.machine_problems(config)
        print("\nconfig check (docs/reference/validation.md):")
        for problem in problems or [f"all {len(validation.CHECKS)} start-up checks pass"]:
            print(f"  {problem}")
        ok = ok and not problems
    return 0 if ok else 1
