"""What timing a hook costs (``verl_ext.timing``): entering and leaving one span, and reading it
once per step, on the CPU clock and (where CUDA is present) with CUDA events.

    python scripts/bench/hook_timer_overhead.py [--spans 20000] [--repeats 5]

Prints microseconds per span (median of the repeats): ``span`` is the hot-path cost (what a hook
pays each time it runs), ``collect`` the per-span share of the once-per-step read. A training
step runs a few dozen spans, so multiply by that to get the timer's cost per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from verl_ext.timing import hook_timer, timed


def per_span_us(spans: int, repeats: int, nested: bool) -> tuple[float, float]:
    """(span enter+exit, collect) in µs per span, medians over ``repeats``."""
    enter_exit, collect = [], []
    for _ in range(repeats):
        hook_timer().collect()
        start = time.perf_counter()
        for _ in range(spans):
            with timed("outer"):
                if nested:
                    with timed(None):
                        pass
        enter_exit.append((time.perf_counter() - start) / spans * 1e6)
        start = time.perf_counter()
        hook_timer().collect()
        collect.append((time.perf_counter() - start) / spans * 1e6)
    bare = []
    for _ in range(repeats):  # the loop itself, subtracted
        start = time.perf_counter()
        for _ in range(spans):
            pass
        bare.append((time.perf_counter() - start) / spans * 1e6)
    per = 2 if nested else 1
    return (statistics.median(enter_exit) - statistics.median(bare)) / per, statistics.median(collect) / per


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    clocks = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"| clock | spans | span enter+exit (µs) | collect per span (µs) | nested span enter+exit (µs) |")
    print("|---|---|---|---|---|")
    for clock in clocks:
        if clock == "cuda":
            torch.zeros(1, device="cuda")  # initialises CUDA: spans now record events
            torch.cuda.synchronize()
        flat, flat_collect = per_span_us(args.spans, args.repeats, nested=False)
        nested, _ = per_span_us(args.spans, args.repeats, nested=True)
        print(f"| {clock} | {args.spans} | {flat:.2f} | {flat_collect:.2f} | {nested:.2f} |")
    print(f"\ntorch {torch.__version__}" + (f", {torch.cuda.get_device_name(0)}" if "cuda" in clocks else ", no CUDA"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
