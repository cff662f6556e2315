"""Exact old logits by version: host copies of the trainer's weights, and the version-grouped
recompute that uses them.

Snapshot-based version tracking (Guan et al., arXiv 2605.12070; the async_fixed repository's
"snapshot-based old-logprob recomputation"): keep the training-side weights θ_v of
every version still live in the replay buffer, sharded exactly like the trainer's parameters and
in host memory; at old-logit time group tokens by the version that generated them, run one
forward per version present with θ_v swapped in, and keep each forward's log-probs only where the
token's version matches.

Version convention (verl 0.9.1 v1 trainers): ``update_weights(global_steps)`` publishes the
weights after step ``global_steps`` as version ``global_steps``, so while step g computes its old
log-probs the trainer holds version g - 1. Tokens of that version need no snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from verl_ext.old_logits import swap
from verl_ext.old_logits.swap import Resharder, WeightSwap, host_buffer_bytes, host_buffers_like, local_tensors


class SnapshotMissingError(KeyError):
    """A token's version has no snapshot (evicted, never saved, or lost on resume)."""

    def __init__(self, version: int, available: Sequence[int]) -> None:
        super().__init__(
            f"no weight snapshot for policy version {version} (stored: {list(available)}). Either the staleness bound "
            "trainer.v1.sampler.max_off_policy_threshold is larger than algorithm.old_logits.snapshot.max_versions, "
            "or the run resumed from a checkpoint (snapshots are not checkpointed): set "
            "algorithm.old_logits.snapshot.on_missing=current to fall back to the current weights for such tokens"
        )
        self.version = version


