"""``scripts/bench/flagship_gpu_scripts.py`` without GPUs.

Each flagship script is composed with exactly the environment and overrides the driver gives it on
the project's GPU machine as it is (no Chromium, no flash-attn), for 8 and for 4 GPUs, through the
same ``--cfg job`` dry run as ``tests/test_recipe_scripts.py``, and must pass verl's and verl-ext's
start-up checks and verl's micro-batch rule. The docs section is computed from synthetic runs.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from . import test_recipe_scripts

check_config = test_recipe_scripts.check_config
dry_run = test_recipe_scripts.dry_run  # the fixture: a script's `--cfg job` run, as verl's main_ppo composes it

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "scripts" / "bench"


driver = importlib.import_module("scripts.bench.flagship_gpu_scripts")
# the GPU machine (scripts/gpu_machine_freeze.txt): no Chromium, no flash-attn wheel. Megatron's
# modules are taken as present so that its script is composed too (the driver skips it without them).
GPU_MACHINE = driver.Machine(chromium=False, flash_attn=False)
SCRIPT_IDS = [s.path for s in driver.SCRIPTS]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The driver's --out folder with what its build step writes, except the models (``--cfg job``
    never loads them: the test makes their folders) and with small data sets."""
    from verl_ext.data import main as prepare_data

    root = tmp_path_factory.mktemp("flagship")
    for family in ("text_hybrid", "dv_describe"):
        prepare_data([family, str(root / "data" / family), "--train-size", "8", "--val-size", "2"])
    driver.write_text_only_loops(root)
    return root


@pytest.mark.parametrize("n_gpus", [8, 4])
@pytest.mark.parametrize("script", driver.SCRIPTS, ids=SCRIPT_IDS)
def test_script_composes_with_the_drivers_plan(script, n_gpus, root, dry_run):
    from verl_ext.gpu_checks import batch_problems

    plan = driver.plan(script, n_gpus, 5, GPU_MACHINE, root)
    assert plan.skip is None
    code, out, err = dry_run(REPO / "recipes" / script.path, plan.overrides, **plan.env)
    assert code == 0, f"{script.path} with {n_gpus} GPUs: --cfg job failed:\n{err[-4000:]}"
    config = OmegaConf.create(out)
    test_recipe_scripts.make_model_folders(config, root)  # the driver's build step writes them
    check_config(config)
    assert batch_problems(config) == []
    trainer = config.trainer
    assert (trainer.total_training_steps, trainer.save_freq, trainer.test_freq) == (5, -1, -1)
    assert config.actor_rollout_ref.model.path == plan.env["MODEL"] and config.actor_rollout_ref.rollout.name == "vllm"
    assert Path(config.data.train_files).parent == Path(plan.env["DATA_DIR"])
    judge_gpus = config.reward.reward_model.n_gpus_per_node if config.reward.reward_model.enable else 0
    assert trainer.n_gpus_per_node + judge_gpus == n_gpus
    assert trainer.n_gpus_per_node % config.actor_rollout_ref.rollout.tensor_model_parallel_size == 0
    actor = config.actor_rollout_ref.actor
    if actor.strategy == "megatron":
        assert n_gpus % (actor.megatron.tensor_model_parallel_size * actor.megatron.pipeline_model_parallel_size) == 0
    else:
        assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    if "agent_loops_vl" in script.text:  # text_hybrid: no screenshots, everything else as the script's loop
        loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        script_loops = OmegaConf.load(REPO / "recipes/toolcua_hybrid/agent_loops_vl.yaml")
        assert [{**loop, "screenshots": True} for loop in OmegaConf.to_container(loops)] == \
            OmegaConf.to_container(script_loops)
        assert not loops[0].screenshots
    if script.judge_arch:
        assert config.reward.reward_model.model_path == plan.env["JUDGE_MODEL"]


def test_a_complete_machine_changes_only_the_run_and_a_megatron_less_one_skips_megatron(root):
    complete = driver.Machine(chromium=True, flash_attn=True)
    for script in driver.SCRIPTS:
        plan = driver.plan(script, 8, 5, complete, root)
        assert plan.skip is None and plan.overrides == ["trainer.total_training_steps=5", *driver.RUN_OVERRIDES]
        assert plan.data[0] in ("minidesk", "dv_describe")
        expected = 2 if script.judge_arch else 1  # the run length (+ the random judge's note)
        assert len(plan.changes) == expected, plan.changes
    plan = driver.plan(driver.SCRIPTS[0], 8, 5, complete, root, ("actor_rollout_ref.rollout.enforce_eager=true",))
    assert plan.overrides[-1] == "actor_rollout_ref.rollout.enforce_eager=true"
    assert plan.changes[-1] == "`actor_rollout_ref.rollout.enforce_eager=true` (given with --override)"
    megatron = next(s for s in driver.SCRIPTS if "megatron" in s.path)
    plan = driver.plan(megatron, 8, 5, driver.Machine(True, True, ("transformer_engine_torch",)), root)
    assert "transformer_engine_torch" in plan.skip and "old_logits.md" in plan.skip


