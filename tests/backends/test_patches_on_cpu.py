"""The cpu backend's runtime patches: each still targets real verl code, and each does its job.
A failing `still_needed` test means verl changed the patched code: review or drop the patch."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from verl_ext import patches

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.name)
def test_patch_target_still_exists_in_verl(patch):
    assert patch.still_needed(), f"{patch.module}.{patch.target} no longer contains {patch.snippet!r}"


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.name)
def test_patch_is_documented_in_patches_folder(patch):
    doc = REPO / "patches" / f"{patch.name}.md"
    assert doc.exists(), f"missing {doc}"
    text = doc.read_text()
    assert patch.module in text and patch.snippet in text


def test_backend_string_dedupe():
    assert patches._dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert patches._dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert patches._dedupe_backend("gloo") == "gloo"
    assert patches._dedupe_backend(None) is None


def test_offload_policy_patch_never_pins_and_keeps_the_type():
    module = importlib.import_module("verl.workers.engine.fsdp.transformer_impl")
    original = module.CPUOffloadPolicy
    try:
        patches._patch_offload_pin_memory(module)
        policy = module.CPUOffloadPolicy(pin_memory=True)
        assert policy.pin_memory is False
        assert isinstance(policy, original)  # FSDP2 checks isinstance(offload_policy, CPUOffloadPolicy)
        patches._patch_offload_pin_memory(module)  # idempotent
        assert module.CPUOffloadPolicy.__mro__[1] is original
    finally:
        module.CPUOffloadPolicy = original


def test_valuehead_patch_loads_a_value_model_without_flash_attention(tiny_model_dir):
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    module = importlib.import_module("verl.utils.model")
    original = module.load_valuehead_model
    descriptor = AutoModelForTokenClassification.__dict__.get("from_pretrained")
    try:
        patches._patch_valuehead_attention(module)
        config = AutoConfig.from_pretrained(tiny_model_dir)
        config.num_labels = 1
        model = module.load_valuehead_model(tiny_model_dir, torch.float32, config, False)
        assert model.config._attn_implementation == "sdpa"
        assert AutoModelForTokenClassification.__dict__.get("from_pretrained") is descriptor  # restored
    finally:
        module.load_valuehead_model = original


def test_init_process_group_patch_dedupes_gloo(monkeypatch):
    import torch.distributed as dist

    seen = {}
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: seen.update(kw))
    patches._patch_init_process_group(None)
    dist.init_process_group(backend="cpu:gloo,cpu:gloo", rank=0, world_size=1)
    assert seen["backend"] == "cpu:gloo"
