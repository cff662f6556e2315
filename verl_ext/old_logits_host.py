"""verl glue for the old-logit providers: the trainer side (``OldLogitHost``) and the worker side.

The providers in ``verl_ext.old_logits`` are plain tensor logic over four calls (version,
fetch, forward under some weights, store). This module implements them for verl's v1 trainer:

- fetch/store go through TransferQueue, padded to ``(bs, L)`` exactly as verl's
  ``_compute_old_log_prob`` does;
- a forward under other weights ("ewma", "snapshot:<v>") swaps those weights into the actor's
  local parameter shards on every worker, runs verl's own ``compute_log_prob``, and swaps back;
- per-token versions come from ``extra_fields["token_global_steps"]`` (``verl_ext.rollout_client``).

Worker-side state (``OldLogitWorkerState``: EWMA shadow, snapshot store) lives on each actor
worker as an attribute and is driven with Ray's ``__ray_call__`` (no worker subclass): the
engine's ``optimizer_step`` is wrapped on the instance so the EWMA is updated, and a snapshot
taken, at every optimizer step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_ext.old_logits.config import OldLogitsConfig
from verl_ext.old_logits.providers import (
    PRECOMPUTED_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    TOKEN_VERSIONS,
)
from verl_ext.rollout_client import TOKEN_VERSIONS_KEY

STATE_ATTR = "_verl_ext_old_logits"
CHECKPOINT_DIR = "verl_ext_old_logits"


# ----------------------------------------------------------------------------- worker side
# Each function runs inside an actor worker process via ``handle.__ray_call__.remote(fn, ...)``;
# its first argument is the Ray actor instance (verl's fused ``WorkerDict`` or a plain worker).


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


def install_worker_state(ray_self: Any, config: OldLogitsConfig, updates_per_version: int) -> None:
    """Create the worker's EWMA/snapshot state over its local parameter shards (idempotent)."""
    from verl_ext.old_logits.worker import OldLogitWorkerState

    worker = _actor_worker(ray_self)
    if getattr(worker, STATE_ATTR, None) is not None:
        return
    engine = worker.actor.engine
    state = OldLogitWorkerState(config, list(engine.module.parameters()), updates_per_version, backup_device="cpu")
    original_step = engine.optimizer_step

    def optimizer_step():
        state.before_optimizer_step(state.version)
        result = original_step()
        state.after_optimizer_step()
        return result

    engine.optimizer_step = optimizer_step  # instance attribute: only this engine, only this process
    setattr(worker, STATE_ATTR, state)


def set_worker_version(ray_self: Any, version: int) -> None:
    _state(ray_self).version = version


def publish_worker_version(ray_self: Any, version: int) -> None:
    _state(ray_self).on_version_published(version)


def enter_weights(ray_self: Any, spec: str) -> None:
    state = _state(ray_self)
    if state.active is not None:
        raise RuntimeError(f"old-logit weights {spec!r} requested while another swap is active")
    context = state.weights(spec)
    context.__enter__()
    state.active = context


def exit_weights(ray_self: Any) -> None:
    state = _state(ray_self)
    context, state.active = state.active, None
    if context is not None:
        context.__exit__(None, None, None)


def save_worker_state(ray_self: Any, folder: str) -> None:
    rank = int(os.environ.get("RANK", 0))
    os.makedirs(folder, exist_ok=True)
    torch.save(_state(ray_self).state_dict(), os.path.join(folder, f"rank_{rank}.pt"))


def load_worker_state(ray_self: Any, folder: str) -> bool:
    """Restore the state saved next to a checkpoint; returns whether a file was found. A missing
    file is passed on as ``None`` so the EWMA's ``on_missing_state`` policy decides."""
    path = os.path.join(folder, f"rank_{int(os.environ.get('RANK', 0))}.pt")
    state = torch.load(path, weights_only=False) if os.path.exists(path) else None
    _state(ray_self).load_state_dict(state)
    return state is not None


# ----------------------------------------------------------------------------- trainer side


