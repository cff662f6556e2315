"""Old-logit providers: who computes ``old_log_probs`` (the proximal anchor π_prox) and how.

Contract (ARCHITECTURE.md): ``provider.compute(trainer, batch, metrics) -> batch``, writing
``old_log_probs``; each provider declares what it ``needs`` and is registered by name.

``trainer`` is anything implementing ``OldLogitHost`` (the lead's v1 trainer subclass; the
in-process ``verl_ext.old_logits.local_host.LocalPolicyHost`` for tests and benchmarks), so
every provider here is plain tensor logic over four host calls.

Which provider (research brief §2.2, §4, §6):

| name | old_log_probs | exact? | extra cost |
|---|---|---|---|
| current | π_train(θ_n), verl's decoupled default | no: staleness entangled into ρ | none |
| rollout | μ (verl bypass) | no: numerics leak into the clip | none (no forward) |
| snapshot | π_train(θ_{v(t)}) from host snapshots | yes | D snapshots in host RAM, one forward per version present, over its rows |
| dedicated | scored by a forward-only scorer as segments are generated | yes | extra devices + weight broadcast |
| interrupt | scored by the trainer at each weight sync | yes | rollout stall + prefix re-scoring |
| ewma | π_train(θ̄), θ̄ = EWMA of the parameters (PPO-EWMA) | approximate | one fp32 parameter copy; one extra forward where a batch mixes fresh and stale tokens (none with ``fresh_exact=false``) |
| loglinear | log μ + α (log π_θn - log μ), α = (d-1)/d (AReaL/A-3PO) | no: a widened clip | none beyond current |
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from verl_ext.old_logits.config import OldLogitsConfig
from verl_ext.old_logits.loglinear import loglinear_alpha, loglinear_proxy
from verl_ext.old_logits.metrics import (
    PREFIX,
    approximation_errors,
    cost_meter,
    staleness_metrics,
)
from verl_ext.old_logits.snapshot import SnapshotMissingError, scatter_by_version
from verl_ext.old_logits.worker import CURRENT, EWMA, snapshot_spec

# Fields a provider may fetch through ``OldLogitHost.old_logits_fetch`` (all padded (bs, L)).
RESPONSE_MASK = "response_mask"
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # μ, the inference engine's log-probs
TOKEN_VERSIONS = "token_versions"  # long, -1 = no version (see verl_ext.old_logits.rollout_client)
PRECOMPUTED_LOG_PROBS = "precomputed_old_log_probs"  # float, NaN = not scored (dedicated / interrupt)

logger = logging.getLogger("verl_ext.old_logits")


class OldLogitHost(Protocol):
    """What a provider needs from the trainer. Shapes: ``(bs, L)`` padded response tokens, rows
    in batch order."""

    def old_logits_version(self) -> int:
        """Version n of the weights the trainer holds now (verl v1: ``global_steps - 1``)."""

    def old_logits_fetch(self, batch: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]:
        """Padded ``(bs, L)`` tensors of the named fields (see the constants above)."""

    def old_logits_forward(self, batch: Any, weights: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Training-side log-probs ``(len(rows) or bs, L)`` of the response tokens of ``rows``
        (all rows if None) under ``weights``: "current", "ewma" or "snapshot:<v>"
        (``verl_ext.old_logits.worker.OldLogitWorkerState.weights`` on the workers)."""

    def old_logits_store(self, batch: Any, old_log_probs: torch.Tensor) -> Any:
        """Writes ``old_log_probs (bs, L)`` for the loss and returns the (updated) batch."""

    def old_logits_ewma_calibrate(self, token_age_versions: float | None) -> dict[str, float]:
        """``OldLogitWorkerState.ewma_calibrate`` on the workers (rank 0's report): the EWMA's
        ``beta``, ``age_steps`` and ``steps_per_version``, then the calibrated decay aims at
        ``token_age_versions``."""

    def old_logits_rollout_sync(self, metrics: dict[str, float]) -> None:
        """Rollout-side work that must happen while the trainer still holds the weights the rollout
        just used, before ``precomputed_old_log_probs`` is read (``interrupt``: score the segments
        generated since the last sync). Adds its metrics."""


@dataclass(frozen=True)
class ProviderNeeds:
    """Declared requirements of a provider.

    Attributes:
        fields: batch fields it fetches (``token_versions`` needs the agent loop to record spans).
        weights: weight specs the workers must serve ("current", "ewma", "snapshot").
        worker_hooks: ``OldLogitWorkerState`` methods the worker must call.
        rollout_side: what the rollout side must do beyond recording versions, in words.
    """

    fields: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()
    worker_hooks: tuple[str, ...] = ()
    rollout_side: str = ""


