"""The start-up check knows what each selected plugin imports once it runs: with a module of an
extra missing (simulated in a subprocess by ``sys.modules[name] = None``, which makes every import
of it fail), ``verl-ext doctor`` and the verl-ext trainer's constructor refuse the config and name
the pip extra, before any worker starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_ext import doctor, registry, validation
from verl_ext.compose import compose
from .messages import assert_names

BLOCK = "import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
GUI = ["+plugins/env=minidesk"]


def _python(code: str, blocked: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK.format(blocked=blocked) + code],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.needs_extra("gui")  # the rest of the extra, installed
def test_doctor_refuses_the_gui_env_without_selenium_naming_the_extra():
    proc = _python(f"from verl_ext.cli import main; sys.exit(main(['doctor', *{GUI!r}]))", ["selenium"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("actor_rollout_ref.rollout.agent.default_agent_loop=hybrid_gui_tool on env backend minidesk needs "
            "'selenium', not installed here: pip install 'verl-ext[gui]'") in proc.stdout


def test_the_trainer_refuses_to_start_naming_the_missing_module():
    code = (
        "from verl_ext.compose import compose\n"
        "from verl_ext.trainer import VerlExtTrainerSync\n"
        "from verl_ext.validation import ConfigError\n"
        f"config = compose({GUI!r})\n"
        "try:\n    VerlExtTrainerSync(config)\nexcept ConfigError as e:\n    print(e); sys.exit(3)\n"
    )
    proc = _python(code, ["selenium"])  # PIL and psutil come with verl and Ray
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert_names(proc.stdout, "minidesk", "'selenium'", "pip install 'verl-ext[gui]'")


def test_text_only_agent_loops_need_no_browser_modules(tmp_path):
    # text_hybrid rows on hybrid_gui_tool, and decision_turn, never start a browser: a machine
    # without the gui extra (the offline GPU bundle) runs them
    from verl_ext.cli import main

    assert main(["prepare-data", "text_hybrid", str(tmp_path), "--train-size", "2", "--val-size", "1"]) == 0
    code = (
        "from verl_ext.compose import compose\n"
        "from verl_ext.validation import dependency_problems\n"
        f"for loop in ('hybrid_gui_tool', 'decision_turn'):\n"
        f"    print(loop, dependency_problems(compose([*{GUI!r}, 'data.train_files={tmp_path}/train.parquet',\n"
        "        f'actor_rollout_ref.rollout.agent.default_agent_loop={loop}'])))\n"
    )
    proc = _python(code, ["selenium", "miniwob"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[:2] == ["hybrid_gui_tool []", "decision_turn []"], proc.stdout


@pytest.mark.needs_extra("gui")  # the rest of the extra, installed
def test_with_everything_installed_the_gui_config_passes():
    assert validation.dependency_problems(compose(GUI)) == []


@pytest.mark.needs_extra("gui")  # the rest of the extra, installed
def test_every_required_module_belongs_to_the_named_extra():
    # the extra named in the message really installs the module (pyproject, via the package metadata)
    import importlib.metadata

    providers = importlib.metadata.packages_distributions()
    extras = {extra: {r.name.lower() for r in reqs} for extra, reqs in doctor.extras().items()}
    for spec in registry.PLUGINS:
        for module in {m for modules in spec.backend_requires.values() for m in modules}:
            dists = {d.lower() for d in providers.get(module, [])}
            assert dists & extras[spec.extra], f"{spec.name} requires {module} ({dists}), not in [{spec.extra}]"
