"""Identities between estimators and textbook special cases."""

import numpy as np
import pytest
from step_data import BASE, random_steps

from verl_ext.advantages import compute, compute_with_returns


def inputs(data, *extra):
    return {k: data[k] for k in BASE + extra}


@pytest.mark.parametrize("seed", range(3))
def test_hgpo_without_history_is_the_gigpo_step_term(seed):
    # an identity of the HGPO definition (arXiv 2602.22817): history_length=0 leaves only the k=1 (anchor) groups; in
    # mean_norm the std convention does not matter, so it equals GiGPO's A^S (up to the eps in
    # HGPO's weight denominator).
    data = inputs(random_steps(seed))
    gigpo_full = compute("gigpo", **data, gamma=0.9, mode="mean_norm")
    gigpo_episode = compute("gigpo", **data, gamma=0.9, mode="mean_norm", step_advantage_w=0.0)
    hgpo = compute("hgpo", **data, gamma=0.9, mode="mean_norm", history_length=0, length_weight_alpha=3.0)
    np.testing.assert_allclose(hgpo, gigpo_full - gigpo_episode, rtol=1e-5, atol=1e-9)


def test_gigpo_without_repeated_states_is_grpo():
    # GiGPO paper (arXiv 2505.10978), Eqs. 3-8: if no state repeats, A^S = 0 and GiGPO falls back to (step-pooled) GRPO.
    data = inputs(random_steps(3))
    data["anchor"] = np.array([f"{t}/{s}" for t, s in zip(data["traj_uid"], data["step_idx"])], dtype=object)
    full = compute("gigpo", **data, gamma=0.9, mode="mean_std_norm")
    episode = compute("gigpo", **data, gamma=0.9, mode="mean_std_norm", step_advantage_w=0.0)
    np.testing.assert_array_equal(full, episode)


def one_trajectory(roles, rewards, values, truncated=False):
    n = len(roles)
    return dict(uid=["g"] * n, traj_uid=["t"] * n, step_idx=list(range(n)), anchor=["s"] * n,
                step_reward=rewards, role=roles, values=values, truncated=[truncated] * n)


def test_hiper_with_lambda_one_is_monte_carlo_minus_value():
    roles = ["planner", "executor", "executor", "executor"]
    rewards, values = [0.0, 1.0, 0.0, 2.0], [0.3, 0.5, -0.2, 0.4]
    adv, ret = compute_with_returns("hiper", **one_trajectory(roles, rewards, values), gamma=1.0,
                                    lam=1.0, lam_seg=1.0, norm_adv=False)
    reward_to_go = np.cumsum(rewards[::-1])[::-1]
    np.testing.assert_allclose(adv[1:], reward_to_go[1:] - values[1:])
    np.testing.assert_allclose(adv[0], sum(rewards) - values[0])  # one segment: R_seg - V_high
    np.testing.assert_allclose(ret, adv + values)


def test_hiper_with_lambda_zero_is_the_td_error():
    roles = ["planner", "executor", "executor", "planner", "executor"]
    rewards, values = [0.0, 1.0, 0.5, 0.0, 2.0], [0.3, 0.5, -0.2, 0.9, 0.4]
    gamma = 0.9
    adv, _ = compute_with_returns("hiper", **one_trajectory(roles, rewards, values, truncated=True),
                                  gamma=gamma, lam=0.0, lam_seg=0.0, bootstrap_truncated=True,
                                  norm_adv=False)
    # executors: r + gamma * V(next step) - V; the segment's last executor bootstraps from the next
    # planner's V_high, the trajectory's last (truncated) from its own value.
    np.testing.assert_allclose(adv[1], 1.0 + gamma * -0.2 - 0.5)
    np.testing.assert_allclose(adv[2], 0.5 + gamma * 0.9 + 0.2)
    np.testing.assert_allclose(adv[4], 2.0 + gamma * 0.4 - 0.4)
    # planners: R_seg + gamma^d * V_high(next) - V_high
    np.testing.assert_allclose(adv[0], 1.0 + gamma * 0.5 + gamma**2 * 0.9 - 0.3)
    np.testing.assert_allclose(adv[3], 2.0 + gamma * 0.9 - 0.9)


def test_hiper_whitening_is_per_level():
    data = random_steps(4)
    adv, _ = compute_with_returns("hiper", **inputs(data, "role", "values", "truncated"), gamma=0.95)
    for level in ("planner", "executor"):
        rows = adv[data["role"] == level]
        np.testing.assert_allclose([rows.mean(), rows.std()], [0.0, 1.0], atol=1e-6)


def test_himac_levels_and_alternating_updates():
    data = inputs(random_steps(5), "role")
    both = compute("himac", **data, gamma=0.9, mode="mean_std_norm")
    planner_only = compute("himac", **data, gamma=0.9, mode="mean_std_norm", train_role="planner")
    executor_only = compute("himac", **data, gamma=0.9, mode="mean_std_norm", train_role="executor")
    np.testing.assert_array_equal(planner_only + executor_only, both)
    planner = data["role"] == "planner"
    assert np.all(executor_only[planner] == 0) and np.all(planner_only[~planner] == 0)
    # the macro level is GRPO over trajectories: GiGPO's episode term with per-trajectory stats
    grpo = compute("gigpo", **{k: data[k] for k in BASE}, mode="mean_std_norm", step_advantage_w=0.0,
                   episode_stats="trajectories")
    np.testing.assert_allclose(both[planner], grpo[planner])


def test_median_baseline_on_symmetric_groups_equals_the_mean():
    data = dict(uid=["g"] * 3 + ["h"] * 2, traj_uid=list("abcde"), step_idx=[0] * 5,
                anchor=["s"] * 5, step_reward=[0.0, 1.0, 2.0, 5.0, 7.0])
    mean = compute("gigpo", **data, mode="mean_std_norm")
    median = compute("gigpo", **data, mode="mean_std_norm", baseline="median")
    np.testing.assert_allclose(median, mean)
