"""verl-ext's own cost per training step: every hook times itself and reports the memory it holds.

One timer per process (``hook_timer()``): the trainer process (driver) and each actor worker.
Code that runs inside a training step wraps itself in ``timed("<hook>")`` (a context manager and a
decorator); once per step the trainer collects the driver's spans and the workers' reports
(``collect``) and logs, through verl's metrics dict:

- ``verl_ext/time/<hook>``: seconds the hook took this step (its self time: nested hooks and
  ``timed(None)`` spans, which mark verl's own work inside a hook, are not counted twice);
- ``verl_ext/mem/<what>/{gpu,host}_bytes``: bytes held by verl-ext's state (``held_bytes``);
- ``verl_ext/time/total`` and ``verl_ext/time/share_of_step`` (of verl's ``timing_s/step``).

Clocks. Where CUDA is initialised (actor workers), a span records two CUDA events on the current
stream and reads them when the step's report is collected: no synchronisation on the hot path,
and the span measures what the hook adds to the compute stream (launch gaps included when the
GPU waits for the host). Elsewhere (the driver, the cpu backend) ``time.perf_counter``. A span
nested in another uses its parent's clock. ``device_only=True`` records nothing off CUDA: for
worker work whose host time the driver already measures around the call that runs it.

Adding times across processes: the workers of one step run in parallel, so a worker hook's time is
the largest over ranks (``merge_reports``); bytes add up over ranks. The total sums driver wall
time and worker compute-stream time; where a worker's GPU work overlaps the driver's wait for the
call that launched it the overlap is counted twice, so the total is an upper bound.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TIME_PREFIX = "verl_ext/time/"
MEM_PREFIX = "verl_ext/mem/"
TOTAL = f"{TIME_PREFIX}total"
SHARE_OF_STEP = f"{TIME_PREFIX}share_of_step"


@dataclass
class _Span:
    hook: str | None  # None: verl's own work inside a hook, counted in no hook
    parent: int | None  # index of the enclosing span
    start: Any  # perf_counter float or torch.cuda.Event
    end: Any = None
    on_device: bool = False

    def elapsed_s(self) -> float:
        if not self.on_device:
            return self.end - self.start
        if not self.end.query():  # read at the step's end: the work is done, this rarely waits
            self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1000.0


@dataclass
class HookTimer:
    """Spans of the current step in this process, turned into seconds per hook by ``collect``.
    Spans nest as the calls do, so hooks are timed from one thread per process (the trainer's
    loop; an actor worker's method calls)."""

    spans: list[_Span] = field(default_factory=list)
    _open: list[int] = field(default_factory=list)  # indices of the spans entered and not exited

    def enter(self, hook: str | None, device_only: bool = False) -> int | None:
        """Opens a span; returns its index for ``exit`` (None: not recorded, see ``device_only``)."""
        parent = self._open[-1] if self._open else None
        on_device = self.spans[parent].on_device if parent is not None else _cuda_initialized()
        if device_only and not on_device:
            return None
        self.spans.append(_Span(hook, parent, _now(on_device), on_device=on_device))
        self._open.append(len(self.spans) - 1)
        return self._open[-1]

    def exit(self, index: int | None) -> None:
        if index is not None:
            self._open.pop()
            span = self.spans[index]
            span.end = _now(span.on_device)

    def collect(self) -> dict[str, float]:
        """``{verl_ext/time/<hook>: self seconds}`` of the spans closed since the last call. A span
        still open (a report collected inside a hook) stays, with what it encloses, for the next call."""
        cut = self._open[0] if self._open else len(self.spans)  # everything after it lies inside it
        done, self.spans = self.spans[:cut], self.spans[cut:]
        for span in self.spans:
            span.parent = None if span.parent is None else span.parent - cut
        self._open = [i - cut for i in self._open]
        seconds: dict[str | None, float] = {}
        for span in done:
            elapsed = span.elapsed_s()
            seconds[span.hook] = seconds.get(span.hook, 0.0) + elapsed
            if span.parent is not None:  # a parent's time is its self time
                parent = done[span.parent].hook
                seconds[parent] = seconds.get(parent, 0.0) - elapsed
        return {f"{TIME_PREFIX}{hook}": max(0.0, s) for hook, s in seconds.items() if hook is not None}


_TIMER = HookTimer()


def hook_timer() -> HookTimer:
    """This process's timer."""
    return _TIMER


def timed(hook: str | None, device_only: bool = False) -> contextlib.AbstractContextManager[None]:
    """Times the body (or, as ``@timed("hook")``, each call of the function) into
    ``verl_ext/time/<hook>``; ``timed(None)`` marks verl's own work inside a hook, counted in no hook."""
    return _TimedSpan(hook, device_only)


class _TimedSpan(contextlib.ContextDecorator):
    def __init__(self, hook: str | None, device_only: bool) -> None:
        self.hook, self.device_only = hook, device_only
        self._open: list[int | None] = []  # re-entrant as a decorator of a recursive function

    def __enter__(self) -> None:
        self._open.append(_TIMER.enter(self.hook, self.device_only))

    def __exit__(self, *exc: object) -> None:
        _TIMER.exit(self._open.pop())


def held_bytes(what: str, tensors: Iterable[Any]) -> dict[str, float]:
    """``verl_ext/mem/<what>/{gpu,host}_bytes``: bytes of the (distinct storages of the) tensors."""
    seen: set[int] = set()
    out = {f"{MEM_PREFIX}{what}/gpu_bytes": 0.0, f"{MEM_PREFIX}{what}/host_bytes": 0.0}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        out[f"{MEM_PREFIX}{what}/{'host' if t.device.type == 'cpu' else 'gpu'}_bytes"] += storage.nbytes()
    return out


def merge_reports(reports: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One report from the workers' reports of a step: the slowest rank's time, the sum of bytes."""
    out: dict[str, float] = {}
    for report in reports:
        for key, value in report.items():
            if key.startswith(MEM_PREFIX):
                out[key] = out.get(key, 0.0) + value
            else:
                out[key] = max(out.get(key, 0.0), value)
    return out


def accumulate(into: dict[str, float], reports: Sequence[Mapping[str, float]]) -> None:
    """Adds the workers' reports of one call (``merge_reports``) to ``into``: times add up over
    the calls of a step, bytes are the latest."""
    for key, value in merge_reports(reports).items():
        into[key] = value if key.startswith(MEM_PREFIX) else into.get(key, 0.0) + value


def step_metrics(hooks: Mapping[str, float], step_seconds: float | None) -> dict[str, float]:
    """The hooks' metrics of one step plus ``verl_ext/time/total`` and its share of verl's
    ``timing_s/step`` (``step_seconds``; NaN when verl did not time the step)."""
    out = dict(hooks)
    total = sum(v for k, v in hooks.items() if k.startswith(TIME_PREFIX))
    out[TOTAL] = total
    out[SHARE_OF_STEP] = total / step_seconds if step_seconds else float("nan")
    return out


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # importing verl_ext stays cheap: no torch import here
    return torch is not None and torch.cuda.is_initialized()


def _now(on_device: bool) -> Any:
    if not on_device:
        return time.perf_counter()
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
