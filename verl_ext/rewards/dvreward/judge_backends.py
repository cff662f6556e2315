"""The judge server's backends (``verl-ext judge-server``, ``verl_ext.rewards.dvreward.judge_server``):
what answers a batch of chat requests, behind the server's HTTP and batching code. ``HFBackend``
decodes greedily with a transformers causal LM; ``FakeBackend`` answers deterministically from the
``--fake-answers`` rules (their format: the server module's docstring)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from verl_ext.errors import UserError


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat-completions request this server honours."""

    messages: list[dict[str, Any]]
    max_tokens: int = 16
    logprobs: bool = False
    top_logprobs: int = 0

    @classmethod
    def from_body(cls, body: Any) -> ChatRequest:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ValueError("body must be a JSON object with a non-empty 'messages' list")
        if body.get("stream") or body.get("n", 1) != 1:
            raise ValueError("stream and n > 1 are not supported")
        return cls(
            messages=body["messages"],
            max_tokens=max(1, min(int(body.get("max_tokens") or body.get("max_completion_tokens") or 16), 256)),
            logprobs=bool(body.get("logprobs")),
            top_logprobs=max(0, min(int(body.get("top_logprobs") or 0), 20)),
        )

    def user_text(self) -> str:
        """The last user message as text; image parts become their URL."""
        content = next((m.get("content") for m in reversed(self.messages) if m.get("role") == "user"), "")
        if isinstance(content, str):
            return content
        parts = [p.get("text") or (p.get("image_url") or {}).get("url", "") for p in content if isinstance(p, dict)]
        return "\n".join(parts)


@dataclass
class Completion:
    """One generated answer: per token ``(text, logprob, [(candidate, logprob), ...])``, and the
    prompt's length in tokens (``usage.prompt_tokens``).

    A request the backend refuses has ``http_status`` != 200 and an ``error``; ``delay_s``
    (answer after a delay) is set by the fake backend only, to emulate a slow server.
    """

    content: str
    tokens: list[tuple[str, float, list[tuple[str, float]]]] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    delay_s: float = 0.0
    http_status: int = 200
    error: str | None = None


class Backend(Protocol):
    """Answers a batch of requests, one ``Completion`` each, in order (runs in a worker thread)."""

    def complete(self, batch: Sequence[ChatRequest]) -> list[Completion]: ...


@dataclass(frozen=True)
class FakeRule:
    """One fake answer: used when every ``match`` substring occurs in the user message.

    ``p_yes`` answers yes/no with log-probs log(p) and log(1-p); ``content`` answers that text;
    ``status`` != 200 fails with that HTTP status (the first ``fail_times`` times only, if set);
    ``delay_s`` delays the response.
    """

    match: tuple[str, ...]
    p_yes: float | None = None
    content: str | None = None
    delay_s: float = 0.0
    status: int = 200
    fail_times: int = 0


