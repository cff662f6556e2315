"""Registers the cpu backend with verl: the ``hf`` rollout replica and server adapter, the FSDP
engines for device ``cpu``, and (only when ``VERL_PLATFORM=cpu``) the runtime patches.
The platform itself registers from ``verl_ext.backends.cpu.platform``."""

from verl.workers.rollout import base as rollout_base

from verl_ext import patches
from verl_ext._post_import import when_imported

# verl has no register function for adapters; this dict is what ``get_rollout_class`` reads.
rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "verl_ext.backends.cpu.rollout.HFServerAdapter"


def _load_hf_replica():
    from verl_ext.backends.cpu.rollout import HFReplica

    return HFReplica


def _register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("hf", _load_hf_replica)


def _register_fsdp_engines_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    # verl registers its FSDP engines for cuda/npu only; they run unchanged on CPU over gloo.
    for model_type, engine_cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        registered = EngineRegistry._engines.get(model_type, {})
        if all("cpu" not in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine_cls)


when_imported("verl.workers.rollout.replica", _register_replica)
when_imported("verl.workers.engine.fsdp.transformer_impl", _register_fsdp_engines_for_cpu)
patches.install()
