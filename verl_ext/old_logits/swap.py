"""Temporarily load other weights into live parameters and put the live ones back bit-exactly.

Both the EWMA shadow (``ewma.py``) and the snapshot store (``snapshot.py``) need the same move:
back up the live (possibly sharded) parameters, overwrite them with other values for a
forward-only pass, and restore the backup. The backup is a plain copy in the parameters' own
dtype, so the restore is bit-exact whatever the source dtype was.

Works on local shards: a ``torch.distributed.tensor.DTensor`` is reduced to its local tensor and
nothing here communicates, so every rank swaps its own shard (FSDP2, Megatron distributed
optimizer shards, or plain unsharded tensors).

FSDP2 keeps a module's gathered (unsharded) parameters after a forward when it does not reshard
after forward (``reshard_after_forward=False``, and always for a root wrapped with the default),
and the next forward reuses them instead of gathering the shards again. A write into the shards
alone would then be ignored by the swapped forward, and the restore by the forward after it. So a
swap reshards every FSDP2 module of the model (``fsdp_resharder``) before writing the new values
and again after restoring the live ones: each forward then gathers the values the shards hold.
Resharding only frees the gathered copies on this rank; it does not communicate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Resharder = Callable[[], None]


def fsdp_resharder(modules: Sequence[torch.nn.Module]) -> Resharder | None:
    """A function that reshards every FSDP2 module (``fully_shard``) inside ``modules``, or None
    when there is none (plain modules, Megatron chunks).

    Raises:
        NotImplementedError: a module is wrapped by FSDP1 (``FullyShardedDataParallel``), whose
            gathered parameters can outlive a forward (root module, ``SHARD_GRAD_OP``) with no
            public way to free them: a swap there could silently score with the wrong weights.
    """
    if not modules:
        return None
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    found = [m for module in modules for m in module.modules()]
    if any(isinstance(m, FullyShardedDataParallel) for m in found):
        raise NotImplementedError(
            "algorithm.old_logits.provider=ewma/snapshot swaps weights into the actor's parameter shards, which "
            "verl-ext supports for FSDP2 and Megatron, not FSDP1; set actor_rollout_ref.actor.strategy=fsdp2"
        )
    fsdp = [m for m in found if isinstance(m, FSDPModule)]
    if not fsdp:
        return None

    def reshard() -> None:
        for m in fsdp:
            m.reshard()  # not recursive; a no-op where the parameters are already sharded

    return reshard


def local_parameters(module: Any) -> list[Any]:
    """This rank's parameters of an engine's model: FSDP2 keeps one module (DTensor shards),
    verl's Megatron engine a list of model chunks (virtual pipeline stages; TP/PP-local tensors;
    under Megatron's DDP these are the bf16 model parameters, views of its contiguous buffer, not
    the distributed optimizer's fp32 main copies)."""
    chunks = module if isinstance(module, (list, tuple)) else [module]
    return [p for chunk in chunks for p in chunk.parameters()]


def local_tensors(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors that hold this rank's data, sharing storage with ``params``.

    Args:
        params: parameters; plain tensors, ``nn.Parameter`` or ``DTensor`` (any mix).

    Returns:
        one tensor per parameter whose in-place modification changes the parameter.
    """
    out = []
    for p in params:
        # DTensor.to_local() returns a view of the local shard; under no_grad it is a plain alias.
        t = p.to_local() if hasattr(p, "to_local") else p
        out.append(t.detach())
    return out


def host_empty_like(t: torch.Tensor, pin_memory: bool) -> torch.Tensor:
    """An uninitialised host tensor shaped like ``t``, allocated pinned (through PyTorch's caching
    host allocator, so repeated swaps reuse the pinned blocks) when asked and when CUDA exists."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin_memory and torch.cuda.is_available())


class WeightSwap:
    """One swap of other values into live parameters, restorable bit-exactly.

    Created by ``EWMAShadow.swap_in`` and ``SnapshotStore.swap_in``; use as a context manager
    (``with shadow.swap_in(): forward()``) or call ``swap_out()`` explicitly.

    Args:
        params: live parameters (local shards are used).
        write: writes the replacement values into the given local tensors, in place.
        backup_device: where the backup of the live values lives; ``None`` = same device
            (fastest; costs one parameter copy of accelerator memory), ``"cpu"`` = host memory.
        reshard: frees gathered copies of the parameters (``fsdp_resharder``); called before the
            new values are written and after the live ones are restored.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        write: Callable[[list[torch.Tensor]], None],
        backup_device: str | torch.device | None = None,
        reshard: Resharder | None = None,
    ) -> None:
        self._reshard = reshard
        if reshard is not None:
            reshard()  # gathered copies of the live values must not serve the swapped forward
        self._live = local_tensors(params)
        with torch.no_grad():
            if backup_device is None:
                self._backup = [t.clone() for t in self._live]
            else:
                if torch.device(backup_device).type != "cpu":
                    raise ValueError(f"backup_device must be None (beside the weights) or 'cpu', got {backup_device!r}")
                self._backup = [host_empty_like(t, pin_memory=True).copy_(t, non_blocking=True) for t in self._live]
            write(self._live)
        self._active = True

    @property
    def backup(self) -> list[torch.Tensor]:
        """The live values' backup while swapped (empty after ``swap_out``)."""
        return self._backup

    @property
    def active(self) -> bool:
        return self._active

    def swap_out(self) -> None:
        """Restores the live values bit-exactly. Idempotent."""
        if not self._active:
            return
        with torch.no_grad():
            for t, b in zip(self._live, self._backup, strict=True):
                t.copy_(b, non_blocking=True)
        if self._reshard is not None:
            self._reshard()  # nor may gathered copies of the swapped values serve the next forward
        self._backup = []
        self._active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.swap_out()
