"""The cpu platform answers everything verl asks of a device."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import verl

from verl_ext.backends.cpu.platform import CPUDeviceModule, PlatformCPU

VERL_ROOT = Path(verl.__file__).parent
DEVICE_CALL = re.compile(r"get_torch_device\(\)\.([A-Za-z_]+)")


def test_every_device_function_verl_calls_exists_on_the_cpu_device_module():
    # If a verl upgrade starts calling a new torch.cuda-style function, this lists it.
    used = {m for path in VERL_ROOT.rglob("*.py") for m in DEVICE_CALL.findall(path.read_text(errors="ignore"))}
    assert used, "found no get_torch_device() calls: did verl's device API move?"
    module = CPUDeviceModule()
    missing = sorted(name for name in used if not hasattr(module, name))
    assert not missing, f"CPUDeviceModule lacks: {missing}"


def test_unknown_device_function_fails_loudly_naming_verl_ext():
    with pytest.raises(AttributeError, match="verl-ext"):
        CPUDeviceModule().some_future_cuda_api  # noqa: B018


def test_platform_values_verl_relies_on(monkeypatch):
    platform = PlatformCPU()
    assert platform.device_name == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU"  # verl's pools count GPUs only: fake them
    assert torch.zeros(2).to(platform.current_device()).device.type == "cpu"
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert not platform.is_platform_available(use_smi_check=True)  # never auto-detected
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert platform.is_platform_available(use_smi_check=True)


def test_device_module_memory_and_rng_are_real():
    module = CPUDeviceModule()
    free, total = module.mem_get_info()
    assert 0 < free <= total
    assert module.memory_allocated() > 0
    state = module.get_rng_state()
    a = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))


def test_cpu_platform_is_registered_with_verl():
    from verl.plugin.platform import PlatformRegistry

    import verl_ext.plugin  # noqa: F401 - the entry point

    assert PlatformRegistry.get("cpu") is PlatformCPU
