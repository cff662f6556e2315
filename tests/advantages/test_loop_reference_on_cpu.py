"""The vectorised estimators agree with the plain Python-loop versions on random batches."""

import numpy as np
import pytest
from loop_reference import LOOPS
from step_data import BASE, random_steps

from verl_ext.advantages import compute_with_returns


CASES = [
    ("gigpo", dict(gamma=0.95, mode="mean_norm"), ()),
    ("gigpo", dict(gamma=0.9, mode="mean_std_norm", step_advantage_w=0.5), ()),
    ("gigpo", dict(gamma=1.0, mode="mean_std_norm", episode_stats="trajectories"), ()),
    ("gigpo", dict(gamma=0.95, mode="mean_norm", baseline="median"), ()),
    ("gigpo", dict(gamma=0.95, mode="mean_norm", invalid_action_penalty=0.1), ("action_valid",)),
    ("gigpo", dict(gamma=0.95, mode="mean_std_norm", enable_similarity=True, similarity_thresh=0.75), ()),
    ("hgpo", dict(gamma=0.95, mode="mean_std_norm", history_length=2), ()),
    ("hgpo", dict(gamma=0.95, mode="mean_norm", history_length=4, length_weight_alpha=2.0, base_group=True), ()),
    ("hgpo", dict(gamma=0.95, mode="mean_std_norm", history_length=0), ()),
    ("hgpo", dict(gamma=0.95, mode="mean_norm", history_length=1, baseline="median"), ()),
    ("step_grouped", dict(gamma=0.5, mode="mean_norm"), ("action_match",)),
    ("step_grouped", dict(gamma=0.5, mode="mean_std_norm", episode_advantage_w=0.3), ("action_match",)),
    ("step_grouped", dict(gamma=0.8, mode="mean_norm", baseline="median"), ()),
    ("himac", dict(gamma=0.95, mode="mean_std_norm"), ("role",)),
    ("himac", dict(gamma=0.95, mode="mean_norm", train_role="executor"), ("role", "subgoal")),
    ("hiper", dict(gamma=0.99, lam=0.9, lam_seg=0.95, norm_adv=False), ("role", "values", "truncated")),
    ("hiper", dict(gamma=1.0, lam=1.0, bootstrap_truncated=False, norm_adv=True), ("role", "values", "truncated")),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name, params, columns", CASES)
def test_vectorised_matches_loop(name, params, columns, seed):
    data = random_steps(seed)
    inputs = {k: data[k] for k in BASE + columns}
    advantages, returns = compute_with_returns(name, **inputs, **params)
    expected = LOOPS[name](**inputs, **params)
    expected_adv, expected_ret = expected if isinstance(expected, tuple) else (expected, expected)
    np.testing.assert_allclose(advantages, expected_adv, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(returns, expected_ret, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name, params, columns", CASES)
def test_row_order_does_not_matter(name, params, columns):
    ordered = random_steps(7, shuffle=False)
    perm = np.random.default_rng(1).permutation(len(ordered["uid"]))
    inputs = {k: ordered[k] for k in BASE + columns}
    first = compute_with_returns(name, **inputs, **params)
    second = compute_with_returns(name, **{k: v[perm] for k, v in inputs.items()}, **params)
    for a, b in zip(first, second):
        np.testing.assert_allclose(a[perm], b, rtol=1e-12, atol=1e-12)
