"""Golden numbers produced by running the reference implementations unchanged on toy inputs,
reproduced to 1e-4.

Sources: MC-GRPO (lotusroot-kim/MC-GRPO @ da077455, ``src/open_r1/grpo_trainer_gsm.py`` with
``mc=True``), GiGPO (langfengQ/verl-agent @ 20bd331, ``gigpo/core_gigpo.py``), HGPO (same commit,
``recipe/hgpo/core_hgpo.py``), UI-S1 (X-PLUG/MobileAgent @ 11cea575, ``UI-S1/uis1/core_uis1.py``),
and the ToolCUA worked check of the Tool-Efficient Path Reward (arXiv 2605.12481, with λ=0.4, β=0.2).
"""

import numpy as np
import pytest

from verl_ext.advantages import StepBatch, compute
from verl_ext.advantages.median import median_advantage
from verl_ext.rewards.tool_path import path_length_reward, tool_efficient_reward

TOL = 1e-4

# The GiGPO / HGPO toy: one group, three trajectories, row order t1(A,B,C), t2(A,D,B,C), t3(A,D,D,E).
TOY = dict(
    uid=["g"] * 11,
    traj_uid=["t1"] * 3 + ["t2"] * 4 + ["t3"] * 4,
    step_idx=[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3],
    anchor=list("ABC") + list("ADBC") + list("ADDE"),
    step_reward=[0, 0, 10, 0, 0, 0, 10, 0, 0, 0, 0],
)


@pytest.mark.parametrize(
    "mode, expected",
    [  # the GiGPO reference code's toy (langfengQ/verl-agent @ 20bd331, gigpo/core_gigpo.py), column "A = A_E + A_S"
        ("mean_norm",
         [6.7951, 3.6364, 3.6364, 6.3439, 9.6530, 3.6364, 3.6364, -12.2299, -9.3720, -9.3720, -6.3636]),
        ("mean_std_norm",
         [1.3419, 0.7207, 0.7207, 1.2532, 1.8755, 0.7207, 0.7207, -2.4149, -1.8387, -1.8387, -1.2613]),
    ],
)
def test_gigpo_section_3_7(mode, expected):
    got = compute("gigpo", **TOY, gamma=0.95, mode=mode)
    np.testing.assert_allclose(got, expected, atol=TOL)


@pytest.mark.parametrize("mode, a_e", [("mean_norm", (3.6364, -6.3636)), ("mean_std_norm", (0.7207, -1.2613))])
def test_gigpo_episode_term_section_3_7(mode, a_e):
    # GiGPO toy, column A_E: success rows vs failure rows (step term switched off with omega = 0).
    got = compute("gigpo", **TOY, gamma=0.95, mode=mode, step_advantage_w=0.0)
    np.testing.assert_allclose(got, [a_e[0]] * 7 + [a_e[1]] * 4, atol=TOL)


@pytest.mark.parametrize(
    "params, expected",
    [  # the HGPO reference code's toy (langfengQ/verl-agent @ 20bd331, recipe/hgpo/core_hgpo.py), history_length=2, alpha=1
        (dict(mode="mean_norm", base_group=False),
         [3.1587, 0, 0, 2.7075, 5.1142, 0, 0, -5.8662, -3.9108, -3.0083, 0]),
        (dict(mode="mean_norm", base_group=True),
         [3.3180, 3.6364, 3.6364, 3.0171, 4.8679, 3.6364, 3.6364, -6.0320, -4.3196, -4.1268, -6.3636]),
        (dict(mode="mean_std_norm", base_group=False),
         [0.7607, 0, 0, 0.6521, 1.1657, 0, 0, -1.4128, -0.8828, -0.7071, 0]),
        (dict(mode="mean_std_norm", base_group=True),
         [0.7474, 0.7207, 0.7207, 0.6750, 1.0915, 0.7207, 0.7207, -1.3623, -0.9459, -0.8918, -1.2613]),
        (dict(mode="mean_std_norm", history_length=0),
         [0.7607, 0, 0, 0.6521, 1.4142, 0, 0, -1.4128, -0.7071, -0.7071, 0]),
    ],
)
def test_hgpo_section_4_5(params, expected):
    params = {"history_length": 2, "length_weight_alpha": 1.0, **params}
    got = compute("hgpo", **TOY, gamma=0.95, **params)
    np.testing.assert_allclose(got, expected, atol=TOL)


def test_golden_toys_ignore_row_order():
    # The notes' numbers are for batch order t1, t2, t3; verl may hand rows over in any order.
    perm = np.random.default_rng(0).permutation(11)
    shuffled = {k: np.asarray(v, dtype=object)[perm] for k, v in TOY.items()}
    shuffled["step_idx"] = shuffled["step_idx"].astype(int)
    got = compute("hgpo", **shuffled, gamma=0.95, mode="mean_norm", history_length=2)
    expected = np.array([3.1587, 0, 0, 2.7075, 5.1142, 0, 0, -5.8662, -3.9108, -3.0083, 0])
    np.testing.assert_allclose(got, expected[perm], atol=TOL)


