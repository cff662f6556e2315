"""scripts/bench/old_logits_gpu_study.py without a GPU: ``--dry-run`` composes every arm's command
the arms differ only in the old-logit source (and, for the fp32 controls,
the precision), and an arm's command composes through verl's config checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from omegaconf import OmegaConf

from scripts.bench.launch import thread_caps

from .test_bench_scripts_on_cpu import _script
from .test_recipe_scripts import REPO, check_config, dry_run  # noqa: F401 - dry_run is a fixture


def _dry_run_specs(out: Path, *extra: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.old_logits_gpu_study", "--dry-run", "--out", str(out),
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_dry_run_lists_every_arm_warmup_and_seed_with_fair_settings(tmp_path):
    study = _script("old_logits_gpu_study")
    specs = _dry_run_specs(tmp_path)
    assert len(specs) == len(study.ARMS) * len(study.WARMUPS) * 3  # 3 seeds by default
    assert {s["arm"] for s in specs} >= {"current", "rollout", "snapshot", "ewma", "current, fp32 rollout",
                                         "snapshot, fp32 rollout"}
    assert {s["warmup"] for s in specs} == {3, 6} and all(s["env"]["STEPS"] == "60" for s in specs)
    by_run = {(s["arm"], s["warmup"], s["seed"]): s for s in specs}
    base = by_run["current", 3, 0]
    for (arm, warmup, _seed), spec in by_run.items():
        # only the provider (and for the controls the precision) changes; loss and correction never do
        env_diff = {k for k in base["env"].keys() | spec["env"].keys() if base["env"].get(k) != spec["env"].get(k)}
        assert env_diff <= {"PROVIDER", "ROLLOUT_DTYPE", "WARMUP", "BOUND", "SEED", "OUT", "MODEL"}, (arm, env_diff)
        assert spec["env"]["LOSS"] == "ppo_ewma" and spec["env"]["ROLLOUT"] == "vllm"
        assert spec["args"][: len(study.SHARED_OVERRIDES)] == list(study.SHARED_OVERRIDES)
        fp32 = "fp32" in arm
        assert spec["env"].get("ROLLOUT_DTYPE") == ("float32" if fp32 else None)
        assert any("mixed_precision.param_dtype=fp32" in a for a in spec["args"]) == fp32
        assert spec["env"]["BOUND"] == str(2 * warmup)


def test_dry_run_skips_finished_runs_and_keeps_engines_awake_when_asked(tmp_path):
    study = _script("old_logits_gpu_study")
    finished = tmp_path / "warmup3" / "current" / "seed0"
    finished.mkdir(parents=True)
    (finished / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(1, 61)))
    started = tmp_path / "warmup3" / "current" / "seed1"  # cut short at step 59: runs again
    started.mkdir(parents=True)
    (started / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in range(1, 60)))
    specs = _dry_run_specs(tmp_path, "--engine-awake")
    runs = {(s["arm"], s["warmup"], s["seed"]) for s in specs}
    assert ("current", 3, 0) not in runs and ("current", 3, 1) in runs
    assert len(specs) == len(study.ARMS) * len(study.WARMUPS) * 3 - 1
    assert all(s["args"][-1] == "actor_rollout_ref.rollout.free_cache_engine=false" for s in specs)
    assert all(not s["args"][-1].startswith("actor_rollout_ref.rollout.free_cache") for s in _dry_run_specs(tmp_path))


def test_an_arm_and_a_control_compose_through_verls_checks(dry_run, tmp_path):  # noqa: F811
    study = _script("old_logits_gpu_study")
    specs = {(s["arm"], s["warmup"]): s for s in _dry_run_specs(tmp_path) if s["seed"] == 0}
    for key, awake in [(("ewma", 6), True), (("snapshot, fp32 rollout", 3), False)]:
        spec = specs[key]
        env = {**spec["env"], "MODEL": "Qwen/Qwen2.5-0.5B-Instruct"}  # a hub id, never downloaded
        args = [*spec["args"], *(study.ENGINE_AWAKE if awake else ())]
        code, out, err = dry_run(REPO / "recipes/text_corridor/run_gpu.sh", args, **env)
        assert code == 0, err[-4000:]
        config = OmegaConf.create(out)
        check_config(config)
        assert config.algorithm.old_logits.provider == spec["env"]["PROVIDER"]
        assert config.trainer.v1.colocate_async.num_warmup_batches == key[1]
        assert config.algorithm.rollout_correction.rollout_rs_threshold == "0.5_2.0"
        assert config.actor_rollout_ref.actor.optim.lr == 3e-3
        assert config.reward.num_workers == 2  # host memory per run
        assert config.transfer_queue.backend.SimpleStorage.num_data_storage_units == 2
        # a fixed KV cache (vLLM skips its start-up memory profiling, so runs can start together)
        assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == 1 << 30
        assert config.actor_rollout_ref.rollout.free_cache_engine is (not awake)  # memory only: no sleep
        fp32 = "fp32" in key[0]
        assert config.actor_rollout_ref.rollout.dtype == ("float32" if fp32 else "bfloat16")
        if fp32:
            assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"


def test_report_pairs_seeds_and_counts_steps_to_target():
    study = _script("old_logits_gpu_study")
    curve = np.array([[0.1] * 5 + [0.9] * 10, [0.1] * 15])
    assert study.steps_to(curve, 0.8).tolist()[0] == 10 and np.isnan(study.steps_to(curve, 0.8)[1])
    # the stale tokens' masked fraction falls to 0 once the policy stops moving (step 5 on here)
    runs = {seed: {t: {study.SUCCESS: 0.5 + 0.01 * seed, "timing_s/step": 2.0,
                       "old_logits/correction/masked_stale": 0.3 if t < 5 else 0.0} for t in range(1, 11)}
            for seed in range(3)}
    row = study.summary(runs, 10, phase_steps=4)
    np.testing.assert_allclose(row["final success (last 5 steps)"], [0.5, 0.51, 0.52])
    assert row["collapses"].sum() == 0 and row["time per step (s)"].tolist() == [2.0] * 3
    np.testing.assert_allclose(row["masked, stale tokens"], [0.3] * 3)  # the learning phase only
    np.testing.assert_allclose(study.summary(runs, 10, phase_steps=8)["masked, stale tokens"], [0.15] * 3)


def test_pilot_report_is_computed_from_the_stored_runs(tmp_path):
    """docs/results.md's "GPU: old-logit study" (the one-seed H200 pilot) from its stored runs:
    the learning-phase cells are the means of the runs' own metrics, one seed gives no verdicts."""
    study = _script("old_logits_gpu_study")
    results = REPO / "docs" / "bench_results" / "old_logits_gpu_study_h200"
    doc = tmp_path / "benchmarks.md"
    assert study.main(["--report-only", "--out", str(results), "--seeds", "0", "--write", "--doc", str(doc)]) == 0
    text = doc.read_text()
    steps = study.load_steps(results / "warmup6" / "current" / "seed0" / "metrics.jsonl")
    key = "old_logits/correction/masked_stale"  # absent on steps without stale tokens
    masked = np.mean([steps[t][key] for t in range(1, 21) if key in steps[t]])
    six_queued = text[text.index("### num_warmup_batches = 6"):].splitlines()
    row = next(line for line in six_queued if line.startswith("| current | 1 |"))
    assert f"| {masked:.4f} |" in row and masked > 0.1  # the baseline masks stale tokens: the failure shows
    snapshot = next(line for line in six_queued if line.startswith("| snapshot | 1 |"))
    assert "| 0.0000 | 0.0000 | 0.0000 |" in snapshot  # exact old logits: nothing masked for staleness
    assert "no paired differences" in text and "excludes 0" not in text