PROVIDER_REGISTRY: dict[str, type[OldLogitProvider]] = {}


def register_provider(name: str) -> Callable[[type[OldLogitProvider]], type[OldLogitProvider]]:
    """Class decorator: makes a provider selectable as ``algorithm.old_logits.provider=<name>``."""

    def decorator(cls: type[OldLogitProvider]) -> type[OldLogitProvider]:
        if name in PROVIDER_REGISTRY and PROVIDER_REGISTRY[name] is not cls:
            raise ValueError(f"old-logit provider {name!r} already registered by {PROVIDER_REGISTRY[name]}")
        cls.name = name
        PROVIDER_REGISTRY[name] = cls
        return cls

    return decorator


def get_provider(name: str) -> type[OldLogitProvider]:
    """The provider class registered as ``name``."""
    if name not in PROVIDER_REGISTRY:
        raise ValueError(
            f"algorithm.old_logits.provider={name!r} is not registered; available: {registered_providers()}"
        )
    return PROVIDER_REGISTRY[name]


def registered_providers() -> list[str]:
    return sorted(PROVIDER_REGISTRY)


def build_provider(config: OldLogitsConfig) -> OldLogitProvider:
    """Instantiates the provider that ``config.provider`` names."""
    return get_provider(config.provider)(config)


class OldLogitProvider(ABC):
    """Base: one strategy for ``old_log_probs``. Subclasses set ``needs`` and ``compute``."""

    name: ClassVar[str]
    needs: ClassVar[ProviderNeeds] = ProviderNeeds()

    def __init__(self, config: OldLogitsConfig) -> None:
        self.config = config

    def requirements(self) -> ProviderNeeds:
        """Needs under this config (some depend on options, e.g. ``ewma.fresh_exact``)."""
        return self.needs

    @abstractmethod
    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        """Computes ``old_log_probs (bs, L)``, stores them through ``trainer``, adds metrics."""

    def _fetch_with_staleness(
        self, trainer: OldLogitHost, batch: Any, fields: Sequence[str], metrics: dict[str, float]
    ) -> dict[str, torch.Tensor]:
        data = trainer.old_logits_fetch(batch, [RESPONSE_MASK, *fields])
        if TOKEN_VERSIONS in data:
            metrics.update(
                staleness_metrics(
                    data[TOKEN_VERSIONS],
                    trainer.old_logits_version(),
                    data[RESPONSE_MASK],
                    max_bucket=max(1, self.config.staleness_bound or 8),
                )
            )
        return data


@register_provider("current")
class CurrentProvider(OldLogitProvider):
    """π_prox = π_train(θ_n): verl's decoupled mode (brief §2.2 A). Exact only for fresh tokens."""

    needs = ProviderNeeds(weights=(CURRENT,))

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        with cost_meter(metrics, self.name) as cost:
            old = trainer.old_logits_forward(batch, CURRENT)
            cost["forward_rows"] = old.shape[0]
        return trainer.old_logits_store(batch, old)


@register_provider("rollout")
class RolloutProvider(OldLogitProvider):
    """π_prox = μ (verl bypass mode, brief §2.2 B): no forward; ρ ≡ 1 and the clip absorbs numerics."""

    needs = ProviderNeeds(fields=(ROLLOUT_LOG_PROBS,))

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = trainer.old_logits_fetch(batch, [ROLLOUT_LOG_PROBS])
        return trainer.old_logits_store(batch, data[ROLLOUT_LOG_PROBS])


@register_provider("snapshot")
class SnapshotProvider(OldLogitProvider):
    """Exact old logits from host snapshots, one forward per version present, over the rows holding
    its tokens (brief §4.1)."""

    needs = ProviderNeeds(
        fields=(TOKEN_VERSIONS,),
        weights=(CURRENT, "snapshot"),
        worker_hooks=("before_optimizer_step",),
        rollout_side="record per-token versions (verl_ext.old_logits.rollout_client, extra_fields['token_global_steps'])",
    )

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(trainer, batch, [TOKEN_VERSIONS], metrics)
        versions = torch.where(data[RESPONSE_MASK].bool(), data[TOKEN_VERSIONS], -1)
        n = trainer.old_logits_version()
        present = torch.unique(versions[versions >= 0]).tolist()
        if present and max(present) > n:
            raise ValueError(f"tokens of version {max(present)} are newer than the trainer's weights (version {n})")
        too_old = [v for v in present if v < n - self.config.snapshot_max_versions()]
        if too_old and self.config.snapshot.on_missing == "error":
            raise SnapshotMissingError(min(too_old), [])

        def forward(v: int, rows: torch.Tensor) -> torch.Tensor:
            return trainer.old_logits_forward(batch, CURRENT if v == n or v in too_old else snapshot_spec(v), rows)

        with cost_meter(metrics, self.name) as cost:
            old, rows_per_version = scatter_by_version(versions, forward)
            cost["forward_rows"] = sum(rows_per_version.values())
            cost["versions"] = len(rows_per_version)
        # tokens scored with the current weights because their snapshot is gone (on_missing=current)
        missing = torch.isin(versions, torch.tensor(too_old, dtype=versions.dtype))
        metrics[f"{PREFIX}snapshot/missing_frac"] = float(missing.sum()) / max(1, int((versions >= 0).sum()))
        return trainer.old_logits_store(batch, old)


