"""Registers the verl-ext step-aware estimator names (``register_estimator``) in verl's
``ADV_ESTIMATOR_REGISTRY``.

verl's stock ``compute_advantage`` passes only token rewards, the response mask and ``uid``; these
estimators need step metadata (trajectory, step index, anchor state, step rewards), which only the
verl-ext trainer fetches. Registering the names makes ``algorithm.adv_estimator=gigpo`` valid to
verl's config checks, and turns a run with the stock trainer into a clear error.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.core_algos import register_adv_est

from verl_ext.advantages import estimator_registry
from verl_ext.registry import PLUGINS

# The verl-ext trainer modes, whichever names the trainer plugin registers.
TRAINER_MODES = [spec.name for spec in PLUGINS if spec.kind == "trainer"]


class StepMetadataRequiredError(RuntimeError):
    """A step-aware estimator was called through verl's stock advantage dispatch."""


def _stock_trainer_stub(name: str):
    def estimator(**kwargs: Any):
        raise StepMetadataRequiredError(
            f"advantage estimator {name!r} needs per-step metadata (trajectory ids, step indices, "
            "anchor states, step rewards) that verl's stock trainer does not pass to estimators "
            "(it passes token rewards only). Run a verl_ext trainer: set "
            f"trainer.v1.trainer_mode={' or '.join(TRAINER_MODES)}, and an agent loop that "
            "records StepMetadata (verl_ext.steps)."
        )

    estimator.__name__ = f"verl_ext_{name}_needs_step_metadata"
    return estimator


def _register_in_verl(name: str) -> None:
    register_adv_est(name)(_stock_trainer_stub(name))


# every registered estimator, including one a package of its own registers after this module ran
estimator_registry.for_each_estimator(_register_in_verl)
