"""The ``toolcua_hybrid_dvreward`` recipe (DVReward on MiniDesk's final state next to the path
reward) composes with verl 0.9.1 both ways the docs select it, and the composed config passes the
checks the GPU recipe scripts pass (``tests/test_recipe_scripts.py``: verl's ``validate_config``,
its config dataclasses, the reward function import, verl-ext's doctor and agent-loop checks).
The recipe scoring real episodes: ``tests/envs/test_minidesk_dv_questions_on_cpu.py``."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from .main_ppo_job import main_ppo_job
from .test_recipe_scripts import check_config, dry_run  # noqa: F401  (dry_run: a fixture)

REPO = Path(__file__).resolve().parents[1]


def _expect_recipe(config, monkeypatch) -> None:
    from verl_ext.rewards.dvreward.settings import DVRewardSettings

    assert config.reward.reward_manager.name == "dvreward"
    assert config.reward.custom_reward_function.path == "pkg://verl_ext.rewards.env_rewards"  # the env score
    assert config.reward.custom_reward_function.reward_kwargs.mode == "path"
    assert config.algorithm.path_length_reward.weight == 0.2  # tool_path's group term is kept
    assert config.algorithm.adv_estimator == "hgpo" and config.trainer.v1.trainer_mode == "verl_ext_sync"
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "hybrid_gui_tool"
    monkeypatch.delenv("DVREWARD_JUDGE_URL", raising=False)
    keys = OmegaConf.to_container(config.reward.reward_kwargs.dvreward, resolve=True)
    settings = DVRewardSettings.from_mapping(keys)  # every key is one the manager knows
    assert settings.judge_url is None  # unset: verl's GenRM router
    assert (settings.questions_key, settings.artifact_key) == ("verl_ext.extras.dv_questions",
                                                               "verl_ext.extras.artifact.state")
    assert (settings.dv_weight, settings.env_weight, settings.aggregation, settings.env_score_key) == (
        1.0, 1.0, "sum_mean", None)
    monkeypatch.setenv("DVREWARD_JUDGE_URL", "http://127.0.0.1:8123/v1")
    judge_url = OmegaConf.to_container(config.reward.reward_kwargs.dvreward, resolve=True)["judge_url"]
    assert judge_url == "http://127.0.0.1:8123/v1"


def test_plus_recipe_composes_and_passes_verls_checks(tiny_model_dir, tmp_path, monkeypatch):
    """`--config-dir recipes/toolcua_hybrid +recipe=toolcua_hybrid_dvreward` on the cpu backend."""
    from verl_ext.data import main as prepare_data

    prepare_data(["minidesk", str(tmp_path), "--train-size", "4", "--val-size", "2"])
    args = ["--config-dir", str(REPO / "recipes/toolcua_hybrid"), "+recipe=toolcua_hybrid_dvreward",
            "+plugins/backend=cpu", f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files={tmp_path}/train.parquet", f"data.val_files={tmp_path}/val.parquet",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.agent.agent_loop_config_path="
            f"{REPO}/recipes/toolcua_hybrid/agent_loops_cpu.yaml",
            "--cfg", "job"]
    code, out, err = main_ppo_job(args)
    assert code == 0, f"main_ppo --cfg job exited {code}:\n{err[-3000:]}"
    config = OmegaConf.create(out)
    _expect_recipe(config, monkeypatch)
    check_config(config)


def test_a_toolcua_hybrid_script_switches_to_it(dry_run, monkeypatch):
    """A script that selects `+recipe=toolcua_hybrid` takes `recipe=toolcua_hybrid_dvreward`."""
    script = REPO / "recipes/toolcua_hybrid/run_fsdp_qwen25_1p5b.sh"
    code, out, err = dry_run(script, ["recipe=toolcua_hybrid_dvreward"])
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    _expect_recipe(config, monkeypatch)
    check_config(config)
    assert config.trainer.project_name == "verl_ext_toolcua_hybrid_dvreward"
