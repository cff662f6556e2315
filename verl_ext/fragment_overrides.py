"""A plugin fragment and a plain override on the same command line that pick different values for
the fragment's selector key: Hydra applies plain overrides after every fragment, so the fragment's
choice would be dropped while its settings stay. ``verl_ext.validation.problems`` runs
:func:`fragment_conflicts` wherever the command line is known (the driver, ``verl-ext doctor``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.registry import CONFIG_KEYS

# Keys whose value *is* a plugin fragment's choice: a command-line value for one of them next to
# the fragment on the same command line drops the fragment's choice but keeps its settings.
SELECTOR_KEYS = tuple(key for _, key in CONFIG_KEYS) + ("reward.reward_manager.name",)


@dataclass(frozen=True)
class _Override:
    key: str
    value: Any
    is_fragment: bool


# Hydra's own options that take a value (main_ppo's argv); everything else not starting with "-" is an override
_HYDRA_OPTIONS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c",
                  "--package", "-p", "--experimental-rerun"}


def _parse(command_line: list[str]) -> list[_Override]:
    """The overrides of ``command_line`` (Hydra's ``overrides.task``, or main_ppo's whole argv)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, skip = [], False
    for arg in command_line:
        if skip or arg.startswith("-"):
            skip = not skip and arg in _HYDRA_OPTIONS
            continue
        overrides.append(arg)
    parsed = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_delete():
            continue
        key = override.key_or_group
        parsed.append(_Override(key, override.value(), key.startswith("plugins/")))
    return parsed


def fragment_leaves(group: str, option: str) -> dict[str, Any]:
    """``{dotted key: value}`` a shipped fragment (``plugins/<kind>/<option>.yaml``) sets."""
    import yaml

    path = Path(__file__).parent / group / f"{option}.yaml"  # group: plugins/<kind>, as the command line says
    if not path.exists():
        return {}

    def leaves(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for key, value in tree.items():
            dotted = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                yield from leaves(value, dotted)
            else:
                yield dotted, value

    return dict(leaves(yaml.safe_load(path.read_text()) or {}))


def fragment_conflicts(command_line: list[str]) -> list[str]:
    """A plugin fragment and a plain override on the same command line that pick different values for
    the fragment's selector key (``algorithm.adv_estimator``, ``algorithm.old_logits.provider``, ...).
    Hydra applies plain overrides after every fragment, so the fragment's choice would be dropped while
    its settings stay: e.g. ``algorithm.adv_estimator=gigpo`` from a recipe script and a user's
    ``+plugins/advantage=hgpo`` train gigpo. Both are explicit; the run is refused naming both."""
    overrides = _parse(command_line)
    plain = {o.key.lstrip("+"): o.value for o in overrides if not o.is_fragment}
    found = []
    for fragment in (o for o in overrides if o.is_fragment):
        for option in fragment.value if isinstance(fragment.value, list) else [fragment.value]:
            for key, value in fragment_leaves(fragment.key, str(option)).items():
                if key in SELECTOR_KEYS and key in plain and plain[key] != value:
                    found.append(
                        f"{key}: the command line sets both {fragment.key}={option} (which sets {key}={value}) and "
                        f"{key}={plain[key]}; Hydra would apply {key}={plain[key]} and keep the fragment's other "
                        "settings. Drop one of the two (a recipe script's own setting, e.g. ADV=..., picks it there)"
                    )
    return found
