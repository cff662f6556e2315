"""``verl-ext dv-questions``: decompose each dataset prompt into atomic yes/no questions.

Reads a parquet or JSONL dataset, asks an OpenAI-compatible LLM to split every distinct
prompt into semantic questions (entities, attributes, counts, relations, text; DSG-style parent
links optional) and quality questions, validates / deduplicates / caps them
(``question_set.clean_questions``) and writes them to ``extra_info["dv_questions"]``.

Every LLM answer is appended to a JSONL cache as soon as it arrives, keyed by sha256 of
``DECOMPOSE_PROMPT_VERSION``, the model and the exact request (the prompt and the requested
numbers of questions), so an interrupted run resumes where it stopped and a re-run costs no
request. The cache holds the raw decomposition: validation, dedup and ``--no-parents`` run on it
again each time; a new prompt version, model or cap asks again.

Example::

    verl-ext dv-questions data/train.parquet -o data/train_dv.parquet \\
        --base-url http://127.0.0.1:8000/v1 --model Qwen2.5-7B-Instruct [--api-key-env OPENAI_API_KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import httpx

from verl_ext.cli_args import command_parser
from verl_ext.errors import UserError
from verl_ext.rewards.dvreward.question_set import clean_questions
from verl_ext.rewards.dvreward.scoring import QUALITY, SEMANTIC
from verl_ext.rewards.dvreward.settings import field_value
from verl_ext.rewards.dvreward.transport import Endpoint, RequestFailed, post_json, probe

# Bump the version whenever the prompt text changes: it is part of every cache key.
DECOMPOSE_PROMPT_VERSION = "dvq-v1"
DECOMPOSE_SYSTEM_PROMPT = (
    "You write verification checklists. Given a request, list the yes/no questions a careful "
    "reviewer would ask about the final result (an image, a screen or a text) to check that the "
    "request was met. Output JSON only."
)
DECOMPOSE_USER_TEMPLATE = """Request:
<<<
{prompt}
>>>

Write two lists of questions.
"semantic": one question per checkable fact of the request: every entity, attribute, count,
spatial or logical relation and exact text string it asks for. Each question is atomic (one fact),
self-contained (names its subject; never "it" or "they") and answerable with yes or no from the
result alone. When a question only makes sense if an earlier one is answered yes (e.g. "Is the car
red?" needs "Is there a car?"), give the indices of those earlier questions in "parents".
"quality": {n_quality} generic questions on the quality of the result (no artifacts or glitches,
legible text, coherent layout), also yes/no, where yes means good.
At most {n_semantic} semantic questions.

Answer with this JSON and nothing else:
{{"semantic": [{{"q": "Is there a car?", "parents": []}}, {{"q": "Is the car red?", "parents": [0]}}],
 "quality": ["Is the result free of visual artifacts?"]}}"""


def decompose_messages(prompt: str, max_semantic: int, max_quality: int) -> list[dict[str, str]]:
    """The chat messages that ask the LLM to decompose ``prompt``."""
    user = DECOMPOSE_USER_TEMPLATE.format(prompt=prompt, n_semantic=max_semantic, n_quality=max_quality)
    return [{"role": "system", "content": DECOMPOSE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def cache_key(messages: list[dict[str, str]], model: str) -> str:
    """sha256 of the prompt version, the model and the exact request (so of the prompt and caps)."""
    return hashlib.sha256(json.dumps([DECOMPOSE_PROMPT_VERSION, model, messages]).encode()).hexdigest()


def parse_decomposition(text: str) -> list[tuple[str, str, list[int]]]:
    """``(text, kind, parents)`` items from the LLM's JSON answer (code fences tolerated).

    Raises ``RequestFailed("bad_decomposition")`` when there is no usable JSON object.
    """
    match = re.search(r"\{.*\}", text or "", flags=re.DOTALL)
    try:
        obj = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        obj = None
    if not isinstance(obj, dict) or not any(isinstance(obj.get(k), list) for k in (SEMANTIC, QUALITY)):
        raise RequestFailed("bad_decomposition", (text or "")[:120])
    items = []
    for kind in (SEMANTIC, QUALITY):
        for entry in obj.get(kind) or []:
            if isinstance(entry, Mapping):
                question = entry.get("q") or entry.get("question") or entry.get("text") or ""
                parents = [p for p in entry.get("parents") or [] if isinstance(p, int)]
            else:
                question, parents = entry, []
            items.append((str(question), kind, parents))
    return items


class QuestionCache:
    """Append-only JSONL of ``{"key", "prompt", "items"}``; a torn last line is ignored."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: dict[str, list] = {}
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            for line in text.splitlines():
                try:
                    entry = json.loads(line)
                    self.entries[entry["key"]] = entry["items"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
            if text and not text.endswith("\n"):  # end the torn line so the next entry starts clean
                with open(path, "a") as f:
                    f.write("\n")

    def add(self, key: str, prompt: str, items: list) -> None:
        self.entries[key] = items
        with open(self.path, "a") as f:
            entry = {"key": key, "version": DECOMPOSE_PROMPT_VERSION, "prompt": prompt, "items": items}
            f.write(json.dumps(entry) + "\n")
            f.flush()


def prompt_text(row: Mapping[str, Any], prompt_key: str) -> str:
    """The request text of a row: a string, or the last user turn of a chat-message list."""
    value = field_value(row, prompt_key)
    if isinstance(value, str):
        return value
    messages = [m for m in (list(value) if value is not None else []) if isinstance(m, Mapping)]
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(f"row has no text prompt under {prompt_key!r}; pass --prompt-key")
    return users[-1]


async def decompose_all(
    requests: dict[str, tuple[str, list[dict[str, str]]]],
    endpoint: Endpoint,
    cache: QuestionCache,
    args: argparse.Namespace,
) -> dict[str, str]:
    """Send every request (cache key -> (prompt, messages)) not in the cache; returns failures
    (prompt -> reason)."""
    from tqdm import tqdm

    todo = {key: request for key, request in requests.items() if key not in cache.entries}
    failures: dict[str, str] = {}
    semaphore = asyncio.Semaphore(args.concurrency)
    bar = tqdm(total=len(todo), desc="dv-questions", unit="prompt", disable=args.quiet)

    async def one(client: httpx.AsyncClient, key: str, prompt: str, messages: list[dict[str, str]]) -> None:
        payload = {"model": endpoint.model, "messages": messages, "temperature": 0.0, "max_tokens": args.max_tokens}
        try:
            async with semaphore:
                body = await post_json(client, endpoint, payload)
            items = parse_decomposition((body.get("choices") or [{}])[0].get("message", {}).get("content"))
            cache.add(key, prompt, items)
        except RequestFailed as exc:
            failures[prompt] = exc.reason
        bar.update(1)

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, key, *request) for key, request in todo.items()))
    bar.close()
    return failures


