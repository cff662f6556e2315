"""The benchmark scripts' generated text: the claims they print come from the data they measure."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench"


def _script(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def test_the_plain_gigpo_loop_is_the_same_math_as_the_public_entry_point():
    bench = _script("bench_advantages")
    from step_data import random_steps  # tests/advantages, put on the path by the script

    from verl_ext.advantages import compute

    data = random_steps(3, n_groups=20, group_size=6, max_len=7, n_anchors=4)
    columns = {k: data[k] for k in ("uid", "traj_uid", "step_idx", "anchor", "step_reward")}
    plain = bench.plain_gigpo(**{k: v.tolist() for k, v in columns.items()}, **bench.ENTRY_POINT_GIGPO)
    np.testing.assert_allclose(compute("gigpo", **columns, **bench.ENTRY_POINT_GIGPO), plain, rtol=1e-9, atol=1e-9)
    row = bench.bench_entry_point([300], repeats=1)[0]
    assert row["n"] > 0 and row["vec"] > 0 and row["loop"] > 0


def test_cpu_backend_section_is_computed_from_the_run_metrics():
    timing = _script("cpu_backend_timing")
    steps = {0: {"val-core/x": 1.0}}
    for s, gen in ((1, 9.0), (2, 0.7), (3, 0.9), (4, 0.8)):
        steps[s] = {"timing_s/gen": gen, "timing_s/step": gen + 1, "training/rollout_probs_diff_max": 1e-9 * s}
    text = timing.section(steps, wall_s=120.0, load=3.0)
    assert "| gen (hf rollout, 32 sequences) | 0.80 | 0.70-0.90 |" in text  # step 1 (warm-up) left out
    assert "median over steps 2-4" in text and "1.0e-09 to 4.0e-09 over steps 1-4" in text
    assert "took 2.0 minutes" in text
