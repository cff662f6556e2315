"""Rule reward for the arithmetic quickstart: 1 for the right number, 0.1 for any number."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, **kwargs) -> float:
    """verl ``custom_reward_function``: score the last integer in the response."""
    numbers = _NUMBER.findall(solution_str)
    if not numbers:
        return 0.0
    return 1.0 if numbers[-1] == str(ground_truth).strip() else 0.1
