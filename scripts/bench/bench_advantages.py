"""Benchmark: vectorised step-aware advantage estimators vs straightforward Python loops.

Both sides get the same random step batch (tests/advantages/step_data.py) and are timed in
alternation, so machine load hits both alike; the loop versions are the test references in
tests/advantages/loop_reference.py. Prints a markdown table and, with --write, replaces the
``## Advantage estimators`` section of docs/benchmarks.md.

    python scripts/bench/bench_advantages.py                  # 1k, 10k, 100k, 1M rows
    python scripts/bench/bench_advantages.py --sizes 1000 10000 --write
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "advantages"))

from loop_reference import LOOPS  # noqa: E402
from step_data import BASE, random_steps  # noqa: E402

from verl_ext.advantages import compute_with_returns, grouping  # noqa: E402

# name -> (hyper-parameters, optional step columns): the published scripts' settings.
SETTINGS = {
    "gigpo": (dict(gamma=0.95, mode="mean_std_norm"), ()),
    "hgpo": (dict(gamma=0.95, mode="mean_std_norm", history_length=2), ()),
    "step_grouped": (dict(gamma=0.5, mode="mean_std_norm"), ("action_match",)),
    "himac": (dict(gamma=0.95, mode="mean_std_norm"), ("role",)),
    "hiper": (dict(gamma=1.0, lam=1.0, lam_seg=0.95), ("role", "values", "truncated")),
}
GROUP_SIZE, MAX_LEN, N_ANCHORS = 8, 30, 20
ROWS_PER_GROUP = (1 + GROUP_SIZE) / 2 * (1 + MAX_LEN) / 2  # expected rows of one random group
HEADING = "## Advantage estimators"
NOTES = """
Reading the tables:

- String keys: every id and anchor is a python object that has to be hashed and compared once per
  row (a dict built and queried in C, about 50-100 ns per row and column); the loop pays the same
  cost, so these columns bound the speedup. Integer keys (ids or anchor hashes an agent loop
  stores as int64) skip it.
- `hiper`'s loop is a plain two-level GAE recurrence with no group statistics (2-4 µs per row
  here), so there is less to win than for the group estimators.
- Rows are shuffled, so sorting them and gathering by group touch memory at random; we attribute
  most of the rise in per-row time from 100k to 1M rows to arrays outgrowing the cache on a
  loaded machine (not measured separately).
"""


def timed(fn) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def repeats_for(n: int) -> int:
    return 7 if n <= 10_000 else 5 if n <= 100_000 else 3


def integer_keys(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same batch with uid, traj_uid and anchor as int64 codes (e.g. ids and anchor hashes
    an agent loop already stores as integers)."""
    return {k: grouping.factorize(v)[0] if k in ("uid", "traj_uid", "anchor") else v for k, v in data.items()}


def bench(sizes: list[int]) -> list[dict]:
    rows = []
    for size in sizes:
        strings = random_steps(0, n_groups=max(1, round(size / ROWS_PER_GROUP)), group_size=GROUP_SIZE,
                               max_len=MAX_LEN, n_anchors=N_ANCHORS)
        for keys, data in (("str", strings), ("int", integer_keys(strings))):
            n = len(data["uid"])
            for name, (params, columns) in SETTINGS.items():
                inputs = {k: data[k] for k in BASE + columns}
                loop_inputs = {k: v.tolist() for k, v in inputs.items()}  # the loops work on lists
                vec, loop = [], []
                for _ in range(repeats_for(n)):  # alternate, so load changes hit both sides
                    vec.append(timed(lambda: compute_with_returns(name, **inputs, **params)))
                    loop.append(timed(lambda: LOOPS[name](**loop_inputs, **params)))
                row = dict(name=name, keys=keys, n=n)
                for label, times in (("vec", vec), ("loop", loop)):
                    row[label] = statistics.median(t[0] for t in times)
                    row[label + "_wall"] = statistics.median(t[1] for t in times)
                rows.append(row)
                print(f"{name:13s} {keys} n={n:>9,d}  loop {row['loop'] * 1e3:10.1f} ms  vectorised "
                      f"{row['vec'] * 1e3:8.2f} ms  speedup {row['loop'] / row['vec']:7.1f}x "
                      f"(wall {row['loop_wall'] / row['vec_wall']:.1f}x)", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    sizes = sorted({r["n"] for r in rows})
    names = list(dict.fromkeys(r["name"] for r in rows))
    by = {(r["name"], r["keys"], r["n"]): r for r in rows}
    cpu = platform.processor() or platform.machine()
    load = os.getloadavg()[0]
    lines = [
        HEADING,
        "",
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())} with `python scripts/bench/bench_advantages.py` "
        f"on a {os.cpu_count()}-core CPU ({cpu}) shared with other engineers' jobs (load average "
        f"{load:.1f} at the end of the run); Python {platform.python_version()}, numpy {np.__version__}.",
        "",
        "- Loop: the plain Python reference in `tests/advantages/loop_reference.py` (dicts of lists, "
        "numpy for each group's mean/std, as the reference implementations do with torch).",
        "- Vectorised: `verl_ext.advantages.compute_with_returns`, validation and sorting included.",
        f"- Both get the same shuffled batch: groups of 1-{GROUP_SIZE} trajectories of 1-{MAX_LEN} steps, "
        f"{N_ANCHORS} anchor states; settings of the published scripts.",
        "- Cells: median process CPU time, loop / vectorised = speedup, timed alternately (7 runs up "
        "to 10k rows, 5 at 100k, 3 at 1M). CPU time, because other jobs share the 2 cores; the "
        "wall-clock speedup is in brackets. numpy runs these ops on one thread.",
        "",
    ]
    for keys, title in (("str", "String ids and anchors (python objects, as `compute` usually gets them)"),
                        ("int", "Integer ids and anchors (int64 codes or hashes)")):
        lines += [f"**{title}**", "", "| estimator | " + " | ".join(f"{n:,} rows" for n in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for name in names:
            cells = []
            for n in sizes:
                r = by[(name, keys, n)]
                cells.append(f"{_ms(r['loop'])} / {_ms(r['vec'])} = **{r['loop'] / r['vec']:.0f}x** "
                             f"({r['loop_wall'] / r['vec_wall']:.0f}x)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Vectorised CPU time per row in µs (string keys | integer keys), for linear growth:", "",
              "| estimator | " + " | ".join(f"{n:,}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for name in names:
        cells = [f"{by[(name, 'str', n)]['vec'] / n * 1e6:.2f} \\| {by[(name, 'int', n)]['vec'] / n * 1e6:.2f}"
                 for n in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + NOTES


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def write_section(path: Path, section: str) -> None:
    """Replace (or append) this script's section, leaving the other sections alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(HEADING + "\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(HEADING))
        text = text[:start] + section + (text[end + 1:] and "\n" + text[end + 1:] if end >= 0 else "")
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    section = table(bench(args.sizes))
    print("\n" + section)
    if args.write:
        write_section(ROOT / "docs" / "benchmarks.md", section)


if __name__ == "__main__":
    main()
