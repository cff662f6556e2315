"""Run a callback right after a named module finishes importing (a post-import hook).

verl imports its registries (``core_algos``, the agent-loop module, the platform registry, ...)
lazily and only in the processes that need them. Registering our plugins at that moment, instead
of importing all of verl's heavy modules when the ``verl.plugins`` entry point fires, keeps
``import verl`` as cheap in an inference server as it is without verl-ext.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable

_hooks: dict[str, list[Callable[[], None]]] = {}
_lock = threading.RLock()


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _fire(self._name)

    def __getattr__(self, item):  # get_source, get_code, ... used by tracebacks and inspect
        return getattr(self._inner, item)


class _Finder(importlib.abc.MetaPathFinder):
    _busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_finder = _Finder()


def _fire(name: str) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for callback in callbacks:
        callback()


def when_imported(module_name: str, callback: Callable[[], None]) -> None:
    """Call ``callback()`` once ``module_name`` is imported (immediately if it already is)."""
    with _lock:
        if module_name in sys.modules:
            run_now = True
        else:
            run_now = False
            _hooks.setdefault(module_name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
    if run_now:
        callback()
