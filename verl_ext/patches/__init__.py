"""Runtime patches applied to verl where it has no extension point (cpu backend only).

Each patch is version-guarded (verl 0.9.1 exactly), idempotent, applied by a post-import hook on
the module it changes, and described in ``patches/<name>.md`` with the verl line it targets and
the upstream change that would remove it. ``APPLIED`` lists what this process patched;
``tests/backends/test_patches_on_cpu.py`` fails when a targeted verl line no longer exists or a
patch stops taking effect in verl's own code path. The replacements that apply on every backend
(the advantage hook and the replay-buffer ``sample`` wrapper in ``verl_ext/trainer.py``, the
optimizer-step wrapper in ``verl_ext/old_logits/host.py``) are listed in ``patches/README.md`` too.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from verl_ext import VERL_VERSION
from verl_ext._post_import import when_imported

logger = logging.getLogger("verl_ext")


@dataclass(frozen=True)
class Patch:
    name: str
    module: str  # the verl module the patch changes
    target: str  # qualified name inside ``module`` whose source holds ``snippet``
    snippet: str  # the verl source text the patch exists because of
    apply: Callable[[object], None]  # receives the imported module

    def target_source(self) -> str:
        obj = importlib.import_module(self.module)
        for part in self.target.split("."):
            obj = getattr(obj, part)
        return inspect.getsource(obj)

    def still_needed(self) -> bool:
        """True while verl still contains the code this patch works around."""
        return self.snippet in self.target_source()


APPLIED: list[str] = []
SKIPPED: dict[str, str] = {}


def _dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: keep the first backend per device type."""
    if not backend or "," not in backend:
        return backend
    seen: dict[str, str] = {}
    for part in backend.split(","):
        device = part.split(":", 1)[0] if ":" in part else part
        seen.setdefault(device, part)
    return ",".join(seen.values())


def _patch_init_process_group(_module: object) -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_verl_ext_patched", False):
        return

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backend(kwargs["backend"])
        elif args:
            args = (_dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._verl_ext_patched = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _patch_valuehead_attention(module: object) -> None:
    original = module.load_valuehead_model
    if getattr(original, "_verl_ext_patched", False):
        return
    import transformers

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        # verl hard-codes attn_implementation="flash_attention_2"; on CPU use sdpa instead by
        # making from_pretrained ignore that argument for the duration of the call.
        auto_classes = (transformers.AutoModelForTokenClassification, transformers.AutoModelForCausalLM)
        own = {cls: cls.__dict__.get("from_pretrained") for cls in auto_classes}

        def with_sdpa(bound_from_pretrained):
            def from_pretrained(_cls, *args, **kwargs):
                if kwargs.get("attn_implementation") == "flash_attention_2":
                    kwargs["attn_implementation"] = "sdpa"
                return bound_from_pretrained(*args, **kwargs)

            return classmethod(from_pretrained)

        try:
            for cls in auto_classes:
                cls.from_pretrained = with_sdpa(cls.from_pretrained)
            return original(local_path, torch_dtype, model_config, trust_remote_code)
        finally:
            for cls, descriptor in own.items():
                if descriptor is None:
                    delattr(cls, "from_pretrained")
                else:
                    cls.from_pretrained = descriptor

    load_valuehead_model._verl_ext_patched = True  # type: ignore[attr-defined]
    module.load_valuehead_model = load_valuehead_model


def _patch_offload_pin_memory(module: object) -> None:
    base = module.CPUOffloadPolicy
    if getattr(base, "_verl_ext_patched", False):
        return

    # A subclass, so FSDP2's isinstance checks still hold; pinning needs an accelerator.
    class CPUOffloadPolicyNoPin(base):  # type: ignore[misc, valid-type]
        _verl_ext_patched = True

        def __init__(self, pin_memory: bool = False, **kwargs):
            super().__init__(pin_memory=False, **kwargs)

    module.CPUOffloadPolicy = CPUOffloadPolicyNoPin


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="gloo_backend_dedupe",
        module="verl.utils.distributed",
        target="initialize_global_process_group_ray",
        snippet='f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"',
        apply=_patch_init_process_group,
    ),
    Patch(
        name="valuehead_sdpa",
        module="verl.utils.model",
        target="load_valuehead_model",
        snippet='attn_implementation="flash_attention_2"',
        apply=_patch_valuehead_attention,
    ),
    Patch(
        name="offload_no_pin_memory",
        module="verl.workers.engine.fsdp.transformer_impl",
        target="FSDPEngine._build_fsdp_module",
        snippet="CPUOffloadPolicy(pin_memory=True)",
        apply=_patch_offload_pin_memory,
    ),
)


def cpu_backend_active() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


def _apply(patch: Patch) -> None:
    import verl

    if verl.__version__ != VERL_VERSION:
        SKIPPED[patch.name] = f"verl {verl.__version__} != {VERL_VERSION}"
        logger.warning("verl-ext: patch %s skipped: written for verl %s, found %s", patch.name, VERL_VERSION, verl.__version__)
        return
    patch.apply(importlib.import_module(patch.module))
    if patch.name not in APPLIED:
        APPLIED.append(patch.name)


def install() -> None:
    """Apply each patch when its verl module is imported (only on the cpu backend)."""
    if not cpu_backend_active():
        return
    for patch in PATCHES:
        when_imported(patch.module, lambda patch=patch: _apply(patch))
