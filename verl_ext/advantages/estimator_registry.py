"""The step-aware estimators by name, filled by ``@register_estimator`` as their modules are imported.

Importing this module imports numpy only and changes nothing. Everything else that lists estimators
(``verl_ext.advantages.ESTIMATORS``, the plugin rows of ``verl_ext.registry``, verl's
``ADV_ESTIMATOR_REGISTRY`` through ``verl_ext.advantages.registration``, the start-up checks) reads
the names from here, so a new estimator is one module that registers itself and one fragment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

Estimator = Callable[..., "np.ndarray | tuple[np.ndarray, np.ndarray]"]
EstimatorT = TypeVar("EstimatorT", bound=Estimator)
OPTIONAL_STEP_FIELDS = frozenset({"role", "action_match"})  # what a loop may or may not record per step


@dataclass(frozen=True)
class StepFieldNeed:
    """An optional per-step field an estimator reads, in the words of the start-up refusal of an
    agent loop that does not record it (``verl_ext.advantages.preconditions``).

    Attributes:
        field: one of ``OPTIONAL_STEP_FIELDS`` (``StepMetadata.role``, ``.action_match``).
        need: what the estimator needs, e.g. ``"role=planner/executor on every step"``.
        fix: what else the user can do, quoted after how a shipped loop records the field.
    """

    field: str
    need: str
    fix: str

    def __post_init__(self) -> None:
        if self.field not in OPTIONAL_STEP_FIELDS:
            raise ValueError(f"step field {self.field!r}; expected one of {sorted(OPTIONAL_STEP_FIELDS)}")


# name -> estimator; an estimator returns advantages, or (advantages, returns) when its returns
# are not the advantages themselves (HiPER's critic targets).
ESTIMATORS: dict[str, Estimator] = {}
# name -> what a group of one rollout per prompt (rollout.n = 1) leaves of its advantage; an
# estimator listed here is refused at start-up with rollout.n < 2 (verl_ext.advantages.preconditions).
GROUP_OF_ONE: dict[str, str] = {}
# name -> the optional per-step fields it reads (refused at start-up with a loop that leaves one out).
STEP_FIELDS: dict[str, tuple[StepFieldNeed, ...]] = {}
# name -> what it reads of the critic, for an estimator refused at start-up without critic.enable=true.
CRITIC: dict[str, str] = {}

_listeners: list[Callable[[str], None]] = []


def register_estimator(
    name: str,
    *,
    group_of_one: str | None = None,
    step_fields: tuple[StepFieldNeed, ...] = (),
    critic: str | None = None,
) -> Callable[[EstimatorT], EstimatorT]:
    """Function decorator: makes an estimator selectable as ``algorithm.adv_estimator=<name>``.

    Args:
        name: the value of ``algorithm.adv_estimator``; its hyper-parameters are ``algorithm.<name>.*``,
            the keyword-only parameters of the function.
        group_of_one: for an estimator that compares the rollouts of one prompt, what a group of one
            leaves of its advantage (one sentence, quoted in the start-up refusal of rollout.n = 1).
        step_fields: the optional per-step fields it reads.
        critic: for an estimator that reads the critic's values, how (one sentence).
    """

    def decorator(estimator: EstimatorT) -> EstimatorT:
        if name in ESTIMATORS:
            if ESTIMATORS[name] is estimator:
                return estimator
            raise ValueError(f"advantage estimator {name!r} already registered by {ESTIMATORS[name]}")
        ESTIMATORS[name] = estimator
        if group_of_one is not None:
            GROUP_OF_ONE[name] = group_of_one
        if step_fields:
            STEP_FIELDS[name] = step_fields
        if critic is not None:
            CRITIC[name] = critic
        for listener in tuple(_listeners):
            listener(name)
        return estimator

    return decorator


def for_each_estimator(callback: Callable[[str], None]) -> None:
    """Call ``callback(name)`` for every estimator registered so far and for each one registered later
    (an estimator of another package may be imported after verl's registry is filled)."""
    _listeners.append(callback)
    for name in tuple(ESTIMATORS):
        callback(name)
