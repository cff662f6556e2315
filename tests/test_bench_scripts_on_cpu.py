"""The benchmark scripts' generated text: the claims they print come from the data they measure."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import numpy as np



def _script(name: str):
    return importlib.import_module(f"scripts.bench.{name}")


def test_the_plain_gigpo_loop_is_the_same_math_as_the_public_entry_point():
    bench = _script("bench_advantages")
    from tests.advantages.step_data import random_steps

    from verl_ext.advantages import compute

    data = random_steps(3, n_groups=20, group_size=6, max_len=7, n_anchors=4)
    columns = {k: data[k] for k in ("uid", "traj_uid", "step_idx", "anchor", "step_reward")}
    plain = bench.plain_gigpo(**{k: v.tolist() for k, v in columns.items()}, **bench.ENTRY_POINT_GIGPO)
    np.testing.assert_allclose(compute("gigpo", **columns, **bench.ENTRY_POINT_GIGPO), plain, rtol=1e-9, atol=1e-9)
    row = bench.bench_entry_point([300], repeats=1)[0]
    assert row["n"] > 0 and row["vec"] > 0 and row["loop"] > 0


def test_text_hybrid_study_statistics_and_rates_are_computed_from_the_metrics():
    study = _script("text_hybrid_study")
    mean, se, n = study.mean_and_se(np.array([1.0, 2.0, 3.0, np.nan]))
    assert (mean, n) == (2.0, 3) and se == np.std([1, 2, 3], ddof=1) / np.sqrt(3)
    assert np.isnan(study.mean_and_se(np.array([0.5]))[1])
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
    assert study.goal_met(np.array([0.9, 0.85]), np.array([0.1, 0.2])) == "yes"
    assert study.goal_met(np.array([0.9, 0.85]), np.array([0.3, 0.2])) == "no"


def test_hook_cost_dry_run_prints_every_run_interleaved(capsys):
    bench = _script("hook_cost_gpu")
    assert bench.main(["--dry-run", "--repeats", "2", "--out", "/tmp/hc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    models = [line for line in lines if "make-tiny-model" in line]
    assert [line.split("--arch ")[1].split()[0] for line in models] == ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"]
    runs = [line for line in lines if "run_gpu.sh" in line]
    assert len(runs) == 3 * 5 * 2
    for line in runs:
        assert "MODE=colocate_async" in line and "ADV=grpo" in line and "trainer.save_freq=-1" in line
        # the 7B point's memory settings are explicit and hold in every arm, plain verl included
        assert ("optimizer_offload=true" in line) == ("/7b/" in line) == ("BOUND=2" in line)
    providers = [line.split("PROVIDER=")[1].split()[0] for line in runs[:5]]
    assert sorted(providers) == sorted(["current", "snapshot", "ewma", "loglinear", "none"])
    repeats = [int(line.split(" OUT=")[1].split()[0].rsplit("_r", 1)[1]) for line in runs]
    assert repeats == sorted(repeats)  # every arm of every point once before any arm runs again
    assert runs[15].split("/hc/0.5b/")[1].split("_r")[0] == "snapshot"  # repeat 1 starts one arm later
    # the _device arms differ from their provider's arm in where the live weights wait, nothing else
    assert bench.main(["--dry-run", "--repeats", "1", "--out", "/tmp/hc", "--points", "1.5b",
                       "--arms", "ewma", "ewma_device", "ewma_one_pass"]) == 0
    ewma, device, one_pass = [line for line in capsys.readouterr().out.splitlines() if "run_gpu.sh" in line]
    assert "PROVIDER=ewma" in device and device.replace("ewma_device_r0", "ewma_r0") == (
        ewma + " algorithm.old_logits.swap_backup=device")
    # and the one-pass arm from the _device arm only in the fresh tokens' anchor
    assert one_pass.replace("ewma_one_pass_r0", "ewma_device_r0") == device + " algorithm.old_logits.ewma.fresh_exact=false"


def test_hook_cost_timeout_kills_only_the_processes_of_its_own_run(tmp_path):
    import os
    import subprocess

    bench = _script("launch")
    mine, other = tmp_path / "0.5b" / "current_r0", tmp_path / "0.5b" / "verl_r0"
    # stand-ins for a Ray daemon that left the run's process group, and for another run's process
    procs = {folder: subprocess.Popen(["sleep", "60"], env={**os.environ, "OUT": str(folder)}, start_new_session=True)
             for folder in (mine, other)}
    try:
        assert bench.kill_leftovers(mine) == 1
        assert procs[mine].wait(timeout=10) != 0  # killed
        assert procs[other].poll() is None  # still running
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def _synthetic_run(folder: Path, steps: list[dict]) -> None:
    import json

    folder.mkdir(parents=True)
    lines = [json.dumps({"step": s, "data": m}) for s, m in enumerate(steps, start=1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_hook_cost_table_is_computed_from_the_run_metrics(tmp_path):
    import json

    bench = _script("hook_cost_gpu")
    (tmp_path / "machine.json").write_text(json.dumps(
        {"card": "NVIDIA H200", "torch": "t", "vllm": "v", "verl": "0.9.1", "transformers": "x", "context": "",
         "timer_overhead_us": {"cuda": {"span": 6.04, "collect": 0.52, "nested_span": 7.0}}}))
    (tmp_path / "parameters.json").write_text(json.dumps({"0.5b": 250_000_000}))  # fp32: 1e9 bytes
    point = tmp_path / "0.5b"

    def step(i: int, total: float, old: float, **hooks: float) -> dict:
        m = {"timing_s/step": 10.0, "timing_s/old_log_prob": old + 0.01 * i}
        if total:
            m |= {f"verl_ext/time/{h}": v for h, v in hooks.items()}
            m |= {"verl_ext/time/total": total, "verl_ext/time/share_of_step": total / 10.0}
        return m

    # 2 warm-up steps (ignored: huge) + 5 counted per run; plain verl: old_log_prob 1.02..1.06
    _synthetic_run(point / "verl_r0", [step(i, 0, 100.0 if i < 2 else 1.0) for i in range(7)])
    for r, shift in ((0, 0.0), (1, 0.1)):  # current: shares 0.02..0.06 and 0.03..0.07 pooled: median 0.045
        _synthetic_run(point / f"current_r{r}", [
            {**step(i, 99.0 if i < 2 else 0.2 + shift + 0.1 * (i - 2), 1.0, advantages=0.1),
             "verl_ext/mem/x/gpu_bytes": 0.0, "old_logits/stale/frac_d0": 0.75} for i in range(7)])
    _synthetic_run(point / "snapshot_r0", [
        {**step(i, 0.3, 2.0, snapshot_save_wait=0.05, extra_forwards=0.5), "verl_ext/mem/snapshots/host_bytes": 2e9,
         "old_logits/stale/frac_d0": 0.5} for i in range(7)])
    # a run whose batches held no stale token never ran its provider's stale path: cheap, but not measured
    _synthetic_run(point / "loglinear_r0", [{**step(i, 0.1, 1.0, old_logits=0.1), "old_logits/stale/frac_d0": 1.0}
                                            for i in range(7)])
    # an arm whose run died (its folder keeps the log's tail only) is listed with the error it ended on
    (point / "ewma_r0").mkdir()
    (point / "ewma_r0" / "run_tail.log").write_text(
        "Traceback (most recent call last):\n  File \"adam.py\", line 1\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 260.00 MiB.\nTraining Progress: 0/8\n")
    text = bench.table([tmp_path], warmup=2)
    assert "| ewma | 0 finished | — | — | not measured: the run failed (below) |" in text
    assert "`ewma` failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 260.00 MiB." in text
    assert f"{tmp_path.name} 0.5b ewma: the run failed (torch.OutOfMemoryError" in text.split("Targets missed or not measured:")[1]
    assert f"### `{tmp_path}`: NVIDIA H200" in text and "#### 0.5b: 250 M parameters" in text
    assert "6.0 µs per span on the cuda clock, 0.52 µs per span to read once per step" in text
    # current: 10 steps pooled, median share 4.5% > 3%; old_log_prob 1.04 s (steps 3-7) vs plain 1.04 s
    assert ("| current | 2 x 5 | 10.00 | 4.50% | hooks 4.50% > 3%: missed by 1.50 pp | 1.040 | 1.00x | 0 | 0 "
            "| 25.00% |") in text
    # snapshot: the save's critical-path time (here its wait, 0.5% of the step) meets its 1% target;
    # 2 host copies of 1e9 fp32 bytes
    assert ("| snapshot | 1 x 5 | 10.00 | 3.00% | save on the critical path ≤ 1%: met | 2.040 | 1.96x | 0 | 1.86 GiB (2.00x) "
            "| 50.00% |") in text
    assert "| loglinear | 1 x 5 | 10.00 | 1.00% | not measured: no stale token in the counted steps |" in text
    assert f"{tmp_path.name} 0.5b loglinear: not measured: no stale token in the counted steps" in text
    assert "| verl | 1 x 5 | 10.00 | — | — | 1.040 | 1.00x | 0 | 0 | — |" in text
    assert "| advantages | 1.00% | 0.00% | 0.00% |" in text and "| snapshot_save_wait | 0.00% | 0.50% | 0.00% |" in text
    assert "| **all hooks** | 4.50% | 3.00% | 1.00% |" in text  # per-hook means add up to the mean total
    assert "take 0.500 s per step on average, 0.48x verl's own old-log-prob phase (1.040 s)" in text
    assert (f"Targets missed or not measured: {tmp_path.name} 0.5b current: hooks 4.50% > 3%: missed by 1.50 pp (largest hook: "
            "advantages") in text
    # a second folder (another machine or code version) gets its own tables under the same heading
    later = tmp_path / "later"
    later.mkdir()
    for name in ("machine.json", "parameters.json"):
        (later / name).write_text((tmp_path / name).read_text().replace("NVIDIA H200", "NVIDIA H100"))
    _synthetic_run(later / "0.5b" / "current_r0", [step(i, 0.2, 1.0, advantages=0.2) for i in range(7)])
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## GPU: per-step breakdown\n\nold table\n\n## next\n\nkept\n")
    assert bench.main(["--results", str(tmp_path), str(later), "--warmup", "2", "--steps", "7", "--write", "--doc", str(doc)]) == 0
    written = doc.read_text()
    assert "old table" not in written and "| current | 2 x 5 |" in written and "## next\n\nkept" in written
    assert written.count("## GPU: per-step breakdown") == 1 and f"### `{later}`: NVIDIA H100" in written
    assert "| current | 1 x 5 | 10.00 | 2.00% | hooks ≤ 3%: met |" in written


def test_toolcua_pipeline_study_dry_run_and_paired_report(tmp_path, capsys):
    import json

    study = _script("toolcua_pipeline_study")
    assert study.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "2", "--steps", "3"]) == 0
    runs = [line for line in capsys.readouterr().out.splitlines() if " seed " in line and "OUT=" in line]
    assert len(runs) == 9  # per seed: full pipeline, then no RFT and per-decision from its checkpoints
    no_rft = next(line for line in runs if line.startswith("no RFT seed 1"))
    assert f"INIT_MODEL={tmp_path}/seed1/full/sft/global_step_150/huggingface" in no_rft and "SKIP_RFT=1" in no_rft
    per_decision = next(line for line in runs if line.startswith("per-decision tool term seed 2"))
    assert "TOOL_TERM=decision" in per_decision and "seed2/full/rft/global_step_10/actor/huggingface" in per_decision
    assert study.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "--steps", "3", "--arms", "full"]) == 0
    only_full = [line for line in capsys.readouterr().out.splitlines() if " seed " in line and "OUT=" in line]
    assert [line.split(":")[0] for line in only_full] == ["full pipeline seed 0", "full pipeline seed 1"]
    # a later arm without the full pipeline's checkpoint is not started (nothing here has one)
    assert study.main(["--out", str(tmp_path / "empty"), "--seeds", "0", "--steps", "3", "--arms", "no_rft",
                       "--write", "--doc", str(tmp_path / "skip.md")]) == 0
    assert "no RFT seed 0: not run: no full-pipeline checkpoint" in capsys.readouterr().out

    # three seeds of metrics: the full pipeline calls tools at 0.8/0.9/1.0 of the decisions where tools
    # are shorter after online RL (0.5 before it: the "no online RL" arm), no RFT at 0.2/0.3/0.4
    def write(arm: str, seed: int, tool_rate: dict[int, float]) -> None:
        out = tmp_path / f"seed{seed}" / arm
        out.mkdir(parents=True)
        val = study.VAL.format
        lines = [json.dumps({"step": step, "data": {
            val("success"): 0.5, val("len_gain"): 0.25, val("used_tool"): 0.5, val("tool_beneficial"): 0.5,
            val("used_tool_beneficial"): 0.5, val("decisions_tool"): 2.0, val("decisions_tool_tool"): 2.0 * rate,
            val("decisions_gui"): 1.0, val("decisions_gui_tool"): 0.1}}) for step, rate in tool_rate.items()]
        (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")

    for seed, rate in enumerate((0.8, 0.9, 1.0)):
        write("full", seed, {0: 0.5, 3: rate})
        write("no_rft", seed, {0: 0.1, 3: rate - 0.6})
    sft = {"turns": 22, "valid_call_rate": 1.0, "exact_call_rate": 0.18, "tool_turns": 9, "tool_turn_call_rate": 0.0}
    (tmp_path / "seed0" / "full" / "sft_eval.json").write_text(json.dumps({**sft, "gui_turn_call_rate": 0.31}))
    (tmp_path / "seed1" / "full" / "sft_eval.json").write_text(json.dumps(sft))  # evaluated before the column
    study.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "2", "--steps", "3"])
    text = capsys.readouterr().out
    assert "| 0 | 22 | 1.00 | 0.18 | 0.00 | 0.31 |" in text and "| 1 | 22 | 1.00 | 0.18 | 0.00 | n/a |" in text
    assert "| full pipeline | 0.90 ± 0.06 | 0.10 ± 0.00 |" in text  # mean ± SE of 0.8, 0.9, 1.0
    assert "| no online RL | 0.50 ± 0.00 |" in text and "T 0.30 short of 0.8" in text
    assert "| full pipeline |" in text and "| met |" in text.split("| full pipeline |")[1].splitlines()[0]
    assert ("- T where tools shorter (decision), no RFT - full pipeline: -0.60 (2 SE = 0.00, 3 seeds): "
            "**exceeds** 2 SE") in text
    assert "env steps per success" in text and "| 15.0 ± 0.0 |" in text  # S_max 30 * (1 - 0.25 / 0.5)

    # the RFT stage's held-out decisions (2/3 of them tools-shorter): each seed at its first and last
    # validation, and the paired change over the stage; the run notes kept with the runs follow
    for seed, after in enumerate((0.5, 0.6, 0.7)):
        rft = study.RFT_VAL.format
        lines = [json.dumps({"step": step, "data": {
            rft("better_tool"): 2 / 3, rft("tool_call_tool_shorter"): 2 / 3 * t, rft("better_gui"): 1 / 3,
            rft("tool_call_gui_shorter"): 1 / 3 * 0.3, rft("chose_better"): 0.5, rft("format_ok"): 1.0}})
            for step, t in ((0, 0.4), (5, after))]
        (tmp_path / f"seed{seed}" / "full" / "rft_metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "notes.md").write_text("**Run notes** seed 2 restarted by hand.\n")
    study.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "2", "--steps", "3"])
    text = capsys.readouterr().out
    assert "| 5 | mean | 0.60 ± 0.06 | 0.30 ± 0.00 | 0.50 ± 0.00 | 1.00 ± 0.00 | T 0.20 short of 0.8, 0.10 over 0.2 |" in text
    assert "| 0 | 1 | 0.40 | 0.30 | 0.50 | 1.00 | T 0.40 short of 0.8, 0.10 over 0.2 |" in text
    assert "- T where tools shorter: +0.20 (2 SE = 0.12, 3 seeds): **exceeds** 2 SE" in text
    assert "- T where GUI shorter: +0.00 (2 SE = 0.00, 3 seeds): within 2 SE" in text
    assert text.rstrip().endswith("**Run notes** seed 2 restarted by hand.")
    assert text.startswith(study.HEADINGS["cpu"]) or f"\n{study.HEADINGS['cpu']}\n" in text


def test_toolcua_pipeline_study_reports_a_run_cut_during_the_rft_stage_under_its_own_heading(tmp_path, capsys):
    """Runs whose hold ended during the RFT stage have held-out decisions and no online validation: the
    report says so instead of an empty arm table (and where a seed was cut before its last RFT validation,
    that row's mean says over how many seeds); --section writes it under its own heading and leaves the
    backend's section (another run's report) as it was."""
    import json

    study = _script("toolcua_pipeline_study")
    rft = study.RFT_VAL.format
    for seed, steps in ((0, (0, 20)), (1, (0, 20)), (2, (0,))):  # seed 2's run was cut before step 20
        out = tmp_path / f"seed{seed}" / "full"
        out.mkdir(parents=True)
        (out / "rft_metrics.jsonl").write_text("\n".join(json.dumps({"step": step, "data": {
            rft("better_tool"): 0.5, rft("tool_call_tool_shorter"): 0.5 * t, rft("better_gui"): 0.5,
            rft("tool_call_gui_shorter"): 0.5 * g, rft("chose_better"): 0.8, rft("format_ok"): 1.0}})
            for step, t, g in ((0, 0.8, 0.3), (20, 0.9, 0.0)) if step in steps) + "\n")
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Benchmarks\n\n{study.HEADINGS['gpu']}\n\nanother run's report\n")
    section = "## GPU: ToolCUA pipeline study, cut during RFT"
    assert study.main(["--report-only", "--backend", "gpu", "--out", str(tmp_path), "--seeds", "0", "1", "2",
                       "--steps", "2", "--write", "--doc", str(doc), "--section", section]) == 0
    text = doc.read_text()
    assert f"{study.HEADINGS['gpu']}\n\nanother run's report\n" in text and text.count(section + "\n") == 1
    ours = text.split(section + "\n")[1]
    assert "Online stage: no run reached its validation at step 2" in ours and "| arm |" not in ours
    assert "Seeds: RFT stage: 0, 1, 2; online stage: none." in ours
    assert "| 0 | mean | 0.80 ± 0.00 |" in ours and "| 20 | 2 | n/a |" in ours
    assert "| 20 | mean of 2 | 0.90 ± 0.00 | 0.00 ± 0.00 |" in ours and "| 20 | 0 |" in ours and "| met |" in ours
    assert "T where tools shorter: +0.10 (2 SE = 0.00, 2 seeds)" in ours  # paired over the seeds that have both
    assert "--section" not in ours  # where the report goes is not part of what ran


def _stand_in_pipeline(tmp_path, monkeypatch):
    """The pipeline study with a stand-in recipe that records what it was given and writes each
    stage's checkpoint folder (``runs.log`` beside the seeds: one line as each run starts and as it ends)."""
    study = _script("toolcua_pipeline_study")
    recipe = tmp_path / "recipe.sh"
    recipe.write_text("""set -e
mkdir -p "$OUT"
echo "start" >> "$(dirname "$(dirname "$OUT")")/runs.log"
echo "$SEED ${SKIP_SFT:-0} ${MODEL} ${TOOL_TERM:-task} ${RFT_WARMUP_STEPS:-none} $*" > "$OUT/given.txt"
echo "${REUSE_STAGES:-0}" > "$OUT/reuse.txt"
if [ "${SKIP_SFT:-0}" != 1 ]; then
  sleep 0.5; mkdir -p "$OUT/sft/global_step_$SFT_STEPS/huggingface"; echo "sft took 0 s" >> "$OUT/stage_times.txt"
  sleep 0.5; mkdir -p "$OUT/rft/global_step_$RFT_STEPS/actor/huggingface"; echo "rft took 0 s" >> "$OUT/stage_times.txt"
fi
[ -d "$MODEL" ] || { echo "no start model $MODEL"; exit 1; }
sleep 0.3
echo '{"step": '"$STEPS"', "data": {}}' > "$OUT/metrics.jsonl"
echo "end" >> "$(dirname "$(dirname "$OUT")")/runs.log"
""")
    monkeypatch.setattr(study, "SCRIPTS", {"gpu": str(recipe)})
    monkeypatch.setattr(study, "make_fresh_model", lambda args, seed: study.fresh_model(args, seed).mkdir(parents=True))
    monkeypatch.setattr(study, "gpu_environment", lambda: {"card": "stand-in card"})
    monkeypatch.setattr(study, "POLL_S", 0.1)
    return study