# The UI-S1 toy: one task, rollouts a and b, gamma = 0.5.
UIS1 = dict(
    uid=["task"] * 6,
    traj_uid=["a"] * 3 + ["b"] * 3,
    step_idx=[0, 1, 2, 0, 1, 2],
    anchor=["s0", "s1", "s2"] * 2,
    step_reward=[1, 1, 1, 1, 0.55, 1],
    action_match=[True, True, True, True, False, True],
)


@pytest.mark.parametrize(
    "mode, a_e, a",
    [  # the UI-S1 reference code's toy (X-PLUG/MobileAgent @ 11cea575, UI-S1/uis1/core_uis1.py)
        ("mean_norm", [0.075, 0.075, 0.075, 0.075, -0.375, 0.075], [0.45, 0.55, 0.075, -0.30, -0.85, 0.075]),
        ("mean_std_norm", [0.4082, 0.4082, 0.4082, 0.4082, -2.0412, 0.4082],
         [1.1154, 1.1154, 0.4082, -0.2989, -2.7483, 0.4082]),
    ],
)
def test_step_grouped_uis1_section_8_5(mode, a_e, a):
    np.testing.assert_allclose(compute("step_grouped", **UIS1, gamma=0.5, mode=mode), a, atol=TOL)
    episode_only = compute("step_grouped", **UIS1, gamma=0.5, mode=mode, step_advantage_w=0.0)
    np.testing.assert_allclose(episode_only, a_e, atol=TOL)


def test_uis1_returns_section_8_5():
    # UI-S1 toy, column R_t: [1.75, 1.5, 1.0] and [1.0, 0.55, 1.0]; R_t = A^S + group mean, so check the
    # differences inside each step group instead: (1.75 - 1.0) / 2, (1.5 - 0.55) / 2, 0.
    step_only = compute("step_grouped", **UIS1, gamma=0.5, mode="mean_norm", episode_advantage_w=0.0)
    np.testing.assert_allclose(step_only, [0.375, 0.475, 0, -0.375, -0.475, 0], atol=TOL)


def test_mc_grpo_mad_pitfall_section_2_3():
    # MC-GRPO's reference code (lotusroot-kim/MC-GRPO @ da077455): r = [1,0,1,1,0] -> [0,-1000,0,0,-1000], GSM rescale -> -2500.
    r, group = [1, 0, 1, 1, 0], ["p"] * 5
    np.testing.assert_allclose(median_advantage(r, group, scale="mad"), [0, -1000, 0, 0, -1000], atol=TOL)
    rescaled = median_advantage(r, group, scale="mad", nonzero_rescale=True)
    np.testing.assert_allclose(rescaled, [0, -2500, 0, 0, -2500], atol=TOL)


def test_toolcua_worked_check():
    # the ToolCUA path-reward worked check (arXiv 2605.12481; λ=0.4, β=0.2): (succ, 3 steps, 1 tool), (succ, 9, 0), (fail, 30), (bad format,
    # fail, 12), t_b = +1 -> s_bar = 13.5 and rewards [2.756, 2.267, 1.0, 0.0].
    reward = tool_efficient_reward(
        uid=["g"] * 4, num_steps=[3, 9, 30, 12], success=[True, True, False, False],
        format_ok=[True, True, True, False], num_tool_calls=[1, 0, 0, 0], tool_beneficial=[1] * 4,
    )
    np.testing.assert_allclose(reward, [2.756, 2.267, 1.0, 0.0], atol=5e-4)  # notes give 3 decimals
    length = path_length_reward(["g"] * 4, [3, 9, 30, 12], [True, True, False, False])
    np.testing.assert_allclose(length, [1 + 10.5 / 13.5, 1 + 4.5 / 13.5, 0, 0], atol=TOL)


def test_step_returns_sections_3_7_and_8_5():
    # the GiGPO toy's step returns R_t (gamma 0.95) and the UI-S1 toy's R_t (gamma 0.5, cut at mismatch).
    toy = StepBatch.from_arrays(**TOY)
    np.testing.assert_allclose(
        toy.scatter(toy.returns(0.95)),
        [9.025, 9.5, 10, 8.5737, 9.025, 9.5, 10, 0, 0, 0, 0], atol=TOL)
    uis1 = StepBatch.from_arrays(**UIS1)
    np.testing.assert_allclose(uis1.scatter(uis1.returns(0.5, cut_at_mismatch=True)),
                               [1.75, 1.5, 1.0, 1.0, 0.55, 1.0], atol=TOL)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.5])
def test_hgpo_hand_check_section_4_5(alpha):
    # HGPO toy, hand check of t2 step 1 (anchor D), mean_norm: a_1 = 6.0167 in group {D}, a_2 = 4.5125 in
    # group (A, D), weights 2**alpha and 3**alpha (alpha = 1 gives the table's 5.1142).
    got = compute("hgpo", **TOY, gamma=0.95, mode="mean_norm", history_length=2, length_weight_alpha=alpha)
    expected = (2**alpha * 6.0167 + 3**alpha * 4.5125) / (2**alpha + 3**alpha)
    np.testing.assert_allclose(got[4], expected, atol=TOL)
