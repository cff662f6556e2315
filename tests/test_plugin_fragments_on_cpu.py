"""Every plugin fragment composes with verl 0.9.1's own config, as `+plugins/<kind>=<name>`,
and verl's config dataclasses accept the result."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import verl_ext

# What every run must set anyway (verl has no defaults for them).
RUN_OVERRIDES = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
]
FRAGMENTS = sorted(Path(verl_ext.__file__).parent.joinpath("plugins").glob("*/*.yaml"))


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            yield from _leaves(value, path)
        else:
            yield path, value


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fragment_composes_with_verls_config(fragment: Path, tiny_model_dir: str):
    override = f"+plugins/{fragment.parent.name}={fragment.stem}"
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[
            *dict.fromkeys(["+plugins/backend=cpu", override]), *RUN_OVERRIDES,
            f"actor_rollout_ref.model.path={tiny_model_dir}", f"critic.model.path={tiny_model_dir}",
        ])
    for key, value in _leaves(yaml.safe_load(fragment.read_text())):
        if isinstance(value, str) and value.startswith("${"):  # an interpolation: the value it names
            value = OmegaConf.select(config, value[2:-1])
        assert OmegaConf.select(config, key) == value, f"{override}: {key} did not reach the composed config"
    # verl's own typed configs for the sections the fragments touch
    from verl.utils.config import omega_conf_to_dataclass

    omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.critic)


def test_repo_plugins_folder_is_the_shipped_one():
    repo_plugins = Path(__file__).resolve().parents[1] / "plugins"
    assert repo_plugins.resolve() == Path(verl_ext.__file__).parent.joinpath("plugins").resolve()
