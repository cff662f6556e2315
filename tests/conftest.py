"""Shared fixtures and collection rules for the whole suite.

- ``browser`` tests need Debian ``chromium`` + ``chromium-driver`` (and selenium). Where they are
  missing such a test is skipped with the reason, except under ``CI=true``, where it fails: CI must
  never turn green with its browser tests skipped.
- ``needs_extra("<extra>")`` tests need an optional extra of verl-ext (``EXTRA_MODULES``): the same
  rule (skipped with the reason, failed under ``CI=true``). A test that finds out only while it runs
  (e.g. a recipe whose plugins need an extra) calls ``cannot_run_here(reason)``.
- ``tests/gpu`` (marker ``gpu``) is collected only where torch sees a CUDA device or
  ``VERL_EXT_GPU_TESTS=1`` is set, so CPU CI never imports it.
- ``tiny_model_dir``: a tiny model built once per test session (no downloads).
- timeouts (pytest-timeout): pyproject's default per test; ``e2e`` and ``gpu`` tests get
  ``LONG_TEST_TIMEOUT_S`` unless they mark their own.
"""

from __future__ import annotations

import functools
import os
from typing import NoReturn

import pytest

# What each optional extra brings that verl-ext's own dependencies do not (pyproject's
# optional-dependencies; Pillow, psutil and httpx come with verl).
EXTRA_MODULES = {"gui": ("selenium", "miniwob"), "mcp": ("mcp",), "dev": ("openai", "matplotlib")}


def gpu_tests_enabled() -> bool:
    """Whether ``tests/gpu`` is collected: a CUDA device is visible, or VERL_EXT_GPU_TESTS=1 forces it."""
    if os.environ.get("VERL_EXT_GPU_TESTS") == "1":
        return True
    import torch

    return torch.cuda.is_available()


# Paths relative to this file that pytest does not collect.
collect_ignore = [] if gpu_tests_enabled() else ["gpu"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


@functools.cache
def _chromium_missing_reason() -> str | None:
    from verl_ext.envs.browser import chromium_missing_reason

    return chromium_missing_reason()


def browser_requirement(item: pytest.Item, ci: bool) -> str | None:
    """What to do with ``item`` before its fixtures start a browser: None (run it), or the reason
    it cannot run (skipped locally, failed under CI)."""
    if item.get_closest_marker("browser") is None:
        return None
    missing = _chromium_missing_reason()
    if missing is None:
        return None
    return f"CI=true and this browser test cannot run: {missing}" if ci else f"browser test skipped: {missing}"


def missing_extra(item: pytest.Item) -> str | None:
    """Why ``item``'s ``needs_extra`` marker cannot be met here (naming the modules and the pip
    command), or None."""
    from verl_ext.registry import importable

    marker = item.get_closest_marker("needs_extra")
    if marker is None:
        return None
    extra = marker.args[0]
    missing = [module for module in EXTRA_MODULES[extra] if not importable(module)]
    if not missing:
        return None
    return f"needs {', '.join(repr(m) for m in missing)}, not installed here: pip install 'verl-ext[{extra}]'"


def cannot_run_here(reason: str) -> NoReturn:
    """Skip the running test with ``reason``; under CI=true fail it instead."""
    if in_ci():
        pytest.fail(f"CI=true and this test cannot run: {reason}")
    pytest.skip(reason)


# a trainer run (tests/e2e, tests/gpu) starts Ray and verl's workers; one test may run two (resume)
LONG_TEST_TIMEOUT_S = 1800


@pytest.hookimpl(trylast=True)  # after tests/gpu/conftest.py marks its tests gpu
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _is_trainer_run(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TEST_TIMEOUT_S))
    # Trainer runs first: with ``--dist loadfile --no-loadscope-reorder`` the workers take files in
    # this order, so the minutes-long runs overlap each other and the many short tests fill the end,
    # instead of one worker finishing a trainer run alone while the other idles.
    items.sort(key=lambda item: not _is_trainer_run(item))


def _is_trainer_run(item: pytest.Item) -> bool:
    return bool(item.get_closest_marker("e2e") or item.get_closest_marker("gpu"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Runs before the item's fixtures, so a module-scoped browser fixture never starts.
    ci = in_ci()
    reason = browser_requirement(item, ci)
    if reason is not None:
        (pytest.fail if ci else pytest.skip)(reason)
    reason = missing_extra(item)
    if reason is not None:
        cannot_run_here(reason)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from verl_ext.tiny_model import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), seed=0)
