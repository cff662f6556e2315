"""One validation layer: everything verl-ext can tell is wrong with a composed config before any
worker starts.

Three entry points call :func:`problems` and so can never disagree: ``verl-ext doctor`` (with
overrides or ``--config-dir``), the driver of ``python -m verl.trainer.main_ppo`` (verl's
``validate_config`` runs it next to verl's own checks, under every trainer mode: see
:func:`wrap_verl_validate_config`) and the verl-ext trainers' start-up. Each check reads only the
config, the files it names and the environment, and returns sentences that name the key, the value
and the fix. ``docs/reference/validation.md`` has the table of checks and messages.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from verl_ext import VERL_VERSION, gpu_checks, registry
from verl_ext.config_data import AGENT_LOOP_FILE_KEY, agent_loop_file, agent_loops, data_files, env_backends
from verl_ext.fragment_overrides import fragment_conflicts
from verl_ext.gpu_checks import select
from verl_ext.preconditions import precondition_problems
from verl_ext.registry import PLUGINS, importable, load_all, named_plugins, registered_names
from verl_ext.trainer_modes import base_trainer_mode, needs_verl_ext_trainer

logger = logging.getLogger("verl_ext")

# env backends that drive Chromium (verl_ext.envs.pool): hybrid_gui_tool's backends that need selenium (the
# plugin table is where they are listed)
BROWSER_BACKENDS = frozenset(backend for spec in PLUGINS for backend, modules in spec.backend_requires.items()
                             if "selenium" in modules)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")

Check = Callable[[Any], list[str]]
CHECKS: dict[str, Check] = {}


def check(func: Check) -> Check:
    """Register ``func`` as a start-up check (its name is the check's name in docs/reference/validation.md)."""
    CHECKS[func.__name__] = func
    return func


class ConfigError(ValueError):
    """The config cannot train as asked; the message lists every problem found."""


def problems(config: Any, command_line: list[str] | None = None) -> list[str]:
    """Every problem of ``config``, one sentence each (empty: none).

    Args:
        config: the composed config (OmegaConf DictConfig, as ``main_ppo`` receives it).
        command_line: Hydra's command-line overrides (``hydra.overrides.task``), where known: with
            them, a fragment and a plain override that disagree on the same command line are found.
    """
    found = [p for run in CHECKS.values() for p in run(config)]
    if command_line:
        found += fragment_conflicts(command_line)
    return found


def assert_valid(config: Any, command_line: list[str] | None = None, machine: bool = False) -> None:
    """Raise :class:`ConfigError` listing every problem; ``machine`` adds this machine's readiness
    (:func:`machine_problems`)."""
    found = problems(config, command_line)
    if machine:
        found += machine_problems(config)
    if found:
        raise ConfigError("verl-ext: this config cannot train as asked:\n  - " + "\n  - ".join(found))


# ----------------------------------------------------------------------------------- the checks


@check
def plugins_registered(config: Any) -> list[str]:
    """Every plugin the config names is registered and its run-time imports are installed."""
    return check_requirements(config)


def _explain_missing(kind: str, name: str, key: str) -> str:
    spec = next((s for s in registry.plugin_specs() if s.name == name and s.kind == kind), None)
    if spec is None:
        return f"{key}={name}: no {kind} named {name!r} is registered (not a verl-ext plugin either; check the spelling)"
    error = registry.LOAD_ERRORS.get(spec.module)
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
    load_all()
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
    problems = []
    for kind, name, key in named_plugins(config):
        spec = next((s for s in registry.plugin_specs() if s.name == name and s.kind == kind), None)
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
    config key and the fix; the ``plugins_registered`` check."""
    return plugin_problems(config) + dependency_problems(config)


@check
def micro_batches_divide(config: Any) -> list[str]:
    return gpu_checks.batch_problems(config)


def _hook_features(config: Any) -> Iterator[tuple[str, Any, str]]:
    """``(key, value, what verl's own trainer does with it)`` for each setting, other than a plugin
    with preconditions (``verl_ext.preconditions``), that only a verl-ext trainer honours."""
    from verl_ext.rewards import postprocess

    if select(config, "reward.reward_manager.name") == "dvreward":
        yield ("reward.reward_manager.name", "dvreward",
               "trains on the rows the judge could not score (dv_valid=0) as if they had scored failed_score")
    algorithm = select(config, "algorithm")
    if algorithm is not None and postprocess.enabled(algorithm):
        yield (f"{postprocess.PATH_LENGTH_KEY}.weight", select(algorithm, f"{postprocess.PATH_LENGTH_KEY}.weight"),
               "ignores the group term R_length")


@check
def verl_ext_trainer_selected(config: Any) -> list[str]:
    """Settings only the verl-ext trainers read are refused under verl's own trainer, which would
    ignore them (or fail on them after a rollout)."""
    return [p for key, value, effect in _hook_features(config) for p in needs_verl_ext_trainer(config, key, value, effect)]


@check
def preconditions(config: Any) -> list[str]:
    """The preconditions of the selected estimator, loss and old-logit provider
    (``verl_ext.preconditions``; the section "Preconditions" of docs/reference/validation.md)."""
    return precondition_problems(config)


@check
def old_logits_settings(config: Any) -> list[str]:
    """``algorithm.old_logits.*`` parses (unknown keys, ``beta`` with ``com``, bad choices) and names
    a registered provider; the provider's own conditions are its preconditions."""
    from verl_ext.old_logits.preconditions import configured_provider

    try:
        configured_provider(config)
    except (TypeError, ValueError) as exc:
        return [str(exc)]
    return []


SEPARATE_ASYNC_KEY = "trainer.v1.separate_async"
CHECKPOINT_ENGINE_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"


@check
def separate_async_settings(config: Any) -> list[str]:
    """What verl's ``separate_async`` trainer asserts in its constructor, named with the fix before
    any worker starts: a checkpoint engine between the pools, a standalone rollout pool, a batch of
    ``parameter_sync_step`` mini-batches; on the cpu backend, enough (fake) GPUs in Ray for both pools."""
    if base_trainer_mode(config) != "separate_async":
        return []
    found = []
    if str(select(config, CHECKPOINT_ENGINE_KEY, "naive")) == "naive":
        found.append(f"{CHECKPOINT_ENGINE_KEY}=naive cannot move weights between separate pools: set it to nccl "
                     "(GPUs on their own devices) or host_memory (the cpu backend, or both pools on one device)")
    rollout_gpus = int(select(config, "actor_rollout_ref.rollout.nnodes", 0)) * int(
        select(config, "actor_rollout_ref.rollout.n_gpus_per_node", 0))
    if rollout_gpus <= 0:
        found.append("separate_async needs a standalone rollout pool: set actor_rollout_ref.rollout.nnodes and "
                     "actor_rollout_ref.rollout.n_gpus_per_node (each > 0)")
    sync_step = int(select(config, f"{SEPARATE_ASYNC_KEY}.parameter_sync_step", 1))
    batch = int(select(config, "data.train_batch_size", 0))
    mini = int(select(config, "actor_rollout_ref.actor.ppo_mini_batch_size", 0))
    if batch != sync_step * mini:
        found.append(f"data.train_batch_size={batch} must equal {SEPARATE_ASYNC_KEY}.parameter_sync_step={sync_step} "
                     f"x actor_rollout_ref.actor.ppo_mini_batch_size={mini} (one mini-batch per local update): set "
                     f"ppo_mini_batch_size={batch // max(1, sync_step)} or parameter_sync_step={batch // max(1, mini)}")
    if str(select(config, "trainer.device", "cuda")) == "cpu" and rollout_gpus > 0:
        trainer_gpus = int(select(config, "trainer.nnodes", 1)) * int(select(config, "trainer.n_gpus_per_node", 1))
        ray_gpus = select(config, "ray_kwargs.ray_init.num_gpus")
        if ray_gpus is not None and int(ray_gpus) < trainer_gpus + rollout_gpus:
            found.append(f"ray_kwargs.ray_init.num_gpus={ray_gpus}: the cpu backend's fake GPUs must cover the trainer "
                         f"pool ({trainer_gpus}) and the standalone rollout pool ({rollout_gpus}), or Ray waits for "
                         f"them forever: set ray_kwargs.ray_init.num_gpus={trainer_gpus + rollout_gpus}")
    return found


@check
def estimator_settings(config: Any) -> list[str]:
    """Every ``algorithm.<estimator>.*`` section of a verl-ext estimator names only keys the
    estimator takes (verl reads ``algorithm`` untyped and would ignore a misspelt one)."""
    from verl_ext.advantages import ESTIMATORS, hyperparameters
    from verl_ext.advantages.verl_glue import estimator_params

    algorithm = select(config, "algorithm")
    found = []
    for name in ESTIMATORS:
        if select(algorithm, name) is None:
            continue
        try:
            params, _ = estimator_params(name, algorithm)
        except ValueError as exc:
            found.append(str(exc))
            continue
        unknown = sorted(set(params) - set(hyperparameters(name)))
        if unknown:
            found.append(f"unknown key(s) {', '.join(f'algorithm.{name}.{k}' for k in unknown)} for estimator "
                         f"{name!r}; it takes {sorted(hyperparameters(name))} (docs/plugins/advantages.md)")
        elif name == select(algorithm, "adv_estimator"):
            found += _probe_estimator(name, params)
    if algorithm is not None:
        from verl_ext.rewards import postprocess

        if postprocess.enabled(algorithm):
            try:
                postprocess.path_length_settings(algorithm)
            except (TypeError, ValueError) as exc:
                found.append(str(exc))
    return found


def _probe_estimator(name: str, params: dict[str, Any]) -> list[str]:
    """Run the estimator once on two one-step trajectories of one group, so that a value it rejects
    (``mode``, ``baseline``, ``train_role``, ...) is named now rather than at the first advantage."""
    import numpy as np

    from verl_ext.advantages import compute_with_returns

    probe = {"uid": np.array(["probe", "probe"], dtype=object), "traj_uid": np.array(["t0", "t1"], dtype=object),
             "step_idx": np.array([0, 0]), "anchor": np.array(["s", "s"], dtype=object),
             "step_reward": np.array([0.0, 1.0]), "role": np.array(["planner", "planner"], dtype=object),
             "values": np.zeros(2)}
    try:
        compute_with_returns(name, **probe, **params)
    except (TypeError, ValueError) as exc:
        return [f"algorithm.{name}.*: {exc} (docs/plugins/advantages.md)"]
    return []


@check
def agent_loop_settings(config: Any) -> list[str]:
    """``agent_loop_config_path`` loads, each ``_target_`` imports, and every kwarg is a parameter of
    its class: verl's ``AgentLoopBase`` takes ``**kwargs``, so a misspelt one would be dropped silently."""
    import inspect

    from hydra.utils import get_class

    path = select(config, AGENT_LOOP_FILE_KEY)
    try:
        entries = agent_loop_file(config)
    except Exception as exc:  # noqa: BLE001 - missing file, bad YAML: verl would fail in the agent-loop workers
        return [f"{AGENT_LOOP_FILE_KEY}={path}: cannot be loaded ({exc}); fix the path or the YAML"]
    found = []
    for entry in entries:
        try:
            cls = get_class(entry._target_)
        except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, a missing _target_
            found.append(f"{AGENT_LOOP_FILE_KEY}={path}: agent loop {entry.get('name')!r}: cannot import its "
                         f"_target_ {entry.get('_target_')!r} ({exc})")
            continue
        declared = {
            p.name
            for klass in cls.__mro__ if "__init__" in vars(klass)
            for p in inspect.signature(vars(klass)["__init__"]).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        unknown = sorted(set(entry) - {"name", "_target_"} - declared)
        if unknown:
            found.append(f"{AGENT_LOOP_FILE_KEY}={path}: agent loop {entry.name!r} has no parameter(s) {unknown}; "
                         f"{cls.__name__} takes {sorted(declared - {'self'})}")
    return found


@check
def data_files_exist(config: Any) -> list[str]:
    return [f"data.{key}={path}: no such file; write it with `verl-ext prepare-data` or fix the path"
            for key in ("train_files", "val_files") for path in data_files(config, key)
            if "://" not in path and not os.path.exists(os.path.expanduser(path))]


def model_path_problem(key: str, path: str) -> str | None:
    """None when ``path`` is an existing local directory, a remote URL or a Hugging Face hub id."""
    if "://" in path or os.path.exists(os.path.expanduser(path)):
        return None
    if path.startswith(("/", "./", "../", "~", ".")) or path.count("/") > 1:
        return (f"{key}={path}: no such local directory (and not a Hugging Face hub id, which is 'org/name'); "
                "fix the path, or build a tiny test model with `verl-ext make-tiny-model DIR`")
    if not HUB_ID.fullmatch(path):
        return f"{key}={path}: neither an existing local directory nor a Hugging Face hub id ('org/name'); fix the path"
    return None


@check
def model_paths_exist(config: Any) -> list[str]:
    keys = ["actor_rollout_ref.model.path"]
    if gpu_checks._critic_used(config):
        keys.append("critic.model.path")
    if select(config, "reward.reward_model.enable", False):
        keys.append("reward.reward_model.model_path")
    found = (model_path_problem(key, str(select(config, key))) for key in keys if select(config, key))
    return [p for p in found if p]


@check
def dvreward_settings(config: Any) -> list[str]:
    """``reward.reward_kwargs.dvreward.*`` parses as the manager parses it (unknown keys, bad values,
    a judge to ask, ``env_weight`` with an environment score) and every question set in the data
    files is well formed (``verl_ext.rewards.dvreward.startup.check_config``; no network)."""
    if select(config, "reward.reward_manager.name") != "dvreward":
        return []
    from verl_ext.rewards.dvreward.startup import check_config

    try:
        check_config(config)
    except (TypeError, ValueError) as exc:
        return [str(exc)]
    return []


@check
def decision_reward_settings(config: Any) -> list[str]:
    """``reward.custom_reward_function.reward_kwargs`` of the per-decision reward (the RFT stage's
    ``pkg://verl_ext.rewards.decision_reward``): only ``format_weight`` and ``choice_weight``, each a
    finite number >= 0 (its ``compute_score`` takes ``**kwargs``, so a misspelt key would be ignored)."""
    path = select(config, "reward.custom_reward_function.path") or ""
    if not str(path).endswith("verl_ext.rewards.decision_reward"):
        return []
    from verl_ext.rewards.decision_reward import REWARD_KWARGS, check_weights

    kwargs = dict(select(config, "reward.custom_reward_function.reward_kwargs") or {})
    unknown = sorted(set(kwargs) - set(REWARD_KWARGS))
    if unknown:
        return [f"unknown keys {[f'reward.custom_reward_function.reward_kwargs.{k}' for k in unknown]} of the decision "
                f"reward; known: {list(REWARD_KWARGS)} (fix the spelling or drop the key)"]
    try:
        check_weights(**{**REWARD_KWARGS, **kwargs})
    except ValueError as exc:
        return [str(exc)]
    return []


def _run_env(config: Any) -> dict[str, str]:
    """The environment the workers see: this process's plus ``ray_kwargs.ray_init.runtime_env.env_vars``."""
    extra = select(config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    return {**os.environ, **{str(k): str(v) for k, v in dict(extra).items()}}


@check
def browser_found(config: Any) -> list[str]:
    """The ``hybrid_gui_tool`` loop starts Chromium in every episode of a browser env (MiniDesk,
    MiniWoB++): the binaries must exist."""
    if "hybrid_gui_tool" not in agent_loops(config) or not env_backends(config) & BROWSER_BACKENDS:
        return []
    env = _run_env(config)
    return [f"{var}={env[var]}: no such file; point it at the {what} or unset it to use the one on PATH "
            "(apt-get install -y chromium chromium-driver)"
            for var, what in (("VERL_EXT_CHROMIUM", "Chromium binary"), ("VERL_EXT_CHROMEDRIVER", "chromedriver"))
            if env.get(var) and not os.path.exists(env[var])]


def machine_problems(config: Any) -> list[str]:
    """This machine's readiness for the config (the trainers; ``verl-ext doctor --gpu``): the
    accelerator stack (``gpu_checks.machine_problems``), for a Megatron config its stack
    (``megatron_checks``: TransformerEngine loads, megatron-core, Megatron-Bridge) and Chromium where
    browser envs run."""
    from verl_ext.megatron_checks import megatron_problems

    found = gpu_checks.machine_problems(config) + megatron_problems(config)
    if not browser_found(config) and "hybrid_gui_tool" in agent_loops(config) and env_backends(config) & BROWSER_BACKENDS:
        from verl_ext.envs.browser import chromium_missing_reason

        reason = chromium_missing_reason()
        if reason:
            found.append(f"agent loop hybrid_gui_tool on {sorted(env_backends(config) & BROWSER_BACKENDS)} needs Chromium: {reason}")
    return found


# ----------------------------------------------------------------------- the driver's start-up


def wrap_verl_validate_config(module: Any) -> None:
    """Post-import hook on ``verl.utils.config``: its ``validate_config``, which ``main_ppo`` calls in
    the driver before Ray starts, also runs :func:`assert_valid` with Hydra's command line. This is
    the one place verl-ext code sees the config under verl's own trainer modes too (patches/README.md)."""
    original = module.validate_config
    if getattr(original, "_verl_ext_patched", False):
        return
    version = gpu_checks.installed_version("verl")  # verl itself may still be importing
    if version != VERL_VERSION:
        logger.warning("verl-ext: verl %s is not %s; start-up validation runs only in the verl-ext trainers",
                       version, VERL_VERSION)
        return

    @functools.wraps(original)
    def validate_config(config, *args, **kwargs):
        assert_valid(config, _hydra_command_line())  # first: verl's own fails on a bad model path cryptically
        return original(config, *args, **kwargs)

    validate_config._verl_ext_patched = True  # type: ignore[attr-defined]
    module.validate_config = validate_config


def _hydra_command_line() -> list[str] | None:
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
