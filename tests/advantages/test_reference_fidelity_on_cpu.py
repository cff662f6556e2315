"""Cases where the estimators once departed from their reference implementations .

References: verl-agent ``gigpo/core_gigpo.py`` (``build_step_group`` calls
``are_similar(obs, cluster_rep)``, i.e. ``SequenceMatcher(None, obs, rep)``) and
``recipe/hgpo/core_hgpo.py`` (``aggregate_items`` drops items whose advantage is zero), upstream
20bd331 (``gigpo/core_gigpo.py`` and ``recipe/hgpo/core_hgpo.py``).
"""

import difflib

import numpy as np
import pytest

from verl_ext.advantages import compute, grouping

# A 199-character grid map and the same map with the agent moved in (200 characters). difflib
# ignores characters that are frequent in its *second* string once that string has 200+
# characters (autojunk), so the ratio depends on the argument order.
GRID = "\n".join(["#" * 19] + ["#" + "." * 17 + "#"] * 8 + ["#" * 19])[:199]
MOVED = "@" + GRID[1:] + "."


def test_gigpo_similarity_compares_in_the_reference_argument_order():
    # The asymmetry the test relies on: reference order (new anchor, representative) matches,
    # the swapped order does not.
    assert difflib.SequenceMatcher(None, MOVED, GRID).ratio() >= 0.95
    assert difflib.SequenceMatcher(None, GRID, MOVED).ratio() < 0.95
    # t1 is visited first, so GRID represents the cluster and MOVED is compared against it.
    got = compute(
        "gigpo", uid=["g", "g"], traj_uid=["t1", "t2"], step_idx=[0, 0], anchor=[GRID, MOVED],
        step_reward=[10.0, 0.0], mode="mean_norm", enable_similarity=True, similarity_thresh=0.95,
    )
    # Reference: one step group {10, 0} -> A^S = +-5 on top of A^E = +-5. Unclustered: A^S = 0.
    np.testing.assert_allclose(got, [10.0, -10.0])


R_SUCCESS = 10 * 0.95**5


def _shared_anchor_batch() -> dict[str, list]:
    """3 identical successes and 5 failures; at step 1 all eight share anchor X, but step 0 splits
    them (S for successes, F for failures), so the two-anchor level of a success step holds the 3
    identical successes only. Success returns at step 1: 10 * 0.95**5 (reward 10 at step 6)."""
    rows: dict[str, list] = {k: [] for k in ("uid", "traj_uid", "step_idx", "anchor", "step_reward")}
    for j in range(8):
        success = j < 3
        for t in range(7):
            first = "S" if success else "F"
            rows["uid"].append("g")
            rows["traj_uid"].append(f"t{j}")
            rows["step_idx"].append(t)
            rows["anchor"].append(first if t == 0 else "X" if t == 1 else f"u{j}.{t}")
            rows["step_reward"].append(10.0 if success and t == 6 else 0.0)
    return rows


@pytest.mark.parametrize("mode, expected", [
    # Only level k=1 ({X}: 3 x R, 5 x 0) counts, with weight 2 / (2 + 1e-6): mean_norm
    # R - 3R/8 = 5R/8 with R = 10 * 0.95**5 (4.8361, the number); mean_std_norm
    # (5R/8) / (population std R * sqrt(15) / 8 + 1e-6), about 5 / sqrt(15).
    ("mean_norm", 5 / 8 * R_SUCCESS * 2 / (2 + 1e-6)),
    ("mean_std_norm", 5 / 8 * R_SUCCESS / (R_SUCCESS * np.sqrt(15) / 8 + 1e-6) * 2 / (2 + 1e-6)),
])
def test_hgpo_level_of_identical_returns_contributes_nothing(mode, expected):
    got = compute("hgpo", **_shared_anchor_batch(), gamma=0.95, mode=mode, history_length=2)
    # Before: the level {(S, X)} kept a ~1e-15 residue as an item of weight 3 (1.9345 in mean_norm).
    np.testing.assert_allclose(got[[1, 8, 15]], expected, rtol=1e-12)


def test_tie_rtol_makes_floating_point_ties_exact_zeros():
    x = 7.737809374999999  # the mean of three copies of this float is not this float
    values, codes = np.array([x, x, x, 0.0, 0.0]), np.array([0, 0, 0, 1, 1])
    assert np.mean(values[:3]) != x
    raw = grouping.group_relative(values, codes, 2, mode="mean_norm", ddof=0)
    assert raw[0] != 0.0
    for mode in ("mean_norm", "mean_std_norm"):
        tied = grouping.group_relative(values, codes, 2, mode=mode, ddof=0, tie_rtol=1e-9)
        assert (tied == 0.0).all()
    # A genuine difference is untouched, and so is the middle member's exact-arithmetic zero.
    spread = np.array([0.0, 9.025, 18.05])
    tied = grouping.group_relative(spread, np.zeros(3, dtype=np.int64), 1, mode="mean_norm", tie_rtol=1e-9)
    np.testing.assert_allclose(tied, [-9.025, 0.0, 9.025])
    assert tied[1] == 0.0
