"""GiGPO: Group-in-Group Policy Optimization (Feng et al., NeurIPS 2025, arXiv 2505.10978).

Reference implementation: verl-agent (github.com/langfengQ/verl-agent) ``gigpo/core_gigpo.py`` at
commit 20bd331bdbc9026a5668e11362178e10ab7400c8.
"""

from __future__ import annotations

import difflib

import numpy as np

from verl_ext.advantages import grouping
from verl_ext.advantages.batch import StepBatch
from verl_ext.advantages.estimator_registry import register_estimator

EPISODE_STATS = ("steps", "trajectories")


def episode_advantage(
    batch: StepBatch,
    *,
    mode: str,
    episode_stats: str = "steps",
    baseline: str = "mean",
    invalid_action_penalty: float = 0.0,
    epsilon: float = 1e-6,
    tie_rtol: float = 0.0,
) -> np.ndarray:
    """GiGPO's episode-level relative advantage ``A^E`` of every step row, shape (n,).

    Each row's score is its trajectory's return (sum of step rewards) minus the row's own
    invalid-action penalty; groups are ``uid``; unbiased std; a group with one sample keeps the
    raw score (mean 0, std 1), as verl-agent's GRPO does.

    Note:
        ``episode_stats="steps"`` (default, the reference code, ``compute_mean_std_cross_steps``)
        pools every step row, so long trajectories weigh more: in §3.7 the mean is 70/11, not
        20/3. ``"trajectories"`` takes one score per trajectory, as Eq. 3 of the paper writes it.
        ``tie_rtol`` makes scores equal to the group centre exactly 0 (see
        ``grouping.group_relative``); HGPO's base group uses it.
    """
    if episode_stats not in EPISODE_STATS:
        raise ValueError(f"episode_stats must be one of {EPISODE_STATS}, got {episode_stats!r}")
    score = batch.episode_score
    rows = score - batch.penalty(invalid_action_penalty)
    stats = None
    if episode_stats == "trajectories":
        stats = (score[batch.last], batch.uid[batch.last])
    return grouping.group_relative(
        rows, batch.uid, batch.n_uid, mode=mode, baseline=baseline, ddof=1, epsilon=epsilon,
        singleton="raw", stats=stats, tie_rtol=tie_rtol,
    )


def anchor_groups(
    batch: StepBatch, *, enable_similarity: bool = False, similarity_thresh: float = 0.95
) -> tuple[np.ndarray, int]:
    """Step-group code of every row: same ``uid`` and same anchor state, shape (n,).

    With ``enable_similarity`` anchors of one ``uid`` are clustered greedily: an anchor joins the
    first cluster whose first member ``rep`` has
    ``difflib.SequenceMatcher(None, anchor, rep).ratio() >= similarity_thresh``.

    Note:
        The reference visits anchors in batch order; here they are visited in
        ``(traj_uid, step_idx)`` order so the clusters do not depend on how verl ordered the
        batch. Similarity mode compares strings pairwise and is the one place with a Python loop
        (over distinct anchors, not rows). The argument order (new anchor first, representative
        second) is the reference's ``are_similar(obs, rep)``: ``ratio`` is not symmetric once the
        second string has 200+ characters, because difflib's autojunk then ignores characters
        that are frequent in it (a 199-character grid map and a 200-character variant of it
        score 0.99 one way and 0.0 the other).
    """
    if not enable_similarity:
        return grouping.combine(batch.uid, batch.anchor)
    if not 0.0 < similarity_thresh < 1.0:
        raise ValueError(f"algorithm.gigpo.similarity_thresh must be in (0, 1), got {similarity_thresh}")
    # Distinct (uid, anchor) pairs in order of first appearance along the sorted rows.
    rank = np.argsort(batch.traj_names.astype(str))
    position = np.empty_like(rank)
    position[rank] = np.arange(len(rank))
    visit = np.lexsort((batch.step, position[batch.traj]))
    pair, n_pairs = grouping.combine(batch.uid, batch.anchor)
    _, first_seen = np.unique(pair[visit], return_index=True)
    firsts = visit[np.sort(first_seen)]
    cluster_of_pair = np.empty(n_pairs, dtype=np.int64)
    representatives: dict[int, list[tuple[str, int]]] = {}
    for row in firsts:
        text = str(batch.anchor_values[batch.anchor[row]])
        clusters = representatives.setdefault(int(batch.uid[row]), [])
        match = next(
            (cid for rep, cid in clusters
             if difflib.SequenceMatcher(None, text, rep).ratio() >= similarity_thresh),
            None,
        )
        if match is None:
            match = int(row)  # any unique id: the first row of the cluster
            clusters.append((text, match))
        cluster_of_pair[pair[row]] = match
    codes, _ = grouping.factorize(cluster_of_pair[pair])
    return codes, int(codes.max(initial=-1)) + 1


