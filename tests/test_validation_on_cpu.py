"""The config cases: a bad config stops at start-up with its cause, and ``verl-ext doctor``,
the driver of ``python -m verl.trainer.main_ppo`` and the verl-ext trainers refuse the same configs
(all three call ``verl_ext.validation``). Configs are composed as main_ppo composes them (Hydra, in
this process); nothing here starts Ray or a worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_ext import doctor, fragment_overrides, validation
from verl_ext.compose import compose
from verl_ext.trainer_modes import TRAINER_MODE_KEY

from .main_ppo_job import main_ppo_job
from .messages import assert_names

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base(tiny_model_dir, tmp_path_factory) -> list[str]:
    """A cpu-backend config that passes every check: the tiny model (actor and verl's default critic),
    text_corridor data (rows pick the text_env agent loop), one micro-batch per stage."""
    from verl_ext.data import main as prepare_data

    data = tmp_path_factory.mktemp("validation_data")
    prepare_data(["text_corridor", str(data), "--train-size", "8", "--val-size", "2"])
    return [
        "+plugins/backend=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
        f"critic.model.path={tiny_model_dir}", "critic.ppo_micro_batch_size_per_gpu=4",
    ]


@pytest.fixture(scope="module")
def single_turn_data(tmp_path_factory) -> list[str]:
    """Overrides for arithmetic data: rows name no agent loop, so default_agent_loop decides."""
    from verl_ext.data import main as prepare_data

    data = tmp_path_factory.mktemp("single_turn_data")
    prepare_data(["arithmetic", str(data), "--train-size", "4", "--val-size", "2"])
    return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet"]


def problems(*overrides: str, config_dir: str | None = None, config_name: str = "ppo_trainer") -> list[str]:
    """``verl_ext.validation.problems`` of the config main_ppo composes from these arguments."""
    config = compose(list(overrides), config_dir, config_name)
    return validation.problems(config, list(config.hydra.overrides.task))


def test_the_base_config_passes(base):
    assert problems(*base, "trainer.v1.trainer_mode=verl_ext_sync") == []


# ---------------------------------------------------------------- case 1: provider, verl's trainer


def test_case1_a_provider_under_verls_own_trainer_is_refused(base):
    found = problems(*base, "+plugins/old_logits=snapshot", "trainer.v1.trainer_mode=colocate_async")
    assert len(found) == 1
    assert_names(found[0], "algorithm.old_logits.provider=snapshot", "trainer.v1.trainer_mode=colocate_async",
                 "set trainer.v1.trainer_mode=verl_ext_colocate_async")
    assert problems(*base, "+plugins/old_logits=snapshot", "trainer.v1.trainer_mode=verl_ext_colocate_async") == []


def test_case1_main_ppo_refuses_it_in_the_driver_before_ray(base, monkeypatch):
    """verl's own entry point, with verl's own trainer mode: no verl-ext trainer ever runs, yet the
    driver stops in ``validate_config`` (which verl-ext's plugin wraps) before ``run_ppo``."""
    from verl.trainer import main_ppo

    def run_ppo(*args, **kwargs):
        raise AssertionError("main_ppo reached run_ppo (Ray, workers) with a config verl-ext refuses")

    monkeypatch.setattr(main_ppo, "run_ppo", run_ppo)
    code, _, err = main_ppo_job([*base, "+plugins/old_logits=snapshot", "trainer.v1.trainer_mode=colocate_async"])
    assert code == 1
    assert "ConfigError" in err and "algorithm.old_logits.provider=snapshot needs a verl-ext trainer" in err
    assert "reached run_ppo" not in err


# ------------------------------------------------------- case 2/3: fragments vs explicit settings


def _script_args(script: str, *overrides: str, tmp_path: Path) -> list[str]:
    """The arguments ``recipes/<script>`` passes to ``python -m verl.trainer.main_ppo`` (recorded by a
    ``python`` shim first on PATH; the script's data and model steps run for real, in tmp_path)."""
    shim = tmp_path / "bin" / "python"
    shim.parent.mkdir()
    args_file = tmp_path / "main_ppo_args"
    shim.write_text(f"""#!/usr/bin/env bash
if [ "${{1:-}}" = -m ] && [ "${{2:-}}" = verl.trainer.main_ppo ]; then shift 2; printf '%s\\0' "$@" > {args_file}; exit 0; fi
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{shim.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(REPO / "recipes" / script), *overrides], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=300)
    return args_file.read_text().split("\0")[:-1]


def test_case2_a_fragment_and_a_scripts_setting_that_disagree_are_refused_naming_both(tmp_path):
    args = _script_args("text_corridor/run_cpu.sh", "+plugins/advantage=hgpo", tmp_path=tmp_path)
    found = fragment_overrides.fragment_conflicts(args)
    assert len(found) == 1
    assert_names(found[0], "plugins/advantage=hgpo", "algorithm.adv_estimator=gigpo", "Drop one of the two")
    code, _, err = main_ppo_job(args)  # the driver: refused before Ray (the run would start otherwise)
    assert code == 1 and "the command line sets both plugins/advantage=hgpo" in err


def test_case3_no_fragment_picks_the_trainer_mode():
    fragments = sorted((REPO / "verl_ext" / "plugins").glob("*/*.yaml"))
    assert fragments
    for fragment in fragments:
        leaves = fragment_overrides.fragment_leaves(f"plugins/{fragment.parent.name}", fragment.stem)
        assert leaves, fragment  # read as the command line names it
        assert TRAINER_MODE_KEY not in leaves, fragment


def test_case3_a_user_recipes_trainer_mode_survives_the_fragments(base, tmp_path):
    (tmp_path / "my_recipe.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  v1:\n    trainer_mode: verl_ext_colocate_async\n")
    overrides = [*base, "+plugins/advantage=hgpo", "+plugins/old_logits=snapshot"]
    config = compose(overrides, str(tmp_path), "my_recipe")
    assert config.trainer.v1.trainer_mode == "verl_ext_colocate_async"
    code, out, err = main_ppo_job(["--config-dir", str(tmp_path), "--config-name", "my_recipe", *overrides, "--cfg", "job"])
    assert code == 0, err
    assert "trainer_mode: verl_ext_colocate_async" in out


def test_case3_a_fragment_without_a_verl_ext_trainer_is_refused_with_the_fix(base):
    found = problems(*base, "+plugins/advantage=hgpo")
    assert len(found) == 1
    assert_names(found[0], "algorithm.adv_estimator=hgpo", "trainer.v1.trainer_mode=sync",
                 "set trainer.v1.trainer_mode=verl_ext_sync")


# --------------------------------------------------------------------- case 7: interrupt + sync


def test_case7_interrupt_with_the_sync_trainer_is_refused(base):
    found = problems(*base, "+plugins/old_logits=interrupt", "trainer.v1.trainer_mode=verl_ext_sync")
    assert len(found) == 1 and found[0].startswith(
        "algorithm.old_logits.provider=interrupt with trainer.v1.trainer_mode=verl_ext_sync: a synchronous trainer")
    assert "use algorithm.old_logits.provider=current" in found[0]
    assert problems(*base, "+plugins/old_logits=interrupt", "trainer.v1.trainer_mode=verl_ext_colocate_async") == []


def test_case7b_bf16_snapshots_need_a_bf16_forward(base):
    """snapshot.dtype=bf16 is exact only when FSDP casts the parameters to bfloat16 for the forward."""
    snapshot = ("+plugins/old_logits=snapshot", "trainer.v1.trainer_mode=verl_ext_colocate_async",
                "algorithm.old_logits.snapshot.dtype=bf16")
    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    found = problems(*base, *snapshot)  # the cpu backend computes in fp32
    assert len(found) == 1 and f"{key}=fp32" in found[0] and "algorithm.old_logits.snapshot.dtype=param" in found[0]
    assert problems(*base, *snapshot, f"{key}=bf16") == []  # verl's default on GPUs
    wrong = problems(*base, "+plugins/old_logits=snapshot", "trainer.v1.trainer_mode=verl_ext_colocate_async",
                     "algorithm.old_logits.snapshot.dtype=fp16")
    assert len(wrong) == 1 and "snapshot.dtype" in wrong[0] and "'bf16'" in wrong[0]


# -------------------------------------------------------------- case 9: late checks at start-up


def test_case9_an_unknown_estimator_key_is_refused(base):
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", "+plugins/advantage=gigpo", "+algorithm.gigpo.gama=0.9")
    assert len(found) == 1 and found[0].startswith("unknown key(s) algorithm.gigpo.gama for estimator 'gigpo'; it takes")


def test_case9_an_estimator_value_it_rejects_is_refused(base):
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", "+plugins/advantage=hgpo", "algorithm.hgpo.mode=mean")
    assert found == ["algorithm.hgpo.*: mode must be one of ('mean_norm', 'mean_std_norm'), got 'mean' "
                     "(docs/plugins/advantages.md)"]


@pytest.mark.parametrize("estimator", ["himac", "hiper"])
def test_case9_a_role_estimator_with_a_loop_that_writes_no_roles_is_refused(base, estimator):
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", f"+plugins/advantage={estimator}",
                     "critic.enable=true")  # hiper's critic
    assert len(found) == 1, found
    assert found[0].startswith(f"algorithm.adv_estimator={estimator} needs role=planner/executor on every step, but "
                               "agent loop 'text_env' (agent_name in ")


def test_case9_gigpo_on_a_single_turn_task_is_refused(base, single_turn_data):
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", "+plugins/advantage=gigpo", *single_turn_data)
    assert len(found) == 1
    assert_names(found[0], "algorithm.adv_estimator=gigpo", "'single_turn_agent'",
                 "actor_rollout_ref.rollout.agent.default_agent_loop", "use a step-aware loop",
                 "algorithm.adv_estimator=grpo")


def test_case9_a_step_aware_estimator_under_verls_plain_trainer_is_refused(base):
    found = problems(*base, "+plugins/advantage=gigpo", "trainer.v1.trainer_mode=colocate_async")
    assert len(found) == 1 and found[0].startswith("algorithm.adv_estimator=gigpo needs a verl-ext trainer")
    assert found[0].endswith("set trainer.v1.trainer_mode=verl_ext_colocate_async")


@pytest.mark.parametrize("provider", ["dedicated", "interrupt"])
def test_case10_the_rollout_side_providers_are_accepted_with_vllm_and_refused_with_sglang(base, provider):
    async_mode = ("trainer.v1.trainer_mode=verl_ext_colocate_async", f"+plugins/old_logits={provider}")
    vllm = problems(*base, *async_mode, "actor_rollout_ref.rollout.name=vllm")
    assert not [p for p in vllm if "provider" in p], vllm
    sglang = problems(*base, *async_mode, "actor_rollout_ref.rollout.name=sglang")
    refused = [p for p in sglang if "segment-counting" in p]
    assert len(refused) == 1 and "actor_rollout_ref.rollout.name='sglang'" in refused[0], sglang
    assert "provider=snapshot" in refused[0]  # the fix
    pd = problems(*base, *async_mode, "actor_rollout_ref.rollout.name=vllm",
                  "actor_rollout_ref.rollout.disaggregation.enabled=true")
    assert any("disaggregation.enabled=true: verl's prefill/decode replicas" in p for p in pd), pd


def test_case9_a_missing_model_path_is_named(base):
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", "actor_rollout_ref.model.path=/no/such/model")
    assert len(found) == 1
    assert_names(found[0], "actor_rollout_ref.model.path=/no/such/model", "no such local directory",
                 "verl-ext make-tiny-model DIR")
    assert validation.model_path_problem("actor_rollout_ref.model.path", "Qwen/Qwen2.5-0.5B-Instruct") is None
    assert validation.model_path_problem("k", "models/a/b") is not None  # relative, deeper than org/name


# ------------------------------------------------- case 10: doctor refuses what the trainer refuses


CASE10 = {
    "dedicated_with_sglang": (["+plugins/old_logits=dedicated", "trainer.v1.trainer_mode=verl_ext_colocate_async",
                               "actor_rollout_ref.rollout.name=sglang"],
                              "algorithm.old_logits.provider=dedicated is supported with actor_rollout_ref.rollout.name=hf "
                              "or actor_rollout_ref.rollout.name=vllm, not actor_rollout_ref.rollout.name='sglang' (verl-ext "
                              "has no segment-counting server for that engine). Use algorithm.old_logits.provider=snapshot"),
    "ewma_beta_and_com": (["+plugins/old_logits=ewma", "trainer.v1.trainer_mode=verl_ext_sync",
                           "algorithm.old_logits.ewma.beta=0.9", "algorithm.old_logits.ewma.com=4"],
                          "set only one of algorithm.old_logits.ewma.beta and algorithm.old_logits.ewma.com"),
    "dvreward_key_typo": (["+plugins/reward=dvreward", "trainer.v1.trainer_mode=verl_ext_sync",
                           "+reward.reward_kwargs.dvreward.judge_ulr=http://127.0.0.1:1/v1"],
                          "reward.reward_kwargs.dvreward.judge_ulr"),
    "provider_under_verls_trainer": (["+plugins/old_logits=ewma", "trainer.v1.trainer_mode=sync"],
                                     "algorithm.old_logits.provider=ewma needs a verl-ext trainer"),
}


@pytest.mark.parametrize("case", sorted(CASE10))
def test_case10_doctor_exits_non_zero_on_what_the_trainer_refuses(base, case, capsys):
    overrides, expected = CASE10[case]
    assert doctor.main([*base, *overrides]) == 1
    assert expected in capsys.readouterr().out


def test_case10_doctor_names_a_chromium_path_that_does_not_exist(base, single_turn_data, monkeypatch, capsys):
    monkeypatch.setenv("VERL_EXT_CHROMIUM", "/no/such/chromium")  # minidesk: default_agent_loop=hybrid_gui_tool
    assert doctor.main([*base, *single_turn_data, "trainer.v1.trainer_mode=verl_ext_sync", "+plugins/env=minidesk"]) == 1
    assert "VERL_EXT_CHROMIUM=/no/such/chromium: no such file" in capsys.readouterr().out


def test_case11_doctor_checks_a_recipe_folder(base, tmp_path, capsys):
    recipes = str(REPO / "recipes" / "toolcua_hybrid")
    assert doctor.main(["--config-dir", recipes, "+recipe=toolcua_hybrid", "trainer.v1.trainer_mode=colocate_async",
                        *base]) == 1
    out = capsys.readouterr().out
    assert "algorithm.old_logits.provider=ewma needs a verl-ext trainer" in out
    (tmp_path / "ok.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\ntrainer:\n  v1:\n    trainer_mode: verl_ext_sync\n")
    assert doctor.main(["--config-dir", str(tmp_path), "--config-name", "ok", *base]) == 0
    assert "start-up checks pass" in capsys.readouterr().out


# ------------------------------------------- beyond the list: raised once workers ran, now at start-up


def test_a_setting_that_defaults_to_a_null_staleness_bound_is_refused(base):
    found = problems(*base, "+plugins/old_logits=ewma", "trainer.v1.trainer_mode=verl_ext_colocate_async",
                     "trainer.v1.sampler.max_off_policy_threshold=null")
    assert found == ["trainer.v1.sampler.max_off_policy_threshold is null (no staleness bound), so set "
                     "algorithm.old_logits.ewma.max_com explicitly"]  # the calibrated decay's cap


def test_dvreward_env_weight_without_an_env_score_is_refused(base):
    found = problems(*base, "+plugins/reward=dvreward", "trainer.v1.trainer_mode=verl_ext_sync",
                     "+reward.reward_kwargs.dvreward.judge_url=http://127.0.0.1:1/v1",  # a judge: only env_weight is wrong
                     "reward.reward_kwargs.dvreward.env_weight=0.5")
    assert found == ["reward.reward_kwargs.dvreward.env_weight=0.5 needs an environment score: set "
                     "reward.reward_kwargs.dvreward.env_score_key or reward.custom_reward_function.path"]


def test_a_misspelt_agent_loop_kwarg_is_refused(base, tmp_path):
    loops = tmp_path / "agent_loops.yaml"
    loops.write_text("- name: text_env\n  _target_: verl_ext.agent_loops.text_env.TextEnvAgentLoop\n  layot: per_turn\n")
    found = problems(*base, "trainer.v1.trainer_mode=verl_ext_sync", f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}")
    assert len(found) == 1 and f"agent_loop_config_path={loops}: agent loop 'text_env' has no parameter(s) ['layot']" in found[0]


def test_every_check_is_in_the_docs_table():
    table = (REPO / "docs" / "reference" / "validation.md").read_text()
    missing = [name for name in [*validation.CHECKS, "fragment_conflicts"] if f"| `{name}`" not in table]
    assert not missing, f"docs/reference/validation.md has no row for {missing}"
