"""Worker-side state of the old-logit providers: what an actor worker holds and when it acts.

Pure torch: the lead's worker subclass owns one ``OldLogitWorkerState`` built from the trainer's
parameters (local shards) and calls the four hooks below; nothing here knows about Ray or verl.

    before_optimizer_step(version)  # snapshot θ_version before the first step that replaces it
    after_optimizer_step()          # EWMA update (update_every=optimizer_step)
    on_version_published(version)   # EWMA update (update_every=version)
    with state.weights(spec): ...   # forward under "current" | "ewma" | "snapshot:<v>"
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from verl_ext.old_logits.config import OldLogitsConfig
from verl_ext.old_logits.ewma import EWMAShadow
from verl_ext.old_logits.snapshot import SnapshotMissingError, SnapshotStore

logger = logging.getLogger("verl_ext.old_logits")

CURRENT = "current"
EWMA = "ewma"
_SNAPSHOT = "snapshot:"


def snapshot_spec(version: int) -> str:
    """The weight spec that selects the snapshot of ``version`` (travels as a string in ``batch.extra_info``)."""
    return f"{_SNAPSHOT}{int(version)}"


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"snapshot:7" -> ("snapshot", 7)``, ``"ewma" -> ("ewma", None)``."""
    if spec in (CURRENT, EWMA):
        return spec, None
    if spec.startswith(_SNAPSHOT):
        return "snapshot", int(spec[len(_SNAPSHOT) :])
    raise ValueError(f"unknown old-logit weight spec {spec!r}; expected 'current', 'ewma' or 'snapshot:<version>'")


class OldLogitWorkerState:
    """EWMA shadow and/or snapshot store for one worker's parameter shards.

    Args:
        config: resolved ``algorithm.old_logits`` config.
        params: the actor's parameters on this rank (plain tensors or DTensors).
        updates_per_version: optimizer steps per training step (for the EWMA's centre of mass).
        backup_device: where live weights wait during a swap (None: accelerator; "cpu": host).
    """

    def __init__(
        self,
        config: OldLogitsConfig,
        params: Sequence[torch.Tensor],
        updates_per_version: int = 1,
        backup_device: str | None = None,
    ) -> None:
        self.config = config
        self.params = list(params)
        self.backup_device = backup_device
        self.ewma = (
            EWMAShadow(self.params, config.ewma_beta(updates_per_version), config.ewma.bias_correction)
            if config.provider == "ewma"
            else None
        )
        self.snapshots = (
            SnapshotStore(config.snapshot_max_versions(), config.snapshot.pin_memory)
            if config.provider == "snapshot"
            else None
        )
        self.missing_snapshot_forwards = 0
        self._last_saved: int | None = None
        # Set by the trainer glue: the version the live weights hold now, and the weight swap
        # in progress (entered and exited by two separate calls into the worker).
        self.version = 0
        self.active: AbstractContextManager[Any] | None = None

    def before_optimizer_step(self, version: int) -> None:
        """Snapshot the weights of ``version`` once, right before they are first changed."""
        if self.snapshots is not None and self._last_saved != version:
            self.snapshots.save(version, self.params)
            self._last_saved = version

    def after_optimizer_step(self) -> None:
        if self.ewma is not None and self.config.ewma.update_every == "optimizer_step":
            self.ewma.update()

    def on_version_published(self, version: int) -> None:
        if self.ewma is not None and self.config.ewma.update_every == "version":
            self.ewma.update()

    def weights(self, spec: str) -> AbstractContextManager[Any]:
        """Context under which the live parameters hold the weights named by ``spec``."""
        kind, version = parse_spec(spec)
        if kind == CURRENT:
            return nullcontext()
        if kind == EWMA:
            if self.ewma is None:
                raise RuntimeError(
                    f"weights {spec!r} requested but algorithm.old_logits.provider={self.config.provider}"
                )
            return self.ewma.swap_in(self.backup_device)
        if self.snapshots is None:
            raise RuntimeError(f"weights {spec!r} requested but algorithm.old_logits.provider={self.config.provider}")
        try:
            return self.snapshots.swap_in(version, self.params, self.backup_device)
        except SnapshotMissingError:
            if self.config.snapshot.on_missing != "current":
                raise
            self.missing_snapshot_forwards += 1
            logger.warning("verl-ext: no snapshot of version %s; scoring its tokens with the current weights", version)
            return nullcontext()

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state (the EWMA; snapshots are not checkpointed, see SnapshotConfig.on_missing)."""
        return {"ewma": None if self.ewma is None else self.ewma.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.ewma is not None:
            self.ewma.resume((state or {}).get("ewma"), self.config.ewma.on_missing_state)
