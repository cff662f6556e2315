"""``verl-ext judge-server``: a local OpenAI-compatible judge on 127.0.0.1.

Serves the subset of ``/v1/chat/completions`` a DVReward judge uses (greedy decoding,
``max_tokens``, ``logprobs``/``top_logprobs``) plus ``/v1/models``, ``/health`` and ``/stats``.
Concurrent requests are queued and answered in batches (one padded forward per decoding step).

Two backends (``verl_ext.rewards.dvreward.judge_backends``) behind the same HTTP and batching code:

* ``--model PATH``: any transformers causal LM with a chat template (CPU, or CUDA when present).
  Text only: a request with an image part gets HTTP 400.
* ``--fake-answers FILE.json``: deterministic answers for tests and benchmarks. The file maps a
  substring of the user message to an answer spec, or is a list of rules::

      {"Is there a red car?": 0.9,                       # P(yes); logprobs of yes and no
       "Is the sky green?": {"p_yes": 0.2, "delay_s": 5},  # answered after 5 s
       "Is it broken?": {"content": "maybe"},           # neither yes nor no
       "Write JSON": {"content": "{...}"},              # any text (question-builder tests)
       "Is the door open?": {"status": 500, "fail_times": 2}}   # HTTP 500 twice, then 0.5
      [{"match": ["red car", "photo of a"], "p_yes": 0.7}]  # all substrings must occur

  The rule whose substrings all occur in the user message and are longest in total wins; a
  request no rule matches is answered "unsure" (neither yes nor no).

The server binds 127.0.0.1 only; ``--port 0`` picks a free port, which is printed (and written
to ``--port-file``) once the server accepts connections.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from verl_ext.cli_args import command_parser, positive_int
from verl_ext.errors import UserError
from verl_ext.rewards.dvreward.judge_backends import Backend, ChatRequest, Completion, HFBackend, load_fake_answers

HOST = "127.0.0.1"


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    max_batch: int = 0


class Batcher:
    """Collects concurrent requests and runs them through the backend in batches.

    The backend runs in one worker thread so the event loop keeps accepting requests while a
    batch computes; everything that queued meanwhile forms the next batch.
    """

    def __init__(self, backend: Backend, max_batch: int = 32, wait_s: float = 0.002) -> None:
        self.backend = backend
        self.max_batch = max_batch
        self.wait_s = wait_s
        self.stats = BatchStats()
        self.queue: asyncio.Queue[tuple[ChatRequest, asyncio.Future[Completion]]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge-backend")

    async def submit(self, request: ChatRequest) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((request, future))
        return await future

    def _drain(self, batch: list) -> None:
        while len(batch) < self.max_batch and not self.queue.empty():
            batch.append(self.queue.get_nowait())

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            self._drain(batch)
            if len(batch) < self.max_batch and self.wait_s > 0:
                await asyncio.sleep(self.wait_s)  # let requests that are in flight join
                self._drain(batch)
            self.stats.requests += len(batch)
            self.stats.batches += 1
            self.stats.max_batch = max(self.stats.max_batch, len(batch))
            try:
                results = await loop.run_in_executor(self._executor, self.backend.complete, [r for r, _ in batch])
            except Exception as exc:  # noqa: BLE001 - delivered to every request of the batch
                results = [exc] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # the client went away
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def completion_body(request: ChatRequest, completion: Completion, model: str) -> dict[str, Any]:
    """The OpenAI chat-completion JSON for one answer."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": completion.content},
        "finish_reason": completion.finish_reason,
        "logprobs": None,
    }
    if request.logprobs:
        choice["logprobs"] = {
            "content": [
                {
                    **_token_logprob(text, logprob),
                    "top_logprobs": [_token_logprob(c, lp) for c, lp in top[: request.top_logprobs]],
                }
                for text, logprob, top in completion.tokens
            ]
        }
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": len(completion.tokens),
            "total_tokens": completion.prompt_tokens + len(completion.tokens),
        },
    }


def _token_logprob(text: str, logprob: float) -> dict[str, Any]:
    """One ``logprobs.content`` (or ``top_logprobs``) entry. ``bytes`` is required (nullable) by the
    OpenAI schema; like vLLM we send the UTF-8 bytes of the token's text."""
    return {"token": text, "bytes": list(text.encode("utf-8", errors="replace")), "logprob": logprob}