@register_estimator(
    "gigpo",
    group_of_one="the episode term is the raw score (no baseline) and the step term is 0 except on states one "
                 "trajectory revisits",
)
def compute_gigpo_advantage(
    batch: StepBatch,
    *,
    gamma: float = 1.0,
    mode: str = "mean_norm",
    step_advantage_w: float = 1.0,
    enable_similarity: bool = False,
    similarity_thresh: float = 0.95,
    episode_stats: str = "steps",
    baseline: str = "mean",
    invalid_action_penalty: float = 0.0,
    epsilon: float = 1e-6,
) -> np.ndarray:
    """GiGPO advantage ``A = A^E + omega * A^S`` of every step row (paper Eq. 8).

    - ``A^E``: episode-level group-relative score, see ``episode_advantage``.
    - ``A^S``: the step's discounted return ``R_t = sum_k gamma^(k-t) r_k`` (Eq. 5) relative to
      the other steps of the same ``uid`` taken from the same anchor state, at any time index and
      in any trajectory (Eqs. 6-7). Unbiased std; a state seen once gives ``A^S = 0``.

    Args:
        batch: step rows; uses ``uid``, ``traj``, ``step``, ``anchor``, ``reward`` and, when the
            penalty is on, ``action_valid``. Arrays of shape (n,).
        gamma: discount of the step returns (``algorithm.gigpo.gamma``; scripts use 0.95).
        mode: ``"mean_norm"`` (F_norm = 1) or ``"mean_std_norm"`` (F_norm = std); both levels.
        step_advantage_w: omega, the weight of ``A^S``.
        enable_similarity, similarity_thresh: fuzzy anchor matching, see ``anchor_groups``.
        episode_stats: ``"steps"`` (reference) or ``"trajectories"`` (paper Eq. 3).
        baseline: ``"mean"`` (reference) or ``"median"`` for both levels.
        invalid_action_penalty: verl-agent's ``invalid_action_penalty_coef`` (0.1 in its
            scripts), taken off the row's episode score and return after the returns.
        epsilon: added to the std.

    Returns:
        shape (n,), one advantage per step row in ``batch`` order.

    Note:
        Identical to the reference except: rows are sorted by step index instead of trusting
        batch order, and ``episode_stats``/``baseline`` can move away from the reference default.
    """
    episode = episode_advantage(
        batch, mode=mode, episode_stats=episode_stats, baseline=baseline,
        invalid_action_penalty=invalid_action_penalty, epsilon=epsilon,
    )
    returns = batch.returns(gamma) - batch.penalty(invalid_action_penalty)
    codes, n_groups = anchor_groups(
        batch, enable_similarity=enable_similarity, similarity_thresh=similarity_thresh
    )
    step = grouping.group_relative(
        returns, codes, n_groups, mode=mode, baseline=baseline, ddof=1, epsilon=epsilon,
        singleton="zero",
    )
    return episode + step_advantage_w * step
