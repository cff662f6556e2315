"""The actor workers' side of the old-logit providers, driven by the trainer with Ray's
``__ray_call__`` (no worker subclass): each function below runs inside an actor worker process
via ``handle.__ray_call__.remote(fn, ...)``; its first argument is the Ray actor instance (verl's
fused ``WorkerDict`` or a plain worker).

The state (``OldLogitWorkerState``: EWMA shadow, weight snapshots) lives on the actor worker as an
attribute; the engine's ``optimizer_step`` is wrapped on the instance so that the EWMA is updated,
and a snapshot taken, at every optimizer step.
"""

from __future__ import annotations

import os
from typing import Any

import ray
import torch

from verl_ext.backends.hf.wire import to_wire
from verl_ext.checkpoint_files import load_file, save_file
from verl_ext.old_logits.config import KEY, OldLogitsConfig
from verl_ext.old_logits.swap import WeightSwap, local_parameters
from verl_ext.timing import held_bytes, timed
from verl_ext.waits import ray_get

# The driver times its calls that swap weights on the workers (``weight_swap``, which on the cpu
# backend includes the copies); on CUDA the copies run asynchronously after the call returns and
# the workers time them on the compute stream.
WORKER_SWAP_HOOK = "weight_swap_gpu"
STATE_ATTR = "_verl_ext_old_logits"


def _actor_worker(ray_self: Any) -> Any:
    candidates = list(getattr(ray_self, "worker_dict", {}).values()) or [ray_self]
    for worker in candidates:
        if getattr(getattr(worker, "actor", None), "engine", None) is not None:
            return worker
    raise RuntimeError("verl-ext old-logit provider: no actor engine on this worker")


def _state(ray_self: Any):
    state = getattr(_actor_worker(ray_self), STATE_ATTR, None)
    if state is None:
        raise RuntimeError("verl-ext old-logit state was not installed on this worker (install_worker_state)")
    return state


def install_worker_state(ray_self: Any, config: OldLogitsConfig, updates_per_version: int, version: int = 0) -> None:
    """Create the worker's EWMA/snapshot state over its local parameter shards (idempotent).
    ``version``: the version the actor's weights hold now."""
    from verl_ext.old_logits.swap import fsdp_resharder
    from verl_ext.old_logits.worker import OldLogitWorkerState

    worker = _actor_worker(ray_self)
    if getattr(worker, STATE_ATTR, None) is not None:
        return
    engine = worker.actor.engine
    modules = engine.module if isinstance(engine.module, (list, tuple)) else [engine.module]
    reshard = fsdp_resharder(modules)
    if reshard is not None:
        reshard()  # the parameter list must hold the sharded parameters, not gathered copies
    state = OldLogitWorkerState(
        config, local_parameters(engine.module), updates_per_version, backup_device=config.swap_backup_device,
        modules=modules, first_version=version,
    )
    original_step = engine.optimizer_step

    def optimizer_step():
        state.before_optimizer_step(state.version)
        result = original_step()
        state.after_optimizer_step()
        return result

    engine.optimizer_step = optimizer_step  # instance attribute: only this engine, only this process
    setattr(worker, STATE_ATTR, state)


def set_worker_version(ray_self: Any, version: int) -> None:
    _state(ray_self).set_version(version)


def publish_worker_version(ray_self: Any, version: int) -> dict[str, float]:
    """Publishes ``version`` and returns this worker's ``verl_ext/time/*`` and ``verl_ext/mem/*``
    of the step (the trainer calls it once per actor update)."""
    state = _state(ray_self)
    state.on_version_published(version)
    return state.report()


def enter_weights(ray_self: Any, spec: str) -> None:
    state = _state(ray_self)
    if state.active is not None:
        raise RuntimeError(f"old-logit weights {spec!r} requested while another swap is active")
    with timed(WORKER_SWAP_HOOK, device_only=True):
        context = state.weights(spec)
        context.__enter__()
    state.active = context
    if isinstance(context, WeightSwap):
        state.swap_backup_bytes = held_bytes("swap_backup", context.backup)


def exit_weights(ray_self: Any) -> None:
    state = _state(ray_self)
    context, state.active = state.active, None
    if context is not None:
        with timed(WORKER_SWAP_HOOK, device_only=True):
            context.__exit__(None, None, None)


def send_weights_to_scorer(ray_self: Any, scorer_name: str, version: int | None, dtype: torch.dtype,
                           timeout_s: float) -> None:
    """Sends the actor's full weights (``get_per_tensor_param``, which every rank must iterate:
    FSDP gathers each tensor collectively) to the ``dedicated`` scorer, from rank 0, cast to the
    scorer's ``dtype`` as FSDP's mixed precision casts them for the forward. The scorer has
    ``timeout_s`` to take them (its wait for the outgoing version plus the load)."""
    params, peft_config = _actor_worker(ray_self).actor.engine.get_per_tensor_param()
    if peft_config is not None:
        raise NotImplementedError(
            "algorithm.old_logits.provider=dedicated: LoRA adapters must be merged for the scorer "
            "(actor_rollout_ref.model.lora.merge=True)"
        )
    sender = int(os.environ.get("RANK", 0)) == 0
    state = {}
    for name, tensor in params:  # every rank takes part in each gather; rank 0 keeps the tensors
        if sender:  # cast where the tensor is (on a GPU: half the bytes to copy to the host for bf16)
            cast = tensor.detach().to(dtype=dtype if tensor.is_floating_point() else tensor.dtype)
            state[name] = to_wire(cast.to("cpu"))
    if sender:
        from verl_ext.backends.hf.old_logit_scorer import SCORER_COMPONENT

        ray_get(ray.get_actor(scorer_name).update_weights.remote(state, version), timeout_s, SCORER_COMPONENT,
                f"load the weights of version {version} (after its wait of up to {KEY}.dedicated.sync_timeout_s "
                "for the outgoing version)", f"{KEY}.dedicated.call_timeout_s")


def calibrate_worker_ewma(ray_self: Any, token_age_versions: float | None, version: int) -> dict[str, float]:
    return _state(ray_self).ewma_calibrate(token_age_versions, version)


def _rank_file() -> str:
    return f"rank_{int(os.environ.get('RANK', 0))}.pt"


def save_worker_state(ray_self: Any, folder: str) -> dict[str, Any]:
    """Save this rank's state atomically into ``folder``; returns its manifest record."""
    return save_file(_state(ray_self).state_dict(), os.path.join(folder, _rank_file()))


def load_worker_state(ray_self: Any, folder: str, version: int, manifest: dict[str, Any] | None) -> str | None:
    """Restore the state saved next to a checkpoint of the weights of ``version``, after checking
    its bytes against the folder's ``manifest``; returns the file's sha256, or None when nothing
    was saved (``manifest`` None): the state is then passed on as ``None`` so the EWMA's
    ``on_missing_state`` policy decides."""
    state, sha256 = load_file(folder, _rank_file(), manifest) if manifest is not None else (None, None)
    _state(ray_self).load_state_dict(state, version)
    return sha256
