"""The benchmarks' library (``scripts.bench.launch``, ``report``, ``stats``): statistics against
known values, the docs section writer and table renderer, the resumable launcher's slots and retries."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from scripts.bench import launch, learning_runs, report, stats
from verl_ext.doc_sections import GENERATED


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423),
                                          (120, 1.9799), (1e6, 1.9600)])
def test_t_quantile_matches_the_tables(df, expected):
    assert abs(stats.t_quantile(0.975, df) - expected) < 1e-4
    assert abs(stats.t_quantile(0.025, df) + expected) < 1e-4


def test_t_cdf_and_one_sided_quantiles():
    assert stats.t_cdf(0.0, 3) == 0.5
    assert abs(stats.t_quantile(0.95, 5) - 2.0150) < 1e-4 and abs(stats.t_quantile(0.995, 9) - 3.2498) < 1e-4
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


def test_mean_se_and_t_interval():
    assert stats.mean_and_se([1.0, 2.0, 3.0, np.nan]) == (2.0, np.std([1, 2, 3], ddof=1) / np.sqrt(3), 3)
    assert np.isnan(stats.mean_and_se([0.5])[1]) and stats.mean_and_se([])[2] == 0
    e = stats.estimate([1.0, 2.0, 3.0])
    half = 4.302652729911275 * e.se  # t(0.975, 2)
    assert abs(e.low - (2 - half)) < 1e-9 and abs(e.high - (2 + half)) < 1e-9
    assert np.isnan(stats.estimate([1.0]).low)


def test_paired_difference_uses_the_per_seed_differences():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.9, 1.9, 2.9, 3.8])  # spread large, differences tight
    d = a - b
    se = d.std(ddof=1) / 2
    diff = stats.paired_difference(a, b)
    assert abs(diff.mean - d.mean()) < 1e-12 and abs(diff.se - se) < 1e-12 and diff.n == 4 and diff.exceeds_2se
    assert diff.low > 0  # the interval of the paired differences excludes 0; unpaired it would not
    assert stats.paired_verdict(a, b) == f"{d.mean():+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] (95% t, n=4; **excludes 0**)"
    assert "includes 0" in stats.paired_verdict(a, a[::-1])
    assert stats.paired_verdict(a[:1], b[:1]) == "n/a"
    assert stats.paired_mean_and_se([1.0, np.nan, 3.0], [0.0, 1.0, 1.0])[2] == 2  # a seed missing in one arm drops out


def test_table_renders_the_docs_markdown():
    assert report.table(["arm", "n"], [["a", 1], ["b", 2.5]], align="lr") == (
        "| arm | n |\n|---|---:|\n| a | 1 |\n| b | 2.5 |")
    assert report.table(["x", "y"], []).splitlines()[1] == "|---|---|"


def test_publish_prints_and_writes_only_with_a_doc(tmp_path, capsys):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n## A\n\nold\n\n## B\n\nkept\n")
    report.publish(None, "## A", "## A\n\nnew\n")
    assert "new" in capsys.readouterr().out and "old" in doc.read_text()
    report.publish(doc, "## A", "## A\n\nnew\n")
    assert doc.read_text() == "# Results\n\n## A\n\nnew\n\n## B\n\nkept\n"
    doc.write_text(doc.read_text().replace("\n## B", "\n### A.1\n\nother script's\n\n## B"))
    report.write_section(doc, "## A", "## A\n\nnewer\n", until="\n#")  # its subsection written elsewhere stays
    assert doc.read_text() == "# Results\n\n## A\n\nnewer\n\n### A.1\n\nother script's\n\n## B\n\nkept\n"
    report.write_section(doc, "## C", "## C\n\nappended")
    assert doc.read_text().endswith("## B\n\nkept\n\n## C\n\nappended\n\n")
    doc.write_text(f"# Results\n\n## A\n\nprose of the page\n\n{GENERATED}\n\nold table\n\n## B\n\nkept\n")
    report.write_section(doc, "## A", "## A\n\nnew table\n")  # the prose above the marker stays
    assert doc.read_text() == (f"# Results\n\n## A\n\nprose of the page\n\n{GENERATED}\n\nnew table\n\n"
                               "## B\n\nkept\n")
    report.write_section(doc, "## A", "## A\n\nnew table\n")  # rewriting is idempotent
    assert "prose of the page" in doc.read_text() and doc.read_text().count("new table") == 1
    parser = report.script_parser("A script.\n\nMore.", doc)
    assert report.target(parser.parse_args([])) is None and report.target(parser.parse_args(["--write"])) == doc


def _spec(tmp_path: Path, name: str, steps: int = 2) -> launch.RunSpec:
    return launch.RunSpec(name, str(tmp_path / "recipe.sh"), tmp_path / name, steps)


def _finish(spec: launch.RunSpec) -> None:
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / "metrics.jsonl").write_text(json.dumps({"step": spec.steps, "data": {"x": 1.0}}) + "\n")


def test_launch_runs_what_is_not_done_one_per_slot_with_thread_caps(tmp_path):
    specs = [_spec(tmp_path, f"r{i}") for i in range(5)]
    _finish(specs[0])  # done before: resumed past, not run again
    seen, lock = [], threading.Lock()

    def execute(spec, attempts, env):
        with lock:
            seen.append((spec.label, env["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"]))
        if spec.label != "r4":  # r4 fails: reported, the others go on, and it is left to resume
            _finish(spec)

    left = launch.launch(specs, slots=[{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}],
                         execute=execute, cpus=8)
    assert sorted(label for label, *_ in seen) == ["r1", "r2", "r3", "r4"]
    assert {threads for *_, threads in seen} == {"4"} and [s.label for s in left] == ["r4"]
    assert launch.thread_caps(3, 8)["OMP_NUM_THREADS"] == "2" and launch.thread_caps(16, 8)["MKL_NUM_THREADS"] == "1"
    assert launch.thread_caps(16, 64) == {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}


def test_run_retries_a_crashed_run_and_reuses_a_finished_one(tmp_path):
    (tmp_path / "recipe.sh").write_text(  # the first attempt crashes, the second logs the last step
        'if [ ! -f "$OUT/crashed" ]; then touch "$OUT/crashed"; exit 1; fi\n'
        'echo "{\\"step\\": $STEPS, \\"data\\": {\\"k\\": $EXTRA}}" > "$OUT/metrics.jsonl"\n')
    spec = launch.RunSpec("r", str(tmp_path / "recipe.sh"), tmp_path / "out", 3, env={"EXTRA": "7"}, info={"card": "c"})
    assert "EXTRA=7 OUT=" in spec.command() and spec.command().endswith(f"bash recipes/{tmp_path / 'recipe.sh'}")
    assert launch.run(spec, attempts=2) > 0
    assert launch.load_steps(spec.out / "metrics.jsonl") == {3: {"k": 7}}
    assert json.loads((spec.out / "run.json").read_text())["attempt"] == 2
    assert launch.run(spec) is None  # done: not run again
    (tmp_path / "fail.sh").write_text("exit 3\n")
    with pytest.raises(RuntimeError, match="failed 2 times"):
        launch.run(launch.RunSpec("f", str(tmp_path / "fail.sh"), tmp_path / "f", 1), attempts=2)


def test_card_slots_spread_runs_over_the_cards():
    assert launch.card_slots([0, 1]) == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    assert [s["CUDA_VISIBLE_DEVICES"] for s in launch.card_slots([0, 3], 5)] == ["0", "3", "0", "3", "0"]
    assert launch.card_slots([], 3) == [{}, {}, {}] and launch.card_slots([]) == [{}]  # no list: every card


def test_launch_waits_for_ready_runs_and_stops_at_the_budget(tmp_path):
    first, second, third = (_spec(tmp_path, name) for name in ("first", "second", "third"))
    order = []

    def execute(spec, attempts, env):
        order.append((spec.label, spec.timeout_s))
        _finish(spec)

    # `second` waits for `first`'s output although it comes first and two slots are free
    ready = {second.out: lambda: first.done()}
    left = launch.launch([second, first], slots=[{}, {}], execute=execute, poll_s=0.01,
                         ready=lambda s: ready.get(s.out, lambda: True)())
    assert [label for label, _ in order] == ["first", "second"] and left == []
    order.clear()  # a budget of 100 s: the 60 s run starts (killed when the budget is spent), the 150 s one does not
    left = launch.launch([third, _spec(tmp_path, "fourth")], execute=execute, budget_s=100.0,
                         expected_s=lambda s: 60.0 if s.label == "third" else 150.0)
    assert [label for label, _ in order] == ["third"] and 99 < order[0][1] <= 100 and [s.label for s in left] == ["fourth"]


def test_a_failed_run_says_how_it_ended(tmp_path):
    (tmp_path / "slow.sh").write_text("sleep 30\n")
    with pytest.raises(launch.RunFailed) as failed:
        launch.run(launch.RunSpec("s", str(tmp_path / "slow.sh"), tmp_path / "s", 1, timeout_s=0.5), attempts=1)
    assert failed.value.timed_out and failed.value.returncode < 0 and failed.value.log.name == "run1.log"


def test_report_cells_and_two_se_verdicts():
    assert stats.fmt_mean_se([1.0, 2.0, 3.0, np.nan]) == "2.00 ± 0.58" and stats.fmt_mean_se([0.5], 3) == "0.500"
    assert stats.fmt_mean_se([]) == "n/a" and stats.fmt_mean_se(np.array([1.0, 0.0, 1.0]), 0) == "2/3"
    assert stats.two_se_verdict(0.3, 0.07) == "+0.30 (2 SE = 0.14): **exceeds** 2 SE"
    assert stats.two_se_verdict(-0.1, 0.07, n=3) == "-0.10 (2 SE = 0.14, 3 seeds): within 2 SE"
    assert stats.two_se_verdict(0.1, float("nan")) == "+0.10 (2 SE = n/a): SE undefined (fewer than 2 seeds)"


def test_last_finite_value_and_collapse_per_seed():
    values = np.array([[0.1, 0.4, np.nan], [np.nan, np.nan, np.nan], [0.9, 0.2, 0.1]])
    np.testing.assert_array_equal(stats.last_finite(values), [0.4, np.nan, 0.1])
    np.testing.assert_array_equal(stats.collapsed([0.1, 0.1, 0.3], [0.9, 0.2, 0.5]), [1.0, 0.0, 0.0])


def test_step_aggregates_cells_and_run_folders():
    runs = [{1: {"t": 9.0}, 2: {"t": 1.0, "x": 4.0}, 3: {"t": 3.0}}, {1: {"t": 9.0}, 2: {"t": 2.0}}]
    later = learning_runs.after_warmup(runs)  # step 1 of every repeat left out, the rest pooled
    assert [m["t"] for m in later] == [1.0, 3.0, 2.0]
    assert learning_runs.median_of(later, "t") == 2.0 and learning_runs.mean_of(later, "x") == 4.0
    assert learning_runs.mean_of(later, lambda m: m.get("t", 0) * 2) == 4.0
    assert np.isnan(learning_runs.median_of(later, "absent"))
    assert learning_runs.median_after_first(runs[0], "t") == 2.0
    assert learning_runs.timing_phases([{1: {"timing_s/step": 1, "timing_s/gen": 1}}, {2: {"timing_s/adv": 1, "x": 0}}]) \
        == ["adv", "gen", "step"]
    assert learning_runs.run_folder("snapshot, fp32 rollout") == "snapshot-fp32_rollout"
    assert learning_runs.run_folder("verl-ext hgpo + ppo_ewma + ewma") == "verl-ext_hgpo_ppo_ewma_ewma"
    assert report.pct(0.0123) == "1.23%" and report.pct(0.5, 1) == "50.0%" and report.pct(float("nan")) == "—"
    assert report.gib(2**31, 2**30) == "2.00 GiB (2.00x)" and report.gib(0, 1) == "0"
    assert "cores visible, Python " in report.cpu_machine()


def test_sweep_reads_every_seed_and_arm_seed_major(tmp_path):
    (tmp_path / "a-seed1").mkdir()
    (tmp_path / "a-seed1" / "run.json").write_text(json.dumps({"wall_s": 3.0}))
    (tmp_path / "a-seed1" / "metrics.jsonl").write_text(json.dumps({"step": 2, "data": {"x": 1.0}}) + "\n")
    done = learning_runs.sweep("unused.sh", tmp_path, [("arm a", "a", {}), ("arm b", "b", {})], [0, 1], 2,
                               attempts=1, report_only=True)
    assert [(seed, label) for seed, label, *_ in done] == [(0, "arm a"), (0, "arm b"), (1, "arm a"), (1, "arm b")]
    assert done[2][2:] == ({"wall_s": 3.0}, {2: {"x": 1.0}}) and done[0][2:] == (None, {})


def test_every_script_docstring_opens_with_one_line_and_names_its_docs_section():
    import ast

    library = {"__init__", "launch", "report", "stats", "learning_runs"}
    for path in sorted((Path(launch.__file__).parent).glob("*.py")):
        if path.stem in library:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        lines = doc.splitlines()
        assert lines and (len(lines) == 1 or lines[1] == ""), f"{path.name}: the purpose is one line"
        assert "Docs section" in doc, f"{path.name}: name the docs section it writes (or 'none of its own')"