def test_a_failed_run_is_started_again(tmp_path, monkeypatch, capsys):
    """A stand-in for run_gpu.sh that fails on its first start (as on a crowded host) and finishes on
    its second: the study starts it again and records it done, with its thread caps set."""
    study = _script("old_logits_gpu_study")
    fake = tmp_path / "run_gpu.sh"
    fake.write_text('if [ ! -e "$OUT/tried" ]; then touch "$OUT/tried"; exit 1; fi\n'
                    'echo "$OMP_NUM_THREADS" > "$OUT/threads"\n'
                    'for s in $(seq 1 "$STEPS"); do echo "{\\"step\\": $s, \\"data\\": {}}"; done > "$OUT/metrics.jsonl"\n')
    monkeypatch.setattr(study, "SCRIPT", str(fake))
    monkeypatch.setattr(study, "gpu_environment", lambda: {"card": "none"})  # no nvidia-smi here
    args = SimpleNamespace(steps=2, seeds=[0], arms=["current"], out=tmp_path / "out", kv_cache_bytes=1 << 30,
                           engine_awake=False, setting="base", warmups=[3, 6],
                           parallel=2, gpus=[], retries=1, budget_s=float("inf"), run_s=600.0, start_gap_s=0.0,
                           stagger_s=0.0, min_free_gb=0.0)
    for spec in study.all_specs(args):  # the tiny models exist: no make-tiny-model here
        (Path(spec["env"]["MODEL"])).mkdir(parents=True)
        (Path(spec["env"]["MODEL"]) / "config.json").write_text("{}")
    study.run_all(args)
    log = capsys.readouterr().out
    assert log.count("attempt 1 failed (exit 1)") == 2 and log.count(": done in") == 2  # warm-ups 3 and 6
    for spec in study.all_specs(args):
        run = Path(spec["out"])
        assert json.loads((run / "run.json").read_text())["attempt"] == 2
        assert (run / "threads").read_text().strip() == thread_caps(2, os.cpu_count() or 1)["OMP_NUM_THREADS"]


