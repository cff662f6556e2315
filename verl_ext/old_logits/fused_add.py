"""``acc[i] += alpha * src[i]`` over lists of tensors: the EWMA shadow's per-update pass.

On CUDA a single Triton launch covers every tensor (a multi-tensor kernel reading each source in
its own dtype and each fp32 accumulator once), which reaches the memory-bandwidth floor of
10 bytes per bf16 parameter. PyTorch's ``torch._foreach_add_`` falls back to one
non-vectorised, dtype-casting kernel per tensor when the two lists differ in dtype (bf16 params,
fp32 shadow), measured at 1.6-1.9x the floor on an H200 (docs/results.md). Elsewhere (CPU,
no Triton, non-contiguous tensors) the torch path is used; both compute acc + alpha * float(src).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ScaledAdd = Callable[[list[torch.Tensor], float], None]

_BLOCK = 4096


def torch_scaled_add(acc: list[torch.Tensor]) -> ScaledAdd:
    """The portable path: ``torch._foreach_add_`` (any device, any dtypes)."""

    def run(src: list[torch.Tensor], alpha: float) -> None:
        torch._foreach_add_(acc, src, alpha=alpha)

    return run


def make_scaled_add(acc: list[torch.Tensor], src: list[torch.Tensor], fused: bool | None = None) -> ScaledAdd:
    """Picks the fused Triton path when possible (``fused=None``: automatically; ``True``: required).

    Args:
        acc: fp32 accumulators (the shadow), updated in place.
        src: the tensors that will be added (their storage must stay where it is; checked per call).
    """
    usable = (
        fused is not False
        and bool(acc)
        and all(a.is_cuda and a.dtype == torch.float32 and a.is_contiguous() for a in acc)
        and all(s.is_cuda and s.is_contiguous() for s in src)
        and _triton_available()
    )
    if fused and not usable:
        raise RuntimeError("fused EWMA update needs CUDA, Triton and contiguous fp32 shadow / contiguous params")
    return _TritonScaledAdd(acc, src) if usable else torch_scaled_add(acc)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


class _TritonScaledAdd:
    """One launch per source dtype; a static chunk table maps each program to (tensor, offset)."""

    def __init__(self, acc: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        self._acc = acc
        self._build(src)

    def _build(self, src: list[torch.Tensor]) -> None:
        acc = self._acc
        self._ptrs = [s.data_ptr() for s in src]
        self._groups = []
        for dtype in dict.fromkeys(s.dtype for s in src):
            idx = [i for i, s in enumerate(src) if s.dtype == dtype]
            chunks = [(j, off) for j, i in enumerate(idx) for off in range(0, src[i].numel(), _BLOCK)]
            dev = acc[0].device
            table = {
                "acc": torch.tensor([acc[i].data_ptr() for i in idx], dtype=torch.int64, device=dev),
                "src": torch.tensor([src[i].data_ptr() for i in idx], dtype=torch.int64, device=dev),
                "numel": torch.tensor([src[i].numel() for i in idx], dtype=torch.int64, device=dev),
                "chunk_tensor": torch.tensor([c[0] for c in chunks], dtype=torch.int32, device=dev),
                "chunk_start": torch.tensor([c[1] for c in chunks], dtype=torch.int64, device=dev),
            }
            self._groups.append((dtype, len(chunks), table))

    def __call__(self, src: list[torch.Tensor], alpha: float) -> None:
        if [s.data_ptr() for s in src] != self._ptrs:
            # Parameters were reallocated (e.g. re-sharded): rebuild the pointer tables.
            self._build(src)
        from verl_ext.old_logits._triton_kernels import scaled_add_kernel

        for dtype, n_chunks, t in self._groups:
            scaled_add_kernel[(n_chunks,)](
                t["acc"],
                t["src"],
                t["numel"],
                t["chunk_tensor"],
                t["chunk_start"],
                alpha,
                SRC_BF16=dtype == torch.bfloat16,
                SRC_F16=dtype == torch.float16,
                BLOCK=_BLOCK,
                num_warps=4,
            )
