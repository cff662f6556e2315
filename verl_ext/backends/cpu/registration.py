"""Registers the ``hf`` rollout replica and server adapter with verl. The rest of the cpu
backend registers from ``platform`` (the platform) and ``engines`` (FSDP engines on cpu)."""

from verl.workers.rollout import base as rollout_base

from verl_ext._post_import import when_imported

# verl has no register function for adapters; this dict is what ``get_rollout_class`` reads.
rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = "verl_ext.backends.cpu.rollout.HFServerAdapter"


def _load_hf_replica():
    from verl_ext.backends.cpu.rollout import HFReplica

    return HFReplica


def _register_replica() -> None:
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("hf", _load_hf_replica)


when_imported("verl.workers.rollout.replica", _register_replica)
