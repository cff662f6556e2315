"""Vectorised group-by helpers shared by every step-aware advantage estimator.

Every estimator reduces to a few primitives over flat step rows: turn keys into dense integer codes,
sum or average a value per group, put a per-group statistic back on the rows, and run a backward
linear recurrence (discounted returns, GAE) inside each trajectory. They live here once so that no
estimator carries its own Python loop over rows or groups.
"""

from __future__ import annotations

import numpy as np

MODES = ("mean_norm", "mean_std_norm")
BASELINES = ("mean", "median")
SINGLETONS = ("zero", "raw")


def factorize(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense group codes for one key column, numbered in order of first appearance.

    Args:
        key: shape (n,); integers, floats, strings or any hashable python objects (``None`` and
            NaN are keys like any other).

    Returns:
        ``(codes, uniques)``: ``codes`` shape (n,) int64 in ``[0, len(uniques))`` with
        ``uniques[codes] == key``; ``uniques[0]`` is ``key[0]``, and so on. Input that is already
        grouped (all rows of a key contiguous) therefore gets non-decreasing codes.
    """
    import pandas as pd  # here, not at the top: importing the estimators stays numpy-only (plugin load)

    try:  # a private pandas class; if a pandas release moves it, pd.factorize gives the same codes, slower
        from pandas._libs.hashtable import PyObjectHashTable
    except ImportError:
        PyObjectHashTable = None

    key = np.asarray(key)
    if key.ndim != 1:
        raise ValueError(f"keys must be one-dimensional, got shape {key.shape}")
    # pandas' hash tables run in C; a python dict is about 2x slower, numpy's sorting of objects 3-4x.
    if key.dtype.kind in "OUS" and PyObjectHashTable is not None:
        # Python objects: pandas' object table uses the hash every python string caches and exact
        # equality on a collision; None and NaN stay keys of their own. pd.factorize would pick its
        # string table instead, which hashes the UTF-8 bytes of every row again: slow on long
        # anchors (page text, sha256 hex).
        values = key.astype(object, copy=False)
        uniques, codes = PyObjectHashTable(len(values)).factorize(values, ignore_na=False)
    else:
        codes, uniques = pd.factorize(key, use_na_sentinel=False)
    return codes.astype(np.int64, copy=False), uniques


def _int_codes(key: np.ndarray) -> np.ndarray:
    """Dense codes (in no particular order) for int64 keys."""
    n = len(key)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    low, high = int(key.min()), int(key.max())
    if high - low <= 4 * n:  # compact ids: a lookup table over the range, no hashing
        present = np.zeros(high - low + 1, dtype=bool)
        present[key - low] = True
        return (np.cumsum(present) - 1)[key - low]
    return factorize(key)[0]


def combine(*codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes for the tuple of several code columns (e.g. ``(uid, anchor)``).

    Args:
        codes: each shape (n,), non-negative int64 codes (``-1`` is not allowed).

    Returns:
        ``(codes, n_groups)`` with codes shape (n,) int64.
    """
    out = codes[0]
    for column in codes[1:]:
        # Re-densify after every pair so the product code never overflows int64.
        out = _int_codes(out * (int(column.max(initial=0)) + 1) + column)
    return out, int(out.max(initial=-1)) + 1


def segment_sum(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum of ``values`` (n,) per group; returns shape (n_groups,)."""
    return np.bincount(codes, weights=values, minlength=n_groups)


def segment_count(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Number of rows per group; returns shape (n_groups,) int64."""
    return np.bincount(codes, minlength=n_groups)


def group_mean_std(
    values: np.ndarray, codes: np.ndarray, n_groups: int, ddof: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group mean, std (``ddof=1`` unbiased as ``torch.std``, ``0`` population) and count.

    Two passes (mean, then squared deviations) so large offsets do not cancel. Groups with
    ``count <= ddof`` get std 0. All outputs have shape (n_groups,).
    """
    count = segment_count(codes, n_groups)
    mean = segment_sum(values, codes, n_groups) / np.maximum(count, 1)
    squares = segment_sum((values - mean[codes]) ** 2, codes, n_groups)
    std = np.sqrt(squares / np.maximum(count - ddof, 1))
    return mean, std, count


def uniform_group_share(values: np.ndarray, codes: np.ndarray, n_groups: int,
                        atol: float = 1e-6) -> tuple[float, int]:
    """Share of the groups of two or more rows whose ``values`` are all equal (max - min <= ``atol``).

    Under a group-relative baseline (GRPO, RLOO, ...) every row of such a group gets advantage 0:
    the batch teaches nothing there. Rows alone in their group (one sample, a row isolated as a
    fault) have no baseline to differ from and are not counted.

    Args:
        values: shape (n,), e.g. each row's summed reward.
        codes: shape (n,) dense group codes in ``[0, n_groups)`` (``factorize``).

    Returns:
        ``(share, groups)``: ``groups`` = number of groups with two or more rows; ``share`` is NaN
        when it is 0.
    """
    count = segment_count(codes, n_groups)
    high = np.full(n_groups, -np.inf)
    low = np.full(n_groups, np.inf)
    np.maximum.at(high, codes, values)
    np.minimum.at(low, codes, values)
    shared = count >= 2
    groups = int(shared.sum())
    if groups == 0:
        return float("nan"), 0
    return float(((high - low)[shared] <= atol).mean()), groups


def group_median(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per-group median, shape (n_groups,); even groups average the two middle values.

    Note: torch's ``median`` (used by MC-GRPO) returns the lower middle value instead; both agree
    on odd group sizes. Empty groups get NaN.
    """
    order = np.lexsort((values, codes))
    ranked = values[order]
    count = segment_count(codes, n_groups)
    start = np.cumsum(count) - count
    filled = count > 0
    low = np.where(filled, start + (count - 1) // 2, 0)
    high = np.where(filled, start + count // 2, 0)
    median = 0.5 * (ranked[low] + ranked[high]) if len(ranked) else np.zeros(n_groups)
    return np.where(filled, median, np.nan)


def group_relative(
    values: np.ndarray,
    codes: np.ndarray,
    n_groups: int,
    *,
    mode: str,
    baseline: str = "mean",
    ddof: int = 1,
    epsilon: float = 1e-6,
    singleton: str = "zero",
    stats: tuple[np.ndarray, np.ndarray] | None = None,
    tie_rtol: float = 0.0,
) -> np.ndarray:
    """Group-relative advantage ``(x - centre(G)) / scale(G)`` of every row.

    Args:
        values: shape (n,), the quantity being compared (episode score, step return, ...).
        codes: shape (n,), dense group code of each row.
        n_groups: number of groups.
        mode: ``"mean_norm"`` (scale 1) or ``"mean_std_norm"`` (scale ``std + epsilon``); the
            names follow verl-agent, where the mode also applies with a median baseline.
        baseline: ``"mean"`` or ``"median"`` (the MC-GRPO centre; no MAD scaling here, see
            ``verl_ext.advantages.median`` for why).
        ddof: 1 for ``torch.std`` (GiGPO, UI-S1), 0 for the population std (HGPO).
        epsilon: added to the std.
        singleton: what a group of one gets: ``"zero"`` (GiGPO/UI-S1 step groups: no peer, no
            signal) or ``"raw"`` (GRPO episode groups: centre 0 and scale 1, the raw value).
        stats: optional ``(stat_values, stat_codes)`` to take the statistics from other samples
            than the rows being scored (e.g. one score per trajectory); shapes (m,), (m,).
        tie_rtol: a row whose distance to the centre is at most ``tie_rtol`` times its group's
            mean ``|value|`` gets exactly 0. Floating-point means carry residue (the mean of three
            equal returns need not equal them), so an estimator that tests ``advantage == 0``,
            as HGPO does, needs ties made exact. 0 leaves every value as computed.

    Returns:
        shape (n,) float64.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if singleton not in SINGLETONS:
        raise ValueError(f"singleton must be one of {SINGLETONS}, got {singleton!r}")
    stat_values, stat_codes = stats if stats is not None else (values, codes)
    mean, std, count = group_mean_std(stat_values, stat_codes, n_groups, ddof)
    centre = group_median(stat_values, stat_codes, n_groups) if baseline == "median" else mean
    scale = std + epsilon if mode == "mean_std_norm" else np.ones(n_groups)
    alone = count[codes] <= 1
    if singleton == "raw":
        centre_rows = np.where(alone, 0.0, centre[codes])
        scale_rows = np.where(alone, 1.0, scale[codes])
    else:
        centre_rows = np.where(alone, values, centre[codes])
        scale_rows = np.where(alone, 1.0, scale[codes])
    deviation = values - centre_rows
    if tie_rtol > 0.0:
        magnitude = segment_sum(np.abs(stat_values), stat_codes, n_groups) / np.maximum(count, 1)
        deviation = np.where(np.abs(deviation) <= tie_rtol * magnitude[codes], 0.0, deviation)
    return deviation / scale_rows


def reverse_scan(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Solve ``x[i] = b[i] + a[i] * x[i + 1]`` backwards, with ``x[n] = 0``.

    Covers discounted returns (``a = gamma`` inside a trajectory, 0 on its last row) and GAE
    (``a = gamma * lam``). Set ``a[i] = 0`` wherever the row after ``i`` starts a new segment.

    Runs as a doubling scan: ``ceil(log2(longest segment))`` vectorised passes instead of one
    Python step per row, and no ``gamma ** -t`` rescaling, which overflows on long trajectories.

    Args:
        b: shape (n,), the per-row term.
        a: shape (n,), the per-row carry factor.

    Returns:
        shape (n,) float64.
    """
    x = np.array(b, dtype=np.float64)
    carry = np.array(a, dtype=np.float64)
    n = len(x)
    if n:
        carry[-1] = 0.0
    shift = 1
    while shift < n and carry.any():
        # Invariant: x[i] sums the next 2*shift terms, carry[i] is the product of their factors.
        x[:-shift] = x[:-shift] + carry[:-shift] * x[shift:]
        carry[:-shift] = carry[:-shift] * carry[shift:]
        carry[-shift:] = 0.0
        shift *= 2
    return x
