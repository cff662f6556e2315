"""Gymnasium-style env wrappers: cross-cutting behaviour (fault injection, hints) around an env
instead of constructor flags inside it."""

from __future__ import annotations

from typing import Any


class EnvWrapper:
    """Wraps ``env``: ``reset`` and ``step`` go through the wrapper, every other attribute (the
    pool's and the agent loop's: ``tool_defs``, ``counts``, ``faulted``, ``screen``, ...) is the
    wrapped env's."""

    def __init__(self, env: Any):
        self.env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    @property
    def unwrapped(self) -> Any:
        return getattr(self.env, "unwrapped", self.env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.env.step(action)
