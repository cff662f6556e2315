"""An in-process ``OldLogitHost`` over a local torch module: the reference implementation of the
host protocol, used by the unit tests and the CPU old-logit studies (``scripts/bench/old_logits_experiment.py``,
``scripts/bench/old_logits_probe.py``). It holds one version's weights at a time (no window whose live weights
move on).

The batch is a dict of padded ``(bs, L)`` tensors (``response_mask``, ``rollout_log_probs``,
``token_versions``, ``precomputed_old_log_probs``, plus whatever the model needs);
``old_logits_store`` writes ``batch["old_log_probs"]``. The verl trainer implements the same four
methods over TransferQueue and worker groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from verl_ext.old_logits.providers import RECORDED_TOKEN_VERSIONS, TOKEN_VERSIONS
from verl_ext.old_logits.weight_specs import CURRENT
from verl_ext.old_logits.worker import OldLogitWorkerState

LogProbFn = Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


class LocalPolicyHost:
    """Args:
    log_prob_fn: ``(batch, rows) -> (len(rows), L)`` log-probs of the response tokens of ``rows``
        under whatever weights the model holds now.
    state: the worker-side state that serves "ewma" / "snapshot:<v>" weights (None: current only).
    version: the version n of the weights the model holds; advance it as the policy is published.
    """

    def __init__(self, log_prob_fn: LogProbFn, state: OldLogitWorkerState | None = None, version: int = 0) -> None:
        self.log_prob_fn = log_prob_fn
        self.state = state
        self.version = version
        self.forward_rows = 0

    def old_logits_version(self) -> int:
        return self.version

    def old_logits_fetch(self, batch: dict[str, torch.Tensor], fields: Sequence[str]) -> dict[str, torch.Tensor]:
        wanted = [f for f in fields if f != RECORDED_TOKEN_VERSIONS]
        if RECORDED_TOKEN_VERSIONS in fields and TOKEN_VERSIONS in batch:
            wanted.append(TOKEN_VERSIONS)
        missing = [f for f in wanted if f not in batch]
        if missing:
            raise KeyError(f"batch lacks {missing} (needed by the selected algorithm.old_logits.provider)")
        return {f: batch[f] for f in wanted}

    def old_logits_verl_anchor(self, batch: dict[str, torch.Tensor], metrics: dict[str, float]) -> Any:
        """verl's anchor here: the weights the model holds now."""
        return self.old_logits_store(batch, self.old_logits_forward(batch, CURRENT))

    @torch.no_grad()
    def old_logits_forward(
        self, batch: dict[str, torch.Tensor], weights: str, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        if rows is None:
            rows = torch.arange(batch["response_mask"].shape[0])
        ctx = nullcontext() if self.state is None and weights == CURRENT else self._state().weights(weights)
        with ctx:
            self.forward_rows += rows.numel()
            return self.log_prob_fn(batch, rows)

    def _state(self) -> OldLogitWorkerState:
        if self.state is None:
            raise RuntimeError("this LocalPolicyHost has no OldLogitWorkerState to serve non-current weights")
        return self.state

    def old_logits_ewma_calibrate(self, token_age_versions: float | None) -> dict[str, float]:
        return self._state().ewma_calibrate(token_age_versions, self.version)

    def old_logits_rollout_sync(self, metrics: dict[str, float]) -> None:
        """Nothing to do: here ``precomputed_old_log_probs`` comes with the batch dict."""

    def old_logits_store(self, batch: dict[str, torch.Tensor], old_log_probs: torch.Tensor) -> Any:
        batch["old_log_probs"] = old_log_probs
        return batch
