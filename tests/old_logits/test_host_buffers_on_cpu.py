"""Host copies of weights: one exactly sized buffer per copy, and swap backups reused across swaps."""

import torch

from verl_ext.old_logits.swap import WeightSwap, host_buffers_like

SHAPES_DTYPES = [((3, 5), torch.float32), ((7,), torch.bfloat16), ((), torch.float32), ((0, 4), torch.float32),
                 ((129,), torch.int64), ((2, 2), torch.float16)]


def _tensors():
    return [torch.zeros(shape, dtype=dtype) for shape, dtype in SHAPES_DTYPES]


def test_views_share_one_buffer_of_their_aligned_bytes():
    like = _tensors()
    views = host_buffers_like(like, pin_memory=True)  # no CUDA here: unpinned, same layout
    assert [(v.shape, v.dtype) for v in views] == [(t.shape, t.dtype) for t in like]
    assert len({v.untyped_storage().data_ptr() for v in views}) == 1
    aligned = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in like)
    assert views[0].untyped_storage().nbytes() == aligned
    assert all(v.storage_offset() * v.element_size() % 512 == 0 for v in views)


def test_views_do_not_overlap():
    views = host_buffers_like(_tensors(), pin_memory=False)
    for i, v in enumerate(views):
        v.fill_(i + 1)
    for i, v in enumerate(views):
        assert torch.all(v == i + 1), f"view {i} was overwritten by a later one"


def test_host_backup_is_reused_by_the_next_swap_and_not_by_a_nested_one():
    params = [torch.randn(64, 3), torch.randn(5)]
    live = [p.clone() for p in params]

    def write_zeros(targets):
        for t in targets:
            t.zero_()

    first = WeightSwap(params, write_zeros, backup_device="cpu")
    first_backup = [b.data_ptr() for b in first.backup]
    nested = WeightSwap(params, write_zeros, backup_device="cpu")  # the first one's backup is in use
    assert not {b.data_ptr() for b in nested.backup} & set(first_backup)
    nested.swap_out()
    first.swap_out()
    assert all(torch.equal(p, x) for p, x in zip(params, live))
    with WeightSwap(params, write_zeros, backup_device="cpu") as again:
        assert [b.data_ptr() for b in again.backup] == first_backup  # no new host allocation
        assert all(torch.count_nonzero(p) == 0 for p in params)
    assert all(torch.equal(p, x) for p, x in zip(params, live))
