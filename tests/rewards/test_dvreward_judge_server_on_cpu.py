"""`verl-ext judge-server`: batching, the OpenAI response shape, and a tiny random Qwen2 served
through the CLI on 127.0.0.1."""

import asyncio
import json
import math
import os
import subprocess
import sys

import httpx
import pytest

from verl_ext.rewards.dvreward.judge import Artifact, JudgeOptions, OpenAIJudge
from verl_ext.rewards.dvreward.judge_backends import ChatRequest, FakeBackend
from verl_ext.rewards.dvreward.judge_server import Batcher, spawn
from verl_ext.rewards.dvreward.transport import Endpoint


def _request(question: str) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": question}], max_tokens=2, logprobs=True, top_logprobs=2)


@pytest.mark.parametrize("max_batch, expected_batches", [(32, 1), (3, 3)])
def test_concurrent_requests_share_batches(max_batch, expected_batches):
    async def run() -> tuple[list, Batcher]:
        batcher = Batcher(FakeBackend({f"q{i}?": i / 10 for i in range(8)}), max_batch=max_batch, wait_s=0.0)
        worker = asyncio.create_task(batcher.run())
        # all 8 are queued before the batcher wakes up, so batch sizes do not depend on timing
        results = await asyncio.gather(*(batcher.submit(_request(f"q{i}?")) for i in range(8)))
        worker.cancel()
        batcher.close()
        return results, batcher

    results, batcher = asyncio.run(run())
    assert (batcher.stats.requests, batcher.stats.batches) == (8, expected_batches)
    assert batcher.stats.max_batch == min(8, max_batch)
    # each answer belongs to its own request: P(yes) = i / 10 from the yes/no log-probs
    p = [math.exp(dict(c.tokens[0][2]).get("yes", -math.inf)) for c in results]
    assert p == pytest.approx([i / 10 for i in range(8)])


@pytest.fixture(scope="module")
def model_server(tiny_model_dir):
    """`verl-ext judge-server --model <tiny qwen2>` in a subprocess; yields its base URL."""
    with spawn(["--model", tiny_model_dir, "--device", "cpu", "--served-model-name", "tiny"]) as url:
        yield url


def _chat(url: str, question: str, **extra) -> httpx.Response:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 5,
        **extra,
    }
    return httpx.post(url + "/chat/completions", json=body, timeout=60)


def test_model_server_returns_openai_logprobs(model_server):
    body = _chat(model_server, "Is there a red car?").json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    choice = body["choices"][0]
    tokens = choice["logprobs"]["content"]
    assert 1 <= len(tokens) <= 3
    assert choice["message"]["content"] == "".join(t["token"] for t in tokens)
    for t in tokens:
        top = [c["logprob"] for c in t["top_logprobs"]]
        assert len(top) == 5 and top == sorted(top, reverse=True) and top[0] <= 0.0
        assert sum(math.exp(lp) for lp in top) <= 1.0 + 1e-5
        # greedy decoding: the chosen token is the most likely candidate
        assert t["logprob"] == pytest.approx(top[0], abs=1e-5)
    assert httpx.get(model_server + "/models").json()["data"][0]["id"] == "tiny"


def test_model_server_is_deterministic_and_batch_consistent(model_server):
    questions = ["Is there a red car?", "Is the sky blue?", "Does the sign say OPEN?", "Is the cat asleep?"]
    sequential = [_chat(model_server, q).json()["choices"][0] for q in questions]

    async def concurrent():
        async with httpx.AsyncClient(timeout=60) as client:
            bodies = [
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": q}],
                    "max_tokens": 3,
                    "logprobs": True,
                    "top_logprobs": 5,
                }
                for q in questions
            ]
            responses = await asyncio.gather(*(client.post(model_server + "/chat/completions", json=b) for b in bodies))
            return [r.json()["choices"][0] for r in responses]

    batched = asyncio.run(concurrent())
    for one, many in zip(sequential, batched, strict=True):
        assert one["message"]["content"] == many["message"]["content"]
        first_one, first_many = one["logprobs"]["content"][0], many["logprobs"]["content"][0]
        assert first_one["logprob"] == pytest.approx(first_many["logprob"], abs=1e-4)  # left padding is masked


