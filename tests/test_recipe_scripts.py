"""Every GPU recipe script, checked without GPUs.

Each ``recipes/*/run_*.sh`` except the cpu ones (``tests/e2e`` runs those) is run as a user runs it,
with Hydra's ``--cfg job`` appended to its overrides. Only its last command, ``python -m
verl.trainer.main_ppo <args>``, is taken over: a ``python`` placed first on PATH records ``<args>``,
and verl 0.9.1's own ``main_ppo`` entry point is then called with exactly those arguments in this
process (one start-up instead of one per script). With ``--cfg job`` it composes the full config
(verl's ``ppo_trainer``/``ppo_megatron_trainer`` + the recipe + the script's overrides), prints it
and returns before Ray or any GPU work. The printed config then goes through the checks verl runs
before touching a GPU (``main_ppo``'s ``validate_config``, the config dataclasses its v1 trainer and
workers build) and verl-ext's own (``verl_ext.doctor``, old-logit, estimator and agent-loop
settings), so a renamed verl key, a typo or a missing plugin fails here. Model paths stay hub ids
and are never downloaded (HF_HUB_OFFLINE=1 for everything the script runs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from verl_ext import fragment_overrides, validation

from .conftest import cannot_run_here
from .main_ppo_job import main_ppo_job

REPO = Path(__file__).resolve().parents[1]
GPU_SCRIPTS = sorted(p for p in REPO.glob("recipes/*/run_*.sh") if "cpu" not in p.stem)
QWEN_1P5B = REPO / "recipes/toolcua_hybrid/run_fsdp_qwen25_1p5b.sh"
TEXT_CORRIDOR_GPU = REPO / "recipes/text_corridor/run_gpu.sh"
DVREWARD_GPU = REPO / "recipes/dvreward_judge/run_fsdp_qwen25_1p5b.sh"
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward.reward_model.model_path")
TOOLCUA_SFT_RL_GPU = REPO / "recipes/toolcua_sft_rl/run_gpu.sh"
# scripts that build a model unless MODEL names one: a hub id here (never downloaded); the staged
# pipeline without its SFT stage (torchrun would really train) and with small datasets
SCRIPT_ENV = {
    TEXT_CORRIDOR_GPU: {"MODEL": "Qwen/Qwen2.5-0.5B-Instruct"},
    TOOLCUA_SFT_RL_GPU: {"SKIP_SFT": "1", "RFT_ROWS": "4", "RFT_VAL_ROWS": "2", "RL_ROWS": "4", "RL_VAL_SIZE": "2"},
    DVREWARD_GPU: {"DATA_DIR": "{root}/dv_data"},  # prompts with question sets; "{root}": the fixture's folder
}

# (id, script, extra overrides, text the failure must contain): each layer rejects its own kind of typo.
BROKEN = [
    # a typo in a key verl's yaml has: Hydra's struct config refuses it
    ("verl_key", QWEN_1P5B, ["actor_rollout_ref.actor.ppo_mini_batchsize=8"], "ppo_mini_batchsize"),
    # `+` adds any key; verl's RolloutConfig dataclass refuses the unknown one
    ("added_verl_key", QWEN_1P5B, ["+actor_rollout_ref.rollout.limit_image=1"], "limit_image"),
    # a verl-ext estimator setting verl never reads: the estimator's signature refuses it
    ("verl_ext_key", QWEN_1P5B, ["+algorithm.hgpo.history_lenght=3"], "algorithm.hgpo.history_lenght"),
    # a plugin that is not registered: verl-ext's doctor names it
    ("plugin_name", REPO / "recipes/async_agentic/run_ewma.sh", ["algorithm.adv_estimator=hgpo_v2"], "hgpo_v2"),
]

# `python` for the scripts: `python -m verl.trainer.main_ppo ...` only records its arguments.
PYTHON_SHIM = f"""#!/usr/bin/env bash
if [ "${{1:-}}" = -m ] && [ "${{2:-}}" = verl.trainer.main_ppo ]; then
    shift 2
    printf '%s\\0' "$@" > "$MAIN_PPO_ARGS"
    exit 0
