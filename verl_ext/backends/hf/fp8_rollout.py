"""fp8 rollout in the ``hf`` server: it computes the way vLLM's online fp8 does.

verl's ``actor_rollout_ref.rollout.quantization=fp8`` makes vLLM quantize the rollout model on the
fly (``vllm_async_server._apply_quantization`` in verl 0.9.1): every linear layer of the decoder
gets e4m3 weights in 128 x 128 blocks, each block scaled by its absolute maximum, and e4m3
activations quantized per token in groups of 128 ("dynamic"); the embedding and the LM head stay
in the model's dtype. The FSDP trainer keeps computing in bf16/fp32, so the rollout samples from,
and reports log-probs of, a different distribution: the heavy-tailed train/inference mismatch of
fp8 deployments.

This module reproduces those roundings in the ``hf`` server (round to ``torch.float8_e4m3fn`` and
scale back: "fake quantization", deterministic), so the sampler itself draws from the quantized
model, not only its reported log-probs, and the cpu backend exercises the same mismatch in CI.
It departs from vLLM in the matrix product: vLLM multiplies e4m3 operands with fp32 accumulation,
here the dequantized operands are multiplied in the model's dtype; the rounding of both operands,
the source of the mismatch, is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0  # the largest finite torch.float8_e4m3fn
BLOCK = 128  # vLLM's weight block and activation group (verl's FP8_BLOCK_QUANT_KWARGS)
SUPPORTED = ("fp8",)


def _round_e4m3(blocks: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Round fp32 ``blocks`` to e4m3, each block (the values sharing ``dims``) scaled so that its
    absmax maps to e4m3's largest value, and scale back."""
    scale = blocks.abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (blocks / scale).to(torch.float8_e4m3fn).float() * scale


def fake_quantize_weight(weight: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Round a linear layer's weight to e4m3 in ``block x block`` tiles, each scaled by its absmax.

    Args:
        weight: ``(out_features, in_features)``, any float dtype.

    Returns:
        The dequantized weight, same shape and dtype.
    """
    rows, cols = weight.shape
    padded = F.pad(weight.float(), (0, -cols % block, 0, -rows % block))
    tiles = padded.reshape(padded.shape[0] // block, block, padded.shape[1] // block, block)
    return _round_e4m3(tiles, (1, 3)).reshape(padded.shape)[:rows, :cols].to(weight.dtype)


def fake_quantize_activation(x: torch.Tensor, group: int = BLOCK) -> torch.Tensor:
    """Round activations to e4m3 per token in groups of ``group`` along the last dimension, each
    group scaled by its absmax (vLLM's dynamic per-token-group activation quantization).

    Args:
        x: ``(..., in_features)``, any float dtype.

    Returns:
        The dequantized activations, same shape and dtype.
    """
    width = x.shape[-1]
    group = min(group, width)  # a row narrower than a group is one group: no padding to scale
    padded = F.pad(x.float(), (0, -width % group))
    groups = padded.reshape(*padded.shape[:-1], padded.shape[-1] // group, group)
    return _round_e4m3(groups, (-1,)).reshape(padded.shape)[..., :width].to(x.dtype)


def quantized_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The layers vLLM's fp8 path quantizes: every ``nn.Linear`` except the LM head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]


class Fp8Rollout:
    """Keeps a model's linear layers in simulated fp8: activations through a forward pre-hook,
    weights rounded now and after every weight load (``requantize``).

    Args:
        model: the rollout model (transformers causal LM).
        scheme: ``actor_rollout_ref.rollout.quantization``; only ``"fp8"``.
    """

    def __init__(self, model: torch.nn.Module, scheme: str) -> None:
        if scheme not in SUPPORTED:
            raise ValueError(
                f"actor_rollout_ref.rollout.quantization={scheme!r} is not supported by the hf rollout; "
                f"use one of {list(SUPPORTED)} or null"
            )
        self.linears = quantized_linears(model)
        for layer in self.linears:
            layer.register_forward_pre_hook(lambda _module, args: (fake_quantize_activation(args[0]), *args[1:]))
        self.requantize()

    @torch.no_grad()
    def requantize(self) -> None:
        """Round the current weights (after the trainer sent a new version)."""
        for layer in self.linears:
            layer.weight.copy_(fake_quantize_weight(layer.weight))