def test_model_server_with_the_judge_client(model_server):
    # A random model rarely says yes/no; whatever it says must come back as a p in [0, 1] or a fault.
    judge = OpenAIJudge(Endpoint(model_server, "tiny", timeout_s=60, max_retries=0), JudgeOptions(max_concurrency=2))
    report = asyncio.run(judge.answer_detailed(["Is there a red car?", "Is the sky blue?"], Artifact.text("a car")))
    assert all(a is None or 0.0 <= a <= 1.0 for a in report.answers)
    assert sum(report.failures.values()) == report.answers.count(None)
    assert set(report.failures) <= {"not_yes_no"}


def test_model_server_refuses_images_and_bad_requests(model_server):
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, {"type": "text", "text": "Q?"}]
    assert _chat(model_server, image).status_code == 400
    assert httpx.post(model_server + "/chat/completions", json={"messages": []}).status_code == 400


def test_fake_mode_cli_binds_loopback(tmp_path):
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"Is there a car?": 0.75}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "verl_ext.cli", "judge-server", "--fake-answers", str(answers)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
        url = line.split()[3]
        judge = OpenAIJudge(Endpoint(url, "fake-judge", timeout_s=10, max_retries=0))
        assert asyncio.run(judge.answer(["Is there a car?"], Artifact.text("x"))) == [pytest.approx(0.75)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def assert_strict_openai_chat_completion(body: dict) -> None:
    """``body`` parses as the official client's ``ChatCompletion`` in pydantic's strict mode, and
    serves every field of the usage and log-prob objects, nullable ones included (the OpenAI
    schema lists ``bytes`` as required; the client's types only make it ``Optional``)."""
    from openai.types.chat import ChatCompletion
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
    from openai.types.completion_usage import CompletionUsage

    parsed = ChatCompletion.model_validate(body, strict=True)
    required = {name for name, f in CompletionUsage.model_fields.items() if f.is_required()}
    assert required <= set(body["usage"]), f"usage lacks {required - set(body['usage'])}"
    assert parsed.usage.total_tokens == parsed.usage.prompt_tokens + parsed.usage.completion_tokens
    for entry in body["choices"][0]["logprobs"]["content"]:
        assert set(ChatCompletionTokenLogprob.model_fields) <= set(entry)
        assert entry["bytes"] == list(entry["token"].encode("utf-8", errors="replace"))
        for top in entry["top_logprobs"]:
            assert set(TopLogprob.model_fields) <= set(top)


@pytest.mark.needs_extra("dev")  # openai
def test_model_server_responses_pass_strict_openai_validation(model_server):
    body = _chat(model_server, "Is there a red car?").json()
    assert_strict_openai_chat_completion(body)
    assert body["usage"]["prompt_tokens"] > len("Is there a red car?".split())  # the chat template's tokens too


@pytest.mark.needs_extra("dev")  # openai
def test_fake_server_responses_pass_strict_openai_validation_and_the_official_client(fake_judge):
    import openai

    judge_server = fake_judge({"red car": 0.9, "sky": 0.8})
    body = httpx.post(judge_server.url + "/chat/completions", json={
        "model": "fake-judge", "messages": [{"role": "user", "content": "Is there a red car?"}],
        "logprobs": True, "top_logprobs": 2}).json()
    assert_strict_openai_chat_completion(body)
    client = openai.OpenAI(base_url=judge_server.url, api_key="unused", max_retries=0)
    response = client.chat.completions.create(model="fake-judge", messages=[{"role": "user", "content": "Is the sky blue?"}],
                                              logprobs=True, top_logprobs=2, max_tokens=1)
    assert response.usage.prompt_tokens == 4 and response.usage.total_tokens == 5
    assert [t.bytes for t in response.choices[0].logprobs.content] == [list(b"yes")]
