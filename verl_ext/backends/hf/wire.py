"""Full weights between Ray actors as numpy byte views.

Ray hands numpy arrays between processes without copying them through pickle (they travel as
out-of-band buffers of its object store), while a torch tensor is pickled. Qwen2.5-0.5B's shapes
in bf16 (0.72 GB, 290 tensors) reached an actor in 2.54 s as torch tensors (0.28 GB/s, as slow as
the ``dedicated`` scorer's weight sync measured on GPUs, 1.5-2.1 s per step) and in 0.11 s as
``to_wire`` byte views, on one core of the dev machine (docs/results.md, "Weights over Ray").
The ``hf`` rollout server and the ``dedicated`` old-logit scorer receive their weights this way.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import torch

WireTensor = tuple[torch.dtype, tuple[int, ...], np.ndarray]


def to_wire(tensor: torch.Tensor) -> WireTensor:
    """A CPU tensor as ``(dtype, shape, its bytes)``: a uint8 numpy view, no copy when the tensor
    is contiguous (numpy has no bfloat16, so the bytes travel, not the values)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.dtype, tuple(tensor.shape), flat.view(torch.uint8).numpy()


def from_wire(wire: WireTensor) -> torch.Tensor:
    """The tensor ``to_wire`` encoded, viewing the received bytes. Ray's buffers are read-only:
    copy it (as ``load_weights`` does) before writing to it."""
    dtype, shape, data = wire
    if data.size == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # the view is only read; torch warns about any read-only buffer
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def named_to_wire(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, WireTensor]:
    return {name: to_wire(tensor) for name, tensor in named}


def named_from_wire(state: dict[str, WireTensor]) -> Iterator[tuple[str, torch.Tensor]]:
    return ((name, from_wire(wire)) for name, wire in state.items())
