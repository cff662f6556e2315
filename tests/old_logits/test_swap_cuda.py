"""Weight swaps with CUDA parameters and pinned host buffers (skipped without CUDA; run on a GPU
machine with ``python -m pytest tests/old_logits/test_swap_cuda.py``)."""

import pytest
import torch

from verl_ext.old_logits.ewma import EWMAShadow
from verl_ext.old_logits.snapshot import SnapshotStore

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _params():
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(s, device="cuda", generator=g).to(torch.bfloat16) for s in [(1000, 33), (7,), (4096,)]]


@pytest.mark.parametrize("backup_device", [None, "cpu"])
def test_ewma_swap_restores_cuda_params_bit_exactly(backup_device):
    params = _params()
    shadow = EWMAShadow(params, 0.9)
    for _ in range(3):
        for p in params:
            p.add_(torch.randn_like(p) * 0.01)
        shadow.update()
    live = [p.clone() for p in params]
    for _ in range(2):  # the second swap reuses cached pinned blocks
        with shadow.swap_in(backup_device):
            assert all(torch.equal(p, a.to(torch.bfloat16)) for p, a in zip(params, shadow.average()))
        torch.cuda.synchronize()
        assert all(torch.equal(p, x) for p, x in zip(params, live))


def test_snapshot_of_cuda_params_is_pinned_and_exact():
    params = _params()
    store = SnapshotStore(max_versions=2)
    store.save(0, params)
    saved = [p.clone() for p in params]
    assert all(s.is_pinned() for s in store.get(0))
    for p in params:
        p.mul_(2)
    live = [p.clone() for p in params]
    with store.swap_in(0, params, backup_device="cpu"):
        assert all(torch.equal(p, s) for p, s in zip(params, saved))
    torch.cuda.synchronize()
    assert all(torch.equal(p, x) for p, x in zip(params, live))


def test_snapshot_copies_run_on_a_side_stream_into_reused_pinned_buffers():
    """``begin_save`` queues the copies on a side stream; the current stream's writes after
    ``wait_saved`` cannot reach them, and the third version lands in the first one's buffers."""
    params = _params()
    store = SnapshotStore(max_versions=2)
    saved, storages = [], []
    for v in range(3):
        store.begin_save(v, params)
        store.wait_saved()
        saved.append([p.clone() for p in params])
        for p in params:
            p.mul_(2)  # the optimizer step, on the current stream
        storages.append([t.untyped_storage().data_ptr() for t in store.get(v)])
    assert storages[2] == storages[0]
    assert all(t.is_pinned() for t in store.get(2))
    assert all(torch.equal(t.cuda(), s) for t, s in zip(store.get(2), saved[2]))
    assert all(torch.equal(t.cuda(), s) for t, s in zip(store.get(1), saved[1]))


def test_a_snapshot_is_one_registered_buffer_of_its_exact_bytes():
    """PyTorch's caching host allocator rounds each pinned allocation up to a power of two (2.1x the
    bytes at Qwen2.5-7B's shapes); a snapshot is one buffer page-locked with cudaHostRegister instead."""
    params = [torch.zeros(s, device="cuda") for s in [(1000, 33), (7,), (4096,)]]
    store = SnapshotStore(max_versions=1)
    store.save(0, params)
    bufs = store.get(0)
    assert all(b.is_pinned() for b in bufs)
    assert len({b.untyped_storage().data_ptr() for b in bufs}) == 1
    assert bufs[0].untyped_storage().nbytes() == sum(-(-p.numel() * 4 // 512) * 512 for p in params)


def test_a_bf16_snapshot_of_fp32_cuda_params_swaps_in_their_bf16_values():
    """snapshot.dtype=bf16: the narrowing cast runs on the copy stream; the swapped-in fp32 values cast
    to bfloat16 (what FSDP's bf16 all-gather does) equal the saved weights' cast; the restore is exact."""
    g = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(s, device="cuda", generator=g) for s in [(1000, 33), (7,), (4096,)]]
    saved = [p.to(torch.bfloat16) for p in params]
    store = SnapshotStore(max_versions=1, float32_as=torch.bfloat16)
    store.begin_save(0, params)
    store.wait_saved()
    for p in params:
        p.add_(1.0)  # the optimizer step, ordered after the copy by wait_saved
    live = [p.clone() for p in params]
    assert all(b.dtype == torch.bfloat16 and b.is_pinned() for b in store.get(0))
    with store.swap_in(0, params, backup_device="cpu"):
        assert all(torch.equal(p.to(torch.bfloat16), s) for p, s in zip(params, saved))
    torch.cuda.synchronize()
    assert all(torch.equal(p, x) for p, x in zip(params, live))
