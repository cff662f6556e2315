"""``recipes/text_hybrid/run_cpu.sh`` (the text_hybrid study's recipe) composes the config each arm
of the study asks for: mode, loss and old-logit provider from its environment variables, the cpu
backend and the decision menu. Composed as a user runs it, without a trainer
(``tests/test_recipe_scripts.py``'s dry run); one short training run is ``tests/e2e/test_text_hybrid_e2e.py``."""

from __future__ import annotations

import os
import subprocess

import pytest
from omegaconf import OmegaConf

from .test_recipe_scripts import REPO, check_config, dry_run  # noqa: F401 - dry_run is a fixture

SCRIPT = REPO / "recipes/text_hybrid/run_cpu.sh"
# (env, trainer mode, policy loss, old-logit provider or None for verl's own recomputation)
ARMS = [
    ({"ADV": "grpo"}, "verl_ext_sync", "vanilla", None),
    ({"ADV": "gigpo", "LOSS": "ppo_ewma"}, "verl_ext_sync", "ppo_ewma", "ewma"),
    ({"MODE": "colocate_async", "PROVIDER": "current"}, "verl_ext_colocate_async", "vanilla", "current"),
    ({"MODE": "colocate_async", "PROVIDER": "snapshot"}, "verl_ext_colocate_async", "vanilla", "snapshot"),
    ({"MODE": "colocate_async", "LOSS": "ppo_ewma"}, "verl_ext_colocate_async", "ppo_ewma", "ewma"),
]


@pytest.mark.parametrize("env, mode, loss, provider", ARMS, ids=lambda v: str(v))
def test_each_study_arm_composes_its_config(env, mode, loss, provider, dry_run):  # noqa: F811
    code, out, err = dry_run(SCRIPT, [], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.trainer.v1.trainer_mode == mode
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == loss
    assert config.algorithm.get("old_logits", {}).get("provider") == provider
    assert config.algorithm.adv_estimator == env.get("ADV", "hgpo")
    assert config.actor_rollout_ref.rollout.name == "hf"  # the cpu backend
    if mode == "verl_ext_colocate_async":  # 3 batches ahead: staleness 2-3 on this backend
        assert config.trainer.v1.colocate_async.num_warmup_batches == 3
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert loops[0].action_format == "menu" and loops[0].max_steps == config.algorithm.path_length_reward.max_steps
    # HGPO's history covers every turn of an episode (one turn per decision)
    assert config.algorithm.hgpo.history_length >= config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns - 1


def test_a_wrong_loss_is_refused_by_name(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "LOSS": "ppo", "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "LOSS must be vanilla or ppo_ewma, got 'ppo'" in proc.stderr


def _leaves(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


@pytest.fixture(scope="module")
def fair_arm(dry_run, tmp_path_factory):  # noqa: F811
    """``fair_arm(provider, loss)``: the resolved config of one arm of the old-logit comparison, as
    flat ``{key: value}``; every arm shares OUT so paths do not differ."""
    out = tmp_path_factory.mktemp("fair_arms")
    cache = {}

    def compose(provider: str, loss: str = "ppo_ewma") -> dict:
        if (provider, loss) not in cache:
            code, text, err = dry_run(SCRIPT, [], MODE="colocate_async", LOSS=loss, PROVIDER=provider, OUT=str(out))
            assert code == 0, err[-4000:]
            config = OmegaConf.create(text)
            check_config(config)
            flat = _leaves(OmegaConf.to_container(config, resolve=True))
            for key in ("trainer.experiment_name", "actor_rollout_ref.rollout.trace.experiment_name"):
                flat.pop(key)  # names the arm, changes nothing else
            cache[provider, loss] = flat
        return cache[provider, loss]

    return compose


@pytest.mark.parametrize("provider", ["snapshot", "ewma_bound", "rollout"])
def test_fair_arms_differ_only_in_the_old_logit_source(provider, fair_arm):
    """The arms of an old-logit comparison share loss and rollout correction (token IS
    truncated at 2 + the token_k1 band); only ``algorithm.old_logits`` differs. (``rollout`` is
    verl's bypass: the verl-ext trainer switches its loss to ``bypass_mode`` at start-up, where
    π_old = μ makes the same IS weights and band the identity.)"""
    base, arm = fair_arm("current"), fair_arm(provider)
    differ = sorted(k for k in base.keys() | arm.keys() if base.get(k) != arm.get(k))
    assert differ and all(k.startswith("algorithm.old_logits.") for k in differ), differ
    correction = {k: v for k, v in base.items() if k.startswith("algorithm.rollout_correction.")}
    assert correction["algorithm.rollout_correction.rollout_is"] == "token"
    assert correction["algorithm.rollout_correction.rollout_is_threshold"] == 2.0
    assert correction["algorithm.rollout_correction.rollout_rs"] == "token_k1"


def test_the_vanilla_loss_keeps_the_rollout_correction(fair_arm):
    """LOSS=vanilla used to drop the whole loss fragment, `rollout_is: token` included: its arms then
    trained without importance weights while the ppo_ewma arms had them."""
    vanilla, ppo_ewma = fair_arm("current", "vanilla"), fair_arm("current")
    for key, value in ppo_ewma.items():
        if key.startswith("algorithm.rollout_correction."):
            assert vanilla[key] == value, key


@pytest.mark.parametrize("script", ["run_cpu.sh", "run_gpu.sh"])
@pytest.mark.parametrize(("adv", "rollout"), [("step_grouped", "semi_online"), ("himac", "plan_execute"),
                                              ("hiper", "plan_execute")])
def test_the_estimators_of_a_special_rollout_get_it(adv, rollout, script, dry_run):  # noqa: F811
    code, out, err = dry_run(SCRIPT.parent / script, [], ADV=adv)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.actor_rollout_ref.rollout.name == ("hf" if script == "run_cpu.sh" else "vllm")
    assert config.algorithm.adv_estimator == adv and adv in config.algorithm  # the fragment, with its keys
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert loops[0].action_format == "menu" and loops[0].rollout == rollout
    assert loops[0].max_steps == config.algorithm.path_length_reward.max_steps
    assert bool(config.critic.get("enable")) == (adv == "hiper")
    if rollout == "plan_execute":  # a turn per plan step: the longest GUI plan (15) + a planner turn per decision (6)
        assert config.actor_rollout_ref.rollout.multi_turn.max_assistant_turns >= 21
