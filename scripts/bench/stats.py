"""Statistics of the benchmark reports: mean and SE over seeds, paired differences with t-based intervals."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function (scipy is not a dependency, so computed here)."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def mean_and_se(values) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt(n); NaN for fewer than 2) and n over the finite values."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan"), len(v)


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its SE and two-sided t interval (NaN bounds below 2 seeds)."""

    mean: float
    se: float
    n: int
    low: float
    high: float

    @property
    def exceeds_2se(self) -> bool:
        return self.n >= 2 and abs(self.mean) > 2 * self.se


def estimate(values, confidence: float = 0.95) -> Estimate:
    """``mean_and_se`` of the finite ``values`` and the t-based ``confidence`` interval of the mean."""
    mean, se, n = mean_and_se(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * se if n >= 2 else float("nan")
    return Estimate(mean, se, n, mean - half, mean + half)


def paired_difference(a, b, confidence: float = 0.95) -> Estimate:
    """``estimate`` of the per-seed differences ``a - b`` (same index = same seed), over the seeds
    where both are finite: pairing removes the seed-to-seed spread both arms share."""
    return estimate(np.asarray(a, float) - np.asarray(b, float), confidence)


def paired_mean_and_se(a, b) -> tuple[float, float, int]:
    """Mean, SE and n of the per-seed differences ``a - b``."""
    d = paired_difference(a, b)
    return d.mean, d.se, d.n


def paired_verdict(a, b, digits: int = 3) -> str:
    """``a - b`` over paired seeds: the mean of the per-seed differences, its t-based 95% interval and
    whether the interval excludes 0."""
    d = paired_difference(a, b)
    if d.n < 2:
        return "n/a"
    verdict = "**excludes 0**" if d.low > 0 or d.high < 0 else "includes 0"
    return f"{d.mean:+.{digits}f} [{d.low:+.{digits}f}, {d.high:+.{digits}f}] (95% t, n={d.n}; {verdict})"


def fmt_mean_se(values, digits: int = 2) -> str:
    """``mean ± SE`` over the finite values (the mean alone for one value, ``n/a`` for none); ``digits``
    0: per-seed 0/1 flags, shown as their count ``k/n``."""
    if digits == 0:
        return f"{int(np.nansum(values))}/{len(values)}"
    m, se, n = mean_and_se(values)
    if n == 0:
        return "n/a"
    return f"{m:.{digits}f}" if n == 1 else f"{m:.{digits}f} ± {se:.{digits}f}"


def fmt_interval(values, digits: int = 3, sign: str = "") -> str:
    """``mean [low, high]``: the mean over the finite values and its t-based 95% interval; ``sign`` ``+``
    for differences (signed numbers)."""
    e = estimate(values)
    return f"{e.mean:{sign}.{digits}f} [{e.low:{sign}.{digits}f}, {e.high:{sign}.{digits}f}]"


def two_se_verdict(diff: float, se: float, digits: int = 2, n: int | None = None) -> str:
    """``+d (2 SE = s[, n seeds]): verdict``: whether |diff| exceeds two standard errors of it."""
    finite = bool(np.isfinite(se))
    verdict = ("**exceeds** 2 SE" if abs(diff) > 2 * se else "within 2 SE") if finite else \
        "SE undefined (fewer than 2 seeds)"
    two_se = f"{2 * se:.{digits}f}" if finite else "n/a"
    return f"{diff:+.{digits}f} (2 SE = {two_se}{'' if n is None else f', {n} seeds'}): {verdict}"


def last_finite(values) -> np.ndarray:
    """Per seed: the last finite value of a ``(seeds, steps)`` array (NaN where a seed has none)."""
    return np.array([row[np.isfinite(row)][-1] if np.isfinite(row).any() else np.nan
                     for row in np.asarray(values, float)])


def collapsed(final, peak) -> np.ndarray:
    """Per seed, 1.0 where the run collapsed: its final value below half its peak, a peak of at least 0.3."""
    return ((np.asarray(final) < 0.5 * np.asarray(peak)) & (np.asarray(peak) >= 0.3)).astype(float)
