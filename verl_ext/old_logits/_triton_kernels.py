"""Triton kernels (imported only on CUDA machines with Triton; see ``fused_add.py``)."""

import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(
    acc_ptrs,
    src_ptrs,
    numels,
    chunk_tensor,
    chunk_start,
    alpha,
    SRC_BF16: tl.constexpr,
    SRC_F16: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """acc[t][o : o + BLOCK] += alpha * float(src[t][o : o + BLOCK]) for the program's (t, o)."""
    pid = tl.program_id(0)
    t = tl.load(chunk_tensor + pid)
    start = tl.load(chunk_start + pid)
    n = tl.load(numels + t)
    acc = tl.load(acc_ptrs + t).to(tl.pointer_type(tl.float32))
    if SRC_BF16:
        src = tl.load(src_ptrs + t).to(tl.pointer_type(tl.bfloat16))
    elif SRC_F16:
        src = tl.load(src_ptrs + t).to(tl.pointer_type(tl.float16))
    else:
        src = tl.load(src_ptrs + t).to(tl.pointer_type(tl.float32))
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(acc + offs, mask=mask)
    x = tl.load(src + offs, mask=mask).to(tl.float32)
    tl.store(acc + offs, a + alpha * x, mask=mask)
