"""GPU judge throughput of ``verl-ext judge-server``, batched vs unbatched, with random-weight models of real sizes.

Qwen2.5-1.5B and Qwen2.5-7B architectures in bf16, built on the GPU machine: random weights cost the same
FLOPs and memory traffic as trained ones, and nothing is downloaded. The tokenizer is the tiny model's local
BPE, so token counts are held fixed: every judge prompt is about ``--prompt-tokens`` long and every answer
``max_tokens=4`` greedy tokens, as the DVReward client asks for them. Server in a subprocess, client here:

* unbatched: client concurrency 1, and concurrency 32 against a server with ``--max-batch 1``;
* batched: concurrency 8 / 32 / 64 against ``--max-batch 64``.

Every figure is the median of ``--repeats`` rounds (levels interleaved per round). Needs a CUDA torch,
transformers and verl-ext's ``judge`` extra; verl is not imported.

    python -m scripts.bench.bench_dvreward_gpu --sizes 1.5b 7b --json results.json
    python -m scripts.bench.bench_dvreward_gpu --render results.json --write

Docs section (``--write``; printed otherwise): docs/results.md, "## DVReward judge on GPU".
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

from scripts.bench.report import publish, script_parser, table, target
from verl_ext.rewards.dvreward.judge import JUDGE_SYSTEM_PROMPT, Artifact, JudgeOptions, OpenAIJudge
from verl_ext.rewards.dvreward.judge_server import spawn
from verl_ext.rewards.dvreward.transport import Endpoint

# size -> vocabulary of Qwen/Qwen2.5-{1.5B,7B}-Instruct; the rest is verl_ext.tiny_model.ARCHITECTURES
QWEN25 = {"1.5b": 151936, "7b": 152064}
# (label, server --max-batch, client concurrency)
SETTINGS = [
    ("unbatched", 1, 1),
    ("unbatched, queued", 1, 32),
    ("batched", 64, 8),
    ("batched", 64, 32),
    ("batched", 64, 64),
]
SECTION = "## DVReward judge on GPU"


def build_model(out_dir: str, size: str) -> dict:
    """Write a random-weight Qwen2.5-``size`` (bf16) + the local tokenizer to ``out_dir``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl_ext.tiny_model import ARCHITECTURES, build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(**{"tie_word_embeddings": True, **ARCHITECTURES[f"qwen2.5-{size}"]}, vocab_size=QWEN25[size],
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return {"parameters": params}


def artifact_for(prompt_tokens: int, model_dir: str) -> str:
    """A state-dump-like text artifact that makes the judge prompt about ``prompt_tokens`` long."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    line = "row {i}: mail from Gerta, subject 'Q3 numbers', starred=false, folder=inbox. "
    text = ""
    while True:
        question = "Is the email from Gerta starred?"
        messages = [{"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                    {"role": "user", "content": Artifact.text(text).user_content(question)}]
        n = len(tok(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))["input_ids"])
        if n >= prompt_tokens:
            return text
        text += line.format(i=len(text))


async def _round(url: str, concurrency: int, n_questions: int, artifact: str, tag: str) -> float:
    """Questions per second answering ``n_questions`` new questions (no cache hit)."""
    judge = OpenAIJudge(Endpoint(url, "judge", timeout_s=600, max_retries=0),
                        JudgeOptions(max_concurrency=concurrency, cache_size=0))
    questions = [f"Is fact {i} of request {tag} met?" for i in range(n_questions)]
    start = time.perf_counter()
    await judge.answer(questions, Artifact.text(artifact))
    rate = n_questions / (time.perf_counter() - start)
    await judge.aclose()
    return rate


def measure(model_dir: str, artifact: str, repeats: int) -> list[dict]:
    rows = []
    for max_batch in sorted({mb for _, mb, _ in SETTINGS}):
        levels = [(label, c) for label, mb, c in SETTINGS if mb == max_batch]
        with spawn(["--model", model_dir, "--device", "cuda", "--max-batch", str(max_batch),
                    "--served-model-name", "judge"]) as url:
            stats_url = url.removesuffix("/v1") + "/stats"
            asyncio.run(_round(url, max(c for _, c in levels), 64, artifact, "warmup"))
            rates: dict[int, list[float]] = {c: [] for _, c in levels}
            batches: dict[int, list[float]] = {c: [] for _, c in levels}
            for r in range(repeats):
                for _, c in levels:
                    before = httpx.get(stats_url).json()
                    rates[c].append(asyncio.run(_round(url, c, max(32, 4 * c), artifact, f"mb{max_batch}c{c}r{r}")))
                    after = httpx.get(stats_url).json()
                    batches[c].append((after["requests"] - before["requests"]) / max(1, after["batches"] - before["batches"]))
            rows += [{"label": label, "max_batch": max_batch, "concurrency": c,
                      "questions_per_s": statistics.median(rates[c]), "runs": rates[c],
                      "mean_batch": statistics.mean(batches[c])} for label, c in levels]
    return rows


def model_only(model_dir: str, artifact: str, repeats: int, batch_sizes=(1, 8, 64)) -> list[dict]:
    """Questions per second of the server's backend alone (``HFBackend.complete``, no HTTP, no
    client), ``max(64, b)`` questions in batches of ``b``."""
    import torch

    from verl_ext.rewards.dvreward.judge_backends import ChatRequest, HFBackend

    backend = HFBackend(model_dir, device="cuda")

    def requests(n: int, tag: str) -> list[ChatRequest]:
        return [ChatRequest(messages=[{"role": "system", "content": JUDGE_SYSTEM_PROMPT},
                                      {"role": "user", "content": Artifact.text(artifact).user_content(
                                          f"Is fact {i} of request {tag} met?")}],
                            max_tokens=4, logprobs=True, top_logprobs=5) for i in range(n)]

    backend.complete(requests(8, "warmup"))
    rows = []
    for b in batch_sizes:
        runs = []
        for r in range(repeats):
            todo = requests(max(64, b), f"b{b}r{r}")
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(0, len(todo), b):
                backend.complete(todo[i : i + b])
            runs.append(len(todo) / (time.perf_counter() - start))
        rows.append({"batch": b, "questions_per_s": statistics.median(runs), "runs": runs})
    del backend
    torch.cuda.empty_cache()
    return rows


def run(sizes: list[str], repeats: int, prompt_tokens: int) -> dict:
    import torch
    import transformers

    results = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "transformers": transformers.__version__, "repeats": repeats, "prompt_tokens": prompt_tokens,
               "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            model_dir = os.path.join(tmp, size)
            start = time.perf_counter()
            info = build_model(model_dir, size)
            info["build_s"] = time.perf_counter() - start
            artifact = artifact_for(prompt_tokens, model_dir)
            info["model_only"] = model_only(model_dir, artifact, repeats)
            info["rows"] = measure(model_dir, artifact, repeats)
            results["models"][size] = info
            print(json.dumps({size: info}), flush=True)
    return results


def render(results: dict) -> str:
    lines = [
        SECTION,
        "",
        f"Card: **{results['card']}** (torch {results['torch']}, transformers {results['transformers']}, bf16). "
        "`python -m scripts.bench.bench_dvreward_gpu`: every prompt "
        f"~{results['prompt_tokens']} tokens, 4 answer tokens; medians of {results['repeats']} rounds.",
    ]
    for size, info in results["models"].items():
        rows = info["rows"]
        base = next(r for r in rows if r["max_batch"] == 1 and r["concurrency"] == 1)["questions_per_s"]
        lines += [
            "",
            f"**Qwen2.5-{size.upper()} architecture** ({info['parameters'] / 1e9:.2f}B parameters, random weights):",
            "",
            table(["mode", "server `--max-batch`", "client concurrency", "questions / s", "vs unbatched",
                   "mean server batch"],
                  [[r["label"], r["max_batch"], r["concurrency"], f"{r['questions_per_s']:.1f}",
                    f"{r['questions_per_s'] / base:.2f}x", f"{r['mean_batch']:.1f}"] for r in rows]),
        ]
        if "model_only" in info:
            alone = info["model_only"]
            lines += ["", "Backend alone (`HFBackend.complete`, no HTTP, no client):", "",
                      table(["batch", "questions / s", "vs batch 1"],
                            [[r["batch"], f"{r['questions_per_s']:.1f}",
                              f"{r['questions_per_s'] / alone[0]['questions_per_s']:.2f}x"] for r in alone])]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--sizes", nargs="+", choices=sorted(QWEN25), default=["1.5b", "7b"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--render", metavar="JSON", help="report saved results (no run)")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            results = json.load(f)
    else:
        results = run(args.sizes, args.repeats, args.prompt_tokens)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    publish(target(args), SECTION, render(results))
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
