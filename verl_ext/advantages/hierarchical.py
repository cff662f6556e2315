"""Plan/execute estimators for steps marked ``planner`` or ``executor``.

A planner step writes a subgoal (or a whole blueprint) and starts a segment; the executor steps
after it, up to the next planner step, act in the environment towards that subgoal. An agent loop
whose single turn both plans and acts (HiPER's ``<subgoal>…<action>`` format) records two steps
for that turn: the planner span, then the executor span.

References: HiPER (Peng et al., ICML 2026, arXiv 2602.16165; github.com/JonP07/HiPER-agent
``hiper_hae/core_hae.py`` at commit 9d3c118bb38a) and HiMAC (Jin et al., arXiv 2603.00977; no public code).
"""

from __future__ import annotations

import numpy as np

from verl_ext.advantages import grouping
from verl_ext.advantages.batch import StepBatch
from verl_ext.advantages.estimator_registry import StepFieldNeed, register_estimator

PLANNER = 1  # role code, see verl_ext.steps.ROLES
TRAIN_ROLES = ("both", "planner", "executor")
ROLES_NEEDED = StepFieldNeed("role", "role=planner/executor on every step",
                             "or an agent loop of your own that sets StepMetadata.role (docs/plugins/advantages.md), "
                             "or gigpo/hgpo/step_grouped")
_ROLE_SETTING = "record role='planner'/'executor' for every step in the agent loop's StepMetadata"


def _require_roles(batch: StepBatch, estimator: str) -> None:
    batch.reject(batch.role == 0, f"estimator {estimator!r} needs a role on every step ({_ROLE_SETTING}); "
                 "steps without one")


def _segment_ordinal(batch: StepBatch) -> np.ndarray:
    """How many planner steps precede or are each row, within its trajectory, shape (n,)."""
    is_planner = batch.role == PLANNER
    planners = np.cumsum(is_planner)
    starts = np.flatnonzero(batch.step == 0)  # one per trajectory, in trajectory-code order
    before_traj = planners[starts] - is_planner[starts]
    return planners - before_traj[batch.traj]


@register_estimator(
    "himac",
    group_of_one="the planner steps get the raw score (no baseline) and the executor steps are compared only "
                 "within their own trajectory",
    step_fields=(ROLES_NEEDED,),
)
def compute_himac_advantage(
    batch: StepBatch,
    *,
    gamma: float = 1.0,
    mode: str = "mean_std_norm",
    train_role: str = "both",
    baseline: str = "mean",
    epsilon: float = 1e-6,
) -> np.ndarray:
    """Critic-free bi-level group advantage (HiMAC, Jin et al., arXiv 2603.00977).

    - Macro (planner steps): the trajectory's return relative to the other trajectories of the
      same ``uid`` (one score per trajectory, i.e. per blueprint; a lone trajectory keeps its raw
      score), written on every planner step of the trajectory.
    - Micro (executor steps): the step's discounted return relative to the executor steps of the
      same ``uid`` that pursue the same subgoal; a lone step gets 0. The subgoal is the step's
      ``subgoal`` key when recorded, else the ordinal of its segment in the trajectory (how many
      planner steps precede it): right when each planner step writes one subgoal. When one
      planner step writes HiMAC's whole blueprint, the executors' segment is the same for every
      subgoal, so record ``subgoal`` (the blueprint item each executor step pursues, advanced at
      ``<sub_done>``) in the agent loop.

    Args:
        batch: step rows; uses ``uid``, ``traj``, ``step``, ``reward``, ``role`` and optionally
            ``subgoal``. Shapes (n,).
        gamma: discount of the executor returns.
        mode: ``"mean_norm"`` or ``"mean_std_norm"``; unbiased std at both levels.
        train_role: ``"both"``, or ``"planner"``/``"executor"`` to zero the other level's
            advantage, for the paper's alternating planner/executor updates.
        baseline: ``"mean"`` or ``"median"``.
        epsilon: added to the std.

    Returns:
        shape (n,), one advantage per step row in ``batch`` order.

    Note:
        No HiMAC code is public; the formulas are our reading of the abstract (§6), not a
        reproduction. Treat this estimator as experimental.
    """
    _require_roles(batch, "himac")
    if train_role not in TRAIN_ROLES:
        raise ValueError(f"algorithm.himac.train_role must be one of {TRAIN_ROLES}, got {train_role!r}")
    planner = batch.role == PLANNER
    score = batch.episode_score
    macro = grouping.group_relative(
        score, batch.uid, batch.n_uid, mode=mode, baseline=baseline, ddof=1, epsilon=epsilon,
        singleton="raw", stats=(score[batch.last], batch.uid[batch.last]),
    )
    subgoal = batch.subgoal if batch.subgoal is not None else _segment_ordinal(batch)
    executor = np.flatnonzero(~planner)
    codes, n_groups = grouping.combine(batch.uid[executor], subgoal[executor])
    micro = np.zeros(len(batch))
    micro[executor] = grouping.group_relative(
        batch.returns(gamma)[executor], codes, n_groups, mode=mode, baseline=baseline, ddof=1,
        epsilon=epsilon, singleton="zero",
    )
    macro_on = train_role in ("both", "planner")
    micro_on = train_role in ("both", "executor")
    return np.where(planner, macro * macro_on, micro * micro_on)


