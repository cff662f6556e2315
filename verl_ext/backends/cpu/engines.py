"""Registers verl's FSDP engines for device ``cpu``: verl registers them for cuda/npu only,
though they run unchanged on CPU over gloo (FSDP2; FSDP1 needs a GPU for sync_module_states)."""

from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp import transformer_impl

for _model_type, _engine_cls in (
    ("language_model", transformer_impl.FSDPEngineWithLMHead),
    ("value_model", transformer_impl.FSDPEngineWithValueHead),
):
    if "cpu" not in EngineRegistry._engines.get(_model_type, {}).get("fsdp2", {}):
        EngineRegistry.register(model_type=_model_type, backend=["fsdp", "fsdp2"], device="cpu")(_engine_cls)
