"""The verl-ext trainers' advantage step (``VerlExtTrainerMixin._compute_advantage``), around the one
call to verl's ``compute_advantage_for_multi_trajectories``: faulted rows leave their groups, the
share of groups with one reward for all rows, and the step-aware estimators in its place.

``data`` is verl's ``DataProto`` of the batch; ``extra_fields`` its rows' ``extra_fields`` in row order.
"""

from __future__ import annotations

import os

from collections.abc import Callable
from typing import Any

import numpy as np


def exclude_invalid_rewards(data: Any, extra_fields: list[dict], key: str | None, nan_scores: bool, metrics: dict,
                            config: Any = None) -> np.ndarray:
    """Rows whose episode faulted (step metadata ``valid=False``) or whose reward the manager flagged
    as a fault (``reward_extra_info[key] == 0``) leave their group and the loss
    (``verl_ext.advantages.validity``); returns their mask for ``zero_out``. When every row is
    such a row the run stops with the reasons (``validity.check_trainable``)."""
    from verl_ext.advantages import validity
    from verl_ext.rewards.dvreward.startup import describe_judge

    uids = [str(u) for u in data.non_tensor_batch["uid"]]
    invalid = validity.invalid_rows(uids, extra_fields, key)
    validity.check_trainable(uids, extra_fields, invalid, key, describe_judge(config))
    validity.exclude(data, invalid, nan_scores)
    if key is not None or invalid.any():
        metrics.update(validity.metrics(uids, invalid))
    return invalid


def uniform_reward_groups(data: Any) -> dict[str, float]:
    """``verl_ext/groups/uniform_reward_share``: the share of the batch's rollout groups (``uid``, two or
    more rows) whose rows all got the same reward (after post-processing and fault exclusion), i.e.
    whose advantages a group-relative estimator sets to 0; ``verl_ext/groups/count``: those groups."""
    from verl_ext.advantages import grouping

    scores = data.batch["token_level_rewards"].sum(dim=-1).float().cpu().numpy()
    codes, uniques = grouping.factorize(np.asarray([str(u) for u in data.non_tensor_batch["uid"]], dtype=object))
    share, groups = grouping.uniform_group_share(scores, codes, len(uniques))
    if groups == 0:  # one sample per prompt: no group to speak of
        return {}
    return {"verl_ext/groups/uniform_reward_share": share, "verl_ext/groups/count": float(groups)}


def step_aware_estimator(extra_fields: list[dict], dump: str | None = None) -> Callable[..., Any]:
    """A stand-in for verl's ``compute_advantage_for_multi_trajectories`` (same signature) that
    computes step-aware token advantages from the rows' step metadata; with ``dump`` (a file path)
    it also saves the inputs and outputs there (``trainer.v1.verl_ext.dump_advantages_dir``)."""
    from verl_ext.advantages.verl_glue import compute_token_advantages
    from verl_ext.steps import EXTRA_FIELDS_KEY

    def compute(data, batch_keys, adv_estimator, gamma, lam, num_repeat, norm_adv_by_std_in_grpo, config):
        inputs = dict(
            response_mask=data.batch["response_mask"],
            extra_fields=extra_fields,
            uids=[str(u) for u in data.non_tensor_batch["uid"]],
            scores=data.batch["token_level_rewards"].sum(dim=-1),
            row_keys=list(batch_keys),
            values=data.batch["values"] if "values" in data.batch.keys() else None,
        )
        advantages, returns = compute_token_advantages(adv_estimator, algo_config=config, **inputs)
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
        if dump is not None:
            import torch

            os.makedirs(os.path.dirname(dump), exist_ok=True)
            inputs["extra_fields"] = [{EXTRA_FIELDS_KEY: (f or {}).get(EXTRA_FIELDS_KEY)} for f in extra_fields]
            torch.save({**inputs, "estimator": adv_estimator, "advantages": advantages, "returns": returns}, dump)
        return data

    return compute