class SnapshotStore:
    """Host-memory copies of (local shards of) the trainer weights, keyed by policy version.

    Save the weights of version v before the optimizer step that replaces them (then the store
    never holds a copy of the live weights): ``begin_save`` when the actor update of the step
    starts, ``wait_saved`` right before its first optimizer step, so the copies overlap with the
    forward and backward passes in between. A save evicts every version that can no longer be
    sampled once v + 1 is current, given the staleness bound.

    Args:
        max_versions: staleness bound D in versions (verl: ``trainer.v1.sampler.max_off_policy_threshold``).
            After ``save(v)`` the store holds versions v + 1 - D .. v, i.e. at most D copies.
        pin_memory: pin host buffers (fast, asynchronous H2D/D2H copies) when CUDA is present.
        float32_as: store float32 tensors in this dtype (None: as they are). ``torch.bfloat16``
            halves the memory and copy time and stays exact for a forward that casts its
            parameters to bfloat16 (FSDP mixed precision): a swap-in writes values whose bfloat16
            cast equals the live weights' bfloat16 cast.
    """

    def __init__(self, max_versions: int, pin_memory: bool = True, float32_as: torch.dtype | None = None) -> None:
        if max_versions < 1:
            raise ValueError(f"algorithm.old_logits.snapshot.max_versions must be >= 1, got {max_versions}")
        self.max_versions = max_versions
        self.pin_memory = pin_memory
        self.float32_as = float32_as
        self._snapshots: dict[int, list[torch.Tensor]] = {}
        self._aliases: dict[int, int] = {}  # version -> the stored version holding the same weights
        self._free: list[list[torch.Tensor]] = []  # evicted buffers, reused so pinning happens once
        self._copy_stream: torch.cuda.Stream | None = None  # created on the first CUDA save
        self._copied: torch.cuda.Event | None = None  # marks the end of the last CUDA save's copies

    @property
    def versions(self) -> list[int]:
        """Versions that ``get`` serves (stored copies and their aliases)."""
        return sorted([*self._snapshots, *self._aliases])

    @property
    def nbytes(self) -> int:
        """Host bytes held by stored snapshots (the ``old_logits/snapshot_bytes`` cost metric)."""
        return sum(t.numel() * t.element_size() for snap in self._snapshots.values() for t in snap)

    @torch.no_grad()
    def reserve(self, params: Sequence[torch.Tensor]) -> int:
        """Allocates (and pins) the host buffers of all ``max_versions`` copies now, so that no save
        pays for it inside a training step (at Qwen2.5-7B's shapes pinning one fp32 copy takes
        ~10 s). Returns the bytes reserved; a no-op once buffers exist."""
        if self._snapshots or self._free:
            return 0
        live = local_tensors(params)
        needed = self.max_versions * host_buffer_bytes(live, [self._stored_dtype(t) for t in live])
        available = swap.host_memory_available()
        if available is not None and needed > available:  # refuse now rather than die of the OOM killer
            raise MemoryError(
                f"algorithm.old_logits.provider=snapshot keeps {self.max_versions} host copies of this rank's weights, "
                f"{needed / 1e9:.1f} GB, but the host has {available / 1e9:.1f} GB available: set "
                "algorithm.old_logits.snapshot.dtype=bf16 (fp32 weights in half the bytes), lower the staleness bound "
                "trainer.v1.sampler.max_off_policy_threshold (snapshot.max_versions follows it), or use a host with more memory"
            )
        self._free = [self._buffers_like(live) for _ in range(self.max_versions)]
        return needed

    def _stored_dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.float32_as if self.float32_as is not None and t.dtype == torch.float32 else t.dtype

    def _buffers_like(self, live: list[torch.Tensor]) -> list[torch.Tensor]:
        layout = [(t.shape, self._stored_dtype(t)) for t in live]
        while self._free:
            bufs = self._free.pop()
            if [(b.shape, b.dtype) for b in bufs] == layout:
                return bufs
        return host_buffers_like(live, self.pin_memory, [dtype for _, dtype in layout])

    @torch.no_grad()
    def save(self, version: int, params: Sequence[torch.Tensor], same_since: int | None = None) -> None:
        """Copies the live parameters (local shards, in their own dtype or ``float32_as``) as
        ``version`` and returns once the copy is complete (``begin_save`` + a host wait)."""
        self.begin_save(version, params, same_since)
        self._wait_host()

    @torch.no_grad()
    def begin_save(self, version: int, params: Sequence[torch.Tensor], same_since: int | None = None) -> None:
        """Starts copying the live parameters as ``version``; call ``wait_saved`` before anything
        writes them. Versions older than ``version + 1 - max_versions`` are evicted first, so their
        buffers take the copy: after ``max_versions`` saves no host memory is allocated again.

        On CUDA the device-to-host copies run on a side stream, after the work already queued on
        the current stream, into pinned buffers: they overlap with the step until ``wait_saved``.
        Elsewhere they are plain copies, done on return.

        Args:
            same_since: versions ``same_since .. version - 1`` hold these same weights (no
                optimizer step since ``same_since`` was published, e.g. ``trainer.critic_warmup``
                steps); they are served from this copy.
        """
        self.evict_older_than(version + 1 - self.max_versions)
        self._aliases.pop(version, None)
        for v in range(version if same_since is None else same_since, version):
            self._aliases[v] = version
        live = local_tensors(params)
        bufs = self._snapshots.pop(version, None) or self._buffers_like(live)
        self._snapshots[version] = bufs
        if not (live and live[0].is_cuda):
            for b, t in zip(bufs, live, strict=True):
                b.copy_(t)
            return
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=live[0].device)
        # the side stream starts after the current stream's queued work: the parameters are final
        # and earlier reads of the reused buffers (swap-ins of an evicted version) are done
        self._copy_stream.wait_stream(torch.cuda.current_stream(live[0].device))
        with torch.cuda.stream(self._copy_stream):
            for b, t in zip(bufs, live, strict=True):
                # a narrowing cast runs on the GPU, on this stream (its temporary is freed to this
                # stream's pool, so nothing reuses it before the copy has read it)
                b.copy_(t if t.dtype == b.dtype else t.to(b.dtype), non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record(self._copy_stream)

    def wait_saved(self) -> None:
        """Makes the current stream wait until the last ``begin_save`` copy is complete; the host
        does not block. Call before the optimizer step that overwrites the parameters."""
        if self._copied is not None:
            torch.cuda.current_stream(self._copied.device).wait_event(self._copied)

    def _wait_host(self) -> None:
        """Blocks the host until the last copy is complete (before the host reads the buffers)."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    @property
    def buffers(self) -> list[torch.Tensor]:
        """Every host buffer this store holds, stored or free for reuse (the memory it costs)."""
        return [t for bufs in [*self._snapshots.values(), *self._free] for t in bufs]

    def evict_older_than(self, min_version: int) -> list[int]:
        """Drops snapshots of versions < ``min_version``; returns the evicted versions."""
        gone = [v for v in self._snapshots if v < min_version]
        for v in gone:
            self._free.append(self._snapshots.pop(v))
        aliases = [v for v in self._aliases if v < min_version]
        for v in aliases:
            del self._aliases[v]
        return sorted([*gone, *aliases])

    def get(self, version: int) -> list[torch.Tensor]:
        """The stored tensors of ``version`` (host memory). Raises ``SnapshotMissingError``."""
        stored = self._aliases.get(version, version)
        if stored not in self._snapshots:
            raise SnapshotMissingError(version, self.versions)
        self._wait_host()  # the copies finished long ago (the optimizer step waited for them)
        return self._snapshots[stored]

    def swap_in(
        self,
        version: int,
        params: Sequence[torch.Tensor],
        backup_device: str | torch.device | None = None,
        reshard: Resharder | None = None,
    ) -> WeightSwap:
        """Loads snapshot ``version`` into the live parameters; restore with the returned
        ``WeightSwap`` (context manager or ``swap_out()``), bit-exactly. ``reshard`` frees
        gathered parameter copies around the swap (``swap.fsdp_resharder``)."""
        snap = self.get(version)

        def write(targets: list[torch.Tensor]) -> None:
            for t, s in zip(targets, snap, strict=True):
                t.copy_(s, non_blocking=True)

        return WeightSwap(params, write, backup_device, reshard)


def scatter_by_version(
    token_versions: torch.Tensor,
    logprob_fn: Callable[[int, torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[int, int]]:
    """Per-token log-probs under the weights of each token's own version.

    For every version v present, calls ``logprob_fn(v, rows)`` once, for only the rows that hold
    a token of version v, and keeps the result where ``token_versions == v``. Tokens without a
    version (-1: tool/observation tokens, padding) get 0.

    Args:
        token_versions: ``(bs, L)`` int tensor, -1 where a token has no version.
        logprob_fn: ``(version, rows) -> (len(rows), L)`` log-probs of the response tokens of
            those rows computed with the weights of ``version``.

    Returns:
        ``(log_probs (bs, L), rows_per_version)``; ``rows_per_version[v]`` is how many rows the
        forward of version v covered (the compute cost: Σ over versions).
    """
    out: torch.Tensor | None = None
    rows_per_version: dict[int, int] = {}
    for v in torch.unique(token_versions[token_versions >= 0]).tolist():
        here = token_versions == v
        rows = here.any(dim=-1).nonzero(as_tuple=True)[0]
        lp = logprob_fn(int(v), rows)
        if lp.shape != (rows.numel(), token_versions.shape[-1]):
            raise ValueError(
                f"logprob_fn({v}, rows) returned shape {tuple(lp.shape)}, expected {(rows.numel(), token_versions.shape[-1])}"
            )
        if out is None:
            out = torch.zeros(token_versions.shape, dtype=lp.dtype, device=lp.device)
        out[rows] = torch.where(here[rows], lp, out[rows])
        rows_per_version[int(v)] = rows.numel()
    if out is None:
        out = torch.zeros(token_versions.shape, dtype=torch.float32, device=token_versions.device)
    return out, rows_per_version
