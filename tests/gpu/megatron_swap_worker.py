"""The body of ``test_megatron.py::test_swapped_weights_are_what_the_megatron_forward_uses``: one
process, one GPU, a Megatron-Core GPT (TransformerEngine layers, Qwen2-style: RMSNorm, SwiGLU,
GQA, QKV bias) in Megatron's DDP with the distributed optimizer, as verl's Megatron engine builds
it (bf16 model parameters in DDP's contiguous buffer, fp32 main parameters in the optimizer).

Checked, for the ``snapshot`` and ``ewma`` providers' state (``OldLogitWorkerState``) over
``local_parameters`` of the model chunk list:

- the tracked tensors are the bf16 model parameters (views of DDP's parameter buffer), not the
  optimizer's fp32 main parameters;
- after a real optimizer step, the forward under ``snapshot:0`` equals the forward before the step
  bit for bit, and under ``ewma`` the forward of the model with the bf16 EWMA written in by hand;
- after the swap the forward is the live one again, the live bf16 parameters are restored bit for
  bit and the fp32 main parameters were never touched; a second optimizer step after the swap
  gives the same weights as one without a swap.

Run as ``python tests/gpu/megatron_swap_worker.py`` (one GPU) or ``torchrun --nproc-per-node 2
tests/gpu/megatron_swap_worker.py`` (tensor parallel over 2 GPUs: every rank checks its shard);
exits non-zero with the failed check.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F

BETA = 0.5
VOCAB, SEQ = 512, 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build():  # noqa: ANN201 - (ddp model, optimizer)
    """The model and optimizer, initialised from seed 0 (the same weights on every call)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)  # Megatron initialises TP-parallel weights from its own RNG tracker
    config = TransformerConfig(
        num_layers=2, hidden_size=128, ffn_hidden_size=256, num_attention_heads=4, num_query_groups=2,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=True, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        attention_backend=AttnBackend.fused, hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = GPTModel(config, get_gpt_layer_with_transformer_engine_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ, position_embedding_type="rope").cuda()  # fmt: skip
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, use_distributed_optimizer=True), [ddp]
    )
    return ddp, optimizer


def forward(model, tokens: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(SEQ, device=tokens.device).expand_as(tokens)
    return model(tokens, positions, None)  # causal attention from the layer spec


def train_step(model, optimizer, tokens: torch.Tensor, state) -> None:  # noqa: ANN001
    state.before_optimizer_step(state.version)
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = forward(model, tokens)  # [batch, seq, vocab / TP]: this rank's slice of the vocabulary
    vocab_parallel_cross_entropy(logits.float(), tokens.roll(-1, 1)).mean().backward()
    model.finish_grad_sync()
    ok, _, _ = optimizer.step()
    assert ok, "Megatron optimizer step failed"
    state.after_optimizer_step()
    model.zero_grad_buffer()
    optimizer.zero_grad()


def main_params(optimizer) -> list[torch.Tensor]:  # noqa: ANN001
    return [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]


def check(provider: str) -> None:
    from verl_ext.old_logits import OldLogitsConfig, OldLogitWorkerState
    from verl_ext.old_logits.swap import local_parameters

    model, optimizer = build()
    chunks = [model]  # verl's Megatron engine: a list of model chunks
    params = local_parameters(chunks)
    buffer = [b.param_data for b in model.buffers]
    assert all(p.dtype == torch.bfloat16 for p in params), "tracked parameters must be the bf16 model parameters"
    assert all(any(p.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in buffer) for p in params), \
        "tracked parameters must be views of DDP's parameter buffer"
    fp32_main = main_params(optimizer)
    assert fp32_main and all(p.dtype == torch.float32 for p in fp32_main), "distributed optimizer keeps fp32 main params"

    config = OldLogitsConfig.from_config({"provider": provider, "ewma": {"beta": BETA}}, max_off_policy_threshold=2)
    state = OldLogitWorkerState(config, params, backup_device="cpu", modules=chunks)
    tokens = torch.randint(0, VOCAB, (2, SEQ), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    model.eval()
    with torch.no_grad():
        before = forward(model, tokens)
        theta0 = [p.detach().float().clone() for p in params]
    model.train()
    train_step(model, optimizer, tokens, state)  # version 0's only step
    state.version = 1
    model.eval()
    with torch.no_grad():
        live = forward(model, tokens)
        theta1 = [p.detach().clone() for p in params]
        main_before_swap = main_params(optimizer)
        assert not torch.equal(live, before), "the optimizer step did not change the forward"
        spec = "snapshot:0" if provider == "snapshot" else "ewma"
        if provider == "ewma":  # bias-corrected EWMA after one update: (β θ0 + θ1) / (β + 1), then bf16
            expected_weights = [((BETA * a + b.float()) / (BETA + 1)).to(torch.bfloat16) for a, b in zip(theta0, theta1)]
            for p, w in zip(params, expected_weights):
                p.copy_(w)
            expected = forward(model, tokens)  # the EWMA written in by hand
            for p, t in zip(params, theta1):
                p.copy_(t)
        else:
            expected = before
        with state.weights(spec):
            swapped = forward(model, tokens)
            if provider == "ewma":
                assert all(torch.equal(p, w) for p, w in zip(params, expected_weights)), "EWMA weights not swapped in"
        restored = forward(model, tokens)
    torch.testing.assert_close(swapped, expected, rtol=0, atol=0)
    torch.testing.assert_close(restored, live, rtol=0, atol=0)
    assert all(torch.equal(p, t) for p, t in zip(params, theta1)), "live bf16 parameters not restored bit for bit"
    assert all(torch.equal(a, b) for a, b in zip(main_params(optimizer), main_before_swap)), "fp32 main params touched"
    # the next step starts from the restored weights: the same as a step with no swap before it
    model.train()
    train_step(model, optimizer, tokens, state)
    after_swap = [p.detach().clone() for p in params]
    twin, twin_optimizer = build()
    assert all(torch.equal(p.float(), t) for p, t in zip(local_parameters([twin]), theta0)), "build() is not repeatable"
    twin_state = OldLogitWorkerState(config, local_parameters([twin]), backup_device="cpu", modules=[twin])
    for _ in range(2):
        train_step(twin, twin_optimizer, tokens, twin_state)
    assert all(torch.equal(a, b) for a, b in zip(after_swap, local_parameters([twin]))), \
        "a swap changed the next optimizer step"
    print(f"rank {dist.get_rank()}: {provider}: forward under {spec} = expected bit for bit; live weights and "
          "fp32 main params intact", flush=True)


def main() -> None:
    """One process on one GPU, or under ``torchrun --nproc-per-node N``: tensor parallel over N
    GPUs, each rank checking its own shard of every parameter and of the logits."""
    if "WORLD_SIZE" not in os.environ:  # run directly: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1",
                          LOCAL_RANK="0")  # fmt: skip
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world, pipeline_model_parallel_size=1)
    try:
        for provider in ("snapshot", "ewma"):
            check(provider)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