def build_app(backend: Backend, model_name: str, max_batch: int = 32, api_key_env: str | None = None):
    """The FastAPI app; the batcher starts and stops with the app's lifespan."""
    state: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["batcher"] = batcher = Batcher(backend, max_batch=max_batch)
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()
        batcher.close()

    app = FastAPI(lifespan=lifespan)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)

    def key_refused(raw: Request) -> bool:
        return bool(api_key_env) and raw.headers.get("authorization") != f"Bearer {os.environ.get(api_key_env, '')}"

    @app.post("/v1/chat/completions")
    async def chat(raw: Request):
        if key_refused(raw):
            return error(401, "invalid API key")
        try:
            request = ChatRequest.from_body(await raw.json())
        except ValueError as exc:
            return error(400, str(exc))
        completion = await state["batcher"].submit(request)
        if completion.delay_s:
            await asyncio.sleep(completion.delay_s)
        if completion.http_status != 200:
            return error(completion.http_status, completion.error or "error")
        return completion_body(request, completion, model_name)

    @app.get("/v1/models")
    async def models(raw: Request):
        if key_refused(raw):  # as OpenAI's API does: a client's start-up probe learns of a wrong key
            return error(401, "invalid API key")
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/stats")
    async def stats():
        return vars(state["batcher"].stats)

    return app


def bind(port: int = 0) -> socket.socket:
    """A listening socket on 127.0.0.1 (``port=0``: a free one)."""
    # proto=IPPROTO_TCP is what makes asyncio set TCP_NODELAY on accepted connections; with the
    # default proto 0 every response waits ~40 ms for a delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {HOST} is in use (--port {port}); pick another, or --port 0 for a free one"
            ) from None
        raise
    return sock


class ServerThread:
    """Run the judge server in a background thread (tests, benchmarks). Use as a context manager."""

    def __init__(self, backend: Backend, model_name: str = "judge", max_batch: int = 32, **app_kwargs: Any) -> None:
        import uvicorn

        self.sock = bind(0)
        self.port = self.sock.getsockname()[1]
        # a short graceful shutdown: tests leave deliberately slow requests in flight
        app = build_app(backend, model_name, max_batch, **app_kwargs)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), daemon=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("judge server thread exited during startup")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@contextmanager
def spawn(args: Sequence[str], startup_timeout_s: float = 600.0) -> Iterator[str]:
    """Run ``verl-ext judge-server <args>`` in a subprocess, yield its base URL, stop it after.

    The child writes its port to a file once it accepts connections, so no port is guessed.
    """
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "log"), "w+") as log:
        port_file = os.path.join(tmp, "port")
        command = [sys.executable, "-m", "verl_ext.cli", "judge-server", *args, "--port-file", port_file]
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while not os.path.exists(port_file):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"judge-server did not start: {log.read()[-2000:]}")
                time.sleep(0.05)
            with open(port_file) as f:
                yield f"http://{HOST}:{f.read().strip()}/v1"
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main(argv: list[str]) -> int:
    parser = command_parser("verl-ext judge-server", __doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="path of a transformers causal LM with a chat template")
    source.add_argument("--fake-answers", help="JSON file of deterministic answers (see module docstring)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here once the server is ready")
    parser.add_argument("--served-model-name", default=None, help="the model name reported (default: the path)")
    parser.add_argument("--max-batch", type=positive_int, default=32)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--cpu-threads", type=int, default=1, help="torch threads on CPU (more for big models)")
    parser.add_argument("--require-api-key-env", help="answer 401 unless the Bearer token equals this env var")
    args = parser.parse_args(argv)

    import uvicorn

    sock = bind(args.port)  # before loading a model: a busy port fails at once
    if args.model:
        backend: Backend = HFBackend(args.model, args.device, args.cpu_threads)
    else:
        backend = load_fake_answers(args.fake_answers)
    name = args.served_model_name or args.model or "fake-judge"
    app = build_app(backend, name, args.max_batch, api_key_env=args.require_api_key_env)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        if args.port_file:
            with open(args.port_file + ".tmp", "w") as f:
                f.write(str(port))
            os.replace(args.port_file + ".tmp", args.port_file)
        print(f"judge-server listening on http://{HOST}:{port}/v1 (model {name})", flush=True)

    async def serve() -> None:
        announcer = asyncio.create_task(announce())
        await server.serve(sockets=[sock])
        announcer.cancel()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