class VerlOldLogitHost:
    """``OldLogitHost`` for a verl v1 trainer (``trainer``) and one step's ``KVBatchMeta``."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_workers(self, fn, *args: Any) -> list[Any]:
        workers = self.trainer.actor_rollout_wg.workers
        return ray.get([worker.__ray_call__.remote(fn, *args) for worker in workers])

    def old_logits_version(self) -> int:
        # tokens sampled after the weight sync that ended step s carry version s; during step s
        # the actor holds the weights of version s - 1.
        return self.trainer.global_steps - 1

    def old_logits_fetch(self, batch: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]:
        unknown = set(fields) - {RESPONSE_MASK, ROLLOUT_LOG_PROBS, TOKEN_VERSIONS, PRECOMPUTED_LOG_PROBS}
        if unknown:
            raise KeyError(f"old-logit fields {sorted(unknown)} are not available from verl's batch")
        if PRECOMPUTED_LOG_PROBS in fields:
            raise NotImplementedError(
                "algorithm.old_logits.provider=dedicated/interrupt need old log-probs scored on the rollout "
                "side (precomputed_old_log_probs); verl-ext does not record them yet. Use snapshot (exact) or ewma."
            )
        select = [f for f in (RESPONSE_MASK, ROLLOUT_LOG_PROBS) if f in fields or f == RESPONSE_MASK]
        if TOKEN_VERSIONS in fields:
            select.append("extra_fields")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=select)
        extra = data.pop("extra_fields").tolist() if TOKEN_VERSIONS in fields else None
        padded = data.to_padded_tensor()
        out = {name: padded[name] for name in select if name != "extra_fields"}
        if extra is not None:
            out[TOKEN_VERSIONS] = token_versions(extra, out[RESPONSE_MASK], batch.keys)
        return out

    def old_logits_forward(self, batch: Any, weights: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        swapped = weights != "current"
        if swapped:
            self.on_workers(enter_weights, weights)
        try:
            batch.extra_info.update(
                {
                    "calculate_entropy": False,
                    "compute_loss": False,
                    "temperature": self.trainer.config.actor_rollout_ref.rollout.temperature,
                }
            )
            self.trainer.actor_rollout_wg.compute_log_prob(batch)
        finally:
            if swapped:
                self.on_workers(exit_weights)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["log_probs", "response_mask"])
        # the worker returns log-probs over prompt + response; keep the response part, as verl does
        data["log_probs"] = response_from_nested(data["log_probs"], data["response_mask"])
        log_probs = data.to_padded_tensor()["log_probs"]
        return log_probs if rows is None else log_probs[rows]

    def old_logits_store(self, batch: Any, old_log_probs: torch.Tensor) -> Any:
        mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        nested = response_to_nested(old_log_probs, mask["response_mask"])
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"old_log_probs": nested}, batch_size=len(batch)),
        )


def token_versions(extra_fields: list[dict], response_mask: torch.Tensor, keys: Sequence[str]) -> torch.Tensor:
    """``(bs, L)`` long tensor of the weight version of each response token (-1: none).

    Raises ``ValueError`` naming the rows whose rollout recorded no versions: a provider that
    needs versions must not guess them (``verl_ext.rollout_client`` records them; agent loops
    must copy ``extra_fields["token_global_steps"]`` into their output).
    """
    bs, length = response_mask.shape
    out = torch.full((bs, length), -1, dtype=torch.long)
    missing = []
    for i, fields in enumerate(extra_fields):
        versions = (fields or {}).get(TOKEN_VERSIONS_KEY)
        if versions is None:
            if bool(response_mask[i].any()):
                missing.append(keys[i])
            continue
        n = min(len(versions), length)
        out[i, :n] = torch.tensor([-1 if v is None else int(v) for v in versions[:n]], dtype=torch.long)
    if missing:
        raise ValueError(
            f"rows {missing[:5]} carry no per-token weight versions (extra_fields['{TOKEN_VERSIONS_KEY}']); "
            "run a verl_ext trainer (it installs the version-recording LLM client) with an agent loop that "
            "forwards TokenOutput.extra_fields (single_turn_agent, hybrid_gui_tool, text_env do)"
        )
    return torch.where(response_mask.bool(), out, torch.full_like(out, -1))
