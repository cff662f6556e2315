"""Shared fixtures for the env tests: skip browser tests cleanly when Chromium is absent, and
make sure every browser a test starts is closed."""

from __future__ import annotations

import pytest

from verl_ext.envs.browser import chromium_missing_reason

_MISSING = chromium_missing_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _MISSING is None:
        return
    skip = pytest.mark.skip(reason=f"browser test skipped: {_MISSING}")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def minidesk():
    """One MiniDesk env per test module (reset between tests), always closed."""
    from verl_ext.envs.minidesk.env import MiniDeskEnv

    env = MiniDeskEnv()
    yield env
    env.close()
