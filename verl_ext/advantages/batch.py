"""``StepBatch``: flat step rows, validated, sorted by (trajectory, step) and coded as integers.

The estimators are pure functions of a ``StepBatch``. Building it is the one place that checks the
inputs and sorts them, so no estimator depends on the order rows arrive in (verl reorders rows
when it balances batches; the reference implementations silently rely on batch order).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from verl_ext.advantages import grouping
from verl_ext.steps import ROLES

_ROLE_CODES = {role: code for code, role in enumerate(ROLES)}
_MAX_LISTED = 10  # offending ids quoted in one error message


class StepDataError(ValueError):
    """Step rows that an estimator cannot use; the message names the offending ids."""


def _reject(mask: np.ndarray, traj: np.ndarray, traj_names: np.ndarray, what: str) -> None:
    """Raise ``StepDataError`` naming the trajectories of the rows where ``mask`` is True."""
    if mask.any():
        names = traj_names[np.unique(traj[mask])]
        listed = ", ".join(map(repr, names[:_MAX_LISTED]))
        more = f" (+{len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
        raise StepDataError(f"{what}: traj_uid {listed}{more}")


@dataclass(frozen=True)
class StepBatch:
    """Step rows sorted by ``(traj_uid, step_idx)``. Every array has shape (n,).

    Attributes:
        order: position of each sorted row in the caller's input (to scatter results back).
        n_input: number of rows the caller passed, invalid trajectories included.
        uid: dense episode-group code (same task and initial state).
        traj: dense trajectory code; trajectories never straddle two ``uid``.
        step: step index, ``0 .. len(trajectory) - 1``.
        anchor_input: anchor-state keys as given (valid rows, input order); ``anchor`` codes them
            on first use and ``input_order`` sorts them.
        traj_names: shape (n_traj,), the ``traj_uid`` of each trajectory code.
        reward: per-step env reward.
        last: True on the last step of each trajectory.
        action_valid: format validity of each step (verl-agent ``is_action_valid``).
        action_match: whether the step's action matched the reference action (UI-S1
            ``extract_match``); all True when not given.
        role: 0 = none, 1 = planner, 2 = executor (index into ``ROLES``).
        subgoal: dense subgoal code, or None when not given.
        values: critic value of each step, or None when not given.
        truncated: True on rows of trajectories cut by a step limit rather than terminated.
    """

    order: np.ndarray
    n_input: int
    uid: np.ndarray
    n_uid: int
    traj: np.ndarray
    n_traj: int
    step: np.ndarray
    anchor_input: np.ndarray
    input_order: np.ndarray
    traj_names: np.ndarray
    reward: np.ndarray
    last: np.ndarray
    action_valid: np.ndarray
    action_match: np.ndarray
    role: np.ndarray
    subgoal: np.ndarray | None
    values: np.ndarray | None
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.order)

    @cached_property
    def _anchor_coding(self) -> tuple[np.ndarray, np.ndarray]:
        # Coded lazily: estimators that group by step index or role never pay for it.
        codes, uniques = grouping.factorize(self.anchor_input)
        return codes[self.input_order], uniques

    @property
    def anchor(self) -> np.ndarray:
        """Dense anchor-state code of each row (global; estimators pair it with ``uid``)."""
        return self._anchor_coding[0]

    @property
    def anchor_values(self) -> np.ndarray:
        """Shape (n_anchor,): the anchor key of each anchor code."""
        return self._anchor_coding[1]

    @property
    def episode_score(self) -> np.ndarray:
        """Sum of the trajectory's step rewards, on each of its rows."""
        return grouping.segment_sum(self.reward, self.traj, self.n_traj)[self.traj]

    def penalty(self, coef: float) -> np.ndarray:
        """verl-agent's invalid-action penalty ``coef * (1 - is_action_valid)`` of each row.

        It is subtracted from that row's episode score and step return only, after the returns
        are computed, so it never propagates to earlier steps (verl-agent's ``apply_invalid_action_penalty``).
        """
        return coef * (~self.action_valid)

    def returns(self, gamma: float, *, cut_at_mismatch: bool = False) -> np.ndarray:
        """Discounted reward-to-go ``R_t = r_t + gamma * R_{t+1}`` inside each trajectory.

        With ``cut_at_mismatch`` (UI-S1 §8.3) a step only accumulates the next step's return
        when both its own and the next action matched the reference, so nothing at or after a
        wrong action flows back to earlier steps.
        """
        carry = np.where(self.last, 0.0, gamma)
        if cut_at_mismatch:
            match_next = np.append(self.action_match[1:], True)
            carry = carry * (self.action_match & match_next)
        return grouping.reverse_scan(self.reward, carry)

    def require(self, field: str, estimator: str, setting: str) -> np.ndarray:
        """The optional column ``field``, or an error naming the estimator and what to set."""
        value = getattr(self, field)
        if value is None:
            raise StepDataError(f"estimator {estimator!r} needs per-step {field!r}; {setting}")
        return value

    def reject(self, mask: np.ndarray, what: str) -> None:
        """Raise ``StepDataError`` naming the trajectories of the rows where ``mask`` is True."""
        _reject(mask, self.traj, self.traj_names, what)

    def scatter(self, sorted_values: np.ndarray) -> np.ndarray:
        """Per-row results in the caller's row order, shape (n_input,); 0 on excluded rows."""
        out = np.zeros(self.n_input, dtype=np.float64)
        out[self.order] = sorted_values
        return out

    @classmethod
    def from_arrays(
        cls,
        *,
        uid: np.ndarray,
        traj_uid: np.ndarray,
        step_idx: np.ndarray,
        anchor: np.ndarray,
        step_reward: np.ndarray,
        action_valid: np.ndarray | None = None,
        action_match: np.ndarray | None = None,
        role: np.ndarray | None = None,
        subgoal: np.ndarray | None = None,
        values: np.ndarray | None = None,
        truncated: np.ndarray | None = None,
        valid: np.ndarray | None = None,
    ) -> StepBatch:
        """Validate and sort flat step rows (any order). All arguments have shape (n,).

        Rows with ``valid`` False (trajectories hit by an env fault or a judge failure) are left
        out of the batch, hence out of every group statistic; ``scatter`` gives them 0.

        Raises:
            StepDataError: mismatched lengths; a trajectory whose rows carry different ``uid``;
                step indices of a trajectory that are not exactly ``0..T-1``; non-finite rewards
                or values; unknown roles. The message lists the offending trajectory ids.
        """
        columns = {"uid": uid, "traj_uid": traj_uid, "step_idx": step_idx, "anchor": anchor,
                   "step_reward": step_reward}
        optional = {"action_valid": action_valid, "action_match": action_match, "role": role,
                    "subgoal": subgoal, "values": values, "truncated": truncated, "valid": valid}
        columns.update({k: v for k, v in optional.items() if v is not None})
        columns = {k: np.asarray(v) for k, v in columns.items()}
        lengths = {k: len(v) for k, v in columns.items()}
        if len(set(lengths.values())) > 1:
            raise StepDataError(f"step arrays have different lengths: {lengths}")
        n_input = lengths["uid"]
        kept = np.flatnonzero(columns.pop("valid", np.ones(n_input)).astype(bool))
        if len(kept) < n_input:
            columns = {k: v[kept] for k, v in columns.items()}
        n = len(kept)

        traj, traj_names = grouping.factorize(columns["traj_uid"])
        n_traj = len(traj_names)
        step = columns["step_idx"]
        if n and step.dtype.kind not in "iu":
            raise StepDataError(f"step_idx must be integers, got dtype {step.dtype}")
        step = step.astype(np.int64)

        def bad(mask: np.ndarray, what: str, codes: np.ndarray) -> None:
            _reject(mask, codes, traj_names, what)

        # Counting sort: with steps exactly 0..T-1, row (traj, step) belongs at start[traj] + step.
        # Any other step pattern puts two rows on one position or one outside its trajectory.
        length = grouping.segment_count(traj, n_traj)
        start = np.cumsum(length) - length
        inside = (step >= 0) & (step < length[traj])
        position = np.where(inside, start[traj] + step, 0)
        taken = grouping.segment_count(position[inside], n)
        bad(~inside | (taken[position] > 1),
            "step indices must be exactly 0..T-1 within each trajectory (a step is missing or "
            "repeated)", traj)
        order = np.empty(n, dtype=np.int64)
        order[position] = np.arange(n)
        unsorted_traj = traj
        traj, step = traj[order], step[order]
        first = step == 0
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]

        # Object columns are checked and coded in input order and only their int codes are sorted:
        # gathering python objects costs more than gathering int64.
        # A trajectory has one uid: code the uid of each trajectory's step 0, then check all rows.
        uid_rows = columns["uid"]
        traj_uid = uid_rows[order[first]]
        bad(uid_rows != traj_uid[unsorted_traj], "rows of one trajectory carry different uid (episode groups)",
            unsorted_traj)
        traj_uid_codes, _ = grouping.factorize(traj_uid)
        uid_codes = traj_uid_codes[traj]
        reward = columns["step_reward"][order].astype(np.float64)
        bad(~np.isfinite(reward), "non-finite step_reward", traj)

        def flags(name: str, default: bool) -> np.ndarray:
            if name not in columns:
                return np.full(n, default)
            return columns[name][order].astype(bool)

        role_codes = np.zeros(n, dtype=np.int64)
        if "role" in columns:
            codes, names = grouping.factorize(columns["role"])
            role_codes = np.array([_ROLE_CODES.get(name, -1) for name in names.tolist()], dtype=np.int64)[codes]
            bad(role_codes < 0, f"role must be one of {ROLES}", unsorted_traj)
            role_codes = role_codes[order]
        value_col = None
        if "values" in columns:
            value_col = columns["values"][order].astype(np.float64)
            bad(~np.isfinite(value_col), "non-finite values", traj)
        subgoal_col = grouping.factorize(columns["subgoal"])[0][order] if "subgoal" in columns else None
        return cls(
            order=kept[order], n_input=n_input, uid=uid_codes, n_uid=int(uid_codes.max(initial=-1)) + 1,
            traj=traj, n_traj=n_traj, step=step, anchor_input=columns["anchor"], input_order=order,
            traj_names=traj_names, reward=reward, last=last,
            action_valid=flags("action_valid", True), action_match=flags("action_match", True),
            role=role_codes, subgoal=subgoal_col, values=value_col,
            truncated=flags("truncated", False),
        )