class PrecomputedProvider(OldLogitProvider):
    """Exact old logits scored on the rollout side and shipped with the sample
    (``precomputed_old_log_probs``, NaN where unscored; ``verl_ext.old_logits.precomputed``).

    Unscored tokens of the trainer's current version are scored here with the current weights,
    which is exact (metric ``{name}/filled_by_current_frac``). An unscored *stale* token is an
    error, or with ``algorithm.old_logits.<name>.on_missing=current`` it is scored with the current
    weights too, logged and counted in ``{name}/inexact_frac``."""

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        trainer.old_logits_rollout_sync(metrics)
        data = self._fetch_with_staleness(trainer, batch, [PRECOMPUTED_LOG_PROBS, TOKEN_VERSIONS], metrics)
        mask = data[RESPONSE_MASK].bool()
        old = data[PRECOMPUTED_LOG_PROBS].clone()
        n = trainer.old_logits_version()
        unscored = mask & torch.isnan(old)
        stale = unscored & (data[TOKEN_VERSIONS] != n)
        if stale.any():
            rows = stale.any(dim=-1).nonzero(as_tuple=True)[0].tolist()
            versions = sorted(set(data[TOKEN_VERSIONS][stale].tolist()))
            message = (
                f"{int(stale.sum())} stale tokens (versions {versions}, trainer at {n}; rows {rows[:8]}) carry no "
                f"precomputed old log-prob. algorithm.old_logits.provider={self.name} needs every segment scored "
                f"before its weights move ({self.needs.rollout_side}); rows from before a resume, or from an agent "
                "loop that does not forward extra_fields['token_old_log_probs'] / ['old_logit_segments'], have none. "
                f"Set algorithm.old_logits.{self.name}.on_missing=current to score them with the current weights "
                f"(not exact; counted in {PREFIX}{self.name}/inexact_frac)"
            )
            if getattr(self.config, self.name).on_missing == "error":
                raise ValueError(message)
            logger.warning("verl-ext: %s", message)
        with cost_meter(metrics, self.name) as cost:
            rows = unscored.any(dim=-1).nonzero(as_tuple=True)[0]
            if rows.numel():
                old[rows] = torch.where(unscored[rows], trainer.old_logits_forward(batch, CURRENT, rows), old[rows])
            tokens = max(1, int(mask.sum()))
            cost["forward_rows"] = rows.numel()
            cost["filled_by_current_frac"] = float(unscored.sum()) / tokens
            cost["inexact_frac"] = float(stale.sum()) / tokens
        return trainer.old_logits_store(batch, torch.nan_to_num(old, nan=0.0))


def _precomputed_needs(rollout_side: str) -> ProviderNeeds:
    return ProviderNeeds(fields=(PRECOMPUTED_LOG_PROBS, TOKEN_VERSIONS), weights=(CURRENT,), rollout_side=rollout_side)


@register_provider("dedicated")
class DedicatedProvider(PrecomputedProvider):
    """A forward-only scorer with the training numerics receives every weight version with the
    rollout engines; the LLM client has it score each segment right after the segment is
    generated, and its weight update waits until every segment of the outgoing version is scored
    (brief §4.2)."""

    needs = _precomputed_needs("a forward-only scorer scores each segment as it is generated")


@register_provider("interrupt")
class InterruptProvider(PrecomputedProvider):
    """At each weight sync the rollout servers are paused with partial generations parked
    (verl's colocated-async abort); before ``optimizer.step`` the trainer scores, with the weights
    that generated them, every segment produced since the last sync, aborted prefixes included
    (brief §4.3)."""

    needs = _precomputed_needs("the rollout servers log each segment and the trainer scores them at the weight sync")


