"""Shared fixtures: a fake judge server on 127.0.0.1 (real HTTP, real batching code path) and a
tiny random Qwen2 model directory."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from verl_ext.rewards.dvreward.judge_backends import FakeBackend
from verl_ext.rewards.dvreward.judge_server import ServerThread

# the DVReward golden example (JunyiWuCode/AlphaGRPO, alpha_grpo/rewards/rewards.py): 3 questions with p = 0.9 / 0.3 / 0.8 give geometric 0.6929,
# mean 0.7000, sum_mean 0.6667. Only semantic = (0.9, 0.3), quality = (0.8,) reproduces all three:
# sqrt(0.6 * 0.8) = 0.69282, 0.5 * 0.6 + 0.5 * 0.8 = 0.7, (0.9 + 0.3 + 0.8) / 3 = 0.66667. The note's
# 0.6929 is 8e-5 above the exact 0.69282, so comparisons use the note's precision (abs=1e-4).
GOLDEN_P = {
    "Is there a red car in the picture?": 0.9,
    "Is the red car parked behind a tree?": 0.3,
    "Is the picture free of visual artifacts?": 0.8,
}
GOLDEN_KINDS = ["semantic", "semantic", "quality"]
GOLDEN = {"geometric": 0.6929, "mean": 0.7000, "sum_mean": 0.6667}


@pytest.fixture
def golden() -> dict:
    """The golden example: question -> p, kinds in that order, expected score per aggregation."""
    return {"p": dict(GOLDEN_P), "kinds": list(GOLDEN_KINDS), "score": dict(GOLDEN)}


class FakeJudge:
    """A running fake judge: ``url`` for clients, ``requests()`` from the server's own counter."""

    def __init__(self, server: ServerThread) -> None:
        self.server = server
        self.url = server.url
        self.address = f"127.0.0.1:{server.port}"

    def requests(self) -> int:
        return httpx.get(self.url.removesuffix("/v1") + "/stats").json()["requests"]


@pytest.fixture
def fake_judge():
    """Factory: ``fake_judge(spec, **app_kwargs)`` starts a server; all are stopped at teardown."""
    servers: list[ServerThread] = []

    def start(spec, **app_kwargs) -> FakeJudge:
        server = ServerThread(FakeBackend(spec), **app_kwargs).__enter__()
        servers.append(server)
        return FakeJudge(server)

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from verl_ext.tiny_model import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")), seed=0)


@pytest.fixture
def silent_judge() -> Iterator[str]:
    """The URL of a judge that never answers: a socket on 127.0.0.1 that listens (the kernel
    accepts connections into its backlog) and never reads or writes."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
