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


_VIEW_ALIGN = 512  # bytes: every dtype's alignment and the copy engines' preferred one


class _HostRegistration:
    """Keeps one host buffer page-locked (``cudaHostRegister``) for as long as a view of it that
    this module handed out lives; unregisters after the device has finished what it queued."""

    def __init__(self, buffer: torch.Tensor) -> None:
        cudart = torch.cuda.cudart()
        self._buffer = buffer  # its memory outlives the registration
        status = cudart.cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0)
        if status != cudart.cudaError.success:
            raise RuntimeError(
                f"could not pin {buffer.numel() / 2**30:.1f} GiB of host memory for old-logit weight copies "
                f"(cudaHostRegister: {status}); free host memory, or set algorithm.old_logits.snapshot.pin_memory=false "
                "(snapshot saves then copy on the critical path) or, for the live weights' backup during a swap, "
                "algorithm.old_logits.swap_backup=device"
            )

    def __del__(self) -> None:
        try:
            torch.cuda.synchronize()  # no copy may still read or write the buffer once it is pageable
            torch.cuda.cudart().cudaHostUnregister(self._buffer.data_ptr())
        except Exception:  # interpreter shutdown: the CUDA context may be gone, and the memory with it
            pass


def _aligned(size: int) -> int:
    return -(-size // _VIEW_ALIGN) * _VIEW_ALIGN


def host_buffer_bytes(tensors: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype] | None = None) -> int:
    """The bytes ``host_buffers_like(tensors, ..., dtypes)`` allocates."""
    dtypes = [t.dtype for t in tensors] if dtypes is None else list(dtypes)
    return sum(_aligned(t.numel() * d.itemsize) for t, d in zip(tensors, dtypes, strict=True))


def host_memory_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_buffers_like(
    tensors: Sequence[torch.Tensor], pin_memory: bool, dtypes: Sequence[torch.dtype] | None = None
) -> list[torch.Tensor]:
    """Uninitialised host tensors shaped like ``tensors`` (in ``dtypes``, default theirs): views
    into one buffer of exactly their bytes (each view 512-byte aligned), page-locked when asked
    and CUDA exists.

    One registered buffer instead of one pinned allocation per tensor: PyTorch's caching host
    allocator rounds every pinned allocation up to a power of two (Qwen2.5-7B's fp32 MLP matrices
    of 272 MB become 512 MB blocks), which held 49 GB for 26 GB of weights (1.89x, measured:
    docs/results.md) and never gives it back.
    """
    dtypes = [t.dtype for t in tensors] if dtypes is None else list(dtypes)
    sizes = [t.numel() * d.itemsize for t, d in zip(tensors, dtypes, strict=True)]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += _aligned(size)
    buffer = torch.empty(total, dtype=torch.uint8, device="cpu")
    registration = _HostRegistration(buffer) if pin_memory and total and torch.cuda.is_available() else None
    views = []
    for t, dtype, size, start in zip(tensors, dtypes, sizes, offsets, strict=True):
        view = buffer[start : start + size].view(dtype).view(t.shape)
        view._verl_ext_host_registration = registration  # the registration lives while a view does
        views.append(view)
    return views


# Host backups of finished swaps, reused by the next swap of the same shapes: pinning a backup of
# 7B fp32 weights takes seconds, and one swap is active at a time per process (a nested swap takes
# a fresh backup, since the one in use is not in this list).
_spare_host_backups: list[list[torch.Tensor]] = []
_MAX_SPARE_HOST_BACKUPS = 2  # e.g. an actor and a reference model in one process


def _take_host_backup(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    layout = [(t.shape, t.dtype) for t in like]
    for i, spare in enumerate(_spare_host_backups):
        if [(b.shape, b.dtype) for b in spare] == layout:
            return _spare_host_backups.pop(i)
    return host_buffers_like(like, pin_memory=True)


def _return_host_backup(backup: list[torch.Tensor]) -> None:
    _spare_host_backups.insert(0, backup)
    del _spare_host_backups[_MAX_SPARE_HOST_BACKUPS:]


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
                self._backup = _take_host_backup(self._live)
                for b, t in zip(self._backup, self._live, strict=True):
                    b.copy_(t, non_blocking=True)
            self._host_backup = backup_device is not None
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
        if self._host_backup:  # the next swap's copies into it queue behind these restores
            _return_host_backup(self._backup)
        self._backup = []
        self._active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.swap_out()