def test_parallel_sizes_and_the_scripts_own_defaults():
    assert [driver.fit_divisor(2, n) for n in (8, 4, 3, 1)] == [2, 2, 1, 1]
    assert driver.fit_divisor(4, 6) == 3
    megatron = next(s for s in driver.SCRIPTS if "megatron" in s.path)
    defaults = driver.script_defaults(megatron.text)
    assert (defaults["N_GPUS"], defaults["TP"], defaults["PP"], defaults["ROLLOUT_TP"]) == ("8", "2", "1", "2")
    judge = next(s for s in driver.SCRIPTS if s.judge_arch)
    assert driver.prepare_data_call(judge.text) == ("dv_describe", ["--train-size", "4096", "--val-size", "256"])
    plan = driver.plan(megatron, 1, 5, GPU_MACHINE, Path("/r"))  # one GPU: TP and rollout TP scaled to 1
    assert (plan.env["TP"], plan.env["ROLLOUT_TP"], "PP" in plan.env) == ("1", "1", False)


def _write_run(results: Path, script, record: dict, steps: dict[int, dict] | None) -> None:
    folder = results / script.slug
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"script": script.path, "skip": None, "changes": ["a change"],
                                                 **record}))
    if steps:
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": m}) + "\n"
                                                      for s, m in steps.items()))


def test_docs_section_is_computed_from_the_runs(tmp_path):
    results = tmp_path / "flagship"
    results.mkdir()
    (results / "machine.json").write_text(json.dumps({
        "card": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "vllm": "0.24.0", "verl": "0.9.1",
        "transformers": "5.10.4", "context": "", "n_gpus": 4, "steps": 5}))
    text_1p5b, vl, megatron, judge = driver.SCRIPTS
    # step 1 is warm-up: left out of the medians; `adv` never logged by the VL run
    _write_run(results, text_1p5b, {"exit_code": 0, "wall_s": 400.0},
               {s: {"timing_s/gen": g, "timing_s/step": g + 2, "timing_s/adv": 0.1, "num_turns/mean": 1.0}
                for s, g in ((1, 90.0), (2, 10.0), (3, 12.0), (4, 11.0), (5, 30.0))})
    _write_run(results, vl, {"exit_code": 1, "wall_s": 200.0, "error": "torch.OutOfMemoryError: CUDA out of memory"},
               {1: {"timing_s/gen": 50.0, "timing_s/step": 60.0}, 2: {"timing_s/gen": 20.0, "timing_s/step": 25.0}})
    _write_run(results, megatron, {"skip": "not installed here: transformer_engine_torch"}, None)
    text = driver.section(results)
    assert "on **4 x NVIDIA H100 80GB HBM3**" in text and "medians over steps 2-5" in text
    assert "| gen | 11.5 | 20.0 |" in text and "| step | 13.5 | 25.0 |" in text and "| adv | 0.1 | - |" in text
    assert text.index("| gen |") < text.index("| step |")  # the total last
    assert "| `num_turns/mean` | 1 | - |" in text and "| steps logged | 5 | 2 |" in text
    assert "| wall time of the run (s) | 400 | 200 |" in text
    assert f"* `{text_1p5b.path}`: a change." in text
    assert f"* `{megatron.path}`: not run: not installed here: transformer_engine_torch." in text
    assert f"* `{vl.path}`: exit 1 after 2 of 5 steps: `torch.OutOfMemoryError: CUDA out of memory`" in text
    assert f"* `{judge.path}`: not run (no `run.json`" in text
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    for _ in range(2):  # replaced in place, not appended again
        driver.publish(doc, driver.HEADING, text)
    assert doc.read_text().count(driver.HEADING) == 1 and "kept" in doc.read_text()


def test_failure_line_names_the_error():
    log = "starting\nTraceback (most recent call last):\n  File x\nValueError: bad key\nray shutting down\n"
    assert driver.failure_line(log) == "ValueError: bad key"
    assert driver.failure_line("all fine\n") == "all fine"


def test_run_script_records_a_failed_run_and_reuses_a_finished_one(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "stop_ray", lambda: None)  # the machine's other Ray clusters are left alone
    (tmp_path / "fail.sh").write_text("echo starting\necho 'ValueError: bad key' >&2\nexit 3\n")
    (tmp_path / "ok.sh").write_text('echo "{\\"step\\": $STEPS, \\"data\\": {}}" > "$OUT/metrics.jsonl"\n')
    failed = driver.run_script(driver.Script(str(tmp_path / "fail.sh"), "a"),
                               driver.Plan({"OUT": str(tmp_path / "f")}, []), 2, timeout_s=60)
    assert (failed["exit_code"], failed["error"]) == (3, "ValueError: bad key") and failed["wall_s"] > 0
    ok = driver.Script(str(tmp_path / "ok.sh"), "a")
    record = driver.run_script(ok, driver.Plan({"OUT": str(tmp_path / "ok")}, []), 2, timeout_s=60)
    assert record["exit_code"] == 0 and json.loads((tmp_path / "ok" / "run.json").read_text())["wall_s"] == record["wall_s"]
    assert driver.run_script(ok, driver.Plan({"OUT": str(tmp_path / "ok")}, ["x"]), 2, timeout_s=60)["overrides"] == []
