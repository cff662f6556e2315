"""The cpu platform answers everything verl asks of a device."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import verl

from verl_ext.backends.cpu.platform import CPUDeviceModule, PlatformCPU

VERL_ROOT = Path(verl.__file__).parent


def _is_device_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and "get_torch_device" in (getattr(node.func, "id", None),
                                                                  getattr(node.func, "attr", None))


def device_attributes(source: str) -> set[str]:
    """What code reads off verl's device module: ``get_torch_device().x``, and ``d.x`` where ``d``
    holds it (``d = get_torch_device()`` in the same function, or ``self.d = ...`` anywhere in the file)."""
    tree = ast.parse(source)
    stored_on_self = {ast.unparse(t) for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_device_module(n.value)
                      for t in n.targets if isinstance(t, ast.Attribute)}
    used = set()
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        local = {t.id for n in ast.walk(scope) if isinstance(n, ast.Assign) and _is_device_module(n.value)
                 for t in n.targets if isinstance(t, ast.Name)}
        used |= {n.attr for n in ast.walk(scope) if isinstance(n, ast.Attribute) and (
            _is_device_module(n.value) or ast.unparse(n.value) in stored_on_self
            or (scope is not tree and isinstance(n.value, ast.Name) and n.value.id in local))}
    return used


def test_the_scan_sees_calls_through_a_stored_device_module():
    source = (
        "def f():\n    device = get_torch_device()\n    device.reset_accumulated_memory_stats()\n"
        "def g(device):\n    return device.type\n"  # another function's `device` is not the module
        "class A:\n    def __init__(self):\n        self.dev = get_torch_device()\n"
        "    def h(self):\n        return self.dev.get_device_properties(0), get_torch_device().synchronize()\n"
    )
    assert device_attributes(source) == {"reset_accumulated_memory_stats", "get_device_properties", "synchronize"}


def test_every_device_function_verl_calls_exists_on_the_cpu_device_module():
    # If a verl upgrade starts calling a new torch.cuda-style function, this lists it.
    used = {m for path in VERL_ROOT.rglob("*.py") for m in device_attributes(path.read_text(errors="ignore"))}
    assert used, "found no get_torch_device() calls: did verl's device API move?"
    assert {"reset_accumulated_memory_stats", "get_device_properties"} <= used  # via `device = ...` (memory_utils)
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


def test_verls_memory_report_runs_on_the_cpu_device_module(monkeypatch):
    # verl.utils.memory_utils stores `device = get_torch_device()` and calls it through the name
    from verl.utils import memory_utils

    monkeypatch.setattr(memory_utils, "get_torch_device", CPUDeviceModule)  # the device the cpu platform gives verl
    memory_utils.reset_memory_stats()
    assert memory_utils.get_memory_info()["total_memory_gb"] > 0
