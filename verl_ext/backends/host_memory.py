"""The ``host_memory`` checkpoint engine: the trainer's weights to standalone rollout replicas
through Ray's object store (host memory), for verl's ``separate_async`` trainer.

verl's separate pools move weights with a checkpoint engine (``nccl``, ``nixl``, ``mooncake``...),
each needing a transport between devices. This one needs none: actor rank 0 copies each bucket of
full tensors to host memory and puts it into Ray's object store; every rollout worker reads the
buckets in order. It is what the cpu backend uses, and what works where the two pools share one
device, which NCCL refuses (two ranks on one GPU). It is slower than a device-to-device transport
(one device-to-host and one host-to-device copy of the weights per sync).

Select with ``actor_rollout_ref.rollout.checkpoint_engine.backend=host_memory``. verl-ext registers
it through its ``verl.plugins`` entry point in every process; verl's own
``checkpoint_engine.custom_backend_module=verl_ext.backends.host_memory`` works as well.

A sync: verl's ``CheckpointEngineManager.update_weights`` calls ``prepare`` on every worker,
``build_topology`` in the trainer's process (which opens a numbered transfer in the
``WeightMailbox`` actor), ``init_process_group`` with that transfer's id, then ``send_weights`` on
the actor workers and ``receive_weights`` on the rollout workers at once, and ``finalize``. Every
actor rank iterates its weights (FSDP gathers each tensor collectively); rank 0 alone sends.
At most ``MAILBOX_BUCKETS`` unread buckets wait in host memory: the sender waits for the readers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Generator
from typing import Any, ClassVar

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from verl_ext.backends.hf.wire import WireTensor, from_wire, to_wire
from verl_ext.waits import check_timeout, wait_for

BACKEND = "host_memory"
MAILBOX_ACTOR_NAME = "verl_ext_weight_mailbox"
BUCKET_TIMEOUT_KEY = f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{BACKEND}.bucket_timeout_s"
MAILBOX_BUCKETS = 2  # unread buckets in the object store at once (the sender waits beyond that)


class WeightMailbox:
    """A Ray actor that hands each transfer's buckets (object refs) to its readers in order and
    drops a bucket once every reader has taken it."""

    def __init__(self) -> None:
        self._transfers: dict[int, dict[str, Any]] = {}
        self._changed = asyncio.Condition()
        self._next_id = itertools.count()

    def open(self, readers: int) -> int:
        transfer = next(self._next_id)
        self._transfers[transfer] = {"readers": readers, "buckets": {}, "taken": {}, "count": None}
        return transfer

    async def put(self, transfer: int, index: int, bucket: list[ray.ObjectRef]) -> None:
        """Adds bucket ``index`` (the ref wrapped in a list, so Ray does not resolve it), once fewer
        than ``MAILBOX_BUCKETS`` buckets are unread."""
        state = self._transfers[transfer]
        async with self._changed:
            await self._changed.wait_for(lambda: len(state["buckets"]) < MAILBOX_BUCKETS)
            state["buckets"][index] = bucket
            state["taken"][index] = 0
            self._changed.notify_all()

    async def close(self, transfer: int, count: int) -> None:
        async with self._changed:
            self._transfers[transfer]["count"] = count
            self._changed.notify_all()

    async def get(self, transfer: int, index: int) -> list[ray.ObjectRef] | None:
        """Bucket ``index`` of ``transfer``, waiting for it; None once the transfer has no more."""
        state = self._transfers[transfer]
        async with self._changed:
            await self._changed.wait_for(lambda: index in state["buckets"] or state["count"] == index)
            if index not in state["buckets"]:
                return None
            bucket = state["buckets"][index]
            state["taken"][index] += 1
            if state["taken"][index] == state["readers"]:
                del state["buckets"][index], state["taken"][index]
                self._changed.notify_all()
            return bucket

    def finish(self, transfer: int) -> None:
        self._transfers.pop(transfer, None)


@CheckpointEngineRegistry.register(BACKEND)
class HostMemoryCheckpointEngine(CheckpointEngine):
    """Weights through host memory (Ray's object store); see the module docstring.

    Args:
        bucket_size: bytes of tensors per bucket (``checkpoint_engine.update_weights_bucket_megabytes``).
        is_master: actor rank 0, the one sender (verl passes it on the actor side only).
        bucket_timeout_s: how long one bucket may be waited for: by a reader, for the sender to
            gather and put it; by the sender, for the readers to make room. A bucket takes
            seconds to gather and copy, so the default (600 s) fires only on a hung side.
    """

    _mailbox: ClassVar[Any] = None  # the trainer process's handle, kept so the actor lives on

    def __init__(self, bucket_size: int, is_master: bool = False, bucket_timeout_s: float = 600.0, **_: Any) -> None:
        check_timeout(BUCKET_TIMEOUT_KEY, bucket_timeout_s)
        self.bucket_size = max(1, int(bucket_size))
        self.is_master = is_master
        self.bucket_timeout_s = float(bucket_timeout_s)
        self.transfer: int | None = None
        self.role = "idle"

    def prepare(self) -> dict[str, Any]:
        return {"is_master": self.is_master}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        if not metadata or not metadata[0].get("is_master"):
            raise RuntimeError("checkpoint_engine.backend=host_memory: actor rank 0 must be the sender")
        if cls._mailbox is None:
            cls._mailbox = ray.remote(WeightMailbox).options(
                name=MAILBOX_ACTOR_NAME, get_if_exists=True, num_cpus=0, max_concurrency=1000
            ).remote()
        transfer = ray.get(cls._mailbox.open.remote(rollout_world_size))
        actor = {"role": ["sender"] + ["idle"] * (actor_wg_world_size - 1), "transfer": [transfer] * actor_wg_world_size}
        rollout = {"role": ["receiver"] * rollout_world_size, "transfer": [transfer] * rollout_world_size}
        return actor, rollout

    async def _bounded(self, ref: Any, what: str) -> Any:
        return await wait_for(ref, self.bucket_timeout_s,
                              f"the host_memory weight transfer {self.transfer} (Ray actor {MAILBOX_ACTOR_NAME})",
                              what, BUCKET_TIMEOUT_KEY)

    def init_process_group(self, role: str, transfer: int) -> None:
        self.role, self.transfer = role, transfer

    def finalize(self) -> None:
        if self.role == "sender":
            ray.get_actor(MAILBOX_ACTOR_NAME).finish.remote(self.transfer)
        self.role, self.transfer = "idle", None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None) -> dict[str, float]:
        mailbox = ray.get_actor(MAILBOX_ACTOR_NAME) if self.role == "sender" else None
        bucket: list[tuple[str, WireTensor]] = []
        size = count = 0
        async for name, tensor in ensure_async_iterator(weights):  # every rank iterates: FSDP gathers collectively
            if mailbox is None:
                continue
            bucket.append((name, to_wire(tensor.detach().to("cpu"))))
            size += tensor.nbytes
            if size >= self.bucket_size:
                await self._put(mailbox, count, bucket)
                bucket, size, count = [], 0, count + 1
        if mailbox is not None:
            if bucket:
                await self._put(mailbox, count, bucket)
                count += 1
            await mailbox.close.remote(self.transfer, count)
        return {}

    async def _put(self, mailbox: Any, index: int, bucket: list[tuple[str, WireTensor]]) -> None:
        await self._bounded(mailbox.put.remote(self.transfer, index, [ray.put(bucket)]),
                            f"take bucket {index} (it waits for the rollout workers to read the earlier ones)")

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        mailbox = ray.get_actor(MAILBOX_ACTOR_NAME)
        for index in itertools.count():
            wrapped = await self._bounded(mailbox.get.remote(self.transfer, index),
                                          f"hand over bucket {index} (the trainer's rank 0 sends it)")
            if wrapped is None:
                return
            for name, wire in await wrapped[0]:
                yield name, from_wire(wire)
