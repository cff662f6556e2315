"""Group-level reward post-processors, applied by the verl-ext trainers between verl's reward step
and the advantage estimator (any estimator: verl's own or verl-ext's step-aware ones).

verl scores each sample on its own; some rewards need the whole rollout group. Each
post-processor here is switched on by its own section under ``algorithm`` and reads the step
metadata agent loops write (``verl_ext.steps``):

- ``algorithm.path_length_reward`` (ToolCUA's ``R_length``, the group half of the Tool-Efficient
  Path Reward; the per-sample half is ``verl_ext.rewards.env_rewards.compute_score``): a
  successful trajectory shorter than its group's mean step count gains up to ``weight * 2``, a
  longer one less; failures gain nothing. Faulted trajectories (an env fault: step metadata
  ``valid=False``; a reward the reward manager flags, e.g. DVReward's ``dv_valid=0`` when the
  judge could not score it) are left out of the group mean and gain nothing, as every other group
  statistic leaves them out (``verl_ext.advantages.validity``).

The math lives in pure functions (``verl_ext.rewards.tool_path``); this module only maps verl's
batch rows to trajectories and writes the bonus onto each trajectory's last response token.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl_ext.steps import step_metadata

PATH_LENGTH_KEY = "path_length_reward"


def enabled(algo_config: Any) -> list[str]:
    """Names of the post-processors the ``algorithm`` config switches on, in application order."""
    section = algo_config.get(PATH_LENGTH_KEY, None) if algo_config is not None else None
    return [PATH_LENGTH_KEY] if section is not None and float(section.get("weight", 0.0)) != 0.0 else []


def path_length_settings(algo_config: Any) -> tuple[float, float]:
    """``(weight, max_steps)`` from ``algorithm.path_length_reward``; names the key when it is bad."""
    section = algo_config.get(PATH_LENGTH_KEY)
    weight = float(section.get("weight", 0.0))
    max_steps = section.get("max_steps", None)
    if max_steps is None or float(max_steps) <= 0:
        raise ValueError(f"algorithm.{PATH_LENGTH_KEY}.max_steps must be the env's step limit S_max (> 0), "
                         f"got {max_steps!r}; set it to the agent loop's max_steps")
    return weight, float(max_steps)


def path_length_bonus(
    uids: list[str], extra_fields: list[dict], *, weight: float, max_steps: float, flag_key: str | None = None
) -> tuple[np.ndarray, dict[str, float]]:
    """Per-row bonus ``weight * R_length`` and its metrics.

    Args:
        uids: shape (bs,), rollout-group id of each row; ``"pad..."`` rows are verl's padding.
        extra_fields: bs dicts holding each row's ``StepMetadata`` (``extras`` must carry
            ``num_steps`` and ``success``, as ``hybrid_gui_tool`` writes them).
        weight: beta of ToolCUA (0.2). max_steps: ``S_max``.
        flag_key: the ``reward_extra_info`` key the reward manager sets to 0 on a reward it could
            not compute (``validity.flag_key``; DVReward: ``dv_valid``), or None.

    Returns:
        ``(bonus, metrics)``: bonus shape (bs,), non-zero only on the row that holds a
        trajectory's last step (every row in the one-row-per-trajectory layout). A trajectory
        with any faulted row (env fault or flagged reward) gets 0 and is not in its group's mean.
    """
    from verl_ext.rewards.tool_path import path_length_reward
    from verl_ext.advantages.validity import invalid_rows

    bonus = np.zeros(len(uids))
    rows, groups, steps, success = [], [], [], []
    faulted = invalid_rows(uids, extra_fields, flag_key)
    metas = [None if str(uid).startswith("pad") else step_metadata(fields) for uid, fields in zip(uids, extra_fields)]
    left_out = {meta.traj_uid for meta, bad in zip(metas, faulted) if bad}
    last_row: dict[str, tuple[int, int, dict]] = {}  # traj_uid -> (last step index, row, extras)
    for i, meta in enumerate(metas):
        if meta is None or meta.traj_uid in left_out:
            continue
        last_step = max(meta.step_idx) if meta.step_idx else -1
        if meta.traj_uid not in last_row or last_step > last_row[meta.traj_uid][0]:
            last_row[meta.traj_uid] = (last_step, i, meta.extras)
    for _, i, extras in last_row.values():
        if "num_steps" not in extras or "success" not in extras:
            raise KeyError(f"algorithm.{PATH_LENGTH_KEY} needs extras.num_steps and extras.success in the step "
                           "metadata (written by the hybrid_gui_tool agent loop); remove the section for other envs")
        rows.append(i)
        groups.append(str(uids[i]))
        steps.append(float(extras["num_steps"]))
        success.append(bool(extras["success"]))
    if not rows:
        return bonus, {}
    r_length = path_length_reward(np.array(groups, dtype=object), np.array(steps), np.array(success),
                                  max_steps=max_steps)
    bonus[rows] = weight * r_length
    won = np.array(success)
    metrics = {"verl_ext/path_length_reward/mean": float(r_length.mean())}
    if won.any():
        metrics["verl_ext/path_length_reward/success_mean"] = float(r_length[won].mean())
        metrics["verl_ext/path_length_reward/success_steps"] = float(np.array(steps)[won].mean())
    return bonus, metrics


def apply(data: Any, extra_fields: list[dict], algo_config: Any, flag_key: str | None = None) -> dict[str, float]:
    """Apply the enabled post-processors to ``data.batch["token_level_rewards"]`` (a verl
    ``DataProto`` with ``response_mask`` and ``uid``); returns their metrics. ``flag_key``: the
    reward manager's validity key (``validity.flag_key(config.reward)``), so rows whose reward it
    flagged are left out as faulted."""
    metrics: dict[str, float] = {}
    if PATH_LENGTH_KEY in enabled(algo_config):
        weight, max_steps = path_length_settings(algo_config)
        uids = [str(u) for u in data.non_tensor_batch["uid"]]
        bonus, metrics = path_length_bonus(uids, extra_fields, weight=weight, max_steps=max_steps, flag_key=flag_key)
        rewards = data.batch["token_level_rewards"].clone()  # it may alias token_level_scores
        mask = data.batch["response_mask"]
        last = (mask.shape[1] - 1 - torch.flip(mask, dims=[1]).to(torch.int64).argmax(dim=1)).clamp(min=0)
        has_tokens = mask.sum(dim=1) > 0
        add = torch.as_tensor(bonus, dtype=rewards.dtype, device=rewards.device) * has_tokens
        rewards[torch.arange(len(rewards), device=rewards.device), last] += add
        data.batch["token_level_rewards"] = rewards
    return metrics
