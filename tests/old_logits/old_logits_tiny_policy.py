"""A tiny causal token policy (embedding → GRU → vocabulary) for the old-logit tests."""

from __future__ import annotations

import torch

VOCAB, HIDDEN, PROMPT, RESPONSE, ROWS = 11, 16, 3, 9, 6


class TinyPolicy(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.rnn = torch.nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def response_log_probs(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """``(len(rows), RESPONSE)`` log π(response token | prefix), one row at a time: a batched
        forward's rounding can depend on which rows share the batch (1 ulp on an AVX-512 CPU), and
        the bit-exact tests compare a provider's forwards over row subsets with one over all rows."""
        return torch.cat([self._row_log_probs(ids[None]) for ids in batch["input_ids"][rows]])

    def _row_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.emb(ids[:, :-1]))
        logp = torch.log_softmax(self.head(hidden), dim=-1)
        return logp[:, PROMPT - 1 :].gather(-1, ids[:, PROMPT:, None]).squeeze(-1)


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """One fake optimizer step."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