def test_toolcua_pipeline_study_max_runs_caps_the_runs_at_once(tmp_path, monkeypatch):
    """--max-runs 2: six runs (two seeds, three arms), never more than two at a time, all finished."""
    import pytest

    study = _stand_in_pipeline(tmp_path, monkeypatch)
    assert study.main(["--backend", "gpu", "--parallel", "--max-runs", "2", "--stagger-s", "0", "--seeds", "0", "1",
                       "--steps", "2", "--out", str(tmp_path / "runs"), "--write", "--doc", str(tmp_path / "doc.md")]) == 0
    events = (tmp_path / "runs" / "runs.log").read_text().split()
    running = [events[: i + 1].count("start") - events[: i + 1].count("end") for i in range(len(events))]
    assert events.count("start") == events.count("end") == 6 and max(running) == 2
    for bad in (["--max-runs", "0", "--parallel"], ["--max-runs", "2"]):  # below 1, or without --parallel
        with pytest.raises(SystemExit):
            study.main(["--backend", "gpu", *bad, "--out", str(tmp_path / "runs"), "--dry-run"])


def test_toolcua_pipeline_study_parallel_starts_each_arm_from_the_full_pipelines_checkpoint(tmp_path, monkeypatch):
    """--parallel: the seeds run at once, and each later arm starts only once the full pipeline's
    stage it needs has finished (checked against a stand-in recipe that records what it was given)."""
    import pytest

    study = _stand_in_pipeline(tmp_path, monkeypatch)
    doc = tmp_path / "doc.md"
    assert study.main(["--backend", "gpu", "--parallel", "--stagger-s", "0", "--seeds", "0", "1", "--steps", "2",
                       "--out", str(tmp_path / "runs"), "--write", "--doc", str(doc), "--set", "RFT_WARMUP_STEPS=300",
                       "--override", "trainer.x=1"]) == 0
    for seed in (0, 1):
        given = {arm: (tmp_path / "runs" / f"seed{seed}" / arm / "given.txt").read_text().split()
                 for arm in ("full", "no_rft", "per_decision")}
        assert given["full"][2].endswith(f"seed{seed}/model") and given["full"][4:] == ["300", "trainer.x=1"]
        assert given["no_rft"][2].endswith("full/sft/global_step_150/huggingface") and given["no_rft"][1] == "1"
        assert given["per_decision"][2].endswith("full/rft/global_step_10/actor/huggingface")
        assert given["per_decision"][3] == "decision"
        # a second attempt of a run resumes at the stage that failed (vLLM's start-up on a shared card)
        assert all((tmp_path / "runs" / f"seed{seed}" / arm / "reuse.txt").read_text().strip() == "1"
                   for arm in given)
    text = doc.read_text()
    assert text.count(study.HEADINGS["gpu"]) == 1 and study.HEADINGS["cpu"] + "\n" not in text
    assert "Card: **stand-in card**" in text and "--set RFT_WARMUP_STEPS=300 --override trainer.x=1 --parallel" in text
    with pytest.raises(SystemExit):
        study.main(["--set", "rft_steps=3"])  # a knob is a recipe variable in upper case
    with pytest.raises(SystemExit):
        study.main(["--set", "RFT_STEPS=3"])  # the study's own: --rft-steps (checkpoint paths depend on it)
    with pytest.raises(SystemExit):
        study.main(["--set", "REUSE_STAGES=0"])  # the study's own: a retry (--attempts) resumes at the failed stage


