"""The fused Triton EWMA update equals the portable torch path (needs CUDA + Triton; skipped
elsewhere, run on a GPU machine with ``python -m pytest tests/old_logits/test_fused_add.py``)."""

import pytest
import torch

from verl_ext.old_logits.fused_add import make_scaled_add, torch_scaled_add

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_equals_torch_path(src_dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(4099,), (3, 5000), (1,), (8192,), (17, 33)]  # sizes around the block size
    src = [torch.randn(s, device="cuda", generator=g).to(src_dtype) for s in shapes]
    acc_fused = [torch.randn(s, device="cuda", generator=g) for s in shapes]
    acc_ref = [a.clone() for a in acc_fused]
    fused = make_scaled_add(acc_fused, src, fused=True)
    for alpha in (0.3, 7.5):
        fused(src, alpha)
        torch_scaled_add(acc_ref)(src, alpha)
    for a, b in zip(acc_fused, acc_ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_reallocated_sources_rebuild_the_table():
    src = [torch.randn(5000, device="cuda", dtype=torch.bfloat16)]
    acc, ref = [torch.zeros(5000, device="cuda")], [torch.zeros(5000, device="cuda")]
    fused = make_scaled_add(acc, src, fused=True)
    moved = [src[0].clone()]  # same values, new storage
    fused(moved, 1.0)
    torch_scaled_add(ref)(moved, 1.0)
    torch.testing.assert_close(acc[0], ref[0])
