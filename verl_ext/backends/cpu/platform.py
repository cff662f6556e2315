"""A ``cpu`` platform for verl's platform registry (selected with ``VERL_PLATFORM=cpu``).

verl reaches the accelerator through ``get_torch_device()``, i.e. ``platform.device_module``,
and calls about twenty ``torch.cuda``-style functions on it. ``torch.cpu`` lacks most of them,
so ``device_module`` is a small stand-in module that answers each one the way a CPU should
(memory stats from the process, RNG state from the CPU generator, caches and streams as no-ops).
An attribute verl starts using in a later release raises ``AttributeError`` naming verl-ext
instead of silently doing nothing; ``tests/backends`` checks the list against verl's sources.

Ray sees the CPU "devices" as fake GPUs (``+ray_kwargs.ray_init.num_gpus=N``) because verl's
resource pools only count ``GPU``/``NPU`` resources; CPU torch ignores ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


class _NullStream:
    """Stands in for ``torch.cuda.Stream``: CPU work is synchronous, so waits are no-ops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> "_NullEvent":
        return _NullEvent()

    def query(self) -> bool:
        return True


class _NullEvent:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _no_memory_history(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("verl's memory-history profiling (torch.cuda.memory) needs an accelerator; "
                       "the verl-ext cpu backend has none: switch that profiler tool off")


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


class CPUDeviceModule(types.ModuleType):
    """``torch.cuda`` look-alike for the CPU. Every name verl 0.9.1 uses is defined here."""

    def __init__(self) -> None:
        super().__init__("verl_ext.cpu_device")
        self.Stream = _NullStream
        self.Event = _NullEvent
        self.stream = lambda stream=None: contextlib.nullcontext()
        self.current_stream = lambda device=None: _NullStream()
        self.is_available = lambda: True
        self.device_count = lambda: 1
        self.current_device = _zero
        self.set_device = _noop
        self.synchronize = _noop
        self.empty_cache = _noop
        self.ipc_collect = _noop
        self.reset_peak_memory_stats = _noop
        self.reset_accumulated_memory_stats = _noop
        self.get_device_properties = lambda device=None: types.SimpleNamespace(name="cpu", total_memory=_mem_get_info()[1])
        self.memory = types.SimpleNamespace(_record_memory_history=_no_memory_history, _snapshot=_no_memory_history)
        self.set_per_process_memory_fraction = _noop
        self.get_device_name = lambda device=None: "cpu"
        self.get_rng_state = lambda device=None: torch.get_rng_state()
        self.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
        self.manual_seed = torch.manual_seed
        self.manual_seed_all = torch.manual_seed
        self.mem_get_info = _mem_get_info
        # CPU tensors live in the process heap: report RSS so verl's memory logs stay meaningful.
        self.memory_allocated = lambda device=None: _rss_bytes()
        self.memory_reserved = lambda device=None: _rss_bytes()
        self.max_memory_allocated = lambda device=None: _rss_bytes()
        self.max_memory_reserved = lambda device=None: _rss_bytes()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"verl called get_torch_device().{name}, which verl-ext's cpu platform does not provide. "
            "This verl version uses a device function verl-ext does not know yet: add it to "
            "verl_ext/backends/cpu/platform.py (CPUDeviceModule) or report it."
        )


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl platform for CPU-only machines: device ``cpu``, collectives over gloo."""

    _device_module = CPUDeviceModule()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: a GPU node's CPU-only actors must not pick it. Opt in explicitly.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"

    def current_device(self) -> torch.device:  # type: ignore[override]
        # verl passes this straight to ``.to(device=...)``; an int there means an accelerator.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets this for the fake GPUs; CPU torch ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
