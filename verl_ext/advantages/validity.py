"""Faults are not answers: rows whose reward could not be computed are kept out of the loss and out
of their group's statistics, for verl's estimators and verl-ext's step-aware ones alike.

An agent loop marks a row whose episode faulted (``StepMetadata.valid=False``: browser crash, ...);
a reward manager flags a row in ``reward_extra_info`` (``dv_valid=0`` from ``dvreward``: every
judge call failed, no questions, ...) and still has to give verl a number (``failed_score``).
Training on that number would teach the policy that a judge outage is a bad answer, and it would
shift the mean/std of the row's rollout group. The verl-ext trainers therefore, around the one
estimator call of verl's ``_compute_advantage`` (``verl_ext.trainer``):

1. ``exclude``: give each flagged row its own group id, zero its ``response_mask`` and set its
   reward to 0 (verl's estimators) or NaN (verl-ext's step-aware ones, which read a NaN score as
   an invalid trajectory). No group mean/std (GRPO, RLOO, ...), batch whitening (GAE,
   REINFORCE++) or step group sees it;
2. the estimator runs;
3. ``zero_out``: the row's advantages are 0 and its reward is 0 again (verl writes rewards back
   with KL-in-reward). With rollout correction verl also writes the zeroed ``response_mask``
   back, so the row leaves the loss entirely; otherwise its policy-gradient term is exactly 0
   (zero advantage) and its value target is the critic's own estimate (GAE under a zero mask).

The functions on arrays are pure; ``exclude``/``zero_out`` act on a verl ``DataProto`` in place.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl_ext.steps import EXTRA_FIELDS_KEY

# reward manager (reward.reward_manager.name) -> the reward_extra_info key it sets to 0 on a row
# whose reward is a fault
FLAG_KEYS = {"dvreward": "dv_valid"}
# that key -> the reward_extra_info key saying why
REASON_KEYS = {"dv_valid": "dv_fail_reason"}
METRIC_PREFIX = "verl_ext/invalid_reward"


class NothingToLearnError(RuntimeError):
    """Every row of a training batch was kept out of training as a fault: the step would train on nothing."""


def flag_key(reward_config: Any) -> str | None:
    """The validity key of the configured reward manager (``reward.reward_manager.name``), if it
    flags rows; ``None`` otherwise."""
    manager = (reward_config.get("reward_manager", None) or {}) if reward_config is not None else {}
    return FLAG_KEYS.get(manager.get("name", None))


def invalid_rows(uids: Sequence[str], extra_fields: Sequence[Mapping | None], key: str | None) -> np.ndarray:
    """Shape (bs,) bool: non-padding rows the agent loop marked invalid (step metadata
    ``valid=False``: an env fault) or whose ``extra_fields["reward_extra_info"][key]`` is 0 (the
    reward manager flagged a fault; only checked when ``key`` is given). Other rows are valid;
    verl's padding rows (uid ``"pad..."``) are never flagged: verl masks them itself.
    """
    flagged = np.zeros(len(uids), dtype=bool)
    for i, (uid, fields) in enumerate(zip(uids, extra_fields, strict=True)):
        if str(uid).startswith("pad") or not isinstance(fields, Mapping):
            continue
        meta = fields.get(EXTRA_FIELDS_KEY)
        if isinstance(meta, Mapping) and meta.get("valid") is False:
            flagged[i] = True
            continue
        info = (fields.get("reward_extra_info") or {}) if key is not None else {}
        value = info.get(key) if isinstance(info, Mapping) else None
        flagged[i] = value is not None and not bool(value)
    return flagged


def fault_reason(fields: Mapping, key: str | None) -> str:
    """Why an invalid row (``invalid_rows``) is invalid: the agent loop's ``invalid_reason`` or
    the reward manager's reason (``dvreward``'s ``dv_fail_reason``, e.g. ``judge_failed:connect``)."""
    meta = fields.get(EXTRA_FIELDS_KEY)
    if isinstance(meta, Mapping) and meta.get("valid") is False:
        return f"trajectory_invalid:{meta.get('invalid_reason') or 'unknown'}"
    info = fields.get("reward_extra_info") or {}
    return str(info.get(REASON_KEYS.get(key, ""), "") or f"{key}=0")


def real_rows(uids: Sequence[str]) -> np.ndarray:
    """Shape (bs,) bool: rows that are not verl's padding (uid ``"pad..."``)."""
    return np.array([not str(u).startswith("pad") for u in uids], dtype=bool)


def check_trainable(uids: Sequence[str], extra_fields: Sequence[Mapping | None], invalid: np.ndarray, key: str | None,
                    hint: str = "") -> None:
    """Raise ``NothingToLearnError`` when every non-padding row of the batch is invalid, with the
    reasons and their counts (and ``hint``, e.g. where the judge is): training on such a step
    changes nothing but the step count (grad norm 0), so a judge outage or a broken env would
    otherwise run to the end and exit 0."""
    real = real_rows(uids)
    if not real.any() or not invalid[real].all():
        return
    reasons = Counter(fault_reason(fields, key) for fields, bad in zip(extra_fields, invalid) if bad)
    listed = ", ".join(f"{reason} x{count}" for reason, count in reasons.most_common())
    raise NothingToLearnError(
        f"verl-ext: all {int(real.sum())} rows of this training batch were excluded as faults ({listed}); stopping "
        f"instead of training on nothing{'. ' + hint if hint else ''}"
    )


def isolate_groups(uids: np.ndarray, invalid: np.ndarray) -> np.ndarray:
    """A copy of ``uids`` (object array) where each invalid row has a group id of its own, so no
    group statistic includes it and it does not count towards its original group's size."""
    isolated = np.array(uids, dtype=object, copy=True)
    for i in np.flatnonzero(invalid):
        isolated[i] = f"{uids[i]}/invalid_reward/{i}"
    return isolated


def exclude(data: Any, invalid: np.ndarray, nan_scores: bool) -> None:
    """Before the estimator: isolate the invalid rows of ``data`` (a verl ``DataProto`` with
    ``uid``, ``response_mask`` and ``token_level_rewards``) and blank their rewards (NaN with
    ``nan_scores``, for the step-aware estimators; else 0). ``token_level_rewards`` may alias
    ``token_level_scores``, so it is replaced, not written into."""
    if not invalid.any():
        return
    rows = torch.as_tensor(invalid, device=data.batch["response_mask"].device)
    data.non_tensor_batch["uid"] = isolate_groups(data.non_tensor_batch["uid"], invalid)
    data.batch["response_mask"] = data.batch["response_mask"].masked_fill(rows[:, None], 0)
    rewards = data.batch["token_level_rewards"]
    data.batch["token_level_rewards"] = rewards.masked_fill(rows[:, None], float("nan") if nan_scores else 0.0)


def zero_out(data: Any, invalid: np.ndarray) -> Any:
    """After the estimator: zero the advantages and rewards of the invalid rows; returns ``data``."""
    if invalid.any():
        rows = torch.as_tensor(invalid, device=data.batch["advantages"].device)[:, None]
        data.batch["advantages"] = data.batch["advantages"].masked_fill(rows, 0.0)
        data.batch["token_level_rewards"] = data.batch["token_level_rewards"].masked_fill(rows, 0.0)
    return data


def metrics(uids: Sequence[str], invalid: np.ndarray) -> dict[str, float]:
    """How many rows were kept out of training, for verl's tracker."""
    real = real_rows(uids)
    return {
        f"{METRIC_PREFIX}/excluded_rows": float(invalid.sum()),
        f"{METRIC_PREFIX}/excluded_fraction": float(invalid.sum() / max(1, real.sum())),
    }
