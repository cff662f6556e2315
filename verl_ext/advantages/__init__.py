"""Step-aware advantage estimators for multi-turn agent RL, as pure numpy functions.

Each estimator takes a ``StepBatch`` (flat step rows, validated and sorted) and hyper-parameters
named as in the reference configs (``algorithm.<name>.*``), and returns one advantage per step row.
``compute`` is the plain-array entry point; ``verl_ext.advantages.verl_glue`` maps verl's
tensors and ``extra_fields`` onto it. Importing this package needs numpy only; coding group keys
uses pandas (a verl dependency), imported on first use.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np

from verl_ext.advantages.batch import StepBatch, StepDataError
from verl_ext.advantages.estimator_registry import ESTIMATORS, Estimator, StepFieldNeed, register_estimator

# The built-in estimators, each registered by its module (``@register_estimator``) when imported
# here, in this order. An estimator of another package registers from that package's
# ``verl.plugins`` entry point instead (docs/reference/advantages.md, "Add your own estimator").
BUILTIN_MODULES = ("gigpo", "hgpo", "step_grouped", "hierarchical")
for _module in BUILTIN_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

# Per-step columns of StepBatch.from_arrays; everything else passed to compute is a hyper-parameter.
REQUIRED_COLUMNS = ("uid", "traj_uid", "step_idx", "anchor", "step_reward")
OPTIONAL_COLUMNS = ("valid", "action_valid", "action_match", "role", "subgoal", "values", "truncated")


def get_estimator(name: str) -> Estimator:
    """The estimator function registered as ``name``."""
    if name not in ESTIMATORS:
        raise KeyError(f"unknown verl-ext advantage estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def hyperparameters(name: str) -> dict[str, object]:
    """The ``algorithm.<name>.*`` keys an estimator accepts, with their defaults."""
    signature = inspect.signature(get_estimator(name))
    return {p.name: p.default for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY}


def compute_with_returns(name: str, **columns_and_params: object) -> tuple[np.ndarray, np.ndarray]:
    """``compute`` (same arguments), returning ``(advantages, returns)``, both shape (n,).

    Returns equal advantages except for estimators with a critic (``hiper``: ``A + V``).
    """
    params = dict(columns_and_params)
    estimator = get_estimator(name)
    columns = {k: params.pop(k) for k in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if k in params}
    missing = [k for k in REQUIRED_COLUMNS if k not in columns]
    if missing:
        raise TypeError(f"missing step column(s) {missing}")
    unknown = set(params) - set(hyperparameters(name))
    if unknown:
        raise TypeError(
            f"unknown key(s) {', '.join(f'algorithm.{name}.{k}' for k in sorted(unknown))} for "
            f"estimator {name!r}; accepted: {sorted(hyperparameters(name))}"
        )
    batch = StepBatch.from_arrays(**columns)
    result = estimator(batch, **params)
    advantages, returns = result if isinstance(result, tuple) else (result, result)
    return batch.scatter(advantages), batch.scatter(returns)


def compute(
    name: str,
    *,
    uid: np.ndarray,
    traj_uid: np.ndarray,
    step_idx: np.ndarray,
    anchor: np.ndarray,
    step_reward: np.ndarray,
    **params: object,
) -> np.ndarray:
    """One advantage per step row, for the estimator registered as ``name``.

    Args:
        name: a key of ``ESTIMATORS``.
        uid: shape (n,), episode group (same task and initial state) of each row.
        traj_uid: shape (n,), trajectory of each row.
        step_idx: shape (n,) int, step index inside the trajectory, exactly ``0..T-1``.
        anchor: shape (n,), anchor-state key (raw observation text or a stable hash of it).
        step_reward: shape (n,), env reward of the step; a row's episode score is the sum of its
            trajectory's step rewards.
        **params: optional step columns, each shape (n,): ``valid`` (trajectory validity: rows
            with False are excluded from all statistics and get 0), ``action_valid``,
            ``action_match``, ``role``, ``subgoal``, ``values``, ``truncated``; then the
            estimator's hyper-parameters (see ``hyperparameters(name)``).

    Returns:
        shape (n,) float64, in the order the rows were given (rows may come in any order).

    Raises:
        StepDataError: inconsistent step rows (the message names the trajectories).
        TypeError: an unknown hyper-parameter.
    """
    advantages, _ = compute_with_returns(
        name, uid=uid, traj_uid=traj_uid, step_idx=step_idx, anchor=anchor,
        step_reward=step_reward, **params,
    )
    return advantages


__all__ = [
    "ESTIMATORS",
    "Estimator",
    "StepBatch",
    "StepDataError",
    "StepFieldNeed",
    "compute",
    "compute_with_returns",
    "get_estimator",
    "hyperparameters",
    "register_estimator",
]