class FakeBackend:
    """Deterministic answers from a map of user-message substrings to answer specs."""

    def __init__(self, spec: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(spec, dict):  # {"substring": p_yes or {spec}} shorthand
            spec = [{"match": [k], **(v if isinstance(v, dict) else {"p_yes": v})} for k, v in spec.items()]
        self.rules = [FakeRule(**{**item, "match": tuple(item["match"])}) for item in spec]
        self._failures_served = [0] * len(self.rules)
        self._lock = threading.Lock()

    def _rule(self, text: str) -> int | None:
        matching = [i for i, r in enumerate(self.rules) if all(m in text for m in r.match)]
        return max(matching, key=lambda i: sum(map(len, self.rules[i].match)), default=None)

    def _answer(self, index: int | None) -> Completion:
        if index is None:
            return Completion("unsure", [("unsure", 0.0, [("unsure", 0.0)])])
        rule = self.rules[index]
        with self._lock:
            if rule.status != 200 and (rule.fail_times == 0 or self._failures_served[index] < rule.fail_times):
                self._failures_served[index] += 1
                return Completion("", http_status=rule.status, delay_s=rule.delay_s, error="injected fault")
        if rule.content is not None:
            return Completion(rule.content, [(rule.content, 0.0, [(rule.content, 0.0)])], delay_s=rule.delay_s)
        p = 0.5 if rule.p_yes is None else float(rule.p_yes)
        top = [(tok, math.log(q)) for tok, q in (("yes", p), ("no", 1.0 - p)) if q > 0.0]
        answer = "yes" if p >= 0.5 else "no"
        return Completion(answer, [(answer, dict(top)[answer], top)], delay_s=rule.delay_s)

    def complete(self, batch: Sequence[ChatRequest]) -> list[Completion]:
        # No tokenizer here: the prompt's length is counted in words of the user message.
        return [
            replace(self._answer(self._rule(text)), prompt_tokens=len(text.split()))
            for text in (req.user_text() for req in batch)
        ]


class HFBackend:
    """Greedy decoding with a transformers causal LM; torch/transformers are imported here."""

    def __init__(self, path: str, device: str = "auto", cpu_threads: int = 1) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        if self.device == "cpu":
            # Small models on a shared CPU: one thread was 20x faster than two on a loaded 2-core
            # box (OpenMP threads spin at every op's barrier while their core is taken).
            torch.set_num_threads(cpu_threads)
        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()

    def complete(self, batch: Sequence[ChatRequest]) -> list[Completion]:
        results: list[Completion | None] = [
            Completion("", http_status=400, error="this judge-server model is text-only: no image parts")
            if any(_has_image(m.get("content")) for m in req.messages)
            else None
            for req in batch
        ]
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            for i, completion in zip(todo, self._generate([batch[i] for i in todo]), strict=True):
                results[i] = completion
        return results

    def _generate(self, batch: Sequence[ChatRequest]) -> list[Completion]:
        torch, tok = self.torch, self.tokenizer
        texts = [
            tok.apply_chat_template(
                [{**m, "content": _flatten_text(m.get("content"))} for m in req.messages],
                add_generation_prompt=True,
                tokenize=False,
            )
            for req in batch
        ]
        # Left padding keeps every row's last prompt token at the same position for decoding.
        enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        enc = {k: v.to(self.device) for k, v in enc.items()}
        with torch.inference_mode():
            out = self.model.generate(
                **enc,
                max_new_tokens=max(r.max_tokens for r in batch),
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=tok.pad_token_id,
            )
        # (batch, steps, vocab) log-probs of the raw logits, as OpenAI servers report them.
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
        new_ids = out.sequences[:, enc["input_ids"].shape[1] :]
        prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()  # without the left padding
        return [
            replace(self._completion(req, new_ids[b], logprobs[b]), prompt_tokens=int(prompt_tokens[b]))
            for b, req in enumerate(batch)
        ]

    def _completion(self, req: ChatRequest, ids, logprobs) -> Completion:
        """``ids``: (steps,) generated ids; ``logprobs``: (steps, vocab)."""
        tok, tokens, finish = self.tokenizer, [], "length"
        for t in range(min(req.max_tokens, ids.shape[0])):
            token_id = int(ids[t])
            if token_id == tok.eos_token_id:
                finish = "stop"
                break
            values, indices = self.torch.topk(logprobs[t], k=max(1, req.top_logprobs))
            top = [(tok.decode([int(i)]), float(v)) for v, i in zip(values, indices, strict=True)]
            tokens.append((tok.decode([token_id]), float(logprobs[t, token_id]), top))
        return Completion("".join(t[0] for t in tokens), tokens, finish)


def _has_image(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") != "text" for p in content)


def _flatten_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def load_fake_answers(path: str) -> FakeBackend:
    """The ``--fake-answers`` file as a backend; a missing file, bad JSON (with its line) or a
    rule with unknown keys raises ``UserError`` naming the file."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except FileNotFoundError:
        raise UserError(f"--fake-answers {path}: no such file") from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno} column {err.colno}"
        raise UserError(f"--fake-answers {path}: not valid JSON at {where}: {err.msg}") from None
    try:
        return FakeBackend(spec)
    except (TypeError, KeyError, AttributeError) as err:
        raise UserError(
            f"--fake-answers {path}: not a map of substrings to answers nor a list of match rules ({err}); "
            "the format is in the docstring of verl_ext.rewards.dvreward.judge_server"
        ) from None
