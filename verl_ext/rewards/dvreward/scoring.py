"""DVReward scoring: per-question P(yes) from first-token log-probs, DSG gating, aggregation.

Pure functions over Python floats; no I/O and no numpy, so importing this module is free.

Reference: AlphaGRPO / DVReward (arXiv 2605.12495) and its released code
(JunyiWuCode/AlphaGRPO, ``alpha_grpo/rewards/rewards.py``).
Differences from the reference implementation:

* A judge answer that is neither "yes" nor "no" (no yes/no candidate among the first-token
  log-probs and no yes/no text) is a **fault** (``None``), not a "no" (the reference scores 0).
* Failed questions are excluded from the means and counted; a sample with no judged question in
  a non-empty kind has no score (``DVScore.score is None``) instead of a silent 0.
* Optional DSG gating (Cho et al., ICLR'24): a child question whose parent was answered "no"
  scores 0 (the reference has no dependencies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

AGGREGATIONS = ("geometric", "mean", "sum_mean")
SEMANTIC, QUALITY = "semantic", "quality"
_STRIP = " \t\n\r.,?!:;\"'`*"


def normalise_answer(token: str) -> str:
    """Lower-case a token or answer and strip whitespace, quotes and ``.,?!:;`` (" Yes." -> "yes")."""
    return token.strip(_STRIP).lower()


def hard_answer(text: str | None) -> float | None:
    """1.0 / 0.0 when the first word of ``text`` is yes / no, else ``None`` (not an answer)."""
    words = (text or "").split()
    if not words:
        return None
    return {"yes": 1.0, "no": 0.0}.get(normalise_answer(words[0]))


def p_yes(candidates: Sequence[tuple[str, float]], text: str | None, binary: bool = False) -> float | None:
    """Score one judge answer: P(yes) / (P(yes) + P(no)) over the first generated token.

    Args:
        candidates: the first token's top log-prob candidates as ``(token, logprob)`` pairs
            (OpenAI ``logprobs.content[0].top_logprobs``). Tokens are normalised, so " Yes",
            "YES" and "yes." all count as yes.
        text: the generated answer text, used when no candidate is yes/no (hard fallback) and
            always in binary mode.
        binary: score the hard answer only (AlphaGRPO's ``dvreward_binary``).

    Returns:
        The probability of "yes" in [0, 1], or ``None`` when the judge gave neither yes nor no.
    """
    if not binary:
        mass = {"yes": 0.0, "no": 0.0}
        for token, logprob in candidates:
            key = normalise_answer(token)
            if key in mass and logprob is not None and math.isfinite(logprob):
                mass[key] += math.exp(logprob)
        total = mass["yes"] + mass["no"]
        if total > 0.0:
            return mass["yes"] / total
    return hard_answer(text)


def gate_by_parents(
    scores: Sequence[float | None], parents: Sequence[Sequence[int]], threshold: float = 0.5
) -> list[float | None]:
    """DSG dependency gating: a question whose parent scored below ``threshold`` scores 0.

    Args:
        scores: per-question P(yes) or ``None`` (failed), length n.
        parents: ``parents[i]`` lists the indices of question i's parents; every parent index is
            smaller than i (``question_set`` enforces it), so one forward pass is a topological
            pass and gating propagates to grandchildren.
        threshold: a parent below it counts as answered "no".

    Returns:
        Gated per-question scores, length n. A parent that failed (``None``) does not gate: an
        unknown answer is not a "no".
    """
    gated = list(scores)
    for i, parent_ids in enumerate(parents):
        if any(gated[p] is not None and gated[p] < threshold for p in parent_ids):
            gated[i] = 0.0
    return gated


@dataclass(frozen=True)
class DVScore:
    """One sample's DVReward result.

    Attributes:
        score: the aggregate in [0, 1], or ``None`` when the sample could not be judged.
        semantic / quality: mean of the judged questions of each kind (1.0 for a kind with no
            questions, as in the reference), ``None`` when every question of the kind failed.
        per_question: per-question scores after gating, ``None`` where the judge failed.
        n_questions / n_failed: how many questions there were and how many the judge failed on.
    """

    score: float | None
    semantic: float | None
    quality: float | None
    per_question: tuple[float | None, ...]
    n_questions: int
    n_failed: int


def _mean_of_answered(values: list[float | None]) -> float | None:
    answered = [v for v in values if v is not None]
    if not values:
        return 1.0
    return sum(answered) / len(answered) if answered else None


def aggregate(
    scores: Sequence[float | None],
    kinds: Sequence[str],
    method: str = "geometric",
    min_answered_fraction: float = 0.0,
) -> DVScore:
    """Aggregate per-question scores into one DVReward score.

    Args:
        scores: per-question P(yes) (after gating), ``None`` for failed questions; length n.
        kinds: ``"semantic"`` or ``"quality"`` per question; length n.
        method: ``geometric`` (default): sqrt(semantic_mean * quality_mean); ``mean``:
            0.5 * semantic_mean + 0.5 * quality_mean; ``sum_mean``: mean over all questions.
        min_answered_fraction: the sample is unjudged (``score=None``) when fewer than this
            fraction of its questions were answered. Independently of it, a sample is unjudged
            when it has no questions or when every question of a non-empty kind failed.

    Returns:
        A ``DVScore``. Golden example (AlphaGRPO's scoring rule): semantic p = 0.9, 0.3
        and quality p = 0.8 give geometric 0.6929, mean 0.7000, sum_mean 0.6667.
    """
    if method not in AGGREGATIONS:
        raise ValueError(
            f"unknown DVReward aggregation {method!r}: set reward.reward_kwargs.dvreward.aggregation "
            f"to one of {AGGREGATIONS}"
        )
    if len(scores) != len(kinds):
        raise ValueError(f"{len(scores)} scores for {len(kinds)} question kinds")
    semantic = _mean_of_answered([s for s, k in zip(scores, kinds, strict=True) if k == SEMANTIC])
    quality = _mean_of_answered([s for s, k in zip(scores, kinds, strict=True) if k == QUALITY])
    answered = [s for s in scores if s is not None]
    n_failed = len(scores) - len(answered)
    result = dict(
        semantic=semantic, quality=quality, per_question=tuple(scores), n_questions=len(scores), n_failed=n_failed
    )
    if not answered or semantic is None or quality is None or len(answered) < min_answered_fraction * len(scores):
        return DVScore(score=None, **result)
    if method == "geometric":
        score = math.sqrt(semantic * quality)
    elif method == "mean":
        score = 0.5 * semantic + 0.5 * quality
    else:
        score = sum(answered) / len(answered)
    return DVScore(score=score, **result)
