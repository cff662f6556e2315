"""DVReward metrics of a training batch, for verl's tracker (``verl_ext/dvreward/*``).

verl's v1 trainer logs ``reward_extra_info`` only during validation; the verl-ext trainers call
``training_metrics`` on every training batch's rows (``extra_fields["reward_extra_info"]``, the
keys ``DVRewardManager`` writes), one row per trajectory in verl's default layout; the caller leaves
verl's padding rows out. Rows without DVReward keys are skipped.
Every value is finite; a metric with nothing to average (e.g. the score when every row was
flagged) is left out rather than logged as NaN.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

PREFIX = "verl_ext/dvreward"


def _finite(values: list) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _mean(values: list) -> float | None:
    values = _finite(values)
    return sum(values) / len(values) if values else None


def training_metrics(extra_fields: Sequence[Mapping | None]) -> dict[str, float]:
    """Batch means of the per-sample DVReward fields.

    ``score`` / ``semantic`` / ``quality`` average the valid (judged) samples; ``failure_rate``
    and ``cache_hit_rate`` are per question (failed or cached questions / questions asked);
    ``judge_latency_s`` is the mean wall time of a sample's judge calls; ``questions_per_sample``
    counts every sample; ``valid_fraction`` is the share of samples that were judged.
    """
    infos = []
    for fields in extra_fields:
        info = fields.get("reward_extra_info") if isinstance(fields, Mapping) else None
        if isinstance(info, Mapping) and "dv_valid" in info:
            infos.append(info)
    if not infos:
        return {}
    n_questions = [int(i.get("dv_n_questions") or 0) for i in infos]
    asked = sum(n_questions)
    valid = [i for i in infos if i.get("dv_valid")]
    values = {
        "valid_fraction": len(valid) / len(infos),
        "questions_per_sample": asked / len(infos),
        "score/mean": _mean([i.get("dv_score") for i in valid]),
        "semantic/mean": _mean([i.get("dv_semantic") for i in valid]),
        "quality/mean": _mean([i.get("dv_quality") for i in valid]),
        "failure_rate": sum(int(i.get("dv_n_failed") or 0) for i in infos) / asked if asked else None,
        "cache_hit_rate": (
            sum((i.get("dv_cache_hit_rate") or 0.0) * n for i, n in zip(infos, n_questions)) / asked if asked else None
        ),
        "judge_latency_s/mean": _mean([i.get("dv_judge_latency_s") for i in infos]),
        "judge_latency_s/max": max(_finite([i.get("dv_judge_latency_s") for i in infos]), default=None),
    }
    return {f"{PREFIX}/{k}": float(v) for k, v in values.items() if v is not None}
