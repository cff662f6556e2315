"""Median-centred group advantage of MC-GRPO (arXiv 2601.22582), and why the plugin does not use
its MAD scaling by default.

Reference implementation: github.com/lotusroot-kim/MC-GRPO (``grpo_trainer_gsm.py``). MC-GRPO divides by
``MAD + 1e-3``. With discrete rewards (0/10 success, 0/1 accuracy) most samples sit on the median,
so the MAD is 0 and every off-median sample gets an advantage of about ``±1/1e-3``: for
``r = [1, 0, 1, 1, 0]`` the advantages are ``[0, -1000, 0, 0, -1000]``. The group estimators
therefore offer ``baseline="median"`` with the ordinary scale of their ``mode`` (none or the std),
which is the safe default; ``median_advantage(scale="mad")`` is kept for reproducing MC-GRPO.
"""

from __future__ import annotations

import numpy as np

from verl_ext.advantages import grouping

SCALES = ("none", "std", "mad")


def median_advantage(
    scores: np.ndarray,
    group: np.ndarray,
    *,
    scale: str = "none",
    mad_floor: float = 1e-3,
    epsilon: float = 1e-6,
    nonzero_rescale: bool = False,
) -> np.ndarray:
    """``(r - median(G)) / scale(G)`` for every sample.

    Args:
        scores: shape (m,), one score per sample.
        group: shape (m,), group key of each sample (the prompt's ``uid``).
        scale: ``"none"`` (default, safe), ``"std"`` (unbiased std + ``epsilon``) or ``"mad"``
            (MC-GRPO: median absolute deviation + ``mad_floor``).
        mad_floor: MC-GRPO's 1e-3.
        epsilon: added to the std.
        nonzero_rescale: MC-GRPO's GSM trainer multiplies a group's non-zero advantages
            (``|A| > 1e-6``) by ``group size / #non-zero``.

    Returns:
        shape (m,) float64.

    Note:
        MC-GRPO also draws G+1 rollouts and drops the median sample from the loss; that is a
        sampling choice, outside this function.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    values = np.asarray(scores, dtype=np.float64)
    codes, uniques = grouping.factorize(np.asarray(group))
    n_groups = len(uniques)
    centred = values - grouping.group_median(values, codes, n_groups)[codes]
    if scale == "mad":
        centred /= grouping.group_median(np.abs(centred), codes, n_groups)[codes] + mad_floor
    elif scale == "std":
        centred /= grouping.group_mean_std(values, codes, n_groups, ddof=1)[1][codes] + epsilon
    if nonzero_rescale:
        nonzero = np.abs(centred) > 1e-6
        count = grouping.segment_count(codes, n_groups)
        nnz = grouping.segment_count(codes[nonzero], n_groups)
        centred = np.where(nonzero, centred * (count / np.maximum(nnz, 1))[codes], centred)
    return centred