def _read(path: str):
    import pandas as pd

    if not os.path.isfile(path):
        raise UserError(f"input {path}: no such file (a .parquet or .jsonl dataset)")
    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_json(path, lines=True)


def _write(df, path: str) -> None:
    tmp = path + ".tmp"
    if path.endswith(".parquet"):
        df.to_parquet(tmp, index=False)
    else:
        df.to_json(tmp, orient="records", lines=True, force_ascii=False)
    os.replace(tmp, path)  # never leave a half-written dataset behind


def main(argv: list[str]) -> int:
    parser = command_parser("verl-ext dv-questions", __doc__.split("\n\n")[0])
    parser.add_argument("input", help="dataset: .parquet or .jsonl")
    parser.add_argument("-o", "--output", required=True, help="output dataset (.parquet or .jsonl)")
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-env", help="environment variable holding the API key (never printed)")
    parser.add_argument("--prompt-key", default="prompt", help="row field with the request (dots descend)")
    parser.add_argument("--field", default="dv_questions", help="extra_info key written")
    parser.add_argument("--cache", help="JSONL cache (default: <output>.dvq-cache.jsonl)")
    parser.add_argument("--max-semantic", type=int, default=10)
    parser.add_argument("--max-quality", type=int, default=2)
    parser.add_argument("--no-parents", action="store_true", help="drop DSG parent links")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    endpoint = Endpoint(args.base_url, args.model, args.api_key_env, timeout_s=args.timeout, max_retries=args.retries)
    df = _read(args.input)
    unreachable = probe(endpoint)
    if unreachable is not None:
        raise UserError(f"--base-url {args.base_url} does not answer ({unreachable}); start the server or fix the URL"
                        + (f" or the key in ${args.api_key_env}" if args.api_key_env else ""))
    rows = df.to_dict(orient="records")
    prompts = [prompt_text(row, args.prompt_key) for row in rows]
    keys, requests = [], {}  # one request per distinct prompt
    for prompt in prompts:
        messages = decompose_messages(prompt, args.max_semantic, args.max_quality)
        keys.append(cache_key(messages, args.model))
        requests[keys[-1]] = (prompt, messages)
    cache = QuestionCache(args.cache or args.output + ".dvq-cache.jsonl")
    failures = asyncio.run(decompose_all(requests, endpoint, cache, args))
    if failures:
        reasons = sorted(set(failures.values()))
        print(
            f"dv-questions: {len(failures)} prompts failed ({', '.join(reasons)}); {len(cache.entries)} are cached "
            f"in {cache.path}. Nothing written; re-run the same command to resume.",
            file=sys.stderr,
        )
        return 1

    records, n_dropped, n_empty = [], 0, 0
    for row, prompt, key in zip(rows, prompts, keys, strict=True):
        items = [(t, k, [] if args.no_parents else p) for t, k, p in cache.entries[key]]
        question_set, dropped = clean_questions(items, args.max_semantic, args.max_quality)
        n_dropped += len(dropped)
        n_empty += not question_set.questions
        meta = {
            "version": DECOMPOSE_PROMPT_VERSION,
            "model": args.model,
            "prompt_sha": hashlib.sha256(prompt.encode()).hexdigest()[:16],
        }
        extra_info = dict(row.get("extra_info") or {})
        extra_info[args.field] = {**question_set.to_record(), **meta}
        records.append(extra_info)
    df["extra_info"] = records
    _write(df, args.output)
    n_questions = sum(len(r[args.field]["questions"]) for r in records)
    print(
        f"dv-questions: wrote {len(records)} rows to {args.output}: {n_questions / max(1, len(records)):.1f} questions "
        f"per row, {n_dropped} questions dropped by validation, {n_empty} rows without questions"
    )
    return 0
