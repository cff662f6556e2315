"""Shared fixtures: a tiny model built once per test session (no downloads)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from verl_ext.tiny_model import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), seed=0)