def test_old_logit_study_batches_seeds_exactly_and_measures_against_exact_old_logits():
    import torch

    study = _script("old_logits_experiment")
    # stacked seeds are computed as each seed alone (S = 1), and the embedding form of the first layer is
    # the one-hot MLP
    params = study.init_params([3, 4])
    ctx = torch.arange(study.CONTEXTS).repeat_interleave(2)
    tokens = torch.randint(0, study.VOCAB, (2, len(ctx), study.LENGTH), generator=torch.Generator().manual_seed(0))
    stacked = study.log_probs(params, ctx, tokens)
    for s, seed in enumerate((3, 4)):
        torch.testing.assert_close(stacked[s], study.log_probs(study.init_params([seed]), ctx, tokens[s:s + 1])[0],
                                   rtol=0, atol=1e-6)
        prev = torch.cat([torch.full((len(ctx), 1), study.VOCAB), tokens[s, :, :-1]], dim=1)
        one_hot = torch.nn.functional.one_hot
        x = torch.cat([one_hot(ctx, study.CONTEXTS)[:, None].expand(-1, study.LENGTH, -1),
                       one_hot(torch.arange(study.LENGTH), study.LENGTH).expand(len(ctx), -1, -1),
                       one_hot(prev, study.VOCAB + 1)], dim=-1).float()
        w1, b1, w2, b2 = (p[s] for p in params)
        reference = torch.log_softmax(torch.tanh(x @ w1 + b1) @ w2 + b2, -1).gather(-1, tokens[s, ..., None])[..., 0]
        torch.testing.assert_close(stacked[s], reference, rtol=0, atol=1e-6)
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
    # the arm's own knobs: no correction masks nothing; the update's size is measured every step
    bare = study.run_cell(study.EPS_ARMS["current, no correction"], [0, 1], steps=4, mean_staleness=2.0, bound=4,
                          sigma=0.3, lr=3e-2, epochs=1, contexts=2)
    assert bare["masked"].max() == 0 and bare["update_kl"].gt(0).all() and runs["current"]["update_kl"].gt(0).all()