@register_estimator(
    "hiper",
    step_fields=(ROLES_NEEDED,),
    critic="HiPER's two-level GAE reads its per-step values; every trajectory starts with a planner step (checked "
           "at run time)",
)
def compute_hiper_advantage(
    batch: StepBatch,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_seg: float = 0.95,
    bootstrap_truncated: bool = True,
    norm_adv: bool = True,
    invalid_action_penalty: float = 0.0,
    epsilon: float = 1e-8,
) -> tuple[np.ndarray, np.ndarray]:
    """HiPER's hierarchical advantage estimation (HAE; Peng et al., ICML 2026, arXiv 2602.16165).

    Segment k = planner step ``p_k`` plus its executor steps ``e_0 .. e_{d_k - 1}``. ``values``
    holds ``V_high`` on planner steps and ``V_low`` on executor steps.

    - Low level (executor steps), GAE inside the segment:
      ``delta_t = r_t + gamma * V_next - V_t`` with ``V_next`` the next step's value in the
      trajectory (at a segment end that is the next planner's ``V_high``);
      ``A_t = delta_t + gamma * lam * A_{t+1}``, reset at the segment end.
    - High level (planner steps), SMDP GAE across segments:
      ``R_k = r_{p_k} + sum_j gamma^j r_{e_j}``, ``delta_k = R_k + gamma^{d_k} V_high_{k+1} - V_high_k``,
      ``A_k = delta_k + gamma^{d_k} * lam_seg * A_{k+1}``.
    - After the last step: 0 if the trajectory terminated; if it was truncated and
      ``bootstrap_truncated``, the step's own value (``V_low_t``, resp. ``V_high_k``).
    - Returns (critic targets) are ``A + V`` at both levels.
    - ``r`` is the step reward minus ``invalid_action_penalty`` on steps whose action was invalid,
      before both GAEs, as HiPER's per-turn reward (unlike GiGPO/HGPO, where the penalty skips the
      returns).

    Args:
        batch: step rows; uses ``traj``, ``step``, ``reward``, ``role``, ``values`` and
            ``truncated``. Every trajectory must start with a planner step. Shapes (n,).
        gamma: discount per executor step (``algorithm.gamma``; HiPER's default 1.0).
        lam: lambda inside a segment (``algorithm.lam``, HiPER's lambda_turn).
        lam_seg: lambda across segments (``algorithm.hae.lam_seg``).
        bootstrap_truncated: bootstrap truncated trajectories from their own last value.
        norm_adv: whiten the low-level and the high-level advantages separately over the batch
            (population std), as HiPER's ``norm_adv`` does.
        invalid_action_penalty: HiPER's ``invalid_action_penalty_coef`` (0.1 in its scripts; 0
            here, as for the other estimators); reads ``action_valid``.
        epsilon: added to the std when whitening.

    Returns:
        ``(advantages, returns)``, each shape (n,): ``A_high`` on planner steps, ``A_low`` on
        executor steps.

    Note:
        HiPER puts ``A_high`` on the subgoal tokens and ``A_low`` on the action tokens of one turn;
        here those are two steps with their own spans (tokens outside every span, e.g.
        ``<think>``, get advantage 0, but unlike HiPER's loss mask they still count in the loss's
        token average). Not implemented: the termination (switch) head of the three-head critic,
        and HiPER's KEEP penalty and keep-consistency penalty (reward shaping of KEEP turns). See
        docs/plugins/advantages.md.
    """
    _require_roles(batch, "hiper")
    values = batch.require("values", "hiper", "pass the critic's per-step values")
    batch.reject((batch.step == 0) & (batch.role != PLANNER),
                 "estimator 'hiper' needs every trajectory to start with a planner step")
    if len(batch) == 0:
        return np.zeros(0), np.zeros(0)
    planner = batch.role == PLANNER
    reward = batch.reward - batch.penalty(invalid_action_penalty)
    bootstrap = batch.truncated & bootstrap_truncated
    value_next = np.where(batch.last, values * bootstrap, np.roll(values, -1))
    executor_next = np.append(~planner[1:], False) & ~batch.last

    delta_low = reward + gamma * value_next - values
    low = grouping.reverse_scan(np.where(planner, 0.0, delta_low),
                                np.where(planner, 0.0, gamma * lam * executor_next))

    # Segment sums over each planner step and its executors, indexed by the planner's position.
    segment = np.cumsum(planner) - 1
    planner_rows = np.flatnonzero(planner)
    offset = np.arange(len(batch)) - planner_rows[segment] - 1  # j of e_j; -1 on the planner
    powers = gamma ** np.arange(offset.max(initial=0) + 1, dtype=np.float64)  # a table, not n powers
    discount = np.where(planner, 1.0, powers[np.maximum(offset, 0)])
    n_seg = len(planner_rows)
    seg_return = grouping.segment_sum(discount * reward, segment, n_seg)
    seg_len = grouping.segment_count(segment, n_seg) - 1
    seg_last = np.append(planner_rows[1:] - 1, len(batch) - 1)
    has_next = ~batch.last[seg_last]
    v_high = values[planner_rows]
    next_high = np.where(has_next, np.roll(v_high, -1), v_high * bootstrap[seg_last])
    gamma_d = gamma ** seg_len.astype(np.float64)
    high = grouping.reverse_scan(seg_return + gamma_d * next_high - v_high,
                                 gamma_d * lam_seg * has_next)

    advantage = low.copy()
    advantage[planner_rows] = high
    returns = advantage + values
    if norm_adv:
        for rows in (planner, ~planner):  # two levels, each whitened over the whole batch
            if rows.any():
                level = advantage[rows]
                advantage[rows] = (level - level.mean()) / (level.std() + epsilon)
    return advantage, returns
