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


def test_text_hybrid_study_statistics_and_rates_are_computed_from_the_metrics():
    study = _script("text_hybrid_study")
    mean, se, n = study.mean_se(np.array([1.0, 2.0, 3.0, np.nan]))
    assert (mean, n) == (2.0, 3) and se == np.std([1, 2, 3], ddof=1) / np.sqrt(3)
    assert np.isnan(study.mean_se(np.array([0.5]))[1])
    # two arms 0.3 apart with SEs 0.05 each: 2 SE of the difference = 0.141 -> exceeds; a third
    # arm 0.1 from the second does not; a one-seed arm has no SE, so nothing is claimed for it
    spread = np.array([-1.0, 0.0, 1.0]) * 0.05 * np.sqrt(3)  # sample std 0.05 * sqrt(3): SE 0.05
    arms = {"a": 0.9 + spread, "b": 0.6 + spread, "c": 0.7 + spread, "d": np.array([0.1])}
    by_pair = {(c.a, c.b): c for c in study.compare(arms)}
    assert abs(by_pair["a", "b"].diff - 0.3) < 1e-12
    assert abs(by_pair["a", "b"].se - np.hypot(0.05, 0.05)) < 1e-12 and by_pair["a", "b"].exceeds
    assert not by_pair["b", "c"].exceeds and not by_pair["a", "d"].exceeds
    lines = study.comparison_lines("success", arms)
    assert "- success, a - b: +0.30 (2 SE = 0.14): **exceeds** 2 SE" in lines
    assert "- success, b - c: -0.10 (2 SE = 0.14): within 2 SE" in lines
    assert any(line.startswith("- success, a - d:") and "fewer than 2 seeds" in line for line in lines)
    # success rates of 64 episodes a seed: two seeds that agree by chance do not make a one-episode
    # difference significant (binomial floor on each arm's SE)
    close = {"x": np.array([0.97, 0.97]), "y": np.array([0.99, 0.99])}
    assert study.compare(close)[0].exceeds and not study.compare(close, episodes=64)[0].exceeds
    floor = np.sqrt(0.97 * 0.03 / 128)
    assert abs(study.arm_se(close["x"], episodes=64)[1] - floor) < 1e-12
    # conditional rates from verl's unconditional validation means (ratios), per seed and step
    val = study.VAL.format
    run = {5: {val("success"): 0.5, val("len_gain"): 0.25, val("used_tool"): 0.6, val("tool_beneficial"): 0.5,
               val("used_tool_beneficial"): 0.4, val("decisions_tool"): 2.0, val("decisions_tool_tool"): 1.5,
               val("decisions_gui"): 0.0, val("decisions_gui_tool"): 0.0}}
    rates = study.derived({0: run}, [5])
    assert rates["steps_per_success"][0, 0] == study.MAX_STEPS * 0.5  # len_gain/success = 1 - s/S_max
    assert abs(rates["tool_when_beneficial"][0, 0] - 0.8) < 1e-12 and abs(rates["tool_when_not"][0, 0] - 0.4) < 1e-12
    assert rates["decision_tool_when_shorter"][0, 0] == 0.75
    assert np.isnan(rates["decision_tool_when_gui_shorter"][0, 0])  # no such decision: undefined, not 0
    assert list(study.final(np.array([[0.1, 0.2, np.nan], [np.nan, np.nan, np.nan]]))[:1]) == [0.2]
    assert study.goal_met(np.array([0.9, 0.85]), np.array([0.1, 0.2])) == "yes"
    assert study.goal_met(np.array([0.9, 0.85]), np.array([0.3, 0.2])) == "no"


def test_old_logit_study_batches_seeds_exactly_and_measures_against_exact_old_logits():
    import torch

    study = _script("old_logits_experiment")
    # the seed-stacked embedding form of the first layer is the one-hot policy of each seed
    params = study.stack_init([3, 4])
    ctx = torch.arange(study.CONTEXTS).repeat_interleave(2)
    tokens = torch.randint(0, study.VOCAB, (2, len(ctx), study.LENGTH), generator=torch.Generator().manual_seed(0))
    stacked = study.stacked_log_probs(params, ctx, tokens)
    for s in range(2):
        single = [params[0][s], params[1][s, 0], params[2][s], params[3][s, 0]]
        torch.testing.assert_close(stacked[s], study.token_log_probs(single, ctx, tokens[s]), rtol=0, atol=1e-6)
    # exact old logits score zero error and never mask for staleness; `current` lags stale tokens
    runs = {arm: study.run_cell(study.STUDY_ARMS[arm], [0, 1], steps=4, mean_staleness=2.0, bound=4, sigma=0.3,
                                lr=3e-2, epochs=1, contexts=2)
            for arm in ("snapshot", "current", "ewma calibrated")}
    assert runs["snapshot"]["abs_error_stale"][1:].abs().max() == 0
    assert runs["snapshot"]["masked_staleness"].max() == 0
    assert runs["current"]["abs_error_stale"][2:].min() > 0
    ewma = runs["ewma calibrated"]
    assert ewma["ewma_age_steps"][0].eq(0).all() and ewma["ewma_age_steps"][-1].gt(0).all()
    rows = study.study_rows({k: {key: v.tolist() for key, v in h.items()} for k, h in runs.items()}, 4)
    assert rows["snapshot"]["collapsed"].tolist() == [0.0, 0.0]


def test_paired_verdict_uses_the_per_seed_differences():
    learning_runs = _script("learning_runs")
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.9, 1.9, 2.9, 3.8])  # spread large, differences tight
    d = a - b
    se = d.std(ddof=1) / 2
    assert learning_runs.paired_verdict(a, b) == f"{d.mean():+.3f} ± {se:.3f} (**exceeds 2 SE**)"
    assert "within 2 SE" in learning_runs.paired_verdict(a, a[::-1])
