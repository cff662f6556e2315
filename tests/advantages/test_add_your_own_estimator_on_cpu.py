"""A new estimator is one module of its own and one fragment: written outside verl-ext (as a package
of your own would ship them), both are picked up by every place that lists estimators."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module

from verl_ext import registry, validation
from verl_ext.advantages import ESTIMATORS, compute, estimator_registry, hyperparameters

NAME = "toy_step_baseline"
GROUP_OF_ONE = "the baseline is the row's own step reward, so the advantage is 0"
ESTIMATOR_MODULE = f'''
import numpy as np

from verl_ext.advantages import register_estimator
from verl_ext.advantages.batch import StepBatch


@register_estimator("{NAME}", group_of_one="{GROUP_OF_ONE}")
def compute_toy_advantage(batch: StepBatch, *, scale: float = 1.0) -> np.ndarray:
    """``scale * (r - mean r of the uid group)`` of every step row. Shapes (n,)."""
    sums = np.bincount(batch.uid, weights=batch.reward, minlength=batch.n_uid)
    counts = np.bincount(batch.uid, minlength=batch.n_uid)
    return scale * (batch.reward - (sums / counts)[batch.uid])
'''
FRAGMENT = f"""\
# @package _global_
algorithm:
  adv_estimator: {NAME}
  {NAME}:
    scale: 3.0
"""
# uid g: trajectory a (rewards 1, 0) and b (3), mean 4/3; uid h: trajectory c (2, 2), mean 2; scale 3
STEP_ROWS = {"uid": ["g", "h", "g", "g", "h"], "traj_uid": ["b", "c", "a", "a", "c"],
             "step_idx": [0, 1, 1, 0, 0], "anchor": ["s0", "t1", "s1", "s0", "t0"],
             "step_reward": [3.0, 2.0, 0.0, 1.0, 2.0]}
GOLDEN = [5.0, 0.0, -4.0, -1.0, 0.0]


@pytest.fixture
def own_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder holding ``toy_estimator.py`` and ``plugins/advantage/<NAME>.yaml``, on ``sys.path``;
    the estimator is unregistered again afterwards (the shipped set is what other tests list)."""
    (tmp_path / "toy_estimator.py").write_text(ESTIMATOR_MODULE)
    (tmp_path / "plugins" / "advantage").mkdir(parents=True)
    (tmp_path / "plugins" / "advantage" / f"{NAME}.yaml").write_text(FRAGMENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    for table in (ESTIMATORS, estimator_registry.GROUP_OF_ONE, ADV_ESTIMATOR_REGISTRY):  # the ones it filled
        table.pop(NAME, None)
    sys.modules.pop("toy_estimator", None)


def test_an_estimator_in_its_own_module_is_registered_everywhere(own_package: Path):
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    from verl_ext.advantages import registration  # verl's registry is filled before the new module loads

    importlib.import_module("toy_estimator")

    assert NAME in ESTIMATORS and hyperparameters(NAME) == {"scale": 1.0}
    assert registry.PluginSpec(NAME, "adv_estimator", registry.ESTIMATOR_REGISTRATION) in registry.plugin_specs()
    with pytest.raises(registration.StepMetadataRequiredError, match=NAME):
        ADV_ESTIMATOR_REGISTRY[NAME]()  # verl's stock trainer: refused, naming the verl-ext trainers
    assert validation.check_requirements({"algorithm": {"adv_estimator": NAME}}) == []
    np.testing.assert_allclose(compute(NAME, **STEP_ROWS, scale=3.0), GOLDEN)


def test_its_fragment_composes_and_its_keys_are_checked(own_package: Path):
    importlib.import_module("toy_estimator")
    overrides = [f"+plugins/advantage={NAME}", f"hydra.searchpath=[file://{own_package}]"]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
        misspelt = compose(config_name="ppo_trainer", overrides=[*overrides, f"+algorithm.{NAME}.scael=2"])

    assert config.algorithm.adv_estimator == NAME
    assert validation.estimator_settings(config) == []  # also runs the estimator once on a probe batch
    assert validation.estimator_settings(misspelt) == [
        f"unknown key(s) algorithm.{NAME}.scael for estimator {NAME!r}; it takes ['scale'] "
        "(docs/plugins/advantages.md)"]


def test_its_group_of_one_sentence_becomes_a_start_up_check(own_package: Path):
    # a fresh process, as verl's: the package's entry point imports the module before the checks run
    code = textwrap.dedent(f"""
        import toy_estimator
        from verl_ext.preconditions import precondition_problems
        print(precondition_problems({{"algorithm": {{"adv_estimator": "{NAME}"}},
                                     "actor_rollout_ref": {{"rollout": {{"n": 1}}}}}}))
    """)
    env_path = f"{own_package}:{Path(__file__).resolve().parents[2]}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": env_path})
    assert proc.returncode == 0, proc.stderr
    assert f"with one rollout per prompt {GROUP_OF_ONE}" in proc.stdout
