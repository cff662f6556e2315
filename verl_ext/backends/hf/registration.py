"""Registers the ``hf`` rollout replica and server adapter with verl. The cpu backend registers
from ``verl_ext.backends.cpu.platform`` (the platform) and ``verl_ext.backends.cpu.engines``
(FSDP engines on cpu)."""

from verl.workers.rollout import base as rollout_base

from verl_ext._post_import import when_imported

# verl has no register function for adapters; this dict is what ``get_rollout_class`` reads.
rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "verl_ext.backends.hf.rollout.HFServerAdapter"


def _load_hf_replica():
    from verl_ext.backends.hf.rollout import HFReplica

    return HFReplica


def _register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("hf", _load_hf_replica)


when_imported("verl.workers.rollout.replica", _register_replica)
