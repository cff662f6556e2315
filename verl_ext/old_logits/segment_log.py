"""The segment log of the exact old-logit providers ``dedicated`` and ``interrupt``, kept on the
client side of the rollout, whatever engine serves it (``hf``, vLLM).

A *segment* is the tokens of one rollout-server call that returned tokens (an aborted call
included); one call never spans a weight update. verl-ext's per-call LLM client
(``verl_ext.old_logits.rollout_client``) sees every call's prompt ids, token ids and weight
version, so it records each segment here right after the call returns, before its tokens reach
the agent loop. The log runs as one named Ray actor per run (``SEGMENT_LOG_ACTOR_NAME``, started
by the trainer) and:

* counts the segments of each version (``recorded``): the ``dedicated`` scorer's weight update
  waits until it has scored as many segments of the outgoing version;
* for ``interrupt`` (``keep=True``) keeps each segment's prompt and tokens under an id the client
  writes into the trajectory, until the trainer takes them at the weight sync (``take``). Taking
  version ``v`` closes it: a segment of a closed version recorded later (a call whose result was
  still on its way to the client) can no longer be scored with its own weights, so it gets no id
  (it stays unscored and meets ``on_missing``) and is counted in ``late``.

Plain Python: no Ray, no verl, no engine.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

SEGMENT_LOG_ACTOR_NAME = "verl_ext_old_logit_segment_log"


class SegmentLog:
    """Segments recorded by the LLM clients, per weight version.

    Args:
        keep: keep each segment's prompt and tokens for ``take`` and return ids from ``record``
            (``interrupt``); ``False`` only counts (``dedicated``).
    """

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self._prefix = uuid.uuid4().hex[:8]  # ids stay unique across a resume (restored rows keep theirs)
        self._ids = itertools.count()
        self._recorded: dict[Any, int] = {}
        self._segments: list[dict[str, Any]] = []
        self._closed_through: int | None = None  # versions <= this one were taken
        self._late = 0

    def record(self, prompt_ids: list[int], token_ids: list[int], version: Any) -> str | None:
        """Counts one call's segment; returns its id (None: not kept, no tokens, or late)."""
        if not token_ids:
            return None
        self._recorded[version] = self._recorded.get(version, 0) + 1
        if not self.keep:
            return None
        if self._closed_through is not None and (version is None or version <= self._closed_through):
            self._late += 1
            return None
        segment_id = f"{self._prefix}:{next(self._ids)}"
        self._segments.append(
            {"segment_id": segment_id, "version": version, "prompt_ids": list(prompt_ids), "token_ids": list(token_ids)}
        )
        return segment_id

    def recorded(self, version: Any) -> int:
        """How many segments of weight version ``version`` the clients have recorded."""
        return self._recorded.get(version, 0)

    def take(self, version: int) -> tuple[list[dict[str, Any]], int]:
        """The kept segments recorded since the last call (``segment_id``, ``version``,
        ``prompt_ids``, ``token_ids``) and how many late segments were refused meanwhile; closes
        every version up to ``version``."""
        taken, self._segments = self._segments, []
        late, self._late = self._late, 0
        self._closed_through = version if self._closed_through is None else max(self._closed_through, version)
        for old in [v for v in self._recorded if v is not None and v < version]:
            del self._recorded[old]  # counts of versions nobody waits for any more
        return taken, late