def test_eps_match_picks_the_snapshot_arm_by_update_size_alone():
    study = _script("old_logits_experiment")

    def row(kl: float, reward: float) -> dict[str, np.ndarray]:
        return {"update_kl": np.array([kl, kl]), "final reward": np.array([reward, reward])}

    rows = {"current": row(1e-3, 0.5), "snapshot": row(2e-4, 0.9), "snapshot, ε 0.5": row(8e-4, 0.1),
            "snapshot, ε 0.8": row(3e-3, 0.9), "current, no band": row(1e-3, 0.5)}
    assert study.eps_match(rows) == "snapshot, ε 0.5"  # nearest on a log scale, whatever its reward
    assert study.eps_match({"current": row(1e-3, 0.5)}) is None


def test_hook_cost_runs_side_by_side_one_per_card_each_run_once(tmp_path, monkeypatch):
    """``--gpus 0 1``: two workers, one per card, pull the interleaved plan; every run goes to one
    card once, with that card and the thread caps in its environment."""
    import json
    import threading

    bench = _script("hook_cost_gpu")
    models = tmp_path / "models"
    model = bench.model_dir("0.5b", models)  # the model exists: no make-tiny-model here
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "verl_ext_tiny_model.json").write_text(json.dumps({"parameters": 358_360_448}))
    monkeypatch.setattr(bench, "describe_machine", lambda context: {"context": context})  # no GPU to describe
    seen, lock, started = [], threading.Lock(), set()
    both_cards_busy = threading.Barrier(2)  # each card's first run waits for the other's: side by side

    def run_gpu_sh(spec, attempts, extra_env):  # stands in for the recipe
        arm, repeat = spec.out.name.rsplit("_r", 1)
        with lock:
            seen.append((arm, int(repeat), extra_env["CUDA_VISIBLE_DEVICES"], extra_env["OMP_NUM_THREADS"]))
            first = extra_env["CUDA_VISIBLE_DEVICES"] not in started
            started.add(extra_env["CUDA_VISIBLE_DEVICES"])
        if first:
            both_cards_busy.wait(timeout=30)
        _synthetic_run(spec.out, [{} for _ in range(spec.steps)])

    monkeypatch.setattr(bench, "execute", run_gpu_sh)
    assert bench.main(["--points", "0.5b", "--repeats", "2", "--steps", "8", "--gpus", "0", "1",
                       "--out", str(tmp_path / "out"), "--models", str(models)]) == 0
    assert sorted((arm, repeat) for arm, repeat, _, _ in seen) == sorted(
        (arm, r) for arm in bench.DEFAULT_ARMS for r in range(2))
    assert {card for _, _, card, _ in seen} == {"0", "1"}
    assert {threads for *_, threads in seen} == {_script("launch").thread_caps(2, os.cpu_count() or 1)["OMP_NUM_THREADS"]}
    # run again: everything is done, nothing runs
    seen.clear()
    assert bench.main(["--points", "0.5b", "--repeats", "2", "--steps", "8", "--gpus", "0", "1",
                       "--out", str(tmp_path / "out"), "--models", str(models)]) == 0
    assert seen == []


