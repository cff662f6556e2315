"""The hf rollout's sampler: log-probs, sampling controls, stopping, abort, weight loading."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_ext.backends.hf.hf_engine import GenerationRequest, HFGenerationEngine, _filter_top_k_top_p


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def engine(model_and_tokenizer):
    model, tok = model_and_tokenizer
    # No EOS stop, so every request runs to its budget unless a test sets stop tokens.
    return HFGenerationEngine(model, eos_token_ids=[], pad_token_id=tok.pad_token_id, seed=0)


def _full_forward_log_probs(model, request: GenerationRequest) -> torch.Tensor:
    """What verl's actor computes: one forward over prompt+response, logits / temperature."""
    ids = torch.tensor([request.prompt_ids + request.tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(request.prompt_ids) - 1 : -1].float()
    temperature = request.temperature or 1.0
    return (logits / temperature).log_softmax(-1).gather(1, torch.tensor(request.tokens)[:, None]).squeeze(1)


def test_log_probs_equal_a_full_forward_for_each_row_of_a_mixed_batch(engine, model_and_tokenizer):
    model, tok = model_and_tokenizer
    requests = [
        GenerationRequest(prompt_ids=tok("What is 3 plus 4?")["input_ids"], max_tokens=12),
        GenerationRequest(prompt_ids=tok("hi")["input_ids"], max_tokens=9, temperature=0.7, top_k=20, top_p=0.9),
        GenerationRequest(prompt_ids=tok("mail inbox subject")["input_ids"], max_tokens=5, temperature=1.3),
    ]
    engine.generate(requests)
    for request in requests:
        assert len(request.tokens) == request.max_tokens and request.finish_reason == "length"
        expected = _full_forward_log_probs(model, request)
        torch.testing.assert_close(torch.tensor(request.log_probs), expected, atol=1e-5, rtol=0)


def test_greedy_and_top_k_1_pick_the_argmax(engine, model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = tok("click type scroll")["input_ids"]
    greedy = GenerationRequest(prompt_ids=prompt, max_tokens=8, temperature=0.0)
    top1 = GenerationRequest(prompt_ids=prompt, max_tokens=8, temperature=1.0, top_k=1)
    engine.generate([greedy, top1])
    ids = list(prompt)
    for _ in range(8):  # reference greedy decode without a KV cache
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert greedy.tokens == ids[len(prompt) :]
    assert top1.tokens == greedy.tokens


def test_top_p_and_top_k_filter_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    out = _filter_top_k_top_p(logits, top_k=torch.tensor([-1, 2]), top_p=torch.tensor([0.8, 1.0]))
    kept = torch.isfinite(out)
    # row 0: 0.5 + 0.3 reaches 0.8, so the nucleus is the first two tokens; row 1: top-2.
    assert kept.tolist() == [[True, True, False, False], [True, True, False, False]]


def test_stop_tokens_end_a_request_and_are_included(engine, model_and_tokenizer):
    _, tok = model_and_tokenizer
    prompt = tok("settings calendar")["input_ids"]
    probe = GenerationRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0)
    engine.generate([probe])
    stop_at = probe.tokens[2]
    request = GenerationRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0, stop_token_ids=frozenset({stop_at}))
    engine.generate([request])
    first = probe.tokens.index(stop_at)
    assert request.tokens == probe.tokens[: first + 1] and request.finish_reason == "stop"


def test_eos_stops_unless_ignore_eos(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = tok("files folder")["input_ids"]
    probe_engine = HFGenerationEngine(model, eos_token_ids=[], pad_token_id=tok.pad_token_id)
    probe = GenerationRequest(prompt_ids=prompt, max_tokens=5, temperature=0.0)
    probe_engine.generate([probe])
    engine = HFGenerationEngine(model, eos_token_ids=[probe.tokens[0]], pad_token_id=tok.pad_token_id)
    stopped = GenerationRequest(prompt_ids=prompt, max_tokens=5, temperature=0.0)
    ignored = GenerationRequest(prompt_ids=prompt, max_tokens=5, temperature=0.0, ignore_eos=True)
    engine.generate([stopped, ignored])
    assert stopped.tokens == probe.tokens[:1] and stopped.finish_reason == "stop"
    assert ignored.tokens == probe.tokens and ignored.finish_reason == "length"


def test_abort_keeps_the_partial_output(engine, model_and_tokenizer):
    _, tok = model_and_tokenizer
    request = GenerationRequest(prompt_ids=tok("hi")["input_ids"], max_tokens=50)
    calls = iter(range(1000))
    engine.generate([request], should_abort=lambda: next(calls) >= 4)
    assert request.finish_reason == "abort"
    assert len(request.tokens) == 4 == len(request.log_probs)


def test_load_weights_changes_generation_and_rejects_unknown_names(model_and_tokenizer, tiny_model_dir):
    _, tok = model_and_tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine = HFGenerationEngine(model, eos_token_ids=[], pad_token_id=tok.pad_token_id)
    prompt = tok("What is 1 plus 1?")["input_ids"]
    before = GenerationRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0)
    engine.generate([before])
    new_state = {name: torch.randn_like(t) for name, t in model.state_dict().items()}
    assert engine.load_weights(new_state.items()) == len(new_state)
    after = GenerationRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0)
    engine.generate([after])
    assert after.log_probs != before.log_probs
    with pytest.raises(KeyError, match="not_a_weight"):
        engine.load_weights([("not_a_weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])


@pytest.mark.parametrize(
    "kwargs, match",
    [({"prompt_ids": []}, "prompt_ids"), ({"max_tokens": 0}, "max_tokens"), ({"top_p": 0.0}, "top_p"), ({"temperature": -1}, "temperature")],
)
def test_bad_requests_are_rejected_with_the_field_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GenerationRequest(**{"prompt_ids": [1, 2], "max_tokens": 4, **kwargs})
