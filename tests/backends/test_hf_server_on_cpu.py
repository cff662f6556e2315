"""The hf rollout server's protocol as verl drives it: concurrent generate, abort/resume for
partial rollouts, weight updates stamped with the weight version. Runs the server class in
this process's event loop (verl makes it a Ray actor; the protocol is the same)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from verl.workers.config import HFModelConfig, RolloutConfig

from verl_ext.backends.hf.rollout import HFRolloutServer
from verl_ext.backends.hf.wire import named_to_wire


@pytest.fixture
def server(tiny_model_dir):
    config = RolloutConfig(name="hf", prompt_length=32, response_length=24, tensor_model_parallel_size=1, dtype="float32")
    return HFRolloutServer(config=config, model_config=HFModelConfig(path=tiny_model_dir), replica_rank=0)


PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}


async def test_concurrent_requests_complete_with_versioned_tokens(server):
    await server.set_global_steps(3)
    outputs = await asyncio.gather(
        *[server.generate(prompt_ids=[5, 6, 7 + i], sampling_params=dict(PARAMS), request_id=str(i)) for i in range(6)]
    )
    for out in outputs:
        # default budget = min(response_length, prompt+response-len(prompt)), as vLLM
        assert len(out.token_ids) == 24 == len(out.log_probs)
        assert out.stop_reason == "completed"
        assert out.extra_fields["global_steps"] == 3
        assert out.extra_fields["token_global_steps"] == [3] * 24


async def test_max_tokens_is_respected_and_logprobs_optional(server):
    out = await server.generate(
        prompt_ids=[1, 2], sampling_params={**PARAMS, "max_tokens": 5, "logprobs": False}, request_id="a"
    )
    assert len(out.token_ids) == 5 and out.log_probs is None


async def test_prompt_longer_than_the_model_window_is_a_clear_error(server):
    with pytest.raises(ValueError, match="max_model_len"):
        await server.generate(prompt_ids=list(range(60)), sampling_params=dict(PARAMS), request_id="long")


async def test_abort_returns_partial_output_and_resume_continues_under_the_new_version(server):
    # Make decoding slow enough to be interrupted mid-request, and know when it has decoded tokens.
    original_forward = server.engine.model.forward
    forwards = []
    decoding = threading.Event()

    def slow_forward(*args, **kwargs):
        time.sleep(0.02)
        forwards.append(1)
        if len(forwards) >= 3:  # the prompt's forward and two decoding steps
            decoding.set()
        return original_forward(*args, **kwargs)

    server.engine.model.forward = slow_forward
    await server.set_global_steps(1)
    params = {**PARAMS, "max_tokens": 200}
    task = asyncio.create_task(server.generate(prompt_ids=[3, 4, 5], sampling_params=params, request_id="r"))
    assert await asyncio.to_thread(decoding.wait, 60), "the request never started decoding"
    result = await server.abort_all_requests()
    partial = await task
    assert result["aborted_count"] == 1
    assert partial.stop_reason == "aborted"
    assert 0 < len(partial.token_ids) < 200 and len(partial.log_probs) == len(partial.token_ids)

    # While paused, a new request parks until resume (the FullyAsync client's retry does this).
    parked = asyncio.create_task(
        server.generate(prompt_ids=[3, 4, 5, *partial.token_ids], sampling_params={**PARAMS, "max_tokens": 3}, request_id="r")
    )
    await asyncio.sleep(0.1)
    assert not parked.done()
    state = named_to_wire((name, tensor.clone()) for name, tensor in server.engine.model.state_dict().items())
    assert await server.update_weights(state, global_steps=2) == len(state)
    await server.resume_generation()
    resumed = await parked
    assert resumed.stop_reason == "completed"
    assert resumed.extra_fields["token_global_steps"] == [2] * 3
    assert partial.extra_fields["token_global_steps"] == [1] * len(partial.token_ids)


async def test_abort_with_reject_fails_new_requests_fast(server):
    await server.abort_all_requests(reject_request=True)
    out = await server.generate(prompt_ids=[1, 2], sampling_params=dict(PARAMS), request_id="x")
    assert out.stop_reason == "aborted" and out.token_ids == []
    await server.resume_generation()
    out = await server.generate(prompt_ids=[1, 2], sampling_params={**PARAMS, "max_tokens": 2}, request_id="y")
    assert out.stop_reason == "completed"


async def test_update_weights_changes_the_policy(server):
    params = {**PARAMS, "temperature": 0.0, "max_tokens": 6}
    before = await server.generate(prompt_ids=[7, 8, 9], sampling_params=dict(params), request_id="b")
    torch.manual_seed(1)
    state = {name: torch.randn_like(t) for name, t in server.engine.model.state_dict().items()}
    await server.update_weights(named_to_wire(state.items()), global_steps=5)
    after = await server.generate(prompt_ids=[7, 8, 9], sampling_params=dict(params), request_id="c")
    assert after.log_probs != before.log_probs
    assert after.extra_fields["global_steps"] == 5


async def test_multimodal_input_is_refused_with_a_reason(server):
    with pytest.raises(NotImplementedError, match="text-only"):
        await server.generate(prompt_ids=[1], sampling_params=dict(PARAMS), request_id="m", image_data=[object()])


def test_rollout_dtype_makes_a_small_mismatch_with_the_fp32_trainer(tiny_model_dir):
    """``actor_rollout_ref.rollout.dtype=bfloat16``: the server computes in bf16, the trainer in fp32;
    the log-probs of the same tokens then differ by bf16 rounding, not more."""
    from verl_ext.backends.hf.rollout import rollout_dtype

    config = RolloutConfig(name="hf", prompt_length=32, response_length=24, tensor_model_parallel_size=1,
                           dtype="bfloat16")
    bf16 = HFRolloutServer(config=config, model_config=HFModelConfig(path=tiny_model_dir), replica_rank=0)
    fp32 = HFRolloutServer(config=config, model_config=HFModelConfig(path=tiny_model_dir), replica_rank=0,
                           dtype=torch.float32)
    assert bf16.engine.model.dtype == torch.bfloat16 and fp32.engine.model.dtype == torch.float32
    ids = torch.randint(0, bf16.engine.model.config.vocab_size, (4, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        low, high = (s.engine.model(input_ids=ids).logits.float().log_softmax(-1) for s in (bf16, fp32))
    gap = (low - high).abs().max().item()
    assert 0 < gap < 0.1, gap
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.dtype"):
        rollout_dtype("int8")
