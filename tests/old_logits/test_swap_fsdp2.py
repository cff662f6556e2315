"""Weight swaps under real FSDP2 (``fully_shard``) with ``reshard_after_forward=False``.

FSDP2 then keeps each module's gathered parameters after a forward, and the next forward reuses
them instead of gathering the shards again. A swap must still be seen by the forward under it,
and the restore by the forward after it. Two processes: ``cpu`` with gloo here, ``cuda`` with
NCCL where two GPUs exist (``python -m pytest tests/old_logits/test_swap_fsdp2.py`` on a 2-GPU
machine runs both).
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
from fsdp2_swap_worker import WORLD, run

DEVICES = [
    pytest.param("cpu", id="cpu-gloo"),
    pytest.param(
        "cuda", id="cuda-nccl",
        marks=pytest.mark.skipif(torch.cuda.device_count() < WORLD, reason="needs 2 CUDA devices"),
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("device_type", DEVICES)
def test_swap_is_seen_by_fsdp2_without_reshard_after_forward(device_type):
    # both providers' swaps (snapshot, ewma) in one process group per device
    mp.spawn(run, args=(device_type, _free_port()), nprocs=WORLD, join=True)
