"""Step-index grouping as in UI-S1 semi-online RL (Lu et al., arXiv 2509.11543).

Reference implementation: github.com/X-PLUG/MobileAgent, ``UI-S1/uis1/core_uis1.py`` at commit 11cea575.
"""

from __future__ import annotations

import numpy as np

from verl_ext.advantages import grouping
from verl_ext.advantages.batch import StepBatch
from verl_ext.advantages.estimator_registry import StepFieldNeed, register_estimator


@register_estimator(
    "step_grouped",
    group_of_one="the step term (same prompt and step index) is 0 and the episode term compares only the steps "
                 "of one trajectory",
    step_fields=(StepFieldNeed(
        "action_match",
        "action_match on every step (whether its action matched the reference trajectory the rollouts are aligned "
        "to; returns are cut there)",
        "without it every action counts as matching and the step term groups unrelated states by their index. Or an "
        "agent loop of your own that sets StepMetadata.action_match (docs/plugins/advantages.md), or gigpo/hgpo"),),
)
def compute_step_grouped_advantage(
    batch: StepBatch,
    *,
    gamma: float = 1.0,
    mode: str = "mean_norm",
    episode_advantage_w: float = 1.0,
    step_advantage_w: float = 1.0,
    baseline: str = "mean",
    epsilon: float = 1e-6,
) -> np.ndarray:
    """UI-S1 advantage ``A = w_E * A^E + w_S * A^S`` of every step row.

    - ``A^E``: each row's immediate step reward relative to every step row of the same ``uid``
      (all rollouts of the task pooled); a lone row keeps its raw reward.
    - ``A^S``: the row's discounted return relative to the rows with the same ``uid`` and the same
      step index (rollouts are realigned to one expert trajectory, so step t is the natural
      anchor). Returns are cut at mismatches: a step whose action did not match the reference,
      and every step before it, accumulate nothing from that step on. A lone row gets 0.

    Args:
        batch: step rows; uses ``uid``, ``traj``, ``step``, ``reward``, ``action_match``
            (``extract_match``; all True when the agent loop does not record it). Shapes (n,).
        gamma: discount (UI-S1's script: 0.5).
        mode: ``"mean_norm"`` (reference config) or ``"mean_std_norm"`` (UI-S1's script).
        episode_advantage_w, step_advantage_w: w_E and w_S.
        baseline: ``"mean"`` (reference) or ``"median"``.
        epsilon: added to the (unbiased) std.

    Returns:
        shape (n,), one advantage per step row in ``batch`` order.

    Note:
        The reference's "episode" term scores immediate step rewards, not episode returns
        (its reward manager puts the per-step score on each row); this keeps that behaviour.
    """
    episode = grouping.group_relative(
        batch.reward, batch.uid, batch.n_uid, mode=mode, baseline=baseline, ddof=1,
        epsilon=epsilon, singleton="raw",
    )
    returns = batch.returns(gamma, cut_at_mismatch=True)
    codes, n_groups = grouping.combine(batch.uid, batch.step)
    step = grouping.group_relative(
        returns, codes, n_groups, mode=mode, baseline=baseline, ddof=1, epsilon=epsilon,
        singleton="zero",
    )
    return episode_advantage_w * episode + step_advantage_w * step