@register_provider("ewma")
class EWMAProvider(OldLogitProvider):
    """π_prox = π_train(θ̄), θ̄ the EWMA of the trainer's parameters (revised PPO-EWMA, brief §6.1).
    Same single forward as ``current``, other weights. With ``ewma.fresh_exact`` (default) tokens
    of staleness 0 use the current weights (a second forward where a batch holds both kinds; one
    forward under the current weights where nothing is stale) and the error of θ̄ on them is logged.

    Unless ``ewma.beta`` / ``ewma.com`` fix it, the decay is calibrated: after the forward the
    workers aim the EWMA's age at the mean age of this batch's tokens (the stale ones with
    ``fresh_exact``), so the next versions' θ̄ lags the live weights as far as their tokens do.
    Metrics: ``ewma/beta``, ``ewma/age_steps`` (θ̄'s centre-of-mass age in optimizer steps, as used
    in this forward), ``token_age_steps/{mean,max,stale_mean}`` (the tokens' behaviour weights)."""

    needs = ProviderNeeds(
        fields=(TOKEN_VERSIONS,),
        weights=(EWMA,),
        worker_hooks=("after_optimizer_step", "on_version_published"),
        rollout_side="record per-token versions (verl_ext.old_logits.rollout_client, extra_fields['token_global_steps'])",
    )

    def requirements(self) -> ProviderNeeds:
        if not self.config.ewma.fresh_exact:
            return self.needs
        return ProviderNeeds(
            self.needs.fields, (EWMA, CURRENT), self.needs.worker_hooks, self.needs.rollout_side
        )

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(trainer, batch, [TOKEN_VERSIONS], metrics)
        mask = data[RESPONSE_MASK].bool() & (data[TOKEN_VERSIONS] >= 0)
        age = (trainer.old_logits_version() - data[TOKEN_VERSIONS]).clamp(min=0).float()
        fresh = mask & (age == 0)
        with cost_meter(metrics, self.name) as cost:
            if self.config.ewma.fresh_exact and not (mask & (age > 0)).any():
                # nothing stale (e.g. verl's sync trainer): the current weights are exact everywhere
                old = trainer.old_logits_forward(batch, CURRENT)
                cost["forward_rows"] = old.shape[0]
            else:
                old = trainer.old_logits_forward(batch, EWMA)
                cost["forward_rows"] = old.shape[0]
                rows = fresh.any(dim=-1).nonzero(as_tuple=True)[0]
                if self.config.ewma.fresh_exact and rows.numel():
                    exact = trainer.old_logits_forward(batch, CURRENT, rows)
                    metrics.update(approximation_errors(old[rows], exact, fresh[rows]))
                    old[rows] = torch.where(fresh[rows], exact, old[rows])
                    cost["forward_rows"] += rows.numel()
        stand_in = mask & (age > 0) if self.config.ewma.fresh_exact else mask  # tokens θ̄ stands in for
        target = float(age[stand_in].mean()) if stand_in.any() else None
        report = trainer.old_logits_ewma_calibrate(target)
        steps = report["steps_per_version"]
        metrics[f"{PREFIX}ewma/beta"] = report["beta"]
        metrics[f"{PREFIX}ewma/age_steps"] = report["age_steps"]
        if mask.any():
            metrics[f"{PREFIX}token_age_steps/mean"] = float(age[mask].mean()) * steps
            metrics[f"{PREFIX}token_age_steps/max"] = float(age[mask].max()) * steps
        stale = mask & (age > 0)
        if stale.any():
            metrics[f"{PREFIX}token_age_steps/stale_mean"] = float(age[stale].mean()) * steps
        return trainer.old_logits_store(batch, old)


@register_provider("loglinear")
class LogLinearProvider(OldLogitProvider):
    """AReaL's log-linear proxy (brief §2.2 C), a negative control: equivalent to a widened clip
    of the total ratio (``verl_ext.old_logits.loglinear``). By default α follows AReaL
    (``algorithm.old_logits.loglinear.proximal_version=previous``)."""

    needs = ProviderNeeds(
        fields=(ROLLOUT_LOG_PROBS, TOKEN_VERSIONS),
        weights=(CURRENT,),
        rollout_side="record per-token versions (verl_ext.old_logits.rollout_client, extra_fields['token_global_steps'])",
    )

    def compute(self, trainer: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(trainer, batch, [ROLLOUT_LOG_PROBS, TOKEN_VERSIONS], metrics)
        with cost_meter(metrics, self.name) as cost:
            current = trainer.old_logits_forward(batch, CURRENT)
            cost["forward_rows"] = current.shape[0]
        alpha = loglinear_alpha(
            data[TOKEN_VERSIONS], trainer.old_logits_version(), self.config.loglinear.proximal_version
        )
        m = data[RESPONSE_MASK].bool()
        metrics[f"{PREFIX}loglinear/alpha_mean"] = float(alpha[m].mean()) if m.any() else 0.0
        return trainer.old_logits_store(batch, loglinear_proxy(data[ROLLOUT_LOG_PROBS], current, alpha))
