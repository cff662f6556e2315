"""The OpenAI-compatible judge client against a real local server: answers, cache, faults."""

import asyncio
import base64
import logging

import pytest

from verl_ext.rewards.dvreward.judge import Artifact, JudgeOptions, OpenAIJudge, parse_choice
from verl_ext.rewards.dvreward.judge_server import bind
from verl_ext.rewards.dvreward.scoring import aggregate
from verl_ext.rewards.dvreward.transport import Endpoint, RequestFailed


def _judge(url, **endpoint_kwargs) -> OpenAIJudge:
    endpoint_kwargs = {"timeout_s": 10.0, "max_retries": 0, "backoff_s": 0.01, **endpoint_kwargs}
    return OpenAIJudge(Endpoint(url, "judge", **endpoint_kwargs), JudgeOptions(max_concurrency=4))


def test_golden_numbers_through_the_server(fake_judge, golden):
    server = fake_judge(golden["p"])
    judge = _judge(server.url)
    answers = asyncio.run(judge.answer(list(golden["p"]), Artifact.text("a red car parked in front of a tree")))
    assert answers == pytest.approx(list(golden["p"].values()), abs=1e-9)
    for method, expected in golden["score"].items():
        assert aggregate(answers, golden["kinds"], method).score == pytest.approx(expected, abs=1e-4)


def test_cache_answers_repeated_question_artifact_pairs(fake_judge, golden):
    server = fake_judge(golden["p"])
    judge = _judge(server.url)
    questions = list(golden["p"])
    first = asyncio.run(judge.answer_detailed(questions, Artifact.text("A")))
    again = asyncio.run(judge.answer_detailed(questions, Artifact.text("A")))  # a new event loop, too
    other = asyncio.run(judge.answer_detailed(questions[:1], Artifact.text("B")))
    assert again.answers == first.answers
    assert (first.cache_hits, again.cache_hits, other.cache_hits) == (0, 3, 0)
    assert server.requests() == 4
    assert judge.stats.summary()["dv_judge/cache_hit_rate"] == pytest.approx(3 / 7)


def test_image_artifacts_are_sent_as_base64_data_urls(fake_judge):
    png = b"\x89PNG\r\n\x1a\nfake-pixels"
    encoded = base64.b64encode(png).decode()
    # the rule only matches when the image's data URL reaches the server
    server = fake_judge([{"match": [f"data:image/png;base64,{encoded}", "Is the button blue?"], "p_yes": 0.25}])
    answers = asyncio.run(_judge(server.url).answer(["Is the button blue?"], Artifact.image(png)))
    assert answers == [pytest.approx(0.25)]


def test_server_down_gives_none_not_no():
    sock = bind(0)  # a port nobody listens on
    port = sock.getsockname()[1]
    sock.close()
    judge = _judge(f"http://127.0.0.1:{port}/v1", max_retries=1)
    report = asyncio.run(judge.answer_detailed(["Is there a car?", "Is the sky blue?"], Artifact.text("x")))
    assert report.answers == [None, None]
    assert report.failures == {"connect": 2}
    assert judge.stats.summary()["dv_judge/failure_rate"] == 1.0


def test_partial_failures_slow_malformed_and_unknown(fake_judge):
    server = fake_judge(
        {
            "Is there a car?": 0.9,
            "Is the car slow?": {"p_yes": 0.9, "delay_s": 60.0},  # far beyond the client timeout
            "Is the car odd?": {"content": "Maybe."},  # neither yes nor no
        }
    )
    judge = _judge(server.url, timeout_s=5.0)
    questions = ["Is there a car?", "Is the car slow?", "Is the car odd?", "Is nothing matched?"]
    report = asyncio.run(judge.answer_detailed(questions, Artifact.text("x")))
    assert report.answers == [pytest.approx(0.9), None, None, None]
    assert report.failures == {"timeout": 1, "not_yes_no": 2}
    # the failures are not cached: the next call asks again
    again = asyncio.run(judge.answer_detailed(questions, Artifact.text("x")))
    assert again.cache_hits == 1


def test_retries_server_errors_with_backoff(fake_judge):
    server = fake_judge({"Is the door open?": {"p_yes": 0.7, "status": 500, "fail_times": 2}})
    assert asyncio.run(_judge(server.url, max_retries=1).answer(["Is the door open?"], Artifact.text("x"))) == [None]
    # a fresh server fails twice and then answers: two retries reach the answer
    server = fake_judge({"Is the door open?": {"p_yes": 0.7, "status": 500, "fail_times": 2}})
    judge = _judge(server.url, max_retries=2)
    assert asyncio.run(judge.answer(["Is the door open?"], Artifact.text("x"))) == [pytest.approx(0.7)]
    assert judge.stats.requests == 1 and server.requests() == 3


def test_api_key_from_env_is_sent_and_never_logged(fake_judge, monkeypatch, caplog):
    secret = "sk-test-do-not-log-1234"
    monkeypatch.setenv("DV_TEST_KEY", secret)
    server = fake_judge({"Is there a car?": 0.6}, api_key_env="DV_TEST_KEY")
    caplog.set_level(logging.DEBUG)
    ask = lambda judge: asyncio.run(judge.answer_detailed(["Is there a car?"], Artifact.text("x")))  # noqa: E731
    assert ask(_judge(server.url, api_key_env="DV_TEST_KEY")).answers == [pytest.approx(0.6)]
    assert ask(_judge(server.url)).failures == {"http_401": 1}
    monkeypatch.delenv("DV_TEST_KEY")
    assert ask(_judge(server.url, api_key_env="DV_TEST_KEY")).failures == {"no_api_key": 1}
    assert secret not in caplog.text


def test_rate_and_concurrency_limits_still_answer_everything(fake_judge):
    server = fake_judge({"Is there a car?": 0.9, "Is the car red?": 0.2})
    judge = OpenAIJudge(
        Endpoint(server.url, "judge", timeout_s=10.0, max_retries=0),
        JudgeOptions(max_concurrency=1, requests_per_minute=6000),
    )
    answers = asyncio.run(judge.answer(["Is there a car?", "Is the car red?"] * 3, Artifact.text("x")))
    assert answers[:2] == [pytest.approx(0.9), pytest.approx(0.2)]
    assert None not in answers


def test_parse_choice_rejects_bodies_that_are_not_chat_completions():
    for body in [{}, {"choices": []}, {"choices": [{"message": None}]}]:
        with pytest.raises(RequestFailed, match="malformed"):
            parse_choice(body)
