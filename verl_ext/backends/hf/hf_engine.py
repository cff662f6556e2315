"""A batched token-in/token-out sampler over a transformers causal LM (the ``hf`` rollout core).

This is the part of the ``hf`` rollout backend with no Ray in it: it takes a batch of requests,
decodes them together with a KV cache (left-padded prompts), samples with per-request
temperature / top-k / top-p / repetition penalty, stops per request on EOS, stop tokens or its
token budget, and can be interrupted between decode steps (the partial output is kept, so
verl's abort-and-resume partial rollouts work).

Log-probs follow the trainer's convention: ``log_softmax(logits / temperature)`` at the sampled
token, before top-k/top-p filtering (verl's actor recomputes them the same way), so on this
backend the rollout and the trainer agree to float precision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch


@dataclass
class GenerationRequest:
    """One request. ``tokens``/``log_probs``/``finish_reason`` are filled by the engine."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty: the hf rollout needs at least one prompt token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p nucleus with -inf.

    Args:
        logits: (B, V) float.
        top_k: (B,) long; values <= 0 mean "no top-k".
        top_p: (B,) float in (0, 1].
    """
    vocab = logits.shape[-1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    remove = rank >= k[:, None]
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the mass before it already reaches top_p (the best token always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= mass_before >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


class HFGenerationEngine:
    """Runs batches of ``GenerationRequest`` on a causal LM. Thread-safe: one batch at a time,
    and weight loads wait for the running batch.

    Args:
        after_load: called after every ``load_weights`` under the lock (e.g. to round new weights
            to a simulated rollout precision).
    """

    def __init__(self, model: torch.nn.Module, eos_token_ids: Iterable[int], pad_token_id: int, seed: int = 0,
                 after_load: Callable[[], None] | None = None):
        self.model = model.eval()
        self.after_load = after_load
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()

    @torch.inference_mode()
    def generate(self, requests: list[GenerationRequest], should_abort: Callable[[], bool] = lambda: False) -> None:
        """Decode ``requests`` together, filling each one's outputs in place."""
        with self.lock:
            self._generate(requests, should_abort)

    def _generate(self, requests: list[GenerationRequest], should_abort: Callable[[], bool]) -> None:
        batch = len(requests)
        prompt_len = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((batch, prompt_len), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, prompt_len), dtype=torch.long)
        for i, r in enumerate(requests):
            input_ids[i, prompt_len - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attention_mask[i, prompt_len - len(r.prompt_ids) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

        temperature = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        greedy = temperature == 0
        scale = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
        top_k = torch.tensor([r.top_k for r in requests], dtype=torch.long)
        top_p = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
        penalty = torch.tensor([r.repetition_penalty for r in requests], dtype=torch.float32)[:, None]
        use_penalty = bool((penalty != 1.0).any())
        budget = torch.tensor([r.max_tokens for r in requests])
        stops = [r.stop_token_ids | (frozenset() if r.ignore_eos else self.eos_token_ids) for r in requests]
        done = torch.zeros(batch, dtype=torch.bool)

        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1, :].float()
        seen = None
        if use_penalty:
            seen = torch.zeros(batch, logits.shape[-1], dtype=torch.bool)
            seen.scatter_(1, input_ids, attention_mask.bool())

        for _ in range(int(budget.max())):
            if should_abort():
                for i, r in enumerate(requests):
                    if not done[i]:
                        r.finish_reason = "abort"
                return
            if seen is not None:
                # vLLM/HF convention: shrink positive logits, grow negative ones, for seen tokens.
                penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
                logits = torch.where(seen, penalised, logits)
            scaled = logits / scale
            log_probs = scaled.log_softmax(dim=-1)
            filtered = _filter_top_k_top_p(scaled, top_k, top_p)
            sampled = torch.multinomial(filtered.softmax(dim=-1), 1, generator=self.generator).squeeze(1)
            next_tokens = torch.where(greedy, scaled.argmax(dim=-1), sampled)
            token_log_probs = log_probs.gather(1, next_tokens[:, None]).squeeze(1)

            for i, r in enumerate(requests):
                if done[i]:
                    continue
                token = int(next_tokens[i])
                r.tokens.append(token)
                r.log_probs.append(float(token_log_probs[i]))
                if token in stops[i]:
                    r.finish_reason, done[i] = "stop", True
                elif len(r.tokens) >= r.max_tokens:
                    r.finish_reason, done[i] = "length", True
            if bool(done.all()):
                return
            if seen is not None:
                seen[torch.arange(batch), next_tokens] = True
            attention_mask = torch.cat([attention_mask, (~done).long()[:, None]], dim=1)
            position_ids = position_ids[:, -1:] + 1
            out = self.model(
                input_ids=next_tokens[:, None],
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full (unsharded) tensors into the model by name. Returns the number loaded.

        Raises ``KeyError`` naming unknown parameters: a silent partial load would make the
        rollout sample from a model the trainer never had.
        """
        # state_dict (not named_parameters) so tied weights are reachable under both names.
        params = self.model.state_dict(keep_vars=True)
        loaded = 0
        with self.lock, torch.no_grad():
            unknown = []
            for name, tensor in named_tensors:
                target = params.get(name)
                if target is None:
                    unknown.append(name)
                    continue
                if target.shape != tensor.shape:
                    raise ValueError(f"weight {name}: shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
                target.copy_(tensor.to(dtype=target.dtype))
                loaded += 1
            if unknown:
                raise KeyError(f"hf rollout: the trainer sent weights the rollout model does not have: {unknown[:5]}")
            if self.after_load is not None:
                self.after_load()
        return loaded
