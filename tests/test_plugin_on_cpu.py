"""The verl.plugins entry point: cheap to import, registers on demand, fails loudly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _python(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300)


def test_importing_the_entry_point_pulls_in_nothing_heavy():
    proc = _python(
        """
        import sys
        import verl_ext.plugin
        heavy = [m for m in ("torch", "ray", "transformers", "verl", "selenium", "httpx") if m in sys.modules]
        print(heavy)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_verl_loads_the_plugin_and_registries_fill_in_when_verl_imports_them():
    proc = _python(
        """
        import sys
        import verl
        assert "verl_ext.plugin" in sys.modules, "entry point not loaded by import verl"
        assert "verl_ext.trainer" not in sys.modules  # registered lazily, with verl's trainer module
        from verl.trainer.ppo.v1 import get_trainer_cls
        print(get_trainer_cls("verl_ext_sync").__name__, get_trainer_cls("verl_ext_colocate_async").__name__)
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        print(RolloutReplicaRegistry.get("hf").__name__)
        from verl.workers.rollout.base import get_rollout_class
        print(get_rollout_class("hf", "async").__name__)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["VerlExtTrainerSync", "VerlExtTrainerColocateAsync", "HFReplica", "HFServerAdapter"]


def test_cpu_engines_registered_only_as_an_addition():
    proc = _python(
        """
        import verl
        from verl.workers.engine.base import EngineRegistry
        from verl.workers.engine.fsdp import transformer_impl
        engines = EngineRegistry._engines["language_model"]["fsdp2"]
        print(engines["cpu"].__name__, engines["cuda"].__name__)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["FSDPEngineWithLMHead", "FSDPEngineWithLMHead"]


def test_post_import_hook_fires_once_after_the_module_is_complete():
    proc = _python(
        """
        import sys
        from verl_ext._post_import import when_imported
        seen = []
        when_imported("colorsys", lambda: seen.append(hasattr(sys.modules["colorsys"], "rgb_to_hsv")))
        assert seen == []
        import colorsys
        when_imported("colorsys", lambda: seen.append("already imported"))
        print(seen)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[True, 'already imported']"


def test_plugin_import_failure_is_recorded_and_explained(monkeypatch):
    from verl_ext import registry, validation

    spec = registry.PluginSpec("broken_est", "adv_estimator", "verl_ext._no_such_module_for_test", extra="judge")
    monkeypatch.setattr(registry, "PLUGINS", (*registry.PLUGINS, spec))
    registry.load_module(spec.module)
    assert isinstance(registry.LOAD_ERRORS[spec.module], ModuleNotFoundError)
    problems = validation.check_requirements({"algorithm": {"adv_estimator": "broken_est"}})
    assert len(problems) == 1
    message = problems[0]
    assert "algorithm.adv_estimator=broken_est" in message
    assert "verl_ext._no_such_module_for_test" in message and "pip install 'verl-ext[judge]'" in message
    with pytest.raises(validation.ConfigError, match="broken_est"):
        validation.assert_valid({"algorithm": {"adv_estimator": "broken_est"}})
    registry.LOAD_ERRORS.pop(spec.module)


def test_unknown_name_that_is_not_ours_is_reported_as_a_typo():
    from verl_ext import validation

    problems = validation.check_requirements({"actor_rollout_ref": {"rollout": {"name": "hff"}}})
    assert problems == ["actor_rollout_ref.rollout.name=hff: no rollout named 'hff' is registered "
                        "(not a verl-ext plugin either; check the spelling)"]


def test_doctor_cli_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "verl_ext.cli", "doctor"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verl 0.9.1" in ok.stdout and "hf" in ok.stdout and "gloo_backend_dedupe" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "verl_ext.cli", "doctor", "+plugins/backend=cpu", "algorithm.adv_estimator=not_an_estimator"],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 1
    assert "algorithm.adv_estimator=not_an_estimator" in bad.stdout
