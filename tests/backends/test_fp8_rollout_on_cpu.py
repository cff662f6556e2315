"""The cpu backend's fp8 rollout (``actor_rollout_ref.rollout.quantization=fp8``): vLLM's online
fp8 roundings (e4m3 weights in 128 x 128 blocks, e4m3 activations per token in groups of 128) in
the ``hf`` server, so the sampler draws from the quantized model."""

from __future__ import annotations

import asyncio

import pytest
import torch
from verl.workers.config import HFModelConfig, RolloutConfig

from verl_ext.backends.hf.fp8_rollout import (
    E4M3_MAX,
    Fp8Rollout,
    fake_quantize_activation,
    fake_quantize_weight,
    quantized_linears,
)
from verl_ext.backends.hf.old_logit_scorer import HFOldLogitScorer
from verl_ext.backends.hf.rollout import HFRolloutServer
from verl_ext.backends.hf.wire import named_to_wire

# e4m3 keeps 3 mantissa bits: a normal value rounds to within 2^-4 of itself
E4M3_REL_ERROR = 2.0**-4


def test_weight_rounding_is_e4m3_per_128_block():
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(0))
    w[:128, :128] *= 1000  # one block with a much larger scale must not coarsen its neighbours
    q = fake_quantize_weight(w)
    assert q.shape == w.shape and q.dtype == w.dtype
    assert torch.equal(fake_quantize_weight(q), q), "rounding twice must change nothing"
    for r in (slice(0, 128), slice(128, 200)):
        for c in (slice(0, 128), slice(128, 256), slice(256, 300)):
            block, rounded = w[r, c], q[r, c]
            scale = block.abs().max() / E4M3_MAX
            # the block's largest value maps to e4m3's largest exactly
            assert torch.isclose(rounded.abs().max(), block.abs().max(), rtol=1e-6)
            normal = block.abs() > scale * 2.0**-6  # e4m3's smallest normal
            rel = ((rounded - block).abs() / block.abs())[normal]
            assert rel.max() <= E4M3_REL_ERROR + 1e-6
    assert (q != w).float().mean() > 0.5, "most values are not e4m3-representable and must move"


def test_activation_rounding_is_per_token_and_per_group_of_128():
    x = torch.randn(3, 5, 200, generator=torch.Generator().manual_seed(1))
    q = fake_quantize_activation(x)
    assert q.shape == x.shape
    y = x.clone()
    y[1, 2, :128] *= 1e4  # another token, and another group of the same token, are unaffected
    qy = fake_quantize_activation(y)
    others = torch.ones_like(x, dtype=torch.bool)
    others[1, 2, :128] = False
    assert torch.equal(qy[others], q[others])
    assert torch.equal(fake_quantize_activation(q), q)


def _config(**kw) -> RolloutConfig:
    return RolloutConfig(name="hf", prompt_length=32, response_length=24, tensor_model_parallel_size=1, **kw)


def test_fp8_server_samples_from_the_quantized_model_and_requantizes_new_weights(tiny_model_dir):
    model_config = HFModelConfig(path=tiny_model_dir)
    fp8 = HFRolloutServer(config=_config(dtype="float32", quantization="fp8"), model_config=model_config, replica_rank=0)
    bf16 = HFRolloutServer(config=_config(dtype="bfloat16"), model_config=model_config, replica_rank=0)
    fp32 = HFRolloutServer(config=_config(dtype="float32"), model_config=model_config, replica_rank=0)
    linears = quantized_linears(fp8.engine.model)
    assert linears and fp8.engine.model.get_output_embeddings() not in linears
    assert all(torch.equal(fake_quantize_weight(m.weight), m.weight) for m in linears)

    ids = torch.randint(0, fp32.engine.model.config.vocab_size, (4, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact, low, quant = (s.engine.model(input_ids=ids).logits.float().log_softmax(-1) for s in (fp32, bf16, fp8))
    # fp8's 3 mantissa bits move the log-probs far more than bf16's 8
    assert (quant - exact).abs().mean() > 4 * (low - exact).abs().mean() > 0

    torch.manual_seed(2)
    state = {name: torch.randn_like(t) * 0.02 for name, t in fp8.engine.model.state_dict().items()}
    asyncio.run(fp8.update_weights(named_to_wire(state.items()), global_steps=1))
    assert all(torch.equal(fake_quantize_weight(m.weight), m.weight) for m in linears), "new weights not rounded"


def test_dedicated_scorer_keeps_the_training_numerics(tiny_model_dir):
    scorer = HFOldLogitScorer(config=_config(dtype="float32", quantization="fp8"),
                              model_config=HFModelConfig(path=tiny_model_dir), servers=[], temperature=1.0,
                              sync_timeout_s=1.0)
    weights = [m.weight for m in quantized_linears(scorer.engine.model)]
    assert any(not torch.equal(fake_quantize_weight(w), w) for w in weights)


def test_unknown_scheme_names_the_key():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.quantization='int4'"):
        Fp8Rollout(torch.nn.Linear(4, 4), "int4")

