"""Does a training step carry a learning signal? The run-time guard of every estimator's output.

A row carries signal when at least one of its response tokens has a non-zero advantage. Group
estimators (verl's GRPO/RLOO, gigpo, hgpo, ...) give every row of a group advantage 0 when the
group's rewards are all equal or the group has a single member, so a config or a task can make
whole steps train on nothing while every metric looks plausible. After each estimator call the
verl-ext trainers log, for the step's trainable rows (not verl's padding, not faults):

- ``verl_ext/signal/zero_advantage_row_share``: rows whose advantages are all 0;
- ``verl_ext/signal/zero_advantage_token_share``: response tokens whose advantage is 0;
- ``verl_ext/signal/single_member_group_share``: rollout groups (``uid``) with one trainable row.

A step where no trainable row carries signal stops the run with the cause (``NoSignalError``);
``+trainer.v1.verl_ext.stop_on_zero_signal=false`` trains on and only logs the shares (the cpu
recipes' random models have such steps). The functions here are pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verl_ext.advantages.validity import real_rows

PREFIX = "verl_ext/signal/"
STOP_KEY = "trainer.v1.verl_ext.stop_on_zero_signal"


class NoSignalError(RuntimeError):
    """Every trainable row of a step has advantage 0 on every token: the update would change nothing
    but the step count."""


@dataclass(frozen=True)
class SignalReport:
    """What carries signal in one step's advantages (``measure``)."""

    rows: int  # trainable rows
    zero_rows: int  # of those, rows whose advantages are all 0
    tokens: int  # response tokens of the trainable rows
    zero_tokens: int
    groups: int  # rollout groups (uid) of the trainable rows
    single_member_groups: int

    @property
    def has_signal(self) -> bool:
        return self.zero_rows < self.rows

    def metrics(self) -> dict[str, float]:
        if self.rows == 0:  # every row a fault or padding: validity's NothingToLearnError speaks for it
            return {}
        return {
            f"{PREFIX}zero_advantage_row_share": self.zero_rows / self.rows,
            f"{PREFIX}zero_advantage_token_share": self.zero_tokens / max(1, self.tokens),
            f"{PREFIX}single_member_group_share": self.single_member_groups / self.groups,
        }

    def cause(self, estimator: str, local_updates: int = 1) -> str:
        """The message of a step without signal: what was measured (on the step's last local update
        of ``local_updates``) and what to change."""
        if self.single_member_groups == self.groups:
            why = ("every rollout group has a single trainable row, so a group-relative baseline equals the "
                   "row's own reward: set actor_rollout_ref.rollout.n to 2 or more")
        else:
            why = ("every group's rewards are equal (a task the policy always or never solves, or a reward that "
                   "does not vary): check the reward's spread (critic/score/*), or a harder/easier task mix")
        groups = f"{self.groups} groups, {self.single_member_groups} with one row"
        if local_updates == 1:
            where = f"all {self.rows} trainable rows of this step ({groups})"
        else:
            where = (f"each of this step's {local_updates} local updates (trainer.v1.separate_async.parameter_sync_step; "
                     f"the last one: {self.rows} trainable rows, {groups})")
        return (f"verl-ext: algorithm.adv_estimator={estimator} gave advantage 0 to every token of {where}; "
                f"{why}. Stopping instead of training on nothing; {STOP_KEY}=false trains on (prefix the key with + "
                f"if the config has no trainer.v1.verl_ext section)")


def measure(advantages: torch.Tensor, response_mask: torch.Tensor, uids: Sequence[str],
            trainable: np.ndarray) -> SignalReport:
    """Count what carries signal.

    Args:
        advantages: (bs, response_length) the estimator's token advantages.
        response_mask: (bs, response_length) 1 on tokens the loss trains.
        uids: (bs,) rollout-group ids.
        trainable: (bs,) bool: rows that count (not verl's padding, not rows excluded as faults).
    """
    mask = response_mask.bool().cpu()
    nonzero = (advantages.detach().cpu() != 0) & mask
    keep = torch.as_tensor(np.asarray(trainable, dtype=bool))
    row_has_signal = nonzero.any(dim=-1)[keep]
    tokens = int(mask[keep].sum())
    group_sizes = Counter(str(u) for u, t in zip(uids, trainable) if t)
    return SignalReport(
        rows=int(keep.sum()),
        zero_rows=int((~row_has_signal).sum()),
        tokens=tokens,
        zero_tokens=tokens - int(nonzero[keep].sum()),
        groups=len(group_sizes),
        single_member_groups=sum(1 for size in group_sizes.values() if size == 1),
    )


def trainable_rows(uids: Sequence[str], invalid: np.ndarray) -> np.ndarray:
    """(bs,) bool: rows that are neither verl's padding (uid ``"pad..."``) nor excluded as faults."""
    return real_rows(uids) & ~np.asarray(invalid, dtype=bool)