def test_qwen2_shapes_hold_the_bytes_the_hook_cost_runs_logged():
    """scripts/bench/bench_ewma_gpu.py: the 7B shapes hold exactly the bytes the hook-cost runs' snapshots
    logged (26117281792, verl_ext/mem/snapshots/host_bytes at BOUND=1)."""
    import math

    bench = _script("bench_ewma_gpu")
    vocab = 516  # the local tokenizer of the hook-cost runs' models (docs/bench_results/hook_cost_*)
    assert sum(math.prod(s) for g in bench.qwen2_shapes("qwen2.5-7b", vocab) for s in g) * 4 == 26117281792


def test_estimator_study_arms_share_seeds_and_take_their_advantages_from_the_registered_estimators(monkeypatch):
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from verl_ext.advantages import compute
    from verl_ext.advantages.verl_glue import estimator_params

    study = _script("estimator_study")
    calls = []
    token_advantages = study.token_advantages

    def recording(arm, config, batch, fields, values):
        advantages, returns = token_advantages(arm, config, batch, fields, values)
        calls.append((config, batch, advantages))
        return advantages, returns

    monkeypatch.setattr(study, "token_advantages", recording)
    seeds = (0, 1)
    runs = {arm: [study.run_arm(arm, seed, 1) for seed in seeds] for arm in study.ARMS}
    first_batches = {(arm, seed): calls[len(seeds) * a + s]
                     for a, arm in enumerate(study.ARMS) for s, seed in enumerate(seeds)}
    assert all(len(r.success) == 1 for arm_runs in runs.values() for r in arm_runs)
    for seed in (0, 1):
        batches = [first_batches[(arm, seed)][1] for arm in study.ARMS]
        # paired seeds: every arm's first rollouts are the same episodes of the same tasks
        assert all(np.array_equal(b.state, batches[0].state) and np.array_equal(b.action, batches[0].action)
                   for b in batches)
    assert not np.array_equal(first_batches[("grpo", 0)][1].state, first_batches[("grpo", 1)][1].state)
    config, batch, grpo = first_batches[("grpo", 0)]
    # the environment's bookkeeping: a return is the finished subgoals' share, success all of them
    assert set(np.round(batch.returns * study.SUBGOALS, 6)) <= set(range(study.SUBGOALS + 1))
    assert np.array_equal(batch.success, np.isclose(batch.returns, 1.0))
    planner_rows = batch.mask & batch.planner
    next_subgoal = study.make_tasks(0).order[batch.task[:, None], batch.state % study.SUBGOALS]
    assert np.array_equal(batch.match[planner_rows], (batch.subgoal == next_subgoal)[planner_rows])
    mask = torch.from_numpy(batch.mask).float()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(batch.length)), torch.from_numpy(batch.length - 1)] = \
        torch.from_numpy(batch.returns).float()
    expected, _ = get_adv_estimator_fn("grpo")(token_level_rewards=token_rewards, response_mask=mask,
                                               index=np.array([f"task{t}" for t in batch.task], dtype=object))
    torch.testing.assert_close(grpo, expected)
    rows, turns = np.nonzero(batch.mask)
    seen = {}
    for arm in study.ARMS[1:]:
        config, batch, advantages = first_batches[(arm, 0)]
        params, _ = estimator_params(arm, config)
        direct = compute(
            arm, uid=batch.task[rows].astype(str), traj_uid=rows.astype(str), step_idx=turns,
            anchor=np.array([study.anchor_text(s) for s in batch.state[rows, turns]]),
            step_reward=batch.reward[rows, turns], action_match=batch.match[rows, turns],
            role=np.where(batch.planner[rows, turns], "planner", "executor"),
            subgoal=batch.subgoal[rows, turns].astype(str), truncated=batch.truncated[rows],
            values=np.zeros(len(rows)), **params)
        np.testing.assert_allclose(advantages[rows, turns].numpy(), direct, rtol=1e-5, atol=1e-6)
        assert advantages[~torch.from_numpy(batch.mask)].abs().sum() == 0
        seen[arm] = direct
    # the arms differ in their advantages, not only in their names
    assert len({np.round(a, 4).tobytes() for a in seen.values()}) == len(seen)
    section = study.report({arm: r for arm, r in runs.items()}, [0, 1], 1, 1.0)
    assert section.startswith(study.HEADING) and all(f"| `{arm}` |" in section for arm in study.ARMS)


