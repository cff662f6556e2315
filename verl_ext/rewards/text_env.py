"""Reward for ``text_env`` episodes (``TextCorridor``): 1 when the agent reached the exit, else 0.

A verl ``custom_reward_function`` (``reward.custom_reward_function.path=pkg://verl_ext.rewards.text_env``).
verl 0.9.1's reward loop merges the agent loop's ``extra_fields`` into ``extra_info``
(``reward_manager/naive.py``: ``extra_info.update(tool_extra_fields.items())``), so the episode
record is ``extra_info["verl_ext"]`` (``verl_ext.steps.StepMetadata``). The response text is not
re-parsed: the env already judged every action.

The returned dict's other keys become verl's reward extras, which validation reports as
``val-aux/<data_source>/<key>/mean@<n>``.
"""

from __future__ import annotations

from typing import Any

from verl_ext.steps import step_metadata


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, float]:
    """``score`` = episode success (equal to the sum of the env's step rewards), plus counts.

    Raises:
        verl_ext.steps.MissingStepMetadataError: the row was not produced by the ``text_env`` loop
            (the message names the agent-loop setting).
    """
    meta = step_metadata(extra_info)
    # One row per turn holds a single step; the episode's step count is in the extras.
    num_steps = int(meta.extras.get("num_steps", meta.num_steps))
    steps = max(num_steps, 1)
    success = float(bool(meta.extras.get("success")))
    return {
        "score": success,
        "success": success,
        "num_steps": float(num_steps),
        "invalid_action_rate": float(meta.extras.get("num_invalid_actions", 0)) / steps,
        "right_action_rate": float(meta.extras.get("num_right", 0)) / steps,
    }
