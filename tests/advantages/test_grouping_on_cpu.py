"""Properties of the shared group-by helpers."""

import numpy as np
import pytest

from verl_ext.advantages import grouping


@pytest.mark.parametrize("key", [
    np.array(["b", "a", "b", "c", "a"], dtype=object),
    np.array(["b", "a", "b", "c", "a"]),
    np.array([7, -3, 7, 10**12, -3]),
    np.array([0.5, 0.25, 0.5, 1.0, 0.25]),
])
def test_factorize_round_trips(key):
    codes, uniques = grouping.factorize(key)
    assert codes.dtype == np.int64
    assert sorted(set(codes)) == list(range(len(uniques))) == list(range(len(set(key.tolist()))))
    assert list(uniques[codes]) == list(key)


def test_factorize_survives_a_hash_collision():
    class Collide:  # equal hashes, different values: the equality check must catch it
        def __init__(self, v):
            self.v = v

        def __hash__(self):
            return 1

        def __eq__(self, other):
            return self.v == other.v

        def __repr__(self):
            return f"C{self.v}"

    key = np.array([Collide(1), Collide(2), Collide(1)], dtype=object)
    codes, _ = grouping.factorize(key)
    assert codes[0] == codes[2] != codes[1]


def test_combine_is_the_tuple_key():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 200), rng.integers(0, 7, 200)
    codes, n = grouping.combine(a, b)
    assert n == len(set(zip(a.tolist(), b.tolist())))
    pairs = {}
    for code, pair in zip(codes, zip(a, b)):
        assert pairs.setdefault(code, pair) == pair


@pytest.mark.parametrize("ddof", [0, 1])
def test_group_mean_std_matches_numpy(ddof):
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 9, 300)
    values = rng.normal(1e6, 3.0, 300)  # a large offset: the two-pass std must not cancel
    mean, std, count = grouping.group_mean_std(values, codes, 9, ddof)
    for g in range(9):
        np.testing.assert_allclose(mean[g], values[codes == g].mean(), rtol=1e-12)
        np.testing.assert_allclose(std[g], values[codes == g].std(ddof=ddof), rtol=1e-9)
        assert count[g] == (codes == g).sum()


def test_group_median_matches_numpy():
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 12, 301)
    values = rng.integers(0, 4, 301).astype(float)
    median = grouping.group_median(values, codes, 13)  # group 12 is empty
    for g in range(12):
        assert median[g] == np.median(values[codes == g])
    assert np.isnan(median[12])


def test_group_relative_singletons_and_ties():
    codes = np.array([0, 1, 1, 2, 2])
    values = np.array([5.0, 3.0, 3.0, 1.0, 2.0])
    zero = grouping.group_relative(values, codes, 3, mode="mean_std_norm", singleton="zero")
    raw = grouping.group_relative(values, codes, 3, mode="mean_std_norm", singleton="raw")
    assert zero[0] == 0.0 and raw[0] == 5.0  # a lone sample: no signal vs its raw score
    assert zero[1] == zero[2] == 0.0  # all-equal group
    np.testing.assert_allclose(zero[3:], [-0.5, 0.5] / (np.std([1.0, 2.0], ddof=1) + 1e-6))


def loop_scan(b, a):
    x, out = 0.0, np.zeros(len(b))
    for i in range(len(b) - 1, -1, -1):
        x = b[i] + a[i] * x
        out[i] = x
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000])
def test_reverse_scan_matches_the_recurrence(n):
    rng = np.random.default_rng(n)
    b = rng.normal(size=n)
    a = np.where(rng.random(n) < 0.05, 0.0, rng.uniform(0.5, 1.0, n))
    if n:
        a[-1] = 0.0
    np.testing.assert_allclose(grouping.reverse_scan(b, a), loop_scan(b, a), rtol=1e-10, atol=1e-12)


def test_reverse_scan_long_segment_does_not_overflow():
    # gamma ** -t rescaling would overflow here; the doubling scan stays exact.
    n, gamma = 5000, 0.5
    b = np.zeros(n)
    b[-1] = 1.0
    a = np.full(n, gamma)
    a[-1] = 0.0
    x = grouping.reverse_scan(b, a)
    assert np.all(np.isfinite(x))
    np.testing.assert_allclose(x[-60:], gamma ** np.arange(59, -1, -1.0), rtol=1e-12)


def test_none_and_nan_are_keys_of_their_own():
    key = np.array(["a", None, "a", float("nan"), None], dtype=object)
    codes, uniques = grouping.factorize(key)
    assert codes.tolist() == [0, 1, 0, 2, 1]
    assert uniques[0] == "a" and uniques[1] is None and uniques[2] != uniques[2]


def test_long_text_keys_compare_by_content():
    # Page-text anchors: equal text from different objects is one key, a one-character change another.
    page = "<div>" + "x" * 5000
    key = np.array([page, "".join(list(page)), page + "!", page], dtype=object)
    assert key[0] is not key[1]
    assert grouping.factorize(key)[0].tolist() == [0, 0, 1, 0]


def test_sparse_int_keys_are_coded_correctly():
    # Keys spread far beyond 4n skip the lookup table (hash table); compare with np.unique.
    rng = np.random.default_rng(3)
    key = rng.choice(rng.integers(-(2**62), 2**62, 5000), 20000)
    codes, uniques = grouping.factorize(key)
    assert len(uniques) == len(np.unique(key))
    np.testing.assert_array_equal(uniques[codes], key)
    assert codes[0] == 0 and np.all(np.diff(np.maximum.accumulate(codes)) <= 1)  # first appearance


def test_uniform_group_share_counts_groups_a_group_baseline_cannot_learn_from():
    """Groups of 2+ rows whose values are all equal (within atol) over all groups of 2+ rows; rows
    alone in their group (one sample, an isolated fault) are not groups here."""
    uids = np.array(["a", "a", "b", "b", "b", "c", "d", "d"], dtype=object)
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 5.0, 2.0, 2.0 + 1e-9])
    codes, uniques = grouping.factorize(uids)
    share, groups = grouping.uniform_group_share(values, codes, len(uniques))
    assert groups == 3 and share == pytest.approx(2 / 3)  # a and d are uniform, b is not, c is alone
    share, groups = grouping.uniform_group_share(values, codes, len(uniques), atol=0.0)
    assert share == pytest.approx(1 / 3)  # d differs by 1e-9
    share, groups = grouping.uniform_group_share(np.array([1.0, 2.0]), np.array([0, 1]), 2)
    assert groups == 0 and np.isnan(share)
