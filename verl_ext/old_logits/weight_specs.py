"""Names of the weights an old-logit forward runs under, as they travel from the trainer to the
actor workers (strings in ``batch.extra_info`` and ``__ray_call__`` arguments).

- ``current``: the live weights, whatever they hold now;
- ``ewma``: the EWMA of the trainer's parameters (``verl_ext.old_logits.ewma``);
- ``snapshot:<v>``: the weights of version ``v``: the live ones if no optimizer step ran since ``v``
  was published, else a host copy (``verl_ext.old_logits.snapshot``).
"""

from __future__ import annotations

CURRENT = "current"
EWMA = "ewma"
SNAPSHOT = "snapshot"
_SNAPSHOT_PREFIX = f"{SNAPSHOT}:"


def snapshot_spec(version: int) -> str:
    """The spec of the weights of ``version``."""
    return f"{_SNAPSHOT_PREFIX}{int(version)}"


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"snapshot:7" -> ("snapshot", 7)``, ``"ewma" -> ("ewma", None)``."""
    if spec in (CURRENT, EWMA):
        return spec, None
    if spec.startswith(_SNAPSHOT_PREFIX):
        return SNAPSHOT, int(spec[len(_SNAPSHOT_PREFIX):])
    raise ValueError(f"unknown old-logit weight spec {spec!r}; expected 'current', 'ewma' or 'snapshot:<version>'")
