"""Shared fixtures for the env tests: every browser a test starts is closed. (Tests marked
``browser`` are skipped, or failed under CI=true, by tests/conftest.py when Chromium is absent.)"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def minidesk():
    """One MiniDesk env per test module (reset between tests), always closed."""
    from verl_ext.envs.minidesk.env import MiniDeskEnv

    env = MiniDeskEnv()
    yield env
    env.close()
