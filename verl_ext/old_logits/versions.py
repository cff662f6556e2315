"""Per-token policy versions: the rollout side records them, the trainer expands them.

An agent loop writes, per trajectory (one training row), run-length spans over the response
tokens into ``AgentLoopOutput.extra_fields["verl_ext"]["token_versions"]``:

    [(version, n_tokens), ...]      e.g. [(4, 120), (-1, 35), (4, 10), (5, 80)]

``version`` is the weight version the inference server reported for those model tokens (verl:
``TokenOutput.extra_fields["global_steps"]``), ``-1`` marks tokens with no version (tool /
observation tokens, ``response_mask == 0``). Spans cover the response exactly, in order. The
trainer expands rows into a ``(bs, L)`` tensor aligned with the response tokens (padding = -1).

Research brief §2.2 ("no per-token version is recorded" in verl/ROLL) and §4 "shared
prerequisite: version tagging".
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

NO_VERSION = -1
EXTRA_FIELDS_KEY = "verl_ext"
SPANS_KEY = "token_versions"

VersionSpans = list[tuple[int, int]]


def compress_versions(versions: Sequence[int]) -> VersionSpans:
    """Run-length spans of a per-token version list: ``[4, 4, -1, 5] -> [(4, 2), (-1, 1), (5, 1)]``."""
    spans: VersionSpans = []
    for v in versions:
        if spans and spans[-1][0] == v:
            spans[-1] = (v, spans[-1][1] + 1)
        else:
            spans.append((int(v), 1))
    return spans


def expand_spans(spans: Sequence[Sequence[int]]) -> list[int]:
    """Inverse of ``compress_versions``."""
    return [int(v) for v, n in spans for _ in range(int(n))]


class TokenVersionRecorder:
    """Builds the spans of one trajectory while an agent loop appends response tokens.

    ``add(version, n)`` after each model generation (call it once per server reply; if the server
    reports a version change mid-reply, call it per segment), ``add_unversioned(n)`` for tool or
    observation tokens, then ``write_to(output.extra_fields)``.
    """

    def __init__(self) -> None:
        self.spans: VersionSpans = []

    def add(self, version: int, n_tokens: int) -> None:
        if version < 0:
            raise ValueError(
                f"a model token's version must be >= 0, got {version}; use add_unversioned for tool tokens"
            )
        self._append(version, n_tokens)

    def add_unversioned(self, n_tokens: int) -> None:
        self._append(NO_VERSION, n_tokens)

    def _append(self, version: int, n_tokens: int) -> None:
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if n_tokens == 0:
            return
        if self.spans and self.spans[-1][0] == version:
            self.spans[-1] = (version, self.spans[-1][1] + n_tokens)
        else:
            self.spans.append((int(version), int(n_tokens)))

    def write_to(self, extra_fields: dict[str, Any]) -> None:
        """Stores the spans under ``extra_fields["verl_ext"]["token_versions"]`` (lists of 2 ints:
        they survive TransferQueue's NonTensorStack round trip)."""
        extra_fields.setdefault(EXTRA_FIELDS_KEY, {})[SPANS_KEY] = [[v, n] for v, n in self.spans]


def spans_from_extra_fields(extra_fields: Mapping[str, Any] | None) -> VersionSpans | None:
    """The spans an agent loop stored, or None if it stored none."""
    spans = ((extra_fields or {}).get(EXTRA_FIELDS_KEY) or {}).get(SPANS_KEY)
    return None if spans is None else [(int(v), int(n)) for v, n in spans]


def validate_spans(spans: Sequence[Sequence[int]], response_mask: Sequence[int] | torch.Tensor) -> None:
    """Checks one row's spans against its (unpadded) response mask; raises ``ValueError``.

    Rules: spans cover the response exactly; every mask-1 token has a version >= 0 and every
    mask-0 token has -1; model-token versions never decrease (weights only move forward).
    """
    mask = [int(m) for m in (response_mask.tolist() if isinstance(response_mask, torch.Tensor) else response_mask)]
    if any(int(n) <= 0 for _, n in spans):
        raise ValueError(f"token-version spans must have positive lengths: {list(spans)}")
    versions = expand_spans(spans)
    if len(versions) != len(mask):
        raise ValueError(f"token-version spans cover {len(versions)} tokens, the response has {len(mask)}")
    bad = [i for i, (v, m) in enumerate(zip(versions, mask, strict=True)) if (v >= 0) != bool(m)]
    if bad:
        raise ValueError(
            f"token {bad[0]} has version {versions[bad[0]]} but response_mask {mask[bad[0]]}: model tokens need a "
            f"version >= 0, tool/observation tokens {NO_VERSION} ({len(bad)} mismatches)"
        )
    model = [v for v in versions if v >= 0]
    if any(b < a for a, b in itertools.pairwise(model)):
        raise ValueError(f"token versions decrease within a trajectory: {list(spans)}")


def token_versions_tensor(
    rows: Sequence[Sequence[Sequence[int]] | None],
    response_length: int,
    fallback: Sequence[int | None] | None = None,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expands per-row spans into a ``(bs, L)`` long tensor, -1 for padding and unversioned tokens.

    Args:
        rows: per row, its spans or None (the agent loop recorded none).
        response_length: L, the padded response length.
        fallback: per row, a single version to use when the spans are missing (verl's per-sample
            tags give one when ``min_global_steps == max_global_steps``), else None.
        response_mask: ``(bs, L)``; needed with ``fallback`` (versioned where mask is 1).

    Raises:
        ValueError: a row has neither spans nor a fallback version.
    """
    out = torch.full((len(rows), response_length), NO_VERSION, dtype=torch.long)
    for i, spans in enumerate(rows):
        if spans is not None:
            versions = expand_spans(spans)
            if len(versions) > response_length:
                raise ValueError(f"row {i}: spans cover {len(versions)} tokens > response length {response_length}")
            out[i, : len(versions)] = torch.tensor(versions, dtype=torch.long)
        elif fallback is not None and fallback[i] is not None and response_mask is not None:
            out[i] = torch.where(response_mask[i].bool(), int(fallback[i]), NO_VERSION)
        else:
            raise ValueError(
                f"row {i} has no per-token versions and spans several policy versions; the agent loop must record "
                f'extra_fields["{EXTRA_FIELDS_KEY}"]["{SPANS_KEY}"] (verl_ext.old_logits.versions.TokenVersionRecorder), '
                "or pick algorithm.old_logits.provider=current|rollout|ewma, which need no versions"
            )
    return out


def single_version_fallback(min_versions: Sequence[int], max_versions: Sequence[int]) -> list[int | None]:
    """Per row, the version of all its tokens when verl's tags pin it (min == max), else None."""
    return [int(lo) if lo == hi else None for lo, hi in zip(min_versions, max_versions, strict=True)]