def test_keep_runs_copies_finished_runs_cut_to_what_the_report_reads(tmp_path):
    """A machine's --out folder into the repository's results: finished runs only, each metric the
    report or the EWMA calibration line reads kept, the rest dropped, stored runs left alone."""
    study = _script("old_logits_gpu_study")
    source, out = tmp_path / "machine", tmp_path / "results"

    def write_run(root: Path, arm: str, seed: int, steps: int) -> Path:
        folder = root / "warmup3" / study.run_folder(arm) / f"seed{seed}"
        folder.mkdir(parents=True)
        rows = [{"step": t, "data": {study.SUCCESS: 0.5, "old_logits/ewma/age_steps": 3.0, "perf/mfu": 0.1}}
                for t in range(1, steps + 1)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "run.json").write_text(json.dumps({"wall_s": 400.0}))
        return folder

    write_run(source, "ewma", 0, 4)
    write_run(source, "current", 0, 3)  # cut short: not kept
    write_run(source, "snapshot", 0, 4)
    stored = write_run(out, "snapshot", 0, 4)
    stored_text = (stored / "metrics.jsonl").read_text()
    args = SimpleNamespace(out=out, steps=4, seeds=[0], arms=["current", "snapshot", "ewma"], kv_cache_bytes=0,
                           engine_awake=False, setting="base", warmups=[3, 6])
    assert study.keep_runs(source, args) == ["ewma warmup 3 seed 0"]
    kept = study.load_steps(out / "warmup3" / "ewma" / "seed0" / "metrics.jsonl")
    assert sorted(kept) == [1, 2, 3, 4] and kept[4] == {study.SUCCESS: 0.5, "old_logits/ewma/age_steps": 3.0}
    assert json.loads((out / "warmup3" / "ewma" / "seed0" / "run.json").read_text())["wall_s"] == 400.0
    assert not (out / "warmup3" / "current").exists()
    assert (stored / "metrics.jsonl").read_text() == stored_text


def test_hook_cost_device_backup_arm_composes_through_verls_checks(dry_run):  # noqa: F811
    """``hook_cost_gpu.py``'s ``ewma_device`` arm: the ``ewma`` arm with the live weights waiting on
    the GPU during a swap, a setting verl's config and verl-ext's checks accept."""
    bench = _script("hook_cost_gpu")
    run = bench.Run("1.5b", "ewma_device", 0)
    env = {**run.env(Path("/tmp/hc"), Path("/tmp/models"), 8), "MODEL": "Qwen/Qwen2.5-0.5B-Instruct"}
    code, out, err = dry_run(REPO / "recipes/text_corridor/run_gpu.sh", run.overrides(), **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.algorithm.old_logits.provider == "ewma" and config.algorithm.old_logits.swap_backup == "device"


def test_large_steps_setting_changes_only_the_step_size_and_composes(dry_run, tmp_path):  # noqa: F811
    """``--setting large_steps``: lr x10 and 4 epochs (the large-update regime), runs in their own
    folder, nothing else changed."""
    study = _script("old_logits_gpu_study")
    base = study.run_spec("snapshot", 3, 0, 60, tmp_path)
    large = study.run_spec("snapshot", 3, 0, 60, tmp_path, setting="large_steps")
    assert large["out"] == str(tmp_path / "large_steps" / "warmup3" / "snapshot" / "seed0")
    assert {k for k in base["env"] if base["env"][k] != large["env"][k]} == {"LR", "OUT", "MODEL"}
    assert large["env"]["LR"] == "3e-2" and set(large["args"]) - set(base["args"]) == {
        "actor_rollout_ref.actor.ppo_epochs=4"}
    env = {**large["env"], "MODEL": "Qwen/Qwen2.5-0.5B-Instruct"}
    code, out, err = dry_run(REPO / "recipes/text_corridor/run_gpu.sh", large["args"], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.actor_rollout_ref.actor.ppo_epochs == 4 and config.actor_rollout_ref.actor.optim.lr == 3e-2
