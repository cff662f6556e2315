"""A process-wide pool of browser envs: reuse across episodes, a concurrency cap, transparent
restart of crashed browsers (counted), cleanup at exit.

One pool per (backend, options) per process (``get_pool``): agent-loop objects are created per
trajectory by verl, so the pool must outlive them. ``lease()`` (threads) and ``alease()``
(asyncio) hand out one env for one episode; the env is healthy when handed out.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from verl_ext.envs.base import ScreenEnv
from verl_ext.envs.core import EnvFault


_BACKENDS: dict[str, Callable[..., ScreenEnv]] = {}
_BUILT_IN = ("minidesk", "miniwob", "text_hybrid")


def register_env_backend(name: str, factory: Callable[..., ScreenEnv]) -> None:
    """Make ``name`` usable as a dataset row's ``extra_info.env.backend``. Register from a module
    every agent-loop worker imports (e.g. your package's ``verl.plugins`` entry point), or skip
    registration and name the factory as ``"package.module:Factory"`` in the row instead."""
    if name in _BUILT_IN:
        raise ValueError(f"env backend name {name!r} is built in; pick another name")
    _BACKENDS[name] = factory


def make_env(backend: str, **options: Any) -> ScreenEnv:
    """``minidesk``, ``miniwob``, ``text_hybrid`` (imported lazily), a name given to ``register_env_backend``, or an
    import path ``"package.module:Factory"`` of a callable returning a ``ScreenEnv``."""
    if backend == "minidesk":
        from verl_ext.envs.minidesk.env import MiniDeskEnv

        return MiniDeskEnv(**options)
    if backend == "miniwob":
        from verl_ext.envs.miniwob_env import MiniWoBEnv

        return MiniWoBEnv(**options)
    if backend == "text_hybrid":  # pure Python, no browser (verl_ext.envs.text_hybrid)
        from verl_ext.envs.text_hybrid import make_text_hybrid_env

        return make_text_hybrid_env(**options)
    if backend in _BACKENDS:
        return _BACKENDS[backend](**options)
    if ":" in backend:
        module_name, _, attribute = backend.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute, None)
        if factory is None:
            raise ValueError(f"env backend {backend!r}: {module_name} has no attribute {attribute!r}")
        return factory(**options)
    registered = ", ".join([*_BUILT_IN, *sorted(_BACKENDS)])
    raise ValueError(f"unknown env backend {backend!r}: use one of {registered}, or 'package.module:Factory'")


class EnvPool:
    """At most ``max_envs`` envs; idle ones are reused, dead browsers restarted on hand-out.

    Stats (``stats()``): ``created``, ``restarts`` (browsers found dead or faulted and restarted),
    ``faults`` (episodes returned with a fault), ``leases``, ``in_use``, ``idle``.
    """

    def __init__(self, factory: Callable[[], ScreenEnv], max_envs: int = 4):
        if max_envs < 1:
            raise ValueError("max_envs must be >= 1")
        self._factory = factory
        self._slots = threading.BoundedSemaphore(max_envs)
        self._lock = threading.Lock()
        self._idle: list[ScreenEnv] = []
        self._all: list[ScreenEnv] = []
        self._stats = {"created": 0, "faults": 0, "leases": 0}
        self.max_envs = max_envs

    def acquire(self) -> ScreenEnv:
        """Block until a slot is free, then hand out a healthy env (threads)."""
        self._slots.acquire()
        return self._checkout()

    def _checkout(self) -> ScreenEnv:
        """With a slot already taken: reuse or create an env and make sure its browser is fine."""
        try:
            with self._lock:
                env = self._idle.pop() if self._idle else None
            if env is None:
                env = self._factory()
                with self._lock:
                    self._all.append(env)
                    self._stats["created"] += 1
            if not env.ensure_screen() and env.faulted is not None:
                # The last episode faulted but the browser answers (a hang or page error): start clean.
                env.screen.close()
                env.ensure_screen()
            self._count("leases")
            return env
        except BaseException:
            self._slots.release()
            raise

    def release(self, env: ScreenEnv) -> None:
        if env.faulted is not None:
            self._count("faults")
        with self._lock:
            self._idle.append(env)
        self._slots.release()

    @contextlib.contextmanager
    def lease(self) -> Iterator[ScreenEnv]:
        env = self.acquire()
        try:
            yield env
        finally:
            self.release(env)

    @contextlib.asynccontextmanager
    async def alease(self) -> AsyncIterator[ScreenEnv]:
        # Wait for a slot on the event loop, not in an executor thread: hundreds of waiting
        # trajectories must not occupy the threads that the running episodes step their envs in.
        while not self._slots.acquire(blocking=False):
            await asyncio.sleep(0.02)
        env = await asyncio.to_thread(self._checkout)
        try:
            yield env
        finally:
            self.release(env)

    def reset(self, env: ScreenEnv, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """``env.reset`` that restarts the browser once if the reset itself faults."""
        try:
            return env.reset(seed=seed, options=options)
        except EnvFault:
            env.screen.close()
            return env.reset(seed=seed, options=options)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            restarts = sum(env.screen_restarts for env in self._all)
            in_use = len(self._all) - len(self._idle)
            return {**self._stats, "restarts": restarts, "in_use": in_use, "idle": len(self._idle)}

    def close(self) -> None:
        with self._lock:
            envs, self._all, self._idle = self._all, [], []
        for env in envs:
            env.close()


_POOLS: dict[tuple, EnvPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(backend: str, max_envs: int = 4, **options: Any) -> EnvPool:
    """The process-wide pool for this backend and these env options."""
    key = (backend, max_envs, tuple(sorted(options.items())))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = EnvPool(lambda: make_env(backend, **options), max_envs)
        return _POOLS[key]


@atexit.register
def close_all_pools() -> None:
    """Close every pool of this process (at exit, and in tests)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()
