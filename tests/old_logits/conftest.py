"""Fixtures: the tiny policy and a batch with per-token versions (partial rollouts, tool tokens).

The project runs pytest with --import-mode=importlib, so this folder is put on sys.path for the
helper module ``old_logits_tiny_policy``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from old_logits_tiny_policy import PROMPT, RESPONSE, ROWS, VOCAB, TinyPolicy


@pytest.fixture
def policy() -> TinyPolicy:
    return TinyPolicy()


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Rows mixing versions 2..5 (partial rollouts), tool tokens (mask 0, version -1) and padding."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (ROWS, PROMPT + RESPONSE), generator=g)
    versions = torch.tensor(
        [
            [5, 5, 5, 5, 5, 5, 5, 5, 5],
            [2, 2, 2, -1, -1, 3, 3, 3, -1],
            [3, 3, 4, 4, 4, 5, 5, -1, -1],
            [4, 4, 4, 4, 4, 4, 4, 4, 4],
            [2, 2, 2, 2, 2, -1, -1, -1, -1],
            [3, 3, 3, -1, 4, 4, 5, 5, 5],
        ]
    )
    mask = (versions >= 0).long()
    return {
        "input_ids": input_ids,
        "response_mask": mask,
        "token_versions": versions,
        "rollout_log_probs": -torch.rand(ROWS, RESPONSE, generator=g) * 3,
    }
