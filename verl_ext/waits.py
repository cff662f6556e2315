"""Bounded waits on other components (Ray actors, servers): a wait that passes its bound raises
``WaitExpired`` naming the component, what was awaited, the bound and the key that changes it,
so a hung rollout server, scorer or segment log stops the trainer with a cause instead of
hanging it. docs/reference/validation.md ("Waits and timeouts") lists every bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class WaitExpired(TimeoutError):
    """A wait on another component passed its bound."""


def expired(component: str, what: str, timeout_s: float, key: str) -> WaitExpired:
    return WaitExpired(
        f"verl-ext: {component} did not {what} within {timeout_s:g} s; it may be hung. "
        f"If it is only slow, raise {key} (now {timeout_s:g})"
    )


def check_timeout(key: str, value: float) -> None:
    """A bound must be a positive number of seconds; raises naming ``key``."""
    if not value > 0:
        raise ValueError(f"{key} must be > 0 seconds, got {value!r}")


def ray_get(refs: Any, timeout_s: float, component: str, what: str, key: str) -> Any:
    """``ray.get(refs)`` for at most ``timeout_s``; ``WaitExpired`` after that."""
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as exc:
        raise expired(component, what, timeout_s, key) from exc


async def wait_for(awaitable: Awaitable[T], timeout_s: float, component: str, what: str, key: str) -> T:
    """``await awaitable`` (a coroutine, future or Ray object ref) for at most ``timeout_s``."""
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError as exc:
        raise expired(component, what, timeout_s, key) from exc
