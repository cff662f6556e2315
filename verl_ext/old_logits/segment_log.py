"""The segment log of the exact old-logit provider ``interrupt`` and the served-segment counts
both rollout-side providers order themselves by, for every rollout engine (``hf``, vLLM).

A *segment* is the tokens of one rollout-server call that returned tokens (an aborted call
included); one call never spans a weight update.

* ``ServedSegments``: each rollout server counts the segments it returned per weight version,
  before it returns them (the ``hf`` server natively, vLLM's through a registered subclass of
  verl's server, ``verl_ext.old_logits.vllm_segments``). The counts are the ground truth a sync
  waits for: a call's result may still be on its way to the LLM client when verl's abort returns.
* ``SegmentLog``: verl-ext's per-call LLM client (``verl_ext.old_logits.rollout_client``) sees
  every call's prompt ids, token ids and weight version, so it records each segment here right
  after the call returns, before its tokens reach the agent loop, and writes the id it gets into
  the trajectory. The log runs as one named Ray actor per run (``SEGMENT_LOG_ACTOR_NAME``, started
  by the trainer) and keeps each segment's prompt and tokens until the trainer takes them at the
  weight sync (``take``), once it has as many of the outgoing version as the servers served.
  Taking version ``v`` closes it: a segment of a closed version recorded later (possible only
  after a sync that gave up waiting) gets no id, stays unscored, meets ``on_missing`` and is
  counted in ``late``; it is never scored with other weights.

Plain Python: no Ray, no verl, no engine.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from typing import Any

SEGMENT_LOG_ACTOR_NAME = "verl_ext_old_logit_segment_log"
SEGMENT_LOG_COMPONENT = f"the interrupt segment log (Ray actor {SEGMENT_LOG_ACTOR_NAME})"


class ServedSegments:
    """Mixin for a rollout server: how many segments (calls that returned tokens) it has served
    under each weight version. The server calls ``count_served`` before it releases the result."""

    def count_served(self, version: Any) -> None:
        served = self.__dict__.setdefault("_served_segments", {})
        served[version] = served.get(version, 0) + 1

    async def served_segments(self, version: Any) -> int:
        """How many segments this server has returned under weight version ``version``."""
        return self.__dict__.get("_served_segments", {}).get(version, 0)


class SegmentLog:
    """Segments recorded by the LLM clients, until the trainer takes them (``interrupt``)."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:8]  # ids stay unique across a resume (restored rows keep theirs)
        self._ids = itertools.count()
        self._recorded: dict[Any, int] = {}
        self._segments: list[dict[str, Any]] = []
        self._closed_through: int | None = None  # versions <= this one were taken
        self._late = 0

    def record(self, prompt_ids: list[int], token_ids: list[int], version: Any) -> str | None:
        """Keeps one call's segment; returns its id (None: no tokens, or its version was taken)."""
        if not token_ids:
            return None
        if self._closed_through is not None and (version is None or version <= self._closed_through):
            self._late += 1
            return None
        self._recorded[version] = self._recorded.get(version, 0) + 1
        segment_id = f"{self._prefix}:{next(self._ids)}"
        self._segments.append(
            {"segment_id": segment_id, "version": version, "prompt_ids": list(prompt_ids), "token_ids": list(token_ids)}
        )
        return segment_id

    def recorded(self, version: Any) -> int:
        """How many segments of weight version ``version`` the clients have recorded."""
        return self._recorded.get(version, 0)

    def take(self, version: int) -> tuple[list[dict[str, Any]], int]:
        """The recorded segments of versions up to ``version`` not taken yet (``segment_id``,
        ``version``, ``prompt_ids``, ``token_ids``; segments of later versions stay) and how many
        late segments were refused meanwhile; closes every version up to ``version``."""
        taken, self._segments = self._split(lambda v: v is None or v <= version)
        late, self._late = self._late, 0
        self._closed_through = version if self._closed_through is None else max(self._closed_through, version)
        for old in [v for v in self._recorded if v is not None and v <= version]:
            del self._recorded[old]  # closed: nobody waits for these counts any more
        return taken, late

    def take_recorded(self, version: int) -> list[dict[str, Any]]:
        """The segments of ``version`` recorded so far and not taken yet; the version stays open
        (its later segments are taken by ``take``). For a checkpoint in the middle of a version."""
        taken, self._segments = self._split(lambda v: v == version)
        return taken

    def _split(self, selected: Callable[[Any], bool]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(segments whose version is ``selected``, the others), each in recording order."""
        chosen = [seg for seg in self._segments if selected(seg["version"])]
        return chosen, [seg for seg in self._segments if not selected(seg["version"])]
