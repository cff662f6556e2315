"""Bad step data is rejected with a message naming the offending ids or setting."""

import numpy as np
import pytest

from verl_ext.advantages import StepDataError, compute

GOOD = dict(
    uid=["g", "g", "g", "h"],
    traj_uid=["a", "a", "b", "c"],
    step_idx=[0, 1, 0, 0],
    anchor=["x", "y", "x", "x"],
    step_reward=[0.0, 1.0, 0.0, 1.0],
)


def with_(**changes):
    return {**GOOD, **changes}


def test_good_data_passes():
    assert compute("gigpo", **GOOD).shape == (4,)


def test_trajectory_spread_over_uids():
    with pytest.raises(StepDataError, match=r"different uid.*'a'"):
        compute("gigpo", **with_(uid=["g", "h", "g", "h"]))


@pytest.mark.parametrize("steps", [[0, 2, 0, 0], [1, 2, 0, 0], [0, 0, 0, 0]])
def test_non_contiguous_or_repeated_steps(steps):
    with pytest.raises(StepDataError, match=r"0\.\.T-1.*'a'"):
        compute("gigpo", **with_(step_idx=steps))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_reward(bad):
    with pytest.raises(StepDataError, match=r"non-finite step_reward.*'b'"):
        compute("hgpo", **with_(step_reward=[0.0, 1.0, bad, 1.0]))


def test_many_offenders_are_counted():
    n = 30
    data = dict(uid=["g"] * n, traj_uid=[f"t{i}" for i in range(n)], step_idx=[1] * n,
                anchor=["x"] * n, step_reward=[0.0] * n)
    with pytest.raises(StepDataError, match=r"\(\+20 more\)"):
        compute("gigpo", **data)


def test_mismatched_lengths():
    with pytest.raises(StepDataError, match="different lengths"):
        compute("gigpo", **with_(anchor=["x"]))


def test_unknown_hyperparameter_names_the_config_section():
    with pytest.raises(TypeError, match=r"algorithm\.gigpo"):
        compute("gigpo", **GOOD, history_length=2)


def test_unknown_estimator():
    with pytest.raises(KeyError, match="known"):
        compute("nope", **GOOD)


def test_bad_mode_and_threshold():
    with pytest.raises(ValueError, match="mode"):
        compute("gigpo", **GOOD, mode="leave_one_out")
    with pytest.raises(ValueError, match="similarity_thresh"):
        compute("gigpo", **GOOD, enable_similarity=True, similarity_thresh=1.5)


def test_hierarchical_estimators_need_roles_and_values():
    with pytest.raises(StepDataError, match="role"):
        compute("himac", **GOOD)
    roles = ["planner", "executor", "planner", "planner"]
    with pytest.raises(StepDataError, match="values"):
        compute("hiper", **GOOD, role=roles)
    with pytest.raises(StepDataError, match="start with a planner.*'a'"):
        compute("hiper", **GOOD, role=["executor"] * 4, values=[0.0] * 4)
    with pytest.raises(StepDataError, match="role must be one of"):
        compute("himac", **GOOD, role=["boss"] * 4)


def test_invalid_trajectories_are_excluded_and_zero():
    data = dict(uid=["g"] * 4, traj_uid=["a", "b", "c", "d"], step_idx=[0] * 4, anchor=["x"] * 4,
                step_reward=[1.0, 0.0, 0.0, 100.0])
    valid = [True, True, True, False]
    got = compute("gigpo", **data, valid=valid, mode="mean_norm")
    alone = compute("gigpo", **{k: v[:3] for k, v in data.items()}, mode="mean_norm")
    np.testing.assert_allclose(got, np.append(alone, 0.0))
    # an invalid trajectory may even carry unusable rewards: it never reaches the estimator
    data["step_reward"][3] = np.nan
    np.testing.assert_allclose(compute("gigpo", **data, valid=valid, mode="mean_norm"), got)


@pytest.mark.parametrize("name", ["gigpo", "hgpo", "step_grouped", "himac", "hiper"])
def test_empty_and_all_invalid_batches_give_zeros(name):
    extra = {"role": ["planner", "executor", "planner", "planner"], "values": [0.0] * 4}
    columns = {k: v for k, v in extra.items() if name in ("himac", "hiper") and (k == "role" or name == "hiper")}
    empty = {k: np.asarray(v)[:0] for k, v in {**GOOD, **columns}.items()}
    assert compute(name, **empty).shape == (0,)
    np.testing.assert_array_equal(compute(name, **GOOD, **columns, valid=[False] * 4), np.zeros(4))
