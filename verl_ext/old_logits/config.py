"""``algorithm.old_logits.*``: which provider computes ``old_log_probs`` and its settings.

verl 0.9.1 passes ``config.algorithm`` to the trainer as a raw DictConfig, so these dataclasses
are built by ``OldLogitsConfig.from_config`` (strict: an unknown key is an error that names it)
rather than by verl's ``_target_`` instantiation.

Example (Hydra overrides)::

    +algorithm.old_logits.provider=ewma
    +algorithm.old_logits.ewma.com=4          # fixed; default: calibrated from the tokens' age, see EWMAConfig
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.old_logits.ewma import beta_from_com, com_from_beta
from verl_ext.old_logits.loglinear import PROXIMAL_VERSIONS
from verl_ext.waits import check_timeout

KEY = "algorithm.old_logits"
SNAPSHOT_DTYPES = ("param", "bf16")  # what a snapshot stores fp32 parameters as (SnapshotConfig.dtype)
SWAP_BACKUPS = ("host", "device")  # where live weights wait during a swap (OldLogitsConfig.swap_backup)
STALENESS_KEY = "trainer.v1.sampler.max_off_policy_threshold"
# the provider that is verl's own behaviour: any other needs a verl-ext trainer
DEFAULT_PROVIDER = "current"
# verl 0.9.1's trainer modes (trainer.v1.trainer_mode), as the verl-ext trainers extend them
TRAINER_MODES = ("sync", "colocate_async", "separate_async")


@dataclass(frozen=True)
class EWMAConfig:
    """``algorithm.old_logits.ewma``.

    Attributes:
        beta: fixed EWMA decay; give ``beta`` or ``com``, not both.
        com: fixed centre of mass in *versions*; β = c / (1 + c) with c = com × updates per
            version (Hilton's 0.889 is com = 8 updates).
        max_com: with neither set (the default), the decay is *calibrated*: at every version the
            EWMA aims its centre-of-mass age at the measured mean age of the batch's tokens, in
            optimizer steps (Hilton et al. 2022's centre-of-mass rule with the mean lag as com; with ``fresh_exact`` the mean
            over the stale tokens, the only ones the EWMA stands in for), capped at ``max_com``
            versions (default: the staleness bound ``trainer.v1.sampler.max_off_policy_threshold``).
            ``EWMAShadow.set_target_age`` / ``decay_for_target_age`` pick each update's β.
        update_every: ``optimizer_step`` (Hilton; the trainer passes its optimizer steps per
            version) or ``version`` (once per published weight version).
        bias_correction: Hilton's total-weight scheme (θ̄_0 = θ_0 weighs as one update).
        fresh_exact: use the current weights for tokens of staleness 0 (exact there); costs a
            second forward over rows holding such tokens, and logs ``old_logits/abs_error``.
            Default on: on fresh data the objective is then exactly PPO + the rollout correction
            (docs/explanation/old_logit_problem.md), and the calibrated age aims at the stale tokens' mean age, which
            stays put from version to version where the all-token mean swings with the share of
            fresh tokens (0, 1, 0, 1 versions in the quickstart's colocated-async run).
        on_missing_state: ``error`` | ``reset`` when resuming without EWMA state.
    """

    beta: float | None = None
    com: float | None = None
    max_com: float | None = None
    update_every: str = "optimizer_step"
    bias_correction: bool = True
    fresh_exact: bool = True
    on_missing_state: str = "error"

    @property
    def calibrated(self) -> bool:
        """Whether β follows the measured token age (neither ``beta`` nor ``com`` fixed)."""
        return self.beta is None and self.com is None

    def __post_init__(self) -> None:
        if self.beta is not None and self.com is not None:
            raise ValueError(f"set only one of {KEY}.ewma.beta and {KEY}.ewma.com")
        if self.beta is not None:
            com_from_beta(self.beta)
        if self.max_com is not None and (self.max_com < 0 or not self.calibrated):
            raise ValueError(
                f"{KEY}.ewma.max_com={self.max_com} bounds the calibrated decay: it must be >= 0 and "
                f"{KEY}.ewma.beta / com must be unset"
            )
        _check_choice("ewma.update_every", self.update_every, ("optimizer_step", "version"))
        _check_choice("ewma.on_missing_state", self.on_missing_state, ("error", "reset"))


@dataclass(frozen=True)
class SnapshotConfig:
    """``algorithm.old_logits.snapshot``.

    Attributes:
        max_versions: snapshots kept (≥ the staleness bound; default: the bound).
        pin_memory: page-locked host buffers (asynchronous copies): one buffer of exactly the
            weights' bytes per copy, registered with CUDA (``swap.host_buffers_like``).
        dtype: ``param`` (the parameters' own dtype) | ``bf16``: fp32 parameters are stored in
            bfloat16, half the host memory and copy time. Exact when the forward computes with
            bfloat16 parameters (FSDP's ``mixed_precision.param_dtype=bf16``, verl's default): the
            forward casts the swapped-in values to the same bfloat16 it casts the live ones to.
        on_missing: ``error`` | ``current`` (score tokens of a missing version with the current
            weights and count them in ``old_logits/snapshot/missing_frac``).
    """

    max_versions: int | None = None
    pin_memory: bool = True
    dtype: str = "param"
    on_missing: str = "error"

    def __post_init__(self) -> None:
        _check_choice("snapshot.on_missing", self.on_missing, ("error", "current"))
        _check_choice("snapshot.dtype", self.dtype, SNAPSHOT_DTYPES)


@dataclass(frozen=True)
class DedicatedConfig:
    """``algorithm.old_logits.dedicated``: the forward-only scorer next to the rollout replicas.

    Attributes:
        on_missing: ``error`` | ``current``: what to do with a *stale* token that carries no
            scored log-prob (e.g. a trajectory from before a resume). ``current`` scores it with
            the current weights (not exact) and counts it in ``old_logits/dedicated/inexact_frac``.
            Unscored tokens of the current version are always scored with the current weights
            (exact).
        sync_timeout_s: how long the scorer's weight update waits for the segments of the version
            it is about to replace to be scored; after that it logs a warning and moves on (the
            unscored tokens then meet ``on_missing``).
        start_timeout_s: how long the trainer waits for the scorer actor to start and load the
            model (a fresh Ray worker imports torch and verl and reads the checkpoint: minutes on
            a cold node or a network file system).
        call_timeout_s: how long one call to the scorer may take: an agent loop's ``score`` (it
            queues behind the other segments' forwards), the step's stats read and, after the
            ``sync_timeout_s`` wait, the weight load of an update. Expiry stops the run naming
            the scorer: a scorer that does not answer in minutes is hung, not slow.
        gpu: on GPU machines, ``shared``: the scorer runs on the actor's first GPU next to the
            trainer and the colocated rollout (its weights: ``verl_ext/mem/dedicated_scorer/gpu_bytes``);
            ``own``: on a GPU of its own, which Ray must have free on the node (more GPUs than
            ``trainer.n_gpus_per_node``). The cpu backend's scorer runs on the host CPU.
    """

    on_missing: str = "error"
    sync_timeout_s: float = 300.0
    start_timeout_s: float = 1800.0
    call_timeout_s: float = 600.0
    gpu: str = "shared"

    def __post_init__(self) -> None:
        _check_choice("dedicated.on_missing", self.on_missing, ("error", "current"))
        _check_choice("dedicated.gpu", self.gpu, ("shared", "own"))
        for name in ("sync_timeout_s", "start_timeout_s", "call_timeout_s"):
            check_timeout(f"{KEY}.dedicated.{name}", getattr(self, name))


@dataclass(frozen=True)
class InterruptConfig:
    """``algorithm.old_logits.interrupt``: the trainer scores every segment at the weight sync.

    Attributes:
        on_missing: as ``DedicatedConfig.on_missing`` (metric ``old_logits/interrupt/inexact_frac``).
        max_versions: versions of scored segments kept in the trainer (host RAM, 4 bytes per
            token); default: the staleness bound.
        sync_timeout_s: how long the sync waits for the LLM clients to record as many segments of
            the outgoing version as the rollout servers served; then it logs a warning, counts
            ``old_logits/interrupt/sync_timeouts`` and scores what arrived (later ones stay
            unscored and meet ``on_missing``). It also bounds the servers' and the log's answers
            to the counts compared there.
        call_timeout_s: how long one call to the ``SegmentLog`` actor may take: an agent loop's
            ``record`` and the sync's ``take`` of a version's segments (every segment's token
            ids cross Ray there). Expiry stops the run naming the segment log.
    """

    on_missing: str = "error"
    max_versions: int | None = None
    sync_timeout_s: float = 300.0
    call_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _check_choice("interrupt.on_missing", self.on_missing, ("error", "current"))
        for name in ("sync_timeout_s", "call_timeout_s"):
            check_timeout(f"{KEY}.interrupt.{name}", getattr(self, name))


@dataclass(frozen=True)
class LogLinearConfig:
    """``algorithm.old_logits.loglinear``.

    Attributes:
        proximal_version: which version the proxy stands for. ``previous`` (AReaL's convention:
            one version behind the trainer's weights, α = (d-1)/d, 0 for d ≤ 1) or ``current``
            (the trainer's weights, with π_θ one version ahead: α = d/(d+1)).
    """

    proximal_version: str = "previous"

    def __post_init__(self) -> None:
        _check_choice("loglinear.proximal_version", self.proximal_version, PROXIMAL_VERSIONS)


@dataclass(frozen=True)
class OldLogitsConfig:
    """``algorithm.old_logits``.

    Attributes:
        provider: registered provider name (``verl_ext.old_logits.registered_providers()``).
        staleness_bound: filled from ``trainer.v1.sampler.max_off_policy_threshold`` by ``from_config``.
        stale_tokens: whether the trainer can hand tokens of older versions to the provider; False
            under verl's ``sync`` trainer (every token is sampled by the live weights), where
            ``snapshot`` then keeps no copies: they would never be read.
        separate_pools: whether rollout runs on its own pool and never pauses for training (verl's
            ``separate_async``): the trainer's weights then move on (``parameter_sync_step`` local
            updates, the next version) while tokens of the version they started from are still
            being generated or scored, so providers that forward under that version keep a copy
            of it (``OldLogitProvider.requirements``).
        swap_backup: where the live weights wait while ``ewma`` or ``snapshot`` swaps other weights
            in for a forward: ``host`` (pinned host memory; costs a device-to-host and a
            host-to-device copy of the actor's shards per swap) or ``device`` (beside them on the
            accelerator: on-device copies, one more copy of the shards in accelerator memory while
            swapped).
        ewma, snapshot, dedicated, interrupt, loglinear: per-provider settings.
    """

    provider: str = DEFAULT_PROVIDER
    staleness_bound: int | None = None
    stale_tokens: bool = True
    separate_pools: bool = False
    swap_backup: str = "host"
    ewma: EWMAConfig = field(default_factory=EWMAConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    dedicated: DedicatedConfig = field(default_factory=DedicatedConfig)
    interrupt: InterruptConfig = field(default_factory=InterruptConfig)
    loglinear: LogLinearConfig = field(default_factory=LogLinearConfig)

    def __post_init__(self) -> None:
        _check_choice("swap_backup", self.swap_backup, SWAP_BACKUPS)

    @property
    def swap_backup_device(self) -> str | None:
        """``WeightSwap``'s ``backup_device``: "cpu" for ``host``, None (the weights' own device) for
        ``device``."""
        return "cpu" if self.swap_backup == "host" else None

    @classmethod
    def from_config(cls, old_logits: Mapping[str, Any] | None, max_off_policy_threshold: int | None,
                    trainer_mode: str = "colocate_async") -> OldLogitsConfig:
        """Builds the config from ``algorithm.old_logits`` (a DictConfig or dict, or None for the
        defaults), the trainer's staleness bound and verl's trainer mode (``TRAINER_MODES``:
        ``sync`` has no stale tokens, ``separate_async`` separate pools)."""
        if trainer_mode not in TRAINER_MODES:
            raise ValueError(f"trainer mode {trainer_mode!r}; expected one of {TRAINER_MODES}")
        raw = dict(old_logits or {})
        _reject_unknown(KEY, raw, {f.name for f in dataclasses.fields(cls)}
                        - {"staleness_bound", "stale_tokens", "separate_pools"})
        sub = {}
        sections = (
            ("ewma", EWMAConfig),
            ("snapshot", SnapshotConfig),
            ("dedicated", DedicatedConfig),
            ("interrupt", InterruptConfig),
            ("loglinear", LogLinearConfig),
        )
        for name, sub_cls in sections:
            values = dict(raw.pop(name, None) or {})
            _reject_unknown(f"{KEY}.{name}", values, {f.name for f in dataclasses.fields(sub_cls)})
            sub[name] = sub_cls(**values)
        bound = None if max_off_policy_threshold is None else int(max_off_policy_threshold)
        return cls(staleness_bound=bound, stale_tokens=trainer_mode != "sync",
                   separate_pools=trainer_mode == "separate_async", **raw, **sub)

    def ewma_updates(self, versions: float, steps_per_version: int) -> float:
        """``versions`` weight versions in EWMA updates (× the optimizer steps per version with
        ``update_every=optimizer_step``)."""
        return versions * (steps_per_version if self.ewma.update_every == "optimizer_step" else 1)

    def ewma_beta(self, updates_per_version: int = 1) -> float:
        """The decay to build ``EWMAShadow`` with (0 when calibrated: nothing measured yet, and
        θ̄_0 = θ_0 anyway).

        Args:
            updates_per_version: EWMA updates per published version (optimizer steps per
                training step with ``update_every=optimizer_step``, else 1).
        """
        if self.ewma.beta is not None:
            return self.ewma.beta
        if self.ewma.com is None:
            return 0.0
        return beta_from_com(self.ewma_updates(float(self.ewma.com), updates_per_version))

    def ewma_max_com(self) -> float:
        """Upper bound of the calibrated centre of mass, in versions."""
        if self.ewma.max_com is not None:
            return float(self.ewma.max_com)
        return float(self._bound_for("ewma.max_com"))

    def snapshot_max_versions(self) -> int:
        """How many snapshots to keep; at least the staleness bound."""
        if self.snapshot.max_versions is not None:
            return self.snapshot.max_versions
        return max(1, self._bound_for("snapshot.max_versions"))

    def interrupt_max_versions(self) -> int:
        """How many versions of scored segments the trainer keeps (``interrupt``)."""
        if self.interrupt.max_versions is not None:
            return self.interrupt.max_versions
        return max(1, self._bound_for("interrupt.max_versions"))

    def _bound_for(self, key: str) -> int:
        if self.staleness_bound is None:
            raise ValueError(f"{STALENESS_KEY} is null (no staleness bound), so set {KEY}.{key} explicitly")
        return self.staleness_bound


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{KEY}.{key}={value!r}; expected one of {choices}")


def _reject_unknown(prefix: str, values: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{prefix}.{k}' for k in unknown)}; known: {sorted(known)}")
