"""ToolCUA's tool-efficient path reward (arXiv 2605.12481), a group-level reward post-processor.

``R_length`` (the paper's Tool-Efficient Path Reward) compares a
trajectory's step count with the mean step count of its rollout group, so it cannot be computed in
verl's per-sample reward loop; the env/reward code calls these functions once the group is done.
"""

from __future__ import annotations

import numpy as np

from verl_ext.advantages import grouping


def path_length_reward(
    uid: np.ndarray, num_steps: np.ndarray, success: np.ndarray, *, max_steps: float = 30.0
) -> np.ndarray:
    """``R_length`` of every trajectory (one row per trajectory).

    ``s_bar`` is the mean step count of the trajectory's ``uid`` group (failures included, as the
    worked check in §2.3 does). Successful trajectories get ``1 + (s_bar - s) / s_bar`` when shorter
    than ``s_bar`` and ``exp(-(s - s_bar) / (max_steps - s_bar))`` otherwise; failures get 0.

    Args:
        uid: shape (m,), rollout group of each trajectory.
        num_steps: shape (m,), steps taken (``s``).
        success: shape (m,), task success (``I_succ``).
        max_steps: ``S_max``, the episode step limit (30 in ToolCUA).

    Returns:
        shape (m,) float64, in (1, 2] for short successes, (e^-1, 1] for long ones, 0 on failure.
    """
    steps = np.asarray(num_steps, dtype=np.float64)
    codes, uniques = grouping.factorize(np.asarray(uid))
    mean_steps = grouping.segment_sum(steps, codes, len(uniques)) / grouping.segment_count(codes, len(uniques))
    s_bar = mean_steps[codes]
    headroom = max_steps - s_bar
    longer = steps > s_bar
    if np.any(longer & (headroom <= 0)):
        raise ValueError(
            f"a trajectory is longer than its group mean but max_steps={max_steps} <= the group "
            "mean; set max_steps to the env's real step limit"
        )
    short = 1.0 + (s_bar - steps) / np.where(s_bar > 0, s_bar, 1.0)
    long = np.exp(-np.where(longer, steps - s_bar, 0.0) / np.where(headroom > 0, headroom, 1.0))
    return np.where(np.asarray(success, dtype=bool), np.where(steps < s_bar, short, long), 0.0)


def tool_efficient_reward(
    uid: np.ndarray,
    num_steps: np.ndarray,
    success: np.ndarray,
    format_ok: np.ndarray,
    num_tool_calls: np.ndarray,
    tool_beneficial: np.ndarray,
    *,
    tool_weight: float = 0.4,
    length_weight: float = 0.2,
    max_steps: float = 30.0,
) -> np.ndarray:
    """ToolCUA's trajectory reward ``R_fmt + R_acc + lambda * R_tool + beta * R_length``.

    Args:
        uid, num_steps, success: as in ``path_length_reward``; shape (m,).
        format_ok: shape (m,), ``R_fmt`` (every tool call well formed; assumed binary, §2.3).
        num_tool_calls: shape (m,), ``c``.
        tool_beneficial: shape (m,), the task's ``t_b`` label, +1 or -1.
        tool_weight: lambda (0.4). length_weight: beta (0.2). max_steps: ``S_max``.

    Returns:
        shape (m,) float64. ``R_tool = I_succ * [(t_b > 0 and c > 0) or (t_b < 0 and c = 0)]``.
    """
    succ = np.asarray(success, dtype=bool)
    calls = np.asarray(num_tool_calls)
    benefit = np.asarray(tool_beneficial)
    tool = succ & (((benefit > 0) & (calls > 0)) | ((benefit < 0) & (calls == 0)))
    length = path_length_reward(uid, num_steps, succ, max_steps=max_steps)
    return np.asarray(format_ok, dtype=np.float64) + succ + tool_weight * tool + length_weight * length
