"""Worker-side state of the old-logit providers: what an actor worker holds and when it acts.

Pure torch: each actor worker holds one ``OldLogitWorkerState`` over the trainer's parameters (its
local shards), built with what the configured provider requires (an EWMA shadow, weight
snapshots); verl's trainer drives it through ``verl_ext.old_logits.worker_side`` (Ray's
``__ray_call__``, no worker subclass). Nothing here knows about Ray or verl.

    set_version(version)            # the actor update of a step starts: the snapshot of
                                    # θ_version starts copying (overlapped with the update)
    before_optimizer_step(version)  # count the step; the snapshot of θ_version completes before
                                    # the first step that replaces it; recalibrate the EWMA decay
    after_optimizer_step()          # EWMA update (update_every=optimizer_step)
    on_version_published(version)   # EWMA update (update_every=version)
    with state.weights(spec): ...   # forward under "current" | "ewma" | "snapshot:<v>"
    report()                        # this step's verl_ext/time/* and verl_ext/mem/* (verl_ext.timing)
    ewma_calibrate(token_age, n)    # report the EWMA's age; aim it at the batch's token age
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from verl_ext.old_logits.config import OldLogitsConfig
from verl_ext.old_logits.ewma import EWMAShadow, beta_from_com
from verl_ext.old_logits.providers import build_provider
from verl_ext.old_logits.snapshot import SnapshotMissingError, SnapshotStore
from verl_ext.old_logits.weight_specs import CURRENT, EWMA, parse_spec
from verl_ext.old_logits.swap import fsdp_resharder, local_tensors
from verl_ext.timing import held_bytes, hook_timer, timed

logger = logging.getLogger("verl_ext.old_logits")

SAVED_FROM_HOST = "old_logits/snapshot/saved_from_host_bytes"
# host seconds spent starting the saves: `verl_ext/time/snapshot_save` is the compute stream's view,
# which equals it only while the stream is idle; the two apart tell a blocked host from queued work
SAVE_HOST_S = "old_logits/snapshot/save_host_s"


class OldLogitWorkerState:
    """EWMA shadow and/or snapshot store for one worker's parameter shards.

    Args:
        config: resolved ``algorithm.old_logits`` config.
        params: the actor's parameters on this rank (plain tensors or DTensors), sharded.
        updates_per_version: the trainer's estimate of optimizer steps per version; it sets the
            EWMA's decay (``ewma.com`` is in versions) only until the first version has been
            trained, after which the optimizer steps actually counted in the last completed
            version set it (``calibrate``).
        backup_device: where live weights wait during a swap (None: accelerator; "cpu": host).
        modules: the model the parameters belong to; its FSDP2 modules are resharded around every
            swap (``swap.fsdp_resharder``) so no gathered copy outlives the swapped values.
        first_version: the version the parameters hold now (verl v1: ``global_steps - 1``).
    """

    def __init__(
        self,
        config: OldLogitsConfig,
        params: Sequence[torch.Tensor],
        updates_per_version: int = 1,
        backup_device: str | None = None,
        modules: Sequence[torch.nn.Module] = (),
        first_version: int = 0,
    ) -> None:
        self.config = config
        self.params = list(params)
        self.backup_device = backup_device
        self.reshard = fsdp_resharder(modules)
        needs = build_provider(config).requirements()
        self.ewma = (
            EWMAShadow(self.params, config.ewma_beta(updates_per_version), config.ewma.bias_correction)
            if EWMA in needs.weights
            else None
        )
        self.snapshots = (
            SnapshotStore(needs.snapshots, config.snapshot.pin_memory,
                          float32_as=torch.bfloat16 if config.snapshot.dtype == "bf16" else None)
            if needs.snapshots
            else None
        )
        if self.snapshots is not None:  # pin the copies' host memory now, not inside the first steps
            started = time.perf_counter()
            reserved = self.snapshots.reserve(self.params)
            logger.info("verl-ext: %.2f GB of host memory for %d weight snapshots, reserved in %.1f s",
                        reserved / 1e9, self.snapshots.max_versions, time.perf_counter() - started)
        # The version during which the last optimizer step ran: the live weights are those of every
        # version after it. Before the first step: every version since first_version holds them
        # (e.g. the trainer.critic_warmup steps); None: unknown (resumed from a checkpoint).
        self._step_version: int | None = first_version - 1
        self._steps_in_version = 0
        self.steps_per_version: int | None = None  # counted in the last completed version
        self._steps_estimate = max(1, updates_per_version)
        self._published: int | None = None
        # Set by the trainer glue: the version the live weights hold now, and the weight swap
        # in progress (entered and exited by two separate calls into the worker).
        self.version = 0
        self.active: AbstractContextManager[Any] | None = None
        self._saving: int | None = None  # the version whose snapshot copy was started last
        # bytes this step's snapshot saves read from host memory: on CUDA the copies are asynchronous only
        # from the GPU (a save whose live weights sit in host memory copies on the critical path)
        self._saved_from_host = 0.0
        self._save_host_s = 0.0
        # bytes of the live values' backup during the last swap (set by the trainer glue)
        self.swap_backup_bytes = held_bytes("swap_backup", [])

    def set_version(self, version: int) -> None:
        """The live weights hold ``version`` and the actor update that replaces them starts: the
        snapshot's copies start now and overlap with the update until ``before_optimizer_step``."""
        self.version = version
        self._start_snapshot(version)

    def _start_snapshot(self, version: int) -> None:
        if self.snapshots is None or version in (self._saving, self._step_version):
            return
        same_since = None if self._step_version is None else self._step_version + 1
        started = time.perf_counter()
        with timed("snapshot_save"):
            self.snapshots.begin_save(version, self.params, same_since=same_since)
        self._save_host_s += time.perf_counter() - started
        self._saving = version
        self._saved_from_host += held_bytes("save", local_tensors(self.params))["verl_ext/mem/save/host_bytes"]

    def before_optimizer_step(self, version: int) -> None:
        """Counts the step; at the first step of ``version``, snapshots the weights of ``version``
        (and of the versions before it that hold the same weights) and recalibrates the EWMA from
        the steps counted in the previous version."""
        if version != self._step_version:
            if self._step_version is not None and self._steps_in_version:
                self.calibrate(self._steps_in_version)
            if self.snapshots is not None:
                self._start_snapshot(version)  # unless set_version started it
                with timed("snapshot_save_wait"):  # what is left of the copy on the critical path
                    self.snapshots.wait_saved()
            self._step_version, self._steps_in_version = version, 0
        self._steps_in_version += 1

    def after_optimizer_step(self) -> None:
        if self.ewma is not None and self.config.ewma.update_every == "optimizer_step":
            with timed("ewma_update"):
                self.ewma.update()

    def on_version_published(self, version: int) -> None:
        # verl publishes once per local update (trainer.v1.<mode>.parameter_sync_step of them per
        # version): update once per version
        if self.ewma is not None and self.config.ewma.update_every == "version" and version != self._published:
            with timed("ewma_update"):
                self.ewma.update()
        self._published = version

    def calibrate(self, steps_per_version: int) -> None:
        """Sets a fixed ``ewma.com`` decay from the optimizer steps one version took (``com``
        versions = ``com * steps_per_version`` updates); a no-op for a fixed ``ewma.beta`` and
        for the calibrated decay, which ``ewma_calibrate`` aims at the tokens' age."""
        self.steps_per_version = steps_per_version
        if self.ewma is not None and self.config.ewma.com is not None:
            self.ewma.set_beta(self.config.ewma_beta(steps_per_version))

    def ewma_calibrate(self, token_age_versions: float | None, version: int | None = None) -> dict[str, float]:
        """Reports the EWMA as the forward just done used it, then (calibrated decay only) aims
        the following updates' age at the tokens' age: ``token_age_versions``, the mean age of the
        batch's tokens in versions behind ``version`` (the version the trainer's window started
        from), plus the optimizer steps the live weights have taken since (``separate_async``'s
        local updates), capped at ``ewma.max_com`` versions.

        Returns:
            ``beta`` (of the last update), ``age_steps`` (θ̄'s centre-of-mass age in optimizer
            steps behind the live weights), ``steps_per_version`` (counted in the last completed
            version, else the trainer's estimate) and ``steps_into_version`` (optimizer steps since
            ``version`` was published: 0 except within a ``separate_async`` window).
        """
        if self.ewma is None:
            raise RuntimeError(f"ewma_calibrate called but algorithm.old_logits.provider={self.config.provider}")
        steps = self.steps_per_version or self._steps_estimate
        into = self._steps_in_version if version is not None and self._step_version == version else 0
        updates_per_step = self.config.ewma_updates(1.0, steps) / steps  # 1, or 1/steps per version
        report = {"beta": self.ewma.beta, "age_steps": self.ewma.age / updates_per_step, "steps_per_version": steps,
                  "steps_into_version": into}
        if self.config.ewma.calibrated and token_age_versions is not None:
            bound = self.config.ewma_updates(self.config.ewma_max_com(), steps)
            target = self.config.ewma_updates(token_age_versions, steps) + into * updates_per_step
            self.ewma.set_target_age(min(target, bound), beta_from_com(bound))
        return report

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
            return self.ewma.swap_in(self.backup_device, self.reshard)
        if self._step_version is not None and version > self._step_version:
            return nullcontext()  # no optimizer step since this version: the live weights are its weights
        if self.snapshots is None:
            why = "" if self.config.stale_tokens else " (the sync trainer keeps no snapshots: its tokens are never stale)"
            raise RuntimeError(
                f"weights {spec!r} requested but algorithm.old_logits.provider={self.config.provider}{why}"
            )
        try:
            return self.snapshots.swap_in(version, self.params, self.backup_device, self.reshard)
        except SnapshotMissingError:
            if self.config.snapshot.on_missing != "current":
                raise
            logger.warning("verl-ext: no snapshot of version %s; scoring its tokens with the current weights", version)
            return nullcontext()

    def memory(self) -> dict[str, float]:
        """``verl_ext/mem/*``: the EWMA shadow, the snapshot buffers (stored and free for reuse)
        and the backup of the live values during the last swap, in GPU and host bytes."""
        out = dict(self.swap_backup_bytes)
        if self.ewma is not None:
            out.update(held_bytes("ewma_shadow", self.ewma.shadow))
        if self.snapshots is not None:
            out.update(held_bytes("snapshots", self.snapshots.buffers))
        return out

    def report(self) -> dict[str, float]:
        """This worker's hook times since the last report, the memory it holds now and
        ``old_logits/snapshot/saved_from_host_bytes`` and ``old_logits/snapshot/save_host_s``
        (snapshot providers: the bytes its saves since the last report read from host memory, and
        the host seconds they took to start)."""
        out = {**hook_timer().collect(), **self.memory()}
        if self.snapshots is not None:
            out[SAVED_FROM_HOST], self._saved_from_host = self._saved_from_host, 0.0
            out[SAVE_HOST_S], self._save_host_s = self._save_host_s, 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        """Checkpoint state: the EWMA and its calibration (snapshots are not checkpointed, see
        SnapshotConfig.on_missing)."""
        return {
            "ewma": None if self.ewma is None else self.ewma.state_dict(),
            "ewma_target_age": None if self.ewma is None else self.ewma.target_age,
            "steps_per_version": self.steps_per_version,
        }

    def load_state_dict(self, state: dict[str, Any] | None, version: int | None = None) -> None:
        """Restores ``state_dict``'s state; ``version``: the version the restored live weights hold
        (verl v1: the checkpoint's ``global_steps``), None if unknown. Versions before it are gone."""
        state = state or {}
        self._step_version = None if version is None else version - 1
        if state.get("steps_per_version"):
            self.calibrate(state["steps_per_version"])  # the decay the saved EWMA was built with
        if self.ewma is not None:
            calibrated = self.config.ewma.calibrated
            self.ewma.resume(state.get("ewma"), self.config.ewma.on_missing_state, same_beta=not calibrated)
            if calibrated and state.get("ewma_target_age") is not None:
                bound = self.config.ewma_updates(self.config.ewma_max_com(), self.steps_per_version or self._steps_estimate)
                self.ewma.set_target_age(state["ewma_target_age"], beta_from_com(bound))
