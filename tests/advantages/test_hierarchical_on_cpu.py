"""HiPER's per-turn reward shaping and HiMAC's executor groups, on hand-computed toys."""

import numpy as np

from verl_ext.advantages import compute, compute_with_returns


def steps(roles, rewards, traj="t", **columns):
    n = len(roles)
    return dict(uid=["g"] * n, traj_uid=[traj] * n, step_idx=list(range(n)), anchor=["s"] * n,
                step_reward=rewards, role=roles, **columns)


def test_hiper_invalid_action_penalty_is_part_of_the_reward_before_gae():
    # HiPER (JonP07/HiPER-agent @ 9d3c118, hiper_hae/core_hae.py): r_t = env reward - coef * (1 - valid), then both GAEs. With
    # gamma = lam = 1, zero values and a terminated trajectory, A_low is the reward-to-go inside the
    # segment and A_high the segment return, so the penalty on step 1 reaches step 1 and the planner.
    data = steps(["planner", "executor", "executor"], [0.0, 0.0, 1.0], values=[0.0] * 3, truncated=[False] * 3,
                 action_valid=[True, False, True])
    adv, ret = compute_with_returns("hiper", **data, gamma=1.0, lam=1.0, norm_adv=False, invalid_action_penalty=0.1)
    np.testing.assert_allclose(adv, [0.9, 0.9, 1.0])
    np.testing.assert_allclose(ret, [0.9, 0.9, 1.0])
    unpenalised, _ = compute_with_returns("hiper", **data, gamma=1.0, lam=1.0, norm_adv=False)
    np.testing.assert_allclose(unpenalised, [1.0, 1.0, 1.0])


def test_himac_executors_without_subgoal_are_grouped_by_segment_ordinal():
    # Two rollouts of one task with segments of different lengths: the executors of the k-th
    # planner step of each trajectory form one group, whatever their step index.
    a = steps(["planner", "executor", "executor", "planner", "executor"], [0.0, 0.0, 1.0, 0.0, 2.0], traj="a")
    b = steps(["planner", "executor", "planner", "executor", "executor"], [0.0, 0.0, 0.0, 1.0, 0.0], traj="b")
    data = {k: list(a[k]) + list(b[k]) for k in a}
    by_ordinal = compute("himac", **data, gamma=1.0, mode="mean_norm")
    segment = ["", "1", "1", "", "2"] + ["", "1", "", "2", "2"]
    np.testing.assert_allclose(by_ordinal, compute("himac", **data, subgoal=segment, gamma=1.0, mode="mean_norm"))
    # returns: a = [3, 3, 3, 2, 2], b = [1, 1, 1, 1, 0]; group 1 = {a1: 3, a2: 3, b1: 1}, group 2 = {a4: 2, b3: 1, b4: 0}
    executors = [1, 2, 4, 6, 8, 9]
    np.testing.assert_allclose(by_ordinal[executors], [2 / 3, 2 / 3, 1.0, -4 / 3, 0.0, -1.0])


def test_himac_one_blueprint_needs_the_subgoal_key():
    # One planner step writes the whole blueprint: without ``subgoal`` every executor step of the
    # task is one group; with it, only the steps pursuing the same blueprint item are compared.
    a = steps(["planner", "executor", "executor"], [0.0, 1.0, 0.0], traj="a")
    b = steps(["planner", "executor", "executor"], [0.0, 0.0, 1.0], traj="b")
    data = {k: list(a[k]) + list(b[k]) for k in a}
    one_group = compute("himac", **data, gamma=1.0, mode="mean_norm")
    per_item = compute("himac", **data, subgoal=["", "open", "save"] * 2, gamma=1.0, mode="mean_norm")
    # returns: a = [1, 1, 0], b = [1, 1, 1]
    np.testing.assert_allclose(one_group[[1, 2, 4, 5]], [0.25, -0.75, 0.25, 0.25])
    np.testing.assert_allclose(per_item[[1, 2, 4, 5]], [0.0, -0.5, 0.0, 0.5])
