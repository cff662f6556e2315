"""verl_ext/backends/hf/wire.py: weights as numpy byte views come back bit for bit, whatever
their dtype and layout, from the read-only buffers Ray hands an actor."""

from __future__ import annotations

import warnings

import pytest
import torch

from verl_ext.backends.hf.wire import from_wire, named_from_wire, named_to_wire, to_wire

TENSORS = {
    "bf16 matrix": torch.randn(5, 7).to(torch.bfloat16),
    "fp32 vector": torch.randn(11),
    "int64 ids": torch.arange(12).reshape(3, 4),
    "scalar": torch.tensor(2.5),
    "empty": torch.empty(0, 3),
    "transposed (not contiguous)": torch.randn(4, 6).t(),
    "bool mask": torch.rand(3, 3) > 0.5,
}


def _as_received(wire):
    """What an actor gets from Ray's object store: the same bytes, read-only."""
    dtype, shape, data = wire
    copy = data.copy()
    copy.setflags(write=False)
    return dtype, shape, copy


@pytest.mark.parametrize("name", list(TENSORS))
def test_round_trip_is_bit_exact_from_a_read_only_buffer(name):
    tensor = TENSORS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning about the read-only buffer reaches the user
        back = from_wire(_as_received(to_wire(tensor)))
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back, tensor)


def test_a_contiguous_tensor_travels_without_a_copy():
    tensor = torch.randn(8, 8)
    _, _, data = to_wire(tensor)
    assert data.ctypes.data == tensor.data_ptr()  # the numpy view shares the tensor's memory


def test_named_round_trip_keeps_names_and_order():
    state = named_to_wire(TENSORS.items())
    back = dict(named_from_wire({k: _as_received(w) for k, w in state.items()}))
    assert list(back) == list(TENSORS)
    assert all(torch.equal(back[k], TENSORS[k]) for k in TENSORS)
