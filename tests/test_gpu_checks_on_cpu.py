"""The GPU start-up checks (``verl_ext.gpu_checks``): each problem names the package, the version
verl 0.9.1 wants and the pip extra, or the batch rule and the keys; a good config passes."""

from __future__ import annotations

from omegaconf import OmegaConf

from verl_ext import gpu_checks


def _config(**overrides) -> OmegaConf:
    base = {
        "trainer": {"device": "cuda", "n_gpus_per_node": 1, "nnodes": 1},
        "data": {"train_batch_size": 8},
        "algorithm": {"adv_estimator": "grpo"},
        "critic": {"enable": False},
        "actor_rollout_ref": {
            "model": {"use_remove_padding": False, "override_config": {"attn_implementation": "sdpa"}},
            "actor": {"strategy": "fsdp2", "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 8,
                      "use_dynamic_bsz": False, "use_kl_loss": False},
            "rollout": {"name": "vllm", "n": 4, "log_prob_micro_batch_size_per_gpu": 16},
        },
    }
    config = OmegaConf.create(base)
    for key, value in overrides.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


GOOD_VERSIONS = {"vllm": "0.24.0", "transformers": "5.10.4", "torch": "2.11.0+cu130"}


def _machine(config, cuda=True, versions=GOOD_VERSIONS, flash_attn=False):
    return gpu_checks.machine_problems(config, cuda_available=lambda: cuda, version_of=versions.get,
                                       module_present=lambda name: flash_attn)


def test_a_ready_gpu_machine_passes():
    assert _machine(_config()) == []
    assert gpu_checks.batch_problems(_config()) == []


def test_no_cuda_names_torch_and_the_cpu_backend():
    (problem,) = _machine(_config(), cuda=False)
    assert "trainer.device=cuda" in problem and "torch==2.11.0" in problem and "+plugins/backend=cpu" in problem


def test_missing_vllm_names_the_version_verl_pins_and_the_extra():
    (problem,) = _machine(_config(), versions={**GOOD_VERSIONS, "vllm": None})
    assert "actor_rollout_ref.rollout.name=vllm" in problem
    assert "vllm==0.24.0" in problem and "verl-ext[vllm]" in problem


def test_wrong_vllm_version_is_refused():
    (problem,) = _machine(_config(), versions={**GOOD_VERSIONS, "vllm": "0.25.1"})
    assert "vllm 0.25.1 is installed but verl 0.9.1 needs vllm==0.24.0" in problem


def test_too_new_transformers_names_verls_range():
    (problem,) = _machine(_config(), versions={**GOOD_VERSIONS, "transformers": "5.17.0"})
    assert "transformers 5.17.0 is installed" in problem and "<5.11" in problem and "pip install" in problem


def test_flash_attention_missing_gives_the_sdpa_advice():
    config = _config(**{"actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2"})
    (problem,) = _machine(config)
    assert "flash-attn is not installed" in problem and "attn_implementation=sdpa" in problem
    assert _machine(config, flash_attn=True) == []
    # packed sequences have a pure-torch fallback in verl: sdpa + use_remove_padding needs no flash-attn
    assert _machine(_config(**{"actor_rollout_ref.model.use_remove_padding": True})) == []


def test_the_cpu_backend_is_not_asked_for_cuda_or_vllm():
    config = _config(**{"trainer.device": "cpu", "actor_rollout_ref.rollout.name": "hf"})
    assert _machine(config, cuda=False, versions={**GOOD_VERSIONS, "vllm": None}) == []


def test_micro_batches_that_cannot_divide_a_ranks_rows_are_refused_with_the_rule():
    """The first 2-GPU probe: 8 prompts x 4 rollouts over 2 ranks is 16 rows each, and verl's engine
    asserted `data size must be divisible by ... micro_batch_size_per_gpu` with a micro-batch of 32."""
    config = _config(**{"trainer.n_gpus_per_node": 2, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 32})
    (problem,) = gpu_checks.batch_problems(config)
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32" in problem
    assert "32/2 = 16" in problem and "use_dynamic_bsz=true" in problem
    # the same micro-batch with the batch scaled to the GPU count divides
    assert gpu_checks.batch_problems(_config(**{"trainer.n_gpus_per_node": 2, "data.train_batch_size": 16,
                                                "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
                                                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 32})) == []


def test_update_micro_batch_rule_and_dynamic_batches():
    config = _config(**{"trainer.n_gpus_per_node": 4, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8})
    problems = gpu_checks.batch_problems(config)
    assert any("ppo_micro_batch_size_per_gpu=8" in p and "16/4 = 4" in p for p in problems)
    assert gpu_checks.batch_problems(_config(**{"trainer.n_gpus_per_node": 4,
                                                "actor_rollout_ref.actor.use_dynamic_bsz": True,
                                                "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True})) == []


def test_megatron_data_parallel_size_divides_out_model_parallelism():
    config = _config(**{"trainer.n_gpus_per_node": 8, "actor_rollout_ref.actor.strategy": "megatron",
                        "actor_rollout_ref.actor.megatron": {"tensor_model_parallel_size": 2,
                                                             "pipeline_model_parallel_size": 2}})
    assert gpu_checks.data_parallel_size(config) == 2


def test_verls_own_pins_are_read_from_its_metadata():
    assert str(gpu_checks.verl_requirement("vllm", extra="vllm").specifier) == "==0.24.0"
    assert "<5.11" in str(gpu_checks.verl_requirement("transformers").specifier)


def test_doctor_reports_gpu_readiness_and_fails_with_gpu_on_a_cpu_machine():
    import subprocess
    import sys

    plain = subprocess.run([sys.executable, "-m", "verl_ext.cli", "doctor"], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    assert "GPU readiness" in plain.stdout and "CUDA: not visible" in plain.stdout
    # no TransformerEngine here: the Megatron section says so and how to bring it (doctor still passes)
    assert "Megatron readiness" in plain.stdout and "transformer-engine is not installed" in plain.stdout
    assert "--extras vllm,gui,judge,megatron" in plain.stdout
    strict = subprocess.run([sys.executable, "-m", "verl_ext.cli", "doctor", "--gpu"], capture_output=True, text=True,
                            timeout=300)
    assert strict.returncode == 1
    assert "vllm==0.24.0 is needed but not installed" in strict.stdout


def test_megatron_actors_are_not_asked_for_flash_attn():
    """verl's Megatron engine attends with TransformerEngine (megatron_checks), not HF's flash_attention_2."""
    config = _config(**{"actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2",
                        "actor_rollout_ref.actor.strategy": "megatron"})
    assert _machine(config) == []
    config.actor_rollout_ref.actor.strategy = "fsdp2"
    assert any("flash-attn is not installed" in p for p in _machine(config))
