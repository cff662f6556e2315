"""The shipped `plugins/advantage/*.yaml` fragments, composed with verl's config, drive the glue as
their docs say: `algorithm.gamma`/`algorithm.lam` are the fallbacks, and `step_grouped` scores
episodes from the step rewards (UI-S1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module

from verl_ext import advantages, validation
from verl_ext.advantages.verl_glue import compute_token_advantages, estimator_params
from verl_ext.listing import fragments
from verl_ext.steps import StepMetadata

ESTIMATORS = ("gigpo", "hgpo", "step_grouped", "himac", "hiper")


def algorithm_config(*overrides: str):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides)).algorithm


@pytest.mark.parametrize("name", sorted(advantages.ESTIMATORS))
def test_every_registered_estimator_ships_a_fragment_that_selects_it_with_keys_it_takes(name):
    assert f"+plugins/advantage={name}" in fragments()
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=[f"+plugins/advantage={name}"])
    assert config.algorithm.adv_estimator == name
    assert validation.estimator_settings(config) == []


@pytest.mark.parametrize("name", ESTIMATORS)
def test_algorithm_gamma_and_lam_alone_reach_every_estimator(name):
    algorithm = algorithm_config(f"+plugins/advantage={name}", "algorithm.gamma=0.95", "algorithm.lam=0.9")
    params, _ = estimator_params(name, algorithm)
    assert params["gamma"] == 0.95
    if name == "hiper":
        assert params["lam"] == 0.9


def test_the_estimators_own_gamma_still_wins():
    algorithm = algorithm_config("+plugins/advantage=hgpo", "algorithm.gamma=0.95", "algorithm.hgpo.gamma=0.5")
    assert estimator_params("hgpo", algorithm)[0]["gamma"] == 0.5


def test_gigpo_fragment_with_algorithm_gamma_reproduces_the_reference_golden():
    # the GiGPO reference code's toy (langfengQ/verl-agent @ 20bd331, gigpo/core_gigpo.py): the reference code's GiGPO advantages, mean_norm, gamma 0.95.
    trajs = {"t1": list("ABC"), "t2": list("ADBC"), "t3": list("ADDE")}
    rewards = {"t1": [0, 0, 10], "t2": [0, 0, 0, 10], "t3": [0, 0, 0, 0]}
    golden = [[6.7951, 3.6364, 3.6364], [6.3439, 9.6530, 3.6364, 3.6364], [-12.2299, -9.3720, -9.3720, -6.3636]]
    extra, mask = [], torch.zeros(3, 16, dtype=torch.int64)
    for i, (t, anchors) in enumerate(trajs.items()):
        spans = [[4 * s, 4 * s + 3] for s in range(len(anchors))]
        extra.append(StepMetadata(t, list(range(len(anchors))), anchors, rewards[t], spans=spans).to_extra_fields())
        for s, e in spans:
            mask[i, s:e] = 1
    adv, _ = compute_token_advantages(
        "gigpo", response_mask=mask, extra_fields=extra, uids=["g"] * 3, scores=torch.tensor([10.0, 10.0, 0.0]),
        algo_config=algorithm_config("+plugins/advantage=gigpo", "algorithm.gamma=0.95"))
    for i, expected in enumerate(golden):
        np.testing.assert_allclose(adv[i, 0:4 * len(expected):4].numpy(), expected, atol=1e-4)


def test_step_grouped_fragment_reproduces_ui_s1_with_per_step_scores():
    # the UI-S1 reference code's toy (X-PLUG/MobileAgent @ 11cea575, UI-S1/uis1/core_uis1.py): UI-S1's reference code, gamma 0.5, mean_norm. UI-S1's reward manager
    # puts each step's own score on its turn row, so the fragment must not add a terminal residual.
    rewards = {"a": [1.0, 1.0, 1.0], "b": [1.0, 0.55, 1.0]}
    match = {"a": [True, True, True], "b": [True, False, True]}
    extra, scores = [], []
    for t in rewards:
        for s in range(3):
            extra.append(StepMetadata(t, [s], [f"s{s}"], [rewards[t][s]], action_match=[match[t][s]]).to_extra_fields())
            scores.append(rewards[t][s])
    adv, _ = compute_token_advantages(
        "step_grouped", response_mask=torch.ones(6, 2, dtype=torch.int64), extra_fields=extra, uids=["task"] * 6,
        scores=torch.tensor(scores), algo_config=algorithm_config("+plugins/advantage=step_grouped", "algorithm.gamma=0.5"))
    np.testing.assert_allclose(adv[:, 0].numpy(), [0.45, 0.55, 0.075, -0.30, -0.85, 0.075], atol=1e-4)
