"""Old log-probs scored on the rollout side (providers ``dedicated`` and ``interrupt``): how they
travel with a trajectory and how the trainer turns them into a ``(bs, L)`` tensor.

Both providers score each *segment* (the tokens of one rollout-server call; one call never spans
a weight update) with the training-side numerics of the version that generated it, before that
version's weights are gone (the dedicated old-logit model and the synchronisation by
partial-rollout interruption of Guan et al., arXiv 2605.12070). What a trajectory carries, in
``extra_fields`` next to ``token_global_steps`` (``verl_ext.old_logits.rollout_client`` writes both):

* ``dedicated``: ``token_old_log_probs`` — one value per token of the generate() output
  (the scorer's log-prob, ``None`` where a segment went unscored), aligned with the response like
  ``token_global_steps`` (multi-turn loops align it with ``align_token_versions``);
* ``interrupt``: ``old_logit_segments`` — ``[[segment_id, n_tokens], ...]`` per server call, in
  generation order. The trainer scores the segments at the weight sync and keeps the results in a
  ``SegmentStore``; the ids are resolved against it here. A segment's tokens are the next
  ``n_tokens`` *model* tokens of the response (``response_mask == 1``), so multi-turn loops
  concatenate the lists of their turns.

Pure torch: no Ray, no verl.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

TOKEN_OLD_LOG_PROBS_KEY = "token_old_log_probs"
SEGMENTS_KEY = "old_logit_segments"


class SegmentStore:
    """Trainer-side old log-probs of scored segments, keyed by segment id (``interrupt``).

    Args:
        max_versions: segments of versions older than ``current - max_versions`` are dropped by
            ``evict``; no sample that old can still be drawn (the staleness bound).
    """

    def __init__(self, max_versions: int) -> None:
        if max_versions < 1:
            raise ValueError(f"algorithm.old_logits.interrupt.max_versions must be >= 1, got {max_versions}")
        self.max_versions = max_versions
        self._segments: dict[str, tuple[int, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._segments)

    def put(self, segment_id: str, version: int, log_probs: torch.Tensor) -> None:
        self._segments[segment_id] = (int(version), log_probs.detach().to("cpu", torch.float32).reshape(-1))

    def get(self, segment_id: str) -> torch.Tensor | None:
        entry = self._segments.get(segment_id)
        return None if entry is None else entry[1]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: rows restored on resume still name these segments."""
        return {"max_versions": self.max_versions, "segments": dict(self._segments)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._segments = dict(state["segments"])

    def evict(self, current_version: int) -> int:
        """Drops segments of versions < ``current_version - max_versions``; returns how many."""
        old = [s for s, (v, _) in self._segments.items() if v < current_version - self.max_versions]
        for s in old:
            del self._segments[s]
        return len(old)


def precomputed_log_probs(
    extra_fields: Sequence[dict[str, Any] | None],
    response_mask: torch.Tensor,
    store: SegmentStore | None = None,
) -> torch.Tensor:
    """``(bs, L)`` float tensor of the rollout-side old log-probs, NaN where a token has none.

    Reads ``token_old_log_probs`` (response-aligned) and, when ``store`` is given,
    ``old_logit_segments`` (resolved against the store, laid over the model tokens). A row with
    neither is all NaN: the provider decides whether that is an error (stale tokens) or filled
    with the current weights (fresh tokens).

    Raises:
        ValueError: a row's segments cover fewer tokens than its response has model tokens (the
            agent loop dropped a call's list), or a scored segment's length differs from the
            length the trajectory recorded for it.
    """
    bs, length = response_mask.shape
    out = torch.full((bs, length), math.nan, dtype=torch.float32)
    for i, fields in enumerate(extra_fields):
        fields = fields or {}
        values = fields.get(TOKEN_OLD_LOG_PROBS_KEY)
        if values is not None:
            n = min(len(values), length)
            out[i, :n] = torch.tensor([math.nan if v is None else float(v) for v in values[:n]], dtype=torch.float32)
        segments = fields.get(SEGMENTS_KEY)
        if segments is not None and store is not None:
            positions = response_mask[i].bool().nonzero(as_tuple=True)[0]
            out[i, positions] = _segment_values(segments, positions.numel(), store, i)
    return out


def _segment_values(
    segments: Sequence[Sequence[Any]], n_model_tokens: int, store: SegmentStore, index: int
) -> torch.Tensor:
    """The first ``n_model_tokens`` values of the row's segments in order (NaN: not in the store)."""
    values = []
    for segment_id, n_tokens in segments:
        scored = None if segment_id is None else store.get(str(segment_id))
        if scored is not None and scored.numel() != int(n_tokens):
            raise ValueError(
                f"segment {segment_id}: {scored.numel()} scored tokens, the trajectory recorded {n_tokens}"
            )
        values.append(scored if scored is not None else torch.full((int(n_tokens),), math.nan))
    flat = torch.cat(values) if values else torch.empty(0)
    if flat.numel() < n_model_tokens:
        raise ValueError(
            f"row {index}: its {SEGMENTS_KEY} cover {flat.numel()} tokens but the response has {n_model_tokens} "
            "model tokens; multi-turn agent loops must concatenate the lists of all their generate() calls"
        )
    return flat[:n_model_tokens]  # a response cut at its maximum length keeps its first tokens
