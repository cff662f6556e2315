"""The DVReward judge path on CPU: client overhead, throughput against concurrency, the cache's effect.

Runs ``verl-ext judge-server`` in a subprocess (fake answers, and a tiny random Qwen2 through transformers)
and the ``OpenAIJudge`` client in this process, so client and server do not share a GIL. Every figure is the
median of ``--repeats`` runs. The tiny model measures the server's batching, not a real judge's speed.

    python -m scripts.bench.bench_dvreward [--repeats 5] [--model DIR] [--write]

Docs section (``--write``; printed otherwise): docs/results.md, "## DVReward".
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import httpx

from scripts.bench.report import cpu_machine, publish, script_parser, table, target

from verl_ext.rewards.dvreward.judge import Artifact, JudgeOptions, OpenAIJudge, parse_choice  # noqa: E402
from verl_ext.rewards.dvreward.judge_server import spawn  # noqa: E402
from verl_ext.rewards.dvreward.scoring import p_yes  # noqa: E402
from verl_ext.rewards.dvreward.transport import Endpoint  # noqa: E402

N_QUESTIONS = 12  # the question builder's default cap (10 semantic + 2 quality)
LIBS = ("httpx", "aiohttp")
ARTIFACT = "The agent opened the inbox, starred the email from Gerta and archived two newsletters. " * 4


def questions(n: int, tag: str) -> list[str]:
    return [f"Is fact {i} of the request about {tag} met?" for i in range(n)]


def client_overhead_us(repeats: int) -> dict[str, float]:
    """Microseconds of client CPU per question with no network: payload, JSON, parse, score.
    Process CPU time, not wall time: other jobs on a shared machine do not inflate it.
    (The cache-hit path is the warm pass of ``cache_effect``.)"""
    judge = OpenAIJudge(Endpoint("http://127.0.0.1:9/v1", "judge"))
    top = [{"token": "yes", "logprob": -0.1}, {"token": "no", "logprob": -2.4}]
    first = {"token": "yes", "logprob": -0.1, "top_logprobs": top}
    body = json.dumps({"choices": [{"message": {"content": "yes"}, "logprobs": {"content": [first]}}]})
    artifact = Artifact.text(ARTIFACT)
    qs = questions(2000, "x")
    runs = []
    for _ in range(repeats):
        start = time.process_time()
        for q in qs:
            json.dumps(judge.payload(q, artifact))
            candidates, text = parse_choice(json.loads(body))
            p_yes(candidates, text)
        runs.append((time.process_time() - start) / len(qs) * 1e6)
    return {"request build + JSON + parse + score": statistics.median(runs)}


async def _rates(url: str, concurrency: int, n_samples: int, repeats: int) -> list[float]:
    """Questions per second of ``repeats`` rounds of ``n_samples`` artifacts x N_QUESTIONS, every
    question new (no cache hit); round 0 only opens the connections and is not counted."""
    judge = OpenAIJudge(Endpoint(url, "judge", timeout_s=600, max_retries=0), JudgeOptions(max_concurrency=concurrency))
    rates = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        batch = [questions(N_QUESTIONS, f"c{concurrency}r{r}s{s}") for s in range(n_samples)]
        await asyncio.gather(*(judge.answer(qs, Artifact.text(ARTIFACT)) for qs in batch))
        if r:
            rates.append(n_samples * N_QUESTIONS / (time.perf_counter() - start))
    await judge.aclose()
    return rates


def throughput(url: str, concurrencies: list[int], n_samples: int, repeats: int) -> dict[int, tuple[float, float]]:
    """concurrency -> (median questions/s, mean batch size the server saw).

    The concurrency levels are interleaved within each repeat, so load from other jobs on a shared
    machine falls on all levels alike instead of on whichever level ran during a busy minute.
    """
    rates: dict[int, list[float]] = {c: [] for c in concurrencies}
    batches: dict[int, list[float]] = {c: [] for c in concurrencies}
    for _ in range(repeats):
        for c in concurrencies:
            before = httpx.get(url.removesuffix("/v1") + "/stats").json()
            rates[c] += asyncio.run(_rates(url, c, n_samples, 1))
            after = httpx.get(url.removesuffix("/v1") + "/stats").json()
            batches[c].append((after["requests"] - before["requests"]) / max(1, after["batches"] - before["batches"]))
    return {c: (statistics.median(rates[c]), statistics.mean(batches[c])) for c in concurrencies}


def _bare_body(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Is fact {i} met?"}], "max_tokens": 4, "logprobs": True}


async def _raw_rate(url: str, library: str, concurrency: int, n: int) -> float:
    """Requests per second of bare POSTs (no judge client) with httpx or aiohttp: the transport's
    own ceiling against the same server."""
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    if library == "httpx":
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency))

        async def post(i: int) -> None:
            await client.post(url + "/chat/completions", json=_bare_body(i))
    else:
        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

        async def post(i: int) -> None:
            async with client.post(url + "/chat/completions", json=_bare_body(i)) as response:
                await response.read()

    async def one(i: int) -> None:
        async with sem:
            await post(i)

    await asyncio.gather(*(one(i) for i in range(concurrency)))  # open the connections
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    rate = n / (time.perf_counter() - start)
    await (client.aclose() if library == "httpx" else client.close())
    return rate


def transport_ceiling(url: str, concurrencies: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """concurrency -> {library: median requests/s} (libraries and levels interleaved per repeat)."""
    runs: dict[tuple[int, str], list[float]] = {(c, lib): [] for c in concurrencies for lib in LIBS}
    for _ in range(repeats):
        for c, lib in runs:
            runs[c, lib].append(asyncio.run(_raw_rate(url, lib, c, 384)))
    return {c: {lib: statistics.median(runs[c, lib]) for lib in LIBS} for c in concurrencies}


async def _timed_pass(judge: OpenAIJudge, items: list[tuple[list[str], Artifact]]) -> float:
    """Seconds per question to answer every (questions, artifact) item once."""
    start = time.perf_counter()
    await asyncio.gather(*(judge.answer(q, a) for q, a in items))
    return (time.perf_counter() - start) / sum(len(q) for q, _ in items)


def cache_effect(url: str, n_samples: int, repeats: int) -> tuple[float, float]:
    """Median seconds per question for a cold pass and a warm (all cached) pass."""
    cold, warm = [], []
    for r in range(repeats):
        judge = OpenAIJudge(Endpoint(url, "judge", timeout_s=600, max_retries=0), JudgeOptions(max_concurrency=16))
        items = [(questions(N_QUESTIONS, f"cache{r}-{s}"), Artifact.text(f"{r}/{s}")) for s in range(n_samples)]
        cold.append(asyncio.run(_timed_pass(judge, items)))
        warm.append(asyncio.run(_timed_pass(judge, items)))
    return statistics.median(cold), statistics.median(warm)


def render(results: dict) -> str:
    lines = [
        "## DVReward",
        "",
        f"Machine: {results['machine']}. `python -m scripts.bench.bench_dvreward --repeats {results['repeats']}`; "
        f"medians of {results['repeats']} runs; {N_QUESTIONS} questions per sample. Load average (1 min) "
        f"{results['load'][0]:.1f} at the start and {results['load'][1]:.1f} at the end.",
        "",
        "**Client overhead per question** (no network; process CPU time):",
        "",
        table(["path", "µs CPU / question"], [[k, f"{v:.1f}"] for k, v in results["overhead_us"].items()]),
    ]
    for backend, rows in results["throughput"].items():
        base = rows[min(rows)][0]
        lines += [
            "",
            f"**Throughput vs concurrency, {backend}** ({results['samples'][backend]} samples per run):",
            "",
            table(["client concurrency", "questions / s", "vs concurrency 1", "mean server batch"],
                  [[c, f"{q:.0f}", f"{q / base:.2f}x", f"{b:.1f}"] for c, (q, b) in sorted(rows.items())]),
        ]
    lines += [
        "",
        "**Transport ceiling** (bare POSTs to the fake server, no judge client; requests / s):",
        "",
        table(["concurrency", "httpx", "aiohttp"],
              [[c, f"{r['httpx']:.0f}", f"{r['aiohttp']:.0f}"] for c, r in sorted(results["transport"].items())]),
    ]
    shares = ", ".join(f"{r['httpx'] / r['aiohttp']:.0%} at concurrency {c}" for c, r in sorted(results["transport"].items()))
    lines += ["", f"httpx reaches {shares} of aiohttp's rate against the same server."]
    cold, warm = results["cache"]
    lines += [
        "",
        "**Cache effect** (fake server, same questions and artifacts asked twice, concurrency 16):",
        "",
        table(["pass", "ms / question"], [["cold (all requests)", f"{cold * 1e3:.3f}"],
                                          ["warm (all cache hits)", f"{warm * 1e3:.4f}"],
                                          ["ratio cold / warm", f"{cold / warm:.0f}x"]]), "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", help="a transformers causal LM for the model rows (default: a tiny random Qwen2)")
    args = parser.parse_args(argv)

    results: dict = {"machine": cpu_machine() + ", shared with other jobs", "repeats": args.repeats, "throughput": {}, "samples": {}}
    load_start = os.getloadavg()[0]
    results["overhead_us"] = client_overhead_us(args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        answers = os.path.join(tmp, "answers.json")
        with open(answers, "w") as f:
            json.dump({"Is fact": 0.8}, f)
        with spawn(["--fake-answers", answers]) as url:
            results["samples"]["fake answers"] = 16
            results["throughput"]["fake answers"] = throughput(url, [1, 4, 16, 64], 16, args.repeats)
            results["cache"] = cache_effect(url, 16, args.repeats)
            results["transport"] = transport_ceiling(url, [16, 64], args.repeats)
        model = args.model
        if model is None:
            from verl_ext.tiny_model import make_tiny_model

            model = make_tiny_model(os.path.join(tmp, "tiny"))
        with spawn(["--model", model, "--device", "cpu"]) as url:
            results["samples"]["tiny Qwen2 (transformers, CPU)"] = 8
            results["throughput"]["tiny Qwen2 (transformers, CPU)"] = throughput(url, [1, 4, 16, 64], 8, args.repeats)
    results["load"] = (load_start, os.getloadavg()[0])
    publish(target(args), "## DVReward", render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
