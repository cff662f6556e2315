"""The Megatron stack without a GPU: which TransformerEngine pairs with which cuBLAS, what the start-up
check says on a machine without TransformerEngine (this one: a real case), how a core library that
cannot load is explained (the error measured on the H200), and that the bundle's on-target build of
``transformer_engine_torch`` refuses a torch without CUDA with the reason."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_ext import megatron_checks, validation
from verl_ext_bundle import bundle, megatron_stack

REPO = Path(__file__).resolve().parents[1]
# What `import transformer_engine.pytorch` printed on the H200 (torch 2.11.0+cu130, nvidia-cublas
# 13.1.0.3) with transformer_engine_cu13 2.16.1 (2026-11-26).
H200_TE_2_16_ERROR = (
    "OSError: /tmp/site/transformer_engine/libtransformer_engine.so: undefined symbol: "
    "cublasLtGroupedMatrixLayoutInit_internal, version libcublasLt.so.13"
)


@pytest.mark.parametrize("cublas, te", [("13.1.0.3", "2.12.0"), ("13.0.0.19", "2.12.0"), ("12.9.1.4", "2.12.0"),
                                        ("13.2.0.9", "2.16.1"), ("13.3.1", "2.16.1"), (None, "2.12.0")])
def test_te_release_follows_the_cublas_grouped_layout_symbol(cublas, te):
    assert megatron_stack.te_version_for_cublas(cublas)[0] == te


def test_the_gpu_machines_freeze_gives_cuda_13_cublas_13_1_and_te_2_12():
    present = bundle.parse_freeze((REPO / "scripts/gpu_machine_freeze.txt").read_text())
    flavour, cublas = megatron_stack.target_cublas(present)
    assert (flavour, cublas) == ("cu13", "13.1.0.3")
    te, why = megatron_stack.te_version_for_cublas(cublas)
    assert megatron_stack.te_requirements(flavour, te) == ["transformer-engine==2.12.0", "transformer-engine-cu13==2.12.0"]
    assert "cublasLtGroupedMatrixLayoutInit_internal" in why
    assert megatron_stack.target_cublas({"torch": "2.11.0+cu128", "nvidia-cublas-cu12": "12.8.4.1"}) == ("cu12", "12.8.4.1")


def test_an_unloadable_core_names_the_package_the_symbol_the_cublas_and_the_bundle_command():
    message = megatron_checks.explain_te_failure(H200_TE_2_16_ERROR, "13.1.0.3", "2.16.1")
    for part in ("transformer-engine-cu* 2.16.1", "cublasLtGroupedMatrixLayoutInit_internal",
                 "version libcublasLt.so.13", "nvidia-cublas 13.1.0.3", "TransformerEngine 2.12.0",
                 "verl-ext bundle", "--no-deps --extras vllm,gui,judge,megatron"):
        assert part in message, (part, message)
    missing_lib = "OSError: libcudnn.so.9: cannot open shared object file: No such file or directory"
    assert "libcudnn.so.9 is missing" in megatron_checks.explain_te_failure(missing_lib, "13.1.0.3", "2.12.0")


def _megatron_config():
    return OmegaConf.create({
        "trainer": {"device": "cuda", "n_gpus_per_node": 1, "nnodes": 1},
        "data": {"train_batch_size": 8},
        "algorithm": {"adv_estimator": "grpo"},
        "actor_rollout_ref": {"actor": {"strategy": "megatron", "ppo_mini_batch_size": 4},
                              "rollout": {"name": "vllm", "n": 4}},
    })  # fmt: skip


def test_a_megatron_config_without_transformer_engine_stops_at_start_up():
    """This machine has no TransformerEngine and no Megatron packages: the verl-ext trainers'
    start-up check refuses a Megatron config naming each and the bundle command."""
    assert megatron_checks.uses_megatron(_megatron_config())
    problems = megatron_checks.megatron_problems(_megatron_config())
    assert any("transformer-engine is not installed" in p and "No module named 'transformer_engine'" in p
               for p in problems), problems
    assert any("megatron-core, megatron-bridge, mbridge not installed" in p for p in problems), problems
    assert all(p.startswith("actor_rollout_ref.actor.strategy=megatron: ") and "megatron-bundle/install.sh" in p
               for p in problems)
    with pytest.raises(validation.ConfigError, match="transformer-engine is not installed"):
        validation.assert_valid(_megatron_config(), machine=True)  # what the trainers run first
    fsdp = _megatron_config()
    fsdp.actor_rollout_ref.actor.strategy = "fsdp2"
    assert megatron_checks.megatron_problems(fsdp) == []


def test_the_installers_on_target_build_refuses_a_torch_without_cuda(tmp_path):
    """The bundle installer's compile step for a manifest's ``builds`` entry, on this machine's CPU
    torch: refused with the package and the reason before anything is compiled."""
    sdist = tmp_path / "sources" / "transformer_engine_torch-2.12.0.tar.gz"
    sdist.parent.mkdir()
    with tarfile.open(sdist, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("transformer_engine_torch-2.12.0/setup.py"), io.BytesIO(b""))
    manifest = {"builds": [{"name": megatron_stack.TE_TORCH, "version": "2.12.0", "why": "the rule",
                            "sdist": f"sources/{sdist.name}"}]}  # fmt: skip
    with pytest.raises(bundle.BundleError, match="transformer-engine-torch: .*needs a CUDA build of torch"):
        bundle.build_sources(tmp_path, tmp_path, manifest, tmp_path / "site", sys.executable)
