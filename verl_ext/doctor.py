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
from typing import Any

from omegaconf import open_dict
from packaging.requirements import Requirement

from verl_ext import gpu_checks
from verl_ext.compose import compose
from verl_ext.registry import LOAD_ERRORS, load_all, plugin_specs, registered_names
from verl_ext.cli_args import command_parser
from verl_ext.gpu_checks import installed_version
from verl_ext.megatron_checks import megatron_report

DISTRIBUTION = "verl-ext"


def extras() -> dict[str, list[Requirement]]:
    """``pip install verl-ext[<extra>]`` -> its requirements, read from the installed package's
    metadata (pyproject's ``optional-dependencies``), so this never drifts from pyproject."""
    names = importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    requirements = [Requirement(line) for line in importlib.metadata.requires(DISTRIBUTION) or []]
    return {extra: [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]
            for extra in names}


def print_megatron_report() -> None:
    """Print ``megatron_checks.megatron_report``'s lines (a missing stack fails only Megatron configs)."""
    for line in megatron_report()[0]:
        print(f"  {line}")


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

    load_all()
    print(f"verl {verl.__version__} (verl-ext {verl_ext.__version__} is built for verl {verl_ext.VERL_VERSION})")
    ok = verl.__version__ == verl_ext.VERL_VERSION
    print("\nplugins:")
    for spec in plugin_specs():
        error = LOAD_ERRORS.get(spec.module)
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
    for patch in patches.ALL:
        state = "applied" if patch.name in patches.APPLIED else patches.SKIPPED.get(patch.name, "not applied")
        try:
            needed = "still needed" if patch.snippet_in_module_file() else "target changed: review the patch"
        except Exception as exc:  # noqa: BLE001
            needed = f"target missing: {exc!r}"
        print(f"  {patch.name:<34} {state:<12} {needed}")
    from verl_ext import replacements

    print("\nreplacements of verl names (verl_ext/replacements.py; guard: the target's parameters or patched line):")
    for replacement in replacements.inventory():
        changed = replacements.problem(replacement)
        ok = ok and changed is None
        print(f"  {replacement.target:<86} {'guard holds' if changed is None else 'CHANGED: ' + changed}")
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