fi
exec {sys.executable} "$@"
"""


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """``dry_run(script, overrides, **env) -> (exit code, stdout, stderr)`` of verl's main_ppo."""
    from verl_ext.data import main as prepare_data

    root = tmp_path_factory.mktemp("recipe_dry_run")
    data_dir = root / "data"  # prepared here, so no script writes data
    prepare_data(["minidesk", str(data_dir), "--train-size", "8", "--val-size", "2"])
    prepare_data(["dv_describe", str(root / "dv_data"), "--train-size", "8", "--val-size", "2"])
    (root / "bin").mkdir()
    shim = root / "bin" / "python"
    shim.write_text(PYTHON_SHIM)
    shim.chmod(0o755)
    env = {
        **os.environ,
        "DATA_DIR": str(data_dir),
        "OUT": str(root / "out"),
        "HF_HUB_OFFLINE": "1",
        "MAIN_PPO_ARGS": str(root / "main_ppo_args"),
        "PATH": f"{root / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}",  # + this venv's verl-ext
    }

    def run(script: Path, overrides: list[str], **script_env: str) -> tuple[int, str, str]:
        script_env = {key: value.format(root=root) for key, value in script_env.items()}
        proc = subprocess.run(["bash", str(script), *overrides, "--cfg", "job"], cwd=REPO, env={**env, **script_env},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{script} failed before main_ppo:\n{proc.stderr[-4000:]}"
        args_file = Path(env["MAIN_PPO_ARGS"])
        assert args_file.exists(), f"{script} never ran `python -m verl.trainer.main_ppo`"
        args = args_file.read_text().split("\0")[:-1]
        args_file.unlink()
        run.last_args = args
        # a fragment and a plain setting of the same selector on one command line (verl_ext.fragment_overrides)
        assert fragment_overrides.fragment_conflicts(args) == [], f"{script}: {fragment_overrides.fragment_conflicts(args)}"
        return main_ppo_job(args)  # what `python -m verl.trainer.main_ppo` runs

    run.root = root
    return run


def _script_id(script: Path) -> str:
    return f"{script.parent.name}/{script.name}"


def make_model_folders(config: DictConfig, root: Path) -> None:
    """Stand in for the model folders a script's earlier stages (or a driver's build step) write
    under ``root``: a ``--cfg job`` dry run writes none, and the start-up checks want them to exist.
    Model paths outside ``root`` are left as they are."""
    for key in MODEL_KEYS:
        path = OmegaConf.select(config, key)
        if path and Path(path).is_relative_to(root):
            Path(path).mkdir(parents=True, exist_ok=True)


def check_config(config: DictConfig) -> None:
    """Raise on anything verl 0.9.1 or verl-ext would reject in this config before the first step;
    skip (fail under CI) where a plugin it selects needs an optional extra not installed here."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    from verl_ext.advantages import ESTIMATORS
    from verl_ext.validation import dependency_problems, plugin_problems
    from verl_ext.rewards import postprocess

    problems = plugin_problems(config)
    assert not problems, "\n".join(problems)
    # an optional extra not installed here: skipped (failed under CI), before verl-ext's checks,
    # which verl's validate_config below runs too, would refuse it
    missing = dependency_problems(config)
    if missing:
        cannot_run_here("; ".join(missing))
    # verl's main_ppo, then TaskRunnerV1.run (which resolves every interpolation)
    auto_set_device(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    OmegaConf.resolve(config)
    # dataclasses the v1 trainer and the actor/rollout workers build (validate_config built the
    # actor's and, when needed, the critic's). Not built: HFModelConfig, which loads the model.
    rollout = config.actor_rollout_ref.rollout
    omega_conf_to_dataclass(rollout)
    omega_conf_to_dataclass(rollout.checkpoint_engine)
    if config.distillation.enabled:
        omega_conf_to_dataclass(config.distillation)
    # verl reads `algorithm` untyped, so a misspelt verl key there would be ignored silently: check
    # verl's part against verl's own dataclasses, the verl-ext sections with verl-ext's parsers.
    algorithm = config.algorithm
    verl_ext_sections = {"old_logits", postprocess.PATH_LENGTH_KEY, *ESTIMATORS}
    omega_conf_to_dataclass({k: v for k, v in algorithm.items() if k not in verl_ext_sections}, AlgoConfig)
    if algorithm.get("rollout_correction") is not None:
        omega_conf_to_dataclass(algorithm.rollout_correction, RolloutCorrectionConfig)
    get_custom_reward_fn(config)  # verl's loader: imports the reward function the config names

    # verl-ext's start-up checks (verl's validate_config above ran them too: verl-ext wraps it)
    validation.assert_valid(config)


def test_every_recipe_has_gpu_scripts():
    recipes = {p.parent.name for p in GPU_SCRIPTS}
    assert {"toolcua_hybrid", "async_agentic"} <= recipes, recipes


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=_script_id)
def test_gpu_script_config_passes_verls_checks(script: Path, dry_run):
    code, out, err = dry_run(script, [], **SCRIPT_ENV.get(script, {}))
    assert code == 0, f"{_script_id(script)} --cfg job failed:\n{err[-4000:]}"
    config = OmegaConf.create(out)
    make_model_folders(config, dry_run.root)  # toolcua_sft_rl: stage 3 starts from stage 2's checkpoint
    check_config(config)
    # Hydra keeps the composed config under the run's OUT, not in ./outputs/<date>/ of the launch directory
    run_dirs = [a.split("=", 1)[1] for a in dry_run.last_args if a.startswith("hydra.run.dir=")]
    assert run_dirs and Path(run_dirs[-1]).is_relative_to(dry_run.root / "out"), run_dirs
    if script.parent.name == "async_agentic":  # run_[separate_]<provider>.sh trains with that provider
        name = script.stem.removeprefix("run_")
        separate = name.startswith("separate_")
        assert config.algorithm.old_logits.provider == name.removeprefix("separate_")
        assert config.trainer.v1.trainer_mode == ("verl_ext_separate_async" if separate else "verl_ext_colocate_async")
        if separate:  # half of the node's 8 GPUs roll out, the rest train; weights over NCCL between them
            assert (config.trainer.n_gpus_per_node, config.actor_rollout_ref.rollout.n_gpus_per_node) == (4, 4)
            assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
            assert config.data.train_batch_size == (config.trainer.v1.separate_async.parameter_sync_step
                                                    * config.actor_rollout_ref.actor.ppo_mini_batch_size)


# every setting tests/gpu runs run_gpu.sh with (1, 2 and 4 GPUs)
GPU_TEST_MATRIX = [
    dict(ADV="grpo", LOSS="vanilla", PROVIDER="none"),
    dict(ADV="gigpo", LOSS="ppo_ewma", PROVIDER="ewma_bound"),
    dict(ADV="hgpo", LOSS="ppo_ewma", PROVIDER="snapshot"),
    *[dict(MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=p)
      for p in ("current", "rollout", "snapshot", "ewma", "loglinear")],
    *[dict(MODE="colocate_async", ROLLOUT="hf", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=p)
      for p in ("dedicated", "interrupt")],
    # tests/gpu/test_exact_providers_vllm.py: the rollout-side providers on vLLM, rows cut mid-decode trained
    *[dict(MODE="colocate_async", ROLLOUT="vllm", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=p, WARMUP="1", BOUND="2",
           SAMPLER="wait", MAX_NUM_SEQS="8")
      for p in ("dedicated", "interrupt")],
    # tests/gpu/test_separate_async_gpu.py: separate pools sharing one card
    *[dict(MODE="separate_async", SHARE_CARD="1", ADV="gigpo", LOSS="ppo_ewma", PROVIDER=p, WARMUP="1", BOUND="2",
           SAMPLER="wait", MAX_NUM_SEQS="8") for p in ("current", "snapshot", "dedicated", "interrupt")],
    dict(N_GPUS="2", MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER="snapshot"),
    dict(N_GPUS="4", ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma_bound"),
    # test_exact_providers_vllm.py::test_dedicated_scorer_on_a_gpu_of_its_own (2 GPUs visible, the trainer on one)
    dict(MODE="colocate_async", ROLLOUT="vllm", ADV="gigpo", LOSS="ppo_ewma", PROVIDER="dedicated",
         KV_CACHE_BYTES=str(1 << 30)),
    # tests/gpu/test_megatron.py on one GPU and TP=2 on two, and TP=2 x PP=2 for a 4-GPU machine
    dict(STRATEGY="megatron", ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma_bound"),
    dict(STRATEGY="megatron", MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma", PROVIDER="snapshot"),
    dict(STRATEGY="megatron", N_GPUS="2", TP="2", ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma_bound"),
    dict(STRATEGY="megatron", N_GPUS="2", TP="2", MODE="colocate_async", ADV="gigpo", LOSS="ppo_ewma",
         PROVIDER="snapshot"),
    dict(STRATEGY="megatron", N_GPUS="4", TP="2", PP="2", ADV="hgpo", LOSS="ppo_ewma", PROVIDER="ewma_bound"),
]


@pytest.mark.parametrize("env", GPU_TEST_MATRIX, ids=lambda e: "-".join(e.values()))
def test_gpu_test_matrix_composes(env, dry_run):
    from verl_ext.gpu_checks import batch_problems

    code, out, err = dry_run(TEXT_CORRIDOR_GPU, [], **SCRIPT_ENV[TEXT_CORRIDOR_GPU], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert batch_problems(config) == []  # the batch scales with N_GPUS
    expected_mode = env.get("MODE", "sync")
    if env["PROVIDER"] != "none":
        expected_mode = f"verl_ext_{expected_mode}"
        assert config.algorithm.old_logits.provider == env["PROVIDER"].split("_")[0]  # ewma_bound: ewma
    assert config.trainer.v1.trainer_mode == expected_mode
    assert config.trainer.n_gpus_per_node == int(env.get("N_GPUS", 1))
    actor = config.actor_rollout_ref.actor
    assert actor.strategy == env.get("STRATEGY", "fsdp2")
    if actor.strategy == "megatron":
        assert (actor.megatron.tensor_model_parallel_size, actor.megatron.pipeline_model_parallel_size) == (
            int(env.get("TP", 1)), int(env.get("PP", 1)))
        assert actor.megatron.override_transformer_config.attention_backend == "fused"  # no flash-attn wheel
    if "SAMPLER" in env:
        assert config.trainer.v1.sampler.max_off_policy_strategy == env["SAMPLER"]
        assert config.trainer.v1.sampler.max_off_policy_threshold == int(env["BOUND"])
        assert config.actor_rollout_ref.rollout.max_num_seqs == int(env["MAX_NUM_SEQS"])
    if env.get("SHARE_CARD") == "1":  # both pools on the one card: host-memory weights, no colocated replica
        from verl_ext import validation

        assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "host_memory"
        assert config.actor_rollout_ref.hybrid_engine is False and config.ray_kwargs.ray_init.num_gpus == 2
        assert validation.separate_async_settings(config) == []
    if "KV_CACHE_BYTES" in env:  # a fixed KV cache: vLLM skips its start-up memory profiling
        assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes == int(env["KV_CACHE_BYTES"])


def test_async_cpu_twin_composes_the_async_recipe(dry_run):
    """async_agentic/run_cpu.sh wraps toolcua_hybrid/run_cpu.sh, whose +plugins/backend=cpu is merged
    after the recipes: the async settings and PROVIDER must still win."""
    code, out, err = dry_run(REPO / "recipes/async_agentic/run_cpu.sh", [], PROVIDER="loglinear")
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.trainer.v1.trainer_mode == "verl_ext_colocate_async"
    assert config.algorithm.old_logits.provider == "loglinear"
    assert config.algorithm.rollout_correction.rollout_rs == "token_k1"
    assert config.actor_rollout_ref.rollout.name == "hf"  # still the cpu backend


def test_async_cpu_twin_composes_separate_pools(dry_run):
    """MODE=separate_async: verl's separate_async trainer with a standalone hf replica, weights through
    host memory, the start-up checks passing (two local updates of the base script's batch)."""
    from verl_ext import validation

    code, out, err = dry_run(REPO / "recipes/async_agentic/run_cpu.sh", [], PROVIDER="snapshot", MODE="separate_async")
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    check_config(config)
    assert config.trainer.v1.trainer_mode == "verl_ext_separate_async"
    assert config.actor_rollout_ref.rollout.checkpoint_engine.backend == "host_memory"
    assert validation.separate_async_settings(config) == [] and validation.micro_batches_divide(config) == []


@pytest.mark.parametrize("case, script, overrides, expected", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_typo_fails_the_dry_run(case, script, overrides, expected, dry_run):
    code, out, err = dry_run(script, overrides)
    if code != 0:  # Hydra refused it while composing
        assert expected in err, err[-4000:]
        return
    with pytest.raises(Exception, match=re.escape(expected)):
        check_config(OmegaConf.create(out))


def test_a_misspelt_agent_loop_kwarg_fails(dry_run, tmp_path):
    loops = tmp_path / "agent_loops.yaml"
    vl_loops = (REPO / "recipes/toolcua_hybrid/agent_loops_vl.yaml").read_text()
    loops.write_text(vl_loops.replace("screenshots:", "screenshot:"))
    code, out, err = dry_run(QWEN_1P5B, [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"])
    assert code == 0, err[-4000:]
    with pytest.raises(validation.ConfigError, match=re.escape("no parameter(s) ['screenshot']")):
        check_config(OmegaConf.create(out))


@pytest.mark.parametrize("stage", ["rft", "rl"])
def test_staged_pipeline_gpu_stages_compose_and_hand_on_the_checkpoint(stage, dry_run):
    """recipes/toolcua_sft_rl/run_gpu.sh: the single-turn RL stage on critical switching steps
    (decision_turn rows and reward) and the online stage that starts from its HF checkpoint. Only
    the last main_ppo call is taken over, so the RFT stage is checked with the online stage skipped."""
    env = {**SCRIPT_ENV[TOOLCUA_SFT_RL_GPU],
           **({"SKIP_RL": "1", "RFT_BALANCE": "1"} if stage == "rft" else {"TOOL_TERM": "decision"})}
    code, out, err = dry_run(TOOLCUA_SFT_RL_GPU, [], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    make_model_folders(config, dry_run.root)  # the RFT stage's checkpoint
    check_config(config)
    if stage == "rft":
        assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-1.5B-Instruct"  # SFT skipped: MODEL
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "decision_turn"
        assert config.reward.custom_reward_function.path == "pkg://verl_ext.rewards.decision_reward"
        assert config.reward.custom_reward_function.reward_kwargs.choice_weight == 2  # R_choice on (RFT_CHOICE_WEIGHT)
        assert config.data.custom_cls.name == "DecisionDataset" and not config.data.filter_overlong_prompts
        assert "hf_model" in config.actor_rollout_ref.actor.checkpoint.save_contents
        import pandas as pd

        labels = [e["decision"]["better"] for e in pd.read_parquet(config.data.train_files).extra_info]
        assert labels.count("gui") == labels.count("tool")  # RFT_BALANCE=1: half per label
        assert config.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"  # no flash-attn here
        assert config.actor_rollout_ref.model.use_remove_padding is False
    else:
        assert config.actor_rollout_ref.model.path.endswith("/rft/global_step_50/actor/huggingface")
        assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "hybrid_gui_tool"
        assert config.reward.custom_reward_function.reward_kwargs.tool_term == "decision"
        assert config.algorithm.path_length_reward.weight == 0.2


def test_staged_pipeline_show_todo_reaches_the_decision_rows_and_the_online_loop(dry_run):
    """SHOW_TODO=1: the RFT stage's decision rows end each observation with the to-do list, and the
    online stage's hybrid_gui_tool loop gets the same env option (its agent loop config, whose kwargs
    verl-ext's start-up checks match against the loop's parameters)."""
    import json

    import pandas as pd

    code, out, err = dry_run(TOOLCUA_SFT_RL_GPU, [], **SCRIPT_ENV[TOOLCUA_SFT_RL_GPU], SHOW_TODO="1")
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    make_model_folders(config, dry_run.root)
    check_config(config)
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    assert [loop.name for loop in loops] == ["hybrid_gui_tool"] and loops[0].env_options.show_todo is True
    prompts = pd.read_parquet(Path(dry_run.root) / "out" / "rft_data" / "train.parquet")["prompt"]
    assert all(json.loads(p)[-1]["content"].splitlines()[-1].startswith("To do: (") for p in prompts)


SFT_KNOB_ERRORS = {
    "SFT_TOOL_OVERSAMPLE": "SFT_TOOL_OVERSAMPLE must be a whole number >= 1 (1: no oversampling), got '{}'",
    "SFT_DECISION_WEIGHT": "SFT_DECISION_WEIGHT must be a number > 0 (1: no weighting)",
    "RFT_WARMUP_DECISION_WEIGHT": "RFT_WARMUP_DECISION_WEIGHT must be a number > 0 (1: no weighting)",
    "ATTENTION": "ATTENTION must be flash_attention_2 or sdpa, got '{}'",
    "RFT_BALANCE": "RFT_BALANCE must be 0 or 1, got '{}'",
    "RFT_WARMUP_TARGETS": "RFT_WARMUP_TARGETS must be both or shorter, got '{}'",
    "REUSE_STAGES": "REUSE_STAGES must be 0 or 1, got '{}'",
    "RFT_WARMUP_BATCH": "RFT_WARMUP_BATCH must be a whole number >= 1, got '{}'",
}


@pytest.mark.parametrize(("knob", "value"), [
    *(("SFT_TOOL_OVERSAMPLE", v) for v in ("0", "x", "-1", "1.5", "02")),
    *(("SFT_DECISION_WEIGHT", v) for v in ("0", "x", "-1", "0.0", "1e2", " 8")),
    ("RFT_WARMUP_DECISION_WEIGHT", "0"),
    ("ATTENTION", "flash"),
    ("RFT_BALANCE", "yes"),
    ("RFT_WARMUP_TARGETS", "better"),
    ("REUSE_STAGES", "yes"),
    *(("RFT_WARMUP_BATCH", v) for v in ("0", "x", "16.5")),
])
def test_staged_pipeline_refuses_a_bad_sft_knob(knob, value, tmp_path):
    """SFT_TOOL_OVERSAMPLE (prepare-data --tool-oversample), SFT_DECISION_WEIGHT
    (DecisionWeightedSFTDataset) and the GPU script's ATTENTION: the script stops before any stage and
    names the knob."""
    env = {**os.environ, "OUT": str(tmp_path), knob: value, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(TOOLCUA_SFT_RL_GPU)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert SFT_KNOB_ERRORS[knob].format(value) in proc.stderr
    assert not (tmp_path / "sft_data").exists()


@pytest.mark.parametrize("targets", ["both", "shorter"])
def test_staged_pipeline_rft_warmup_hands_its_checkpoint_to_the_rl_half(targets, dry_run):
    """RFT_WARMUP_STEPS: the RFT stage first runs verl's SFT trainer on the switching-step warm-up rows
    (composed only: ``--cfg job``), then its single-turn RL starts from the warm-up's HF checkpoint.
    RFT_WARMUP_TARGETS: both options of each of the RFT_ROWS training decisions (2 rows each), or the
    shorter way's call only (1 row each)."""
    import pandas as pd

    env = {**SCRIPT_ENV[TOOLCUA_SFT_RL_GPU], "SKIP_RL": "1", "RFT_WARMUP_STEPS": "2", "RFT_ROWS": "6",
           "RFT_WARMUP_TARGETS": targets, "SFT_LAUNCHER": sys.executable, "SFT_ARGS": "--cfg job"}
    code, out, err = dry_run(TOOLCUA_SFT_RL_GPU, [], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    assert config.actor_rollout_ref.model.path.endswith("/rft_warmup/global_step_2/huggingface")
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "decision_turn"
    warmup = pd.read_parquet(Path(dry_run.root) / "out" / "rft_warmup_data" / "train.parquet").extra_info
    if targets == "both":
        assert len(warmup) == 12 and [e["mode"] for e in warmup] == ["gui", "tool"] * 6
    else:
        assert len(warmup) == 6 and all(e["mode"] == e["better"] for e in warmup)


def _finished(ckpt: Path, step: int) -> None:
    """What a verl trainer run leaves once its step-``step`` checkpoint is saved."""
    ckpt.mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_staged_pipeline_reuse_stages_resumes_at_the_stage_that_did_not_finish(dry_run, tmp_path):
    """REUSE_STAGES=1: a started-again pipeline hands on the SFT run and the RFT warm-up whose
    checkpoints of their last step are in $OUT (their trainers are not started: SFT_LAUNCHER=false
    would fail) and trains the RFT run whose checkpoint is of another step; once that RFT checkpoint
    is there too, the online stage starts from it. A failed run's metrics file is not appended to."""
    _finished(tmp_path / "sft", 300)
    _finished(tmp_path / "rft_warmup", 2)
    _finished(tmp_path / "rft", 7)  # a run of another length (or one whose save never ended)
    (tmp_path / "rft_metrics.jsonl").write_text('{"step": 1, "data": {"from": "the failed run"}}\n')
    env = {**SCRIPT_ENV[TOOLCUA_SFT_RL_GPU], "SKIP_SFT": "0", "SKIP_RL": "1", "RFT_WARMUP_STEPS": "2",
           "REUSE_STAGES": "1", "SFT_LAUNCHER": "false", "OUT": str(tmp_path)}
    code, out, err = dry_run(TOOLCUA_SFT_RL_GPU, [], **env)
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "decision_turn"  # the RFT run trains
    assert config.actor_rollout_ref.model.path == f"{tmp_path}/rft_warmup/global_step_2/huggingface"
    assert not (tmp_path / "sft_data").exists() and not (tmp_path / "rft_warmup_data").exists()
    assert not (tmp_path / "rft_metrics.jsonl").exists()  # removed before the RFT run (the stand-in logs nothing)

    (tmp_path / "rft" / "latest_checkpointed_iteration.txt").write_text("50")  # RFT_STEPS' checkpoint saved
    code, out, err = dry_run(TOOLCUA_SFT_RL_GPU, [], **{**env, "SKIP_RL": "0"})
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "hybrid_gui_tool"
    assert config.actor_rollout_ref.model.path == f"{tmp_path}/rft/global_step_50/actor/huggingface"


def test_staged_pipeline_trains_every_stage_again_without_reuse_stages(tmp_path):
    """REUSE_STAGES unset (0): a finished SFT checkpoint in $OUT is trained again, as before the knob."""
    _finished(tmp_path / "sft", 300)
    env = {**os.environ, "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "SKIP_RFT": "1", "SKIP_RL": "1",
           "SFT_ROWS": "2", "SFT_LAUNCHER": "false", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(TOOLCUA_SFT_RL_GPU)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and (tmp_path / "sft_data" / "train.parquet").exists()  # the launcher ran
    assert "reusing" not in proc.stdout


def test_staged_pipeline_rft_warmup_decision_weight_selects_the_weighted_dataset(dry_run, tmp_path):
    """RFT_WARMUP_DECISION_WEIGHT=W: the warm-up's SFT config (composed only: ``--cfg job``) uses
    DecisionWeightedSFTDataset with data.decision_weight=W, as SFT_DECISION_WEIGHT does for stage 1.
    RFT_WARMUP_BATCH=B: the warm-up's batch (not SFT_BATCH's), with at least B held-out rows (verl
    validates in batches of B and drops an incomplete one)."""
    import pandas as pd

    env = {**os.environ, "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "SKIP_SFT": "1", "SKIP_RL": "1",
           "RFT_WARMUP_STEPS": "2", "RFT_ROWS": "4", "RFT_VAL_ROWS": "2", "RFT_WARMUP_DECISION_WEIGHT": "8",
           "RFT_WARMUP_BATCH": "6",
           "SFT_LAUNCHER": sys.executable, "SFT_ARGS": "--cfg job", "MAIN_PPO_ARGS": str(tmp_path / "main_ppo_args"),
           "PATH": f"{dry_run.root / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(TOOLCUA_SFT_RL_GPU)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = proc.stdout[:proc.stdout.index("text_hybrid_decisions train:")]  # the RL half's data comes next
    after_data = printed.index("\n", printed.index("text_hybrid_switch_warmup val:")) + 1
    data = OmegaConf.create(printed[after_data:]).data
    assert data.custom_cls.name == "DecisionWeightedSFTDataset" and data.decision_weight == 8
    assert data.train_files.endswith("/rft_warmup_data/train.parquet")
    assert data.train_batch_size == 6 and len(pd.read_parquet(tmp_path / "rft_warmup_data" / "val.parquet")) == 6


@pytest.mark.parametrize("weight", ["1", "8"])
def test_staged_pipeline_sft_decision_weight_selects_the_weighted_dataset(weight, tmp_path):
    """SFT_DECISION_WEIGHT=1 (default) composes verl's SFT config as before (JsonMultiTurnSFTDataset, no
    decision_weight key); another W swaps in DecisionWeightedSFTDataset with data.decision_weight=W."""
    env = {**os.environ, "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "SKIP_RFT": "1", "SKIP_RL": "1",
           "SFT_ROWS": "2", "SFT_LAUNCHER": sys.executable, "SFT_ARGS": "--cfg job", "SFT_DECISION_WEIGHT": weight,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(TOOLCUA_SFT_RL_GPU)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = proc.stdout[:proc.stdout.index("verl-ext toolcua_sft_rl: sft took")]
    after_data = printed.index("\n", printed.index("text_hybrid_sft val:")) + 1
    data = OmegaConf.create(printed[after_data:]).data
    assert data.custom_cls.path == "pkg://verl_ext.datasets.demos" and data.pad_mode == "no_padding"
    if weight == "1":
        assert data.custom_cls.name == "JsonMultiTurnSFTDataset" and "decision_weight" not in data
    else:
        assert data.custom_cls.name == "DecisionWeightedSFTDataset" and data.decision_weight == 8


def test_staged_pipeline_gpu_sft_stage_composes(tmp_path):
    """The SFT stage of recipes/toolcua_sft_rl/run_gpu.sh: verl's sft_trainer composes its config
    (Hydra's ``--cfg job``: printed, nothing trained) from the script's settings; the stage hands
    on its HF checkpoint path."""
    import pandas as pd

    env = {**os.environ, "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "SKIP_RFT": "1", "SKIP_RL": "1",
           "SFT_ROWS": "2", "SFT_LAUNCHER": sys.executable, "SFT_ARGS": "--cfg job",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(TOOLCUA_SFT_RL_GPU)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = proc.stdout[:proc.stdout.index("verl-ext toolcua_sft_rl: sft took")]
    after_data = printed.index("\n", printed.index("text_hybrid_sft val:")) + 1  # prepare-data prints first
    config = OmegaConf.create(printed[after_data:])
    assert config.model.path == "Qwen/Qwen2.5-1.5B-Instruct" and config.engine.strategy == "fsdp2"
    assert config.data.custom_cls.name == "JsonMultiTurnSFTDataset" and "hf_model" in config.checkpoint.save_contents
    # no flash-attn here: padded sdpa, not verl's default flash_attention_2 (which fails at model load)
    assert config.model.override_config.attn_implementation == "sdpa" and config.model.use_remove_padding is False
    assert f"model: {tmp_path}/sft/global_step_300/huggingface" in proc.stdout  # what stage 2 would start from
    # verl validates in batches of data.train_batch_size and drops an incomplete one: at least one full
    # batch of held-out rows, or val/loss would read NaN (as it did with 4 rows and a batch of 8 on the H200)
    assert len(pd.read_parquet(tmp_path / "sft_data" / "val.parquet")) >= config.data.train_batch_size == 32


def test_gpu_quickstart_writes_each_configuration_to_its_own_run_folder(dry_run, tiny_model_dir, tmp_path):
    """verl's file logger starts ``metrics.jsonl`` afresh, so two configurations sharing a folder
    would lose the first one's metrics: without OUT, run_gpu.sh derives the folder from its knobs."""
    script = REPO / "recipes/text_corridor/run_gpu.sh"
    env = {**os.environ, "OUT": "", "MODEL": tiny_model_dir, "MAIN_PPO_ARGS": str(tmp_path / "args"),
           "PATH": f"{dry_run.root / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    folders = []
    for provider in ("ewma", "snapshot"):
        proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**env, "PROVIDER": provider},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        args = (tmp_path / "args").read_text().split("\0")
        local_dir = next(a.split("=", 1)[1] for a in args if a.startswith("trainer.default_local_dir="))
        folders.append(Path(local_dir).parent)
    assert folders == [tmp_path / f"runs/text_corridor_gpu/fsdp2-sync-hgpo-ppo_ewma-{p}-vllm-1gpu-seed0"
                       for p in ("ewma", "snapshot")]
    assert all((folder / "data/train.parquet").is_file() for folder in folders)
