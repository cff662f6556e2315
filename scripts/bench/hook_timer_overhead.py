"""What timing a hook costs (``verl_ext.timing``): one span, and reading it once per step.

On the CPU clock and (where CUDA is present) with CUDA events; microseconds per span, median of the
repeats: ``span`` is the hot-path cost (what a hook pays each time it runs), ``collect`` the per-span share
of the once-per-step read. A step runs a few dozen spans: multiply by that for the timer's cost per step.

    python -m scripts.bench.hook_timer_overhead [--spans 20000] [--repeats 5] [--json]

Docs section: none of its own (prints a table the docs quote).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from scripts.bench.report import table
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


def measure(spans: int, repeats: int) -> dict[str, dict[str, float]]:
    """µs per span on each clock this machine has: ``{clock: {span, collect, nested_span}}``."""
    clocks = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = {}
    for clock in clocks:
        if clock == "cuda":
            torch.zeros(1, device="cuda")  # initialises CUDA: spans now record events
            torch.cuda.synchronize()
        flat, collect = per_span_us(spans, repeats, nested=False)
        nested, _ = per_span_us(spans, repeats, nested=True)
        out[clock] = {"span": flat, "collect": collect, "nested_span": nested}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print measure()'s dict as JSON only")
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(measure(args.spans, args.repeats)))
        return 0
    print(table(["clock", "span enter+exit (µs)", "collect per span (µs)", "nested span enter+exit (µs)"],
                [[clock, *(f"{us[k]:.2f}" for k in ("span", "collect", "nested_span"))]
                 for clock, us in measure(args.spans, args.repeats).items()]))
    print(f"\n{args.spans} spans x {args.repeats} repeats, torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no CUDA"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
