"""verl_ext.timing: self times of nested hooks, reports across ranks, the step's total and share.

The CPU clock is replaced by a counter the test advances, so the arithmetic is checked exactly;
the CUDA path (events read once per step) runs only where CUDA is present."""

import math

import pytest
import torch

from verl_ext import timing
from verl_ext.timing import (
    accumulate,
    held_bytes,
    hook_timer,
    merge_reports,
    step_metrics,
    timed,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    hook_timer().collect()  # spans left by earlier tests in this process
    fake = _Clock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_nested_hooks_report_self_time_and_verl_work_counts_in_no_hook(clock):
    with timed("advantages"):
        clock.now += 1.0
        with timed(None):  # verl's own work inside the hook
            clock.now += 10.0
            with timed("reward_postprocess"):
                clock.now += 2.0
        with timed("advantages"):  # the same hook nested: counted once
            clock.now += 3.0
        clock.now += 0.5
    assert hook_timer().collect() == {
        "verl_ext/time/advantages": 4.5,
        "verl_ext/time/reward_postprocess": 2.0,
    }
    assert hook_timer().collect() == {}  # a step's spans are reported once


def test_decorated_functions_time_every_call_including_recursive_ones(clock):
    @timed("segment_scoring")
    def score(depth: int) -> int:
        clock.now += 1.0
        return depth if depth == 0 else score(depth - 1)

    score(2)
    score(0)
    assert hook_timer().collect() == {"verl_ext/time/segment_scoring": 4.0}


def test_a_hook_still_open_is_reported_with_the_next_collect(clock):
    with timed("version_bookkeeping"):
        clock.now += 1.0
        with timed("ewma_update"):
            clock.now += 2.0
        assert hook_timer().collect() == {}  # the inner span belongs to the open one
        clock.now += 1.0
    assert hook_timer().collect() == {"verl_ext/time/version_bookkeeping": 2.0, "verl_ext/time/ewma_update": 2.0}


def test_device_only_spans_record_nothing_off_cuda(clock):
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: the span would be recorded")
    with timed("weight_swap_gpu", device_only=True):
        clock.now += 1.0
    assert hook_timer().collect() == {}


def test_held_bytes_counts_each_storage_once_by_where_it_lives():
    a = torch.zeros(10, dtype=torch.float32)
    out = held_bytes("ewma_shadow", [a, a[:5], torch.zeros(3, dtype=torch.bfloat16)])
    assert out == {"verl_ext/mem/ewma_shadow/gpu_bytes": 0.0, "verl_ext/mem/ewma_shadow/host_bytes": 46.0}


def test_ranks_merge_to_the_slowest_time_and_the_sum_of_bytes_and_calls_add_up():
    ranks = [
        {"verl_ext/time/ewma_update": 0.2, "verl_ext/mem/ewma_shadow/gpu_bytes": 100.0},
        {"verl_ext/time/ewma_update": 0.3, "verl_ext/mem/ewma_shadow/gpu_bytes": 100.0},
    ]
    assert merge_reports(ranks) == {"verl_ext/time/ewma_update": 0.3, "verl_ext/mem/ewma_shadow/gpu_bytes": 200.0}
    step: dict[str, float] = {}
    accumulate(step, ranks)  # two local updates (parameter_sync_step=2) in one step
    accumulate(step, ranks)
    assert step == {"verl_ext/time/ewma_update": 0.6, "verl_ext/mem/ewma_shadow/gpu_bytes": 200.0}


def test_step_metrics_add_the_total_and_its_share_of_verls_step():
    hooks = {"verl_ext/time/a": 0.25, "verl_ext/time/b": 0.5, "verl_ext/mem/x/host_bytes": 1e9}
    out = step_metrics(hooks, step_seconds=10.0)
    assert out["verl_ext/time/total"] == 0.75
    assert out["verl_ext/time/share_of_step"] == 0.075
    assert out["verl_ext/mem/x/host_bytes"] == 1e9
    empty = step_metrics({}, step_seconds=2.0)
    assert empty["verl_ext/time/total"] == 0.0 and empty["verl_ext/time/share_of_step"] == 0.0
    assert math.isnan(step_metrics({}, None)["verl_ext/time/share_of_step"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_spans_time_the_compute_stream_with_events():
    hook_timer().collect()
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    with timed("ewma_update"):
        for _ in range(10):
            x = x @ x / 2048
        with timed("weight_swap_gpu", device_only=True):
            y = x.to("cpu", non_blocking=True)
    span = hook_timer().spans[0]
    assert span.on_device and isinstance(span.start, torch.cuda.Event)
    out = hook_timer().collect()  # reads the events once, here
    assert out["verl_ext/time/ewma_update"] > 0 and out["verl_ext/time/weight_swap_gpu"] > 0
    assert y.shape == x.shape
