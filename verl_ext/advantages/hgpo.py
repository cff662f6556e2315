"""HGPO: Hierarchy-of-Groups Policy Optimization (He et al., ICLR 2026, arXiv 2602.22817).

Reference implementation: verl-agent (github.com/langfengQ/verl-agent) ``recipe/hgpo/core_hgpo.py`` at
commit 20bd331bdbc9026a5668e11362178e10ab7400c8.
"""

from __future__ import annotations

import numpy as np

from verl_ext.advantages import grouping
from verl_ext.advantages.batch import StepBatch
from verl_ext.advantages.estimator_registry import register_estimator
from verl_ext.advantages.gigpo import episode_advantage

# A level whose return equals its group's centre within this fraction of the group's mean |return|
# is dropped like an exact zero. The reference drops items with ``a == 0``; in exact arithmetic a
# group of identical returns gives exactly 0, but the floating-point mean leaves ~1e-16 relative
# residue (~1e-9 after the std division), which would keep the level and dilute the others.
# 1e-9 is far above that residue and far below any return difference a reward scale can express.
TIE_RTOL = 1e-9


@register_estimator(
    "hgpo",
    group_of_one="every context group but a revisited state's is a group of one and counts 0, so the advantage "
                 "is 0 (the raw score with base_group)",
)
def compute_hgpo_advantage(
    batch: StepBatch,
    *,
    gamma: float = 1.0,
    mode: str = "mean_std_norm",
    history_length: int = 2,
    length_weight_alpha: float = 1.0,
    base_group: bool = False,
    baseline: str = "mean",
    invalid_action_penalty: float = 0.0,
    epsilon: float = 1e-6,
) -> np.ndarray:
    """HGPO advantage of every step row: a weighted mix of relative advantages in nested
    context groups.

    For k = 1 .. history_length + 1, a step belongs to the context group keyed by ``uid`` and the
    last k anchors of its own trajectory (current one included; only if the step has k anchors
    behind it). In each group its discounted return ``R_t`` gives
    ``a_k = (R_t - mean) / (std_pop + eps)`` (``mean_std_norm``) or ``R_t - mean``
    (``mean_norm``). Items with ``a_k == 0`` are dropped (singletons never count, nor do groups
    of identical returns), the rest are averaged with weights ``(k + 1) ** alpha / (sum + eps)``;
    no item left gives 0. ``a_k == 0`` means ``R_t`` equals the group's centre within
    ``TIE_RTOL`` (1e-9) times the group's mean ``|R|``: the reference's exact-zero test, made
    immune to floating-point residue.

    Args:
        batch: step rows; uses ``uid``, ``traj``, ``step``, ``anchor``, ``reward``. Shapes (n,).
        gamma: discount of the step returns.
        mode: ``"mean_norm"`` or ``"mean_std_norm"`` (reference config default).
        history_length: K, the prompt's history window (``env.history_length``).
        length_weight_alpha: alpha of the length weights.
        base_group: add GiGPO's episode advantage (step-pooled, unbiased std) as an item with
            weight ``1 ** alpha``.
        baseline: ``"mean"`` (reference) or ``"median"``.
        invalid_action_penalty: subtracted from the row's return (and base-group score).
        epsilon: added to the std and to the weight denominator, as the reference does.

    Returns:
        shape (n,), one advantage per step row in ``batch`` order.

    Note:
        Weight indexing follows the upstream recipe (§4.6): the current-state-only group weighs
        ``2 ** alpha``, not ``1 ** alpha`` as the pre-release code and the paper notes suggest;
        the std is the population std (GiGPO's is unbiased). History is taken in step order, not
        batch order.
    """
    returns = batch.returns(gamma) - batch.penalty(invalid_action_penalty)
    weighted = np.zeros(len(batch))
    weight = np.zeros(len(batch))

    def add_items(advantage: np.ndarray, rows: np.ndarray | slice, length: int) -> None:
        kept = advantage != 0.0  # the reference's zero test (ties were made exact zeros)
        w = float(length) ** length_weight_alpha
        weighted[rows] += np.where(kept, w * advantage, 0.0)
        weight[rows] += np.where(kept, w, 0.0)

    if base_group:
        base = episode_advantage(
            batch, mode=mode, baseline=baseline, invalid_action_penalty=invalid_action_penalty,
            epsilon=epsilon, tie_rtol=TIE_RTOL,
        )
        add_items(base, slice(None), 1)
    # Level-k key: (uid, anchor_t, anchor_t-1, ..., anchor_t-k+1), built one level at a time.
    context, n_groups = grouping.combine(batch.uid, batch.anchor)
    for k in range(1, history_length + 2):
        if k > 1:
            # Rows are sorted by (trajectory, step): the anchor k-1 steps back is k-1 rows up.
            # Rows with fewer steps behind them get a meaningless key and are skipped below.
            context, n_groups = grouping.combine(context, np.roll(batch.anchor, k - 1))
        rows = np.flatnonzero(batch.step >= k - 1)
        if len(rows) == 0:
            break
        advantage = grouping.group_relative(
            returns[rows], context[rows], n_groups, mode=mode, baseline=baseline, ddof=0,
            epsilon=epsilon, singleton="zero", tie_rtol=TIE_RTOL,
        )
        add_items(advantage, rows, k + 1)
    return np.where(weight > 0, weighted / (weight + epsilon), 0.0)