def test_old_logit_probe_arms_share_the_frozen_batch_and_measure_the_exact_objective():
    import pytest
    import torch

    study, probe = _script("old_logits_experiment"), _script("old_logits_probe")
    # the expected reward is exact: sampling agrees within its noise
    params = study.init_params([0, 1])
    with torch.no_grad():
        for p in params:
            p.mul_(8)
    targets = study.task_targets([0, 1])
    sampled = study.eval_reward(params, targets[:, :2], torch.Generator().manual_seed(0), 2000)
    torch.testing.assert_close(probe.exact_reward(params, targets, 2), sampled, rtol=0, atol=0.02)
    arms = {name: probe.ARMS[name] for name in ("current", "snapshot", *study.EWMA_ANCHOR_ARMS)}
    arms["current, again"] = probe.ARMS["current"]
    kw = dict(seeds=[0, 1], warmup=3, bound=4, sigma=0.3, epochs=1, contexts=2)
    out = probe.probe_cell(arms, lr=3e-2, **kw)
    # one starting point, one batch and one mini-batch order: the same arm twice is the same update
    for arm in arms:
        assert torch.equal(out[arm]["reward_before"], out["current"]["reward_before"])
    assert torch.equal(out["current, again"]["improvement"], out["current"]["improvement"])
    assert out["current"]["improvement"].ne(0).all() and out["current"]["update_kl"].gt(0).all()
    assert not torch.equal(out["snapshot"]["improvement"], out["current"]["improvement"])
    # the per-mini-batch anchor moves with θ̄ between mini-batches ...
    mb, batch = "ewma calibrated, minibatch anchor", "ewma calibrated"
    assert not torch.equal(out[mb]["improvement"], out[batch]["improvement"])
    # ... and is the per-batch anchor where no update falls between them (one mini-batch)
    one = probe.probe_cell(arms, lr=3e-2, setup=study.Setup(minibatches=1), **kw)
    torch.testing.assert_close(one[mb]["improvement"], one[batch]["improvement"], rtol=0, atol=1e-6)
    # no update, no improvement
    still = probe.probe_cell(arms, lr=0.0, **kw)
    for arm in arms:
        assert still[arm]["improvement"].eq(0).all() and still[arm]["update_kl"].abs().max() < 1e-7
    with pytest.raises(ValueError, match="ewma_anchor"):
        study.arm_knobs({"provider": "current", "ewma_anchor": "minibatch"}, 4)
    cells = {"c": {"current": {"improvement": [0.1, 0.2, 0.3]}, "x": {"improvement": [0.2, 0.3, 0.4]},
                   "y": {"improvement": [0.1, 0.3, 0.2]}},
             "d": {"current": {"improvement": [1.0, 2.0, 3.0]}, "z": {"improvement": [1.01, 2.01, 3.01]}}}
    found = probe.beyond_interval(cells)
    assert [(arm, round(rel, 3)) for arm, _, rel in found["c"]] == [("x", 0.5)] and found["d"][0][0] == "z"
    assert probe.worth_gpu_time(cells) == ["c"]  # z's difference is real but under 10% of the improvement
