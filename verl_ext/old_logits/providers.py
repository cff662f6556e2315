"""Old-logit providers: who computes ``old_log_probs`` (the proximal anchor π_prox) and how.

Contract (docs/explanation/architecture.md): ``provider.compute(host, batch, metrics) -> batch``,
writing ``old_log_probs``. A provider is the unit of change: besides ``compute`` it declares
everything the trainer, the host and the start-up checks would otherwise decide by its name
(``ProviderNeeds``, ``rollout_side``, ``bypass_loss``) and what it needs of the config (its entries
in ``verl_ext.old_logits.preconditions.PRECONDITIONS``, run at start-up by ``verl_ext.validation``). A
new provider is one class here (or in a module of its own that registers it), its preconditions and
one fragment in ``plugins/old_logits/``.

``host`` is anything implementing ``OldLogitHost`` (``verl_ext.old_logits.trainer_side`` for verl's
trainers; the in-process ``verl_ext.old_logits.local_host.LocalPolicyHost`` for tests and
benchmarks), so every provider here is plain tensor logic over a few host calls.

| name | old_log_probs | exact? | extra cost |
|---|---|---|---|
| current | verl's own anchor: π_train(θ_n), the weights at the start of the sync window | no: only tokens of version n | none |
| rollout | μ (verl bypass) | no: numerics leak into the clip | none (no forward) |
| snapshot | π_train(θ_{v(t)}) from host snapshots | yes | D snapshots in host RAM, one forward per version present, over its rows |
| dedicated | scored by a forward-only scorer as segments are generated | yes | extra devices + weight broadcast |
| interrupt | scored by the trainer at each weight sync | yes | prefix re-scoring at every sync |
| ewma | π_train(θ̄), θ̄ = EWMA of the parameters (PPO-EWMA) | approximate | one fp32 parameter copy; one extra forward where a batch mixes fresh and stale tokens (none with ``fresh_exact=false``) |
| loglinear | log μ + α (log π_θn - log μ), α = (d-1)/d (AReaL/A-3PO) | no: a widened clip | none beyond current |

Every provider logs ``old_logits/exact_token_share``: the share of response tokens whose old
log-prob is the training engine's log-prob under the weights of the token's own version.
"""

from __future__ import annotations

import dataclasses
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
from verl_ext.old_logits.weight_specs import CURRENT, EWMA, SNAPSHOT, snapshot_spec

# Fields a provider may fetch through ``OldLogitHost.old_logits_fetch`` (all padded (bs, L)).
RESPONSE_MASK = "response_mask"
ROLLOUT_LOG_PROBS = "rollout_log_probs"  # μ, the inference engine's log-probs
TOKEN_VERSIONS = "token_versions"  # long, -1 = no version (see verl_ext.old_logits.rollout_client)
# token_versions where every row recorded them, else left out (TOKEN_VERSIONS raises, naming the rows)
RECORDED_TOKEN_VERSIONS = "recorded_token_versions"
PRECOMPUTED_LOG_PROBS = "precomputed_old_log_probs"  # float, NaN = not scored (dedicated / interrupt)

EXACT_TOKEN_SHARE = f"{PREFIX}exact_token_share"
# rollout engines whose servers count the segments they serve (verl_ext.old_logits.segment_log)
_RECORD_VERSIONS = "record per-token versions (verl_ext.old_logits.rollout_client, extra_fields['token_global_steps'])"

logger = logging.getLogger("verl_ext.old_logits")


class OldLogitHost(Protocol):
    """What a provider needs from the trainer. Shapes: ``(bs, L)`` padded response tokens, rows
    in batch order."""

    def old_logits_version(self) -> int:
        """Version n of the weights the trainer's sync window started from (verl v1:
        ``global_steps - 1``); the tokens generated since the last weight sync carry it."""

    def old_logits_fetch(self, batch: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]:
        """Padded ``(bs, L)`` tensors of the named fields (see the constants above)."""

    def old_logits_forward(self, batch: Any, weights: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Training-side log-probs ``(len(rows) or bs, L)`` of the response tokens of ``rows``
        (all rows if None) under ``weights``: "current" (the weights of version n, also where the
        live weights have moved on within the window), "ewma" or "snapshot:<v>"
        (``verl_ext.old_logits.weight_specs``)."""

    def old_logits_verl_anchor(self, batch: Any, metrics: dict[str, float]) -> Any:
        """verl's own old-log-prob step (its anchor for the trainer mode in use), returning the batch."""

    def old_logits_store(self, batch: Any, old_log_probs: torch.Tensor) -> Any:
        """Writes ``old_log_probs (bs, L)`` for the loss and returns the (updated) batch."""

    def old_logits_ewma_calibrate(self, token_age_versions: float | None) -> dict[str, float]:
        """``OldLogitWorkerState.ewma_calibrate`` on the workers (rank 0's report): the EWMA's
        ``beta``, ``age_steps``, ``steps_per_version`` and ``steps_into_version``, then the
        calibrated decay aims at ``token_age_versions``."""

    def old_logits_rollout_sync(self, metrics: dict[str, float]) -> None:
        """The rollout side's work before ``precomputed_old_log_probs`` is read (``interrupt``: the
        segments of the versions that ended are scored). Adds its metrics."""


@dataclass(frozen=True)
class ProviderNeeds:
    """Declared requirements of a provider under its config.

    Attributes:
        fields: batch fields it fetches (``token_versions`` needs the agent loop to record spans).
        weights: weight specs the actor workers must serve ("current", "ewma", "snapshot").
        snapshots: host copies of past versions' weights the actor workers keep.
        rollout_side: what the rollout side must do beyond recording versions, in words.
    """

    fields: tuple[str, ...] = ()
    weights: tuple[str, ...] = ()
    snapshots: int = 0
    rollout_side: str = ""

    @property
    def worker_state(self) -> bool:
        """Whether the actor workers hold verl-ext state (an EWMA shadow, weight snapshots)."""
        return EWMA in self.weights or self.snapshots > 0


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


def exact_share(exact: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the ``mask`` tokens that are ``exact`` (1.0 where there are none)."""
    m = mask.bool()
    return float((exact.bool() & m).sum()) / int(m.sum()) if m.any() else 1.0


class OldLogitProvider(ABC):
    """Base: one strategy for ``old_log_probs``. Subclasses set ``needs`` and ``compute``, and
    declare what else sets them apart (the class attributes below; their conditions on the config:
    ``verl_ext.old_logits.preconditions``).

    Attributes:
        rollout_side: the rollout-side companion the trainer starts before the first weight sync
            (``"module:Class"``, imported in the trainer only; ``verl_ext.old_logits.rollout_side``),
            None for none. Its servers must count the segments they serve.
        bypass_loss: the loss runs in verl's bypass mode (``old_log_probs`` = μ); the trainer
            switches verl's rollout-correction and loss settings to it, with a warning.
    """

    name: ClassVar[str]
    needs: ClassVar[ProviderNeeds] = ProviderNeeds()
    rollout_side: ClassVar[str | None] = None
    bypass_loss: ClassVar[bool] = False

    def __init__(self, config: OldLogitsConfig) -> None:
        self.config = config

    def own_needs(self) -> ProviderNeeds:
        """``needs`` under this config (some depend on options, e.g. ``ewma.fresh_exact``)."""
        return self.needs

    def requirements(self) -> ProviderNeeds:
        """What the trainer must provide: ``own_needs`` plus, with separate rollout and trainer
        pools (verl's ``separate_async``), a copy of the version-n weights wherever the provider
        forwards under them: there the live weights move on (the window's local updates, the next
        version) before every token of version n has been scored."""
        needs = self.own_needs()
        if self.config.separate_pools and CURRENT in needs.weights:
            needs = dataclasses.replace(needs, snapshots=needs.snapshots + 1)
        return needs

    @abstractmethod
    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        """Computes ``old_log_probs (bs, L)``, stores them through ``host``, adds metrics."""

    def _fetch_with_staleness(
        self, host: OldLogitHost, batch: Any, fields: Sequence[str], metrics: dict[str, float]
    ) -> dict[str, torch.Tensor]:
        data = host.old_logits_fetch(batch, [RESPONSE_MASK, *fields])
        if TOKEN_VERSIONS in data:
            metrics.update(
                staleness_metrics(
                    data[TOKEN_VERSIONS],
                    host.old_logits_version(),
                    data[RESPONSE_MASK],
                    max_bucket=max(1, self.config.staleness_bound or 8),
                )
            )
        return data


@register_provider("current")
class CurrentProvider(OldLogitProvider):
    """verl's own anchor, untouched: π_train(θ_n), θ_n the weights the trainer's sync window started
    from (verl's decoupled mode; under ``separate_async`` its per-window host copy). Exact for the
    tokens of version n only: the baseline arm."""

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        batch = host.old_logits_verl_anchor(batch, metrics)
        if not self.config.stale_tokens:  # verl's sync trainer: every token is of version n
            metrics[EXACT_TOKEN_SHARE] = 1.0
            return batch
        data = self._fetch_with_staleness(host, batch, [RECORDED_TOKEN_VERSIONS], metrics)
        if TOKEN_VERSIONS in data:  # an agent loop that records no versions gets no share
            metrics[EXACT_TOKEN_SHARE] = exact_share(data[TOKEN_VERSIONS] == host.old_logits_version(),
                                                     data[RESPONSE_MASK])
        return batch


@register_provider("rollout")
class RolloutProvider(OldLogitProvider):
    """π_prox = μ (verl's bypass mode): no forward. verl 0.9.1 then computes its rollout correction
    on π_θ/μ inside the loss, on every mini-batch. Its share of exact tokens is 0: μ is the
    inference engine's log-prob, not the training engine's."""

    needs = ProviderNeeds(fields=(ROLLOUT_LOG_PROBS,))
    bypass_loss = True

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = host.old_logits_fetch(batch, [RESPONSE_MASK, ROLLOUT_LOG_PROBS])
        metrics[EXACT_TOKEN_SHARE] = exact_share(torch.zeros_like(data[RESPONSE_MASK]), data[RESPONSE_MASK])
        return host.old_logits_store(batch, data[ROLLOUT_LOG_PROBS])


@register_provider("snapshot")
class SnapshotProvider(OldLogitProvider):
    """Exact old logits from host snapshots, one forward per version present, over the rows holding
    its tokens (per-version weight tracking: keep θ_v for every version still sampleable, score each
    token under its own)."""

    needs = ProviderNeeds(fields=(TOKEN_VERSIONS,), weights=(CURRENT, SNAPSHOT), rollout_side=_RECORD_VERSIONS)

    def own_needs(self) -> ProviderNeeds:
        # none under verl's sync trainer, whose tokens are never stale: a copy would never be read
        kept = self.config.snapshot_max_versions() if self.config.stale_tokens else 0
        return dataclasses.replace(self.needs, snapshots=kept)

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(host, batch, [TOKEN_VERSIONS], metrics)
        versions = torch.where(data[RESPONSE_MASK].bool(), data[TOKEN_VERSIONS], -1)
        n = host.old_logits_version()
        present = torch.unique(versions[versions >= 0]).tolist()
        if present and max(present) > n:
            raise ValueError(f"tokens of version {max(present)} are newer than the trainer's weights (version {n})")
        too_old = [v for v in present if v < n - self.config.snapshot_max_versions()]
        if too_old and self.config.snapshot.on_missing == "error":
            raise SnapshotMissingError(min(too_old), [])

        def forward(v: int, rows: torch.Tensor) -> torch.Tensor:
            return host.old_logits_forward(batch, CURRENT if v == n or v in too_old else snapshot_spec(v), rows)

        with cost_meter(metrics, self.name) as cost:
            old, rows_per_version = scatter_by_version(versions, forward)
            cost["forward_rows"] = sum(rows_per_version.values())
            cost["versions"] = len(rows_per_version)
        # tokens scored with the current weights because their snapshot is gone (on_missing=current)
        missing = torch.isin(versions, torch.tensor(too_old, dtype=versions.dtype))
        metrics[f"{PREFIX}snapshot/missing_frac"] = float(missing.sum()) / max(1, int((versions >= 0).sum()))
        metrics[EXACT_TOKEN_SHARE] = exact_share(~missing, data[RESPONSE_MASK])
        return host.old_logits_store(batch, old)


class PrecomputedProvider(OldLogitProvider):
    """Exact old logits scored on the rollout side and shipped with the sample
    (``precomputed_old_log_probs``, NaN where unscored; ``verl_ext.old_logits.precomputed``).

    Unscored tokens of the trainer's current version are scored here with the weights of that
    version, which is exact (metric ``{name}/filled_by_current_frac``). An unscored *stale* token is
    an error, or with ``algorithm.old_logits.<name>.on_missing=current`` it is scored with those
    weights too, logged and counted in ``{name}/inexact_frac``."""

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        host.old_logits_rollout_sync(metrics)
        data = self._fetch_with_staleness(host, batch, [PRECOMPUTED_LOG_PROBS, TOKEN_VERSIONS], metrics)
        mask = data[RESPONSE_MASK].bool()
        old = data[PRECOMPUTED_LOG_PROBS].clone()
        n = host.old_logits_version()
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
                old[rows] = torch.where(unscored[rows], host.old_logits_forward(batch, CURRENT, rows), old[rows])
            tokens = max(1, int(mask.sum()))
            cost["forward_rows"] = rows.numel()
            cost["filled_by_current_frac"] = float(unscored.sum()) / tokens
            cost["inexact_frac"] = float(stale.sum()) / tokens
        metrics[EXACT_TOKEN_SHARE] = exact_share(~stale, mask)
        return host.old_logits_store(batch, torch.nan_to_num(old, nan=0.0))


def _precomputed_needs(rollout_side: str) -> ProviderNeeds:
    return ProviderNeeds(fields=(PRECOMPUTED_LOG_PROBS, TOKEN_VERSIONS), weights=(CURRENT,), rollout_side=rollout_side)


@register_provider("dedicated")
class DedicatedProvider(PrecomputedProvider):
    """A forward-only scorer with the training numerics receives every weight version with the
    rollout engines; the LLM client has it score each segment right after the segment is
    generated, and its weight update waits until every segment of the outgoing version is scored."""

    needs = _precomputed_needs("a forward-only scorer scores each segment as it is generated")
    rollout_side = "verl_ext.old_logits.rollout_side:DedicatedScorer"


@register_provider("interrupt")
class InterruptProvider(PrecomputedProvider):
    """Every segment the rollout servers return is logged; once its version has ended (the weight
    sync aborted the partial generations and moved the servers on) the trainer scores the
    version's segments, aborted prefixes included, with that version's weights: at the start of
    the next step where generation pauses for training (verl's ``colocate_async``), right after the
    sync where it never pauses (``separate_async``)."""

    needs = _precomputed_needs("the rollout servers log each segment and the trainer scores them after the sync")
    rollout_side = "verl_ext.old_logits.rollout_side:InterruptScoring"



@register_provider("ewma")
class EWMAProvider(OldLogitProvider):
    """π_prox = π_train(θ̄), θ̄ the EWMA of the trainer's parameters (revised PPO-EWMA, Hilton et
    al. 2022, "Batch size-invariance for policy optimization", §4). Same single forward as
    ``current``, other weights. With ``ewma.fresh_exact`` (default) tokens of staleness 0 use the
    weights of version n (a second forward where a batch holds both kinds; one forward under them
    where nothing is stale) and the error of θ̄ on them is logged.

    Unless ``ewma.beta`` / ``ewma.com`` fix it, the decay is calibrated: after the forward the
    workers aim the EWMA's age at the mean age of this batch's tokens (the stale ones with
    ``fresh_exact``), so the next versions' θ̄ lags the live weights as far as their tokens do.
    Metrics: ``ewma/beta``, ``ewma/age_steps`` (θ̄'s centre-of-mass age in optimizer steps, as used
    in this forward), ``token_age_steps/{mean,max,stale_mean}`` (the tokens' behaviour weights,
    behind the live weights, which under ``separate_async`` have also taken the window's local
    updates so far)."""

    needs = ProviderNeeds(fields=(TOKEN_VERSIONS,), weights=(EWMA,), rollout_side=_RECORD_VERSIONS)

    def own_needs(self) -> ProviderNeeds:
        if not self.config.ewma.fresh_exact:
            return self.needs
        return dataclasses.replace(self.needs, weights=(EWMA, CURRENT))

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(host, batch, [TOKEN_VERSIONS], metrics)
        mask = data[RESPONSE_MASK].bool() & (data[TOKEN_VERSIONS] >= 0)
        age = (host.old_logits_version() - data[TOKEN_VERSIONS]).clamp(min=0).float()
        fresh = mask & (age == 0)
        with cost_meter(metrics, self.name) as cost:
            if self.config.ewma.fresh_exact and not (mask & (age > 0)).any():
                # nothing stale (e.g. verl's sync trainer): the weights of version n are exact everywhere
                old = host.old_logits_forward(batch, CURRENT)
                cost["forward_rows"] = old.shape[0]
            else:
                old = host.old_logits_forward(batch, EWMA)
                cost["forward_rows"] = old.shape[0]
                rows = fresh.any(dim=-1).nonzero(as_tuple=True)[0]
                if self.config.ewma.fresh_exact and rows.numel():
                    exact = host.old_logits_forward(batch, CURRENT, rows)
                    metrics.update(approximation_errors(old[rows], exact, fresh[rows]))
                    old[rows] = torch.where(fresh[rows], exact, old[rows])
                    cost["forward_rows"] += rows.numel()
        stand_in = mask & (age > 0) if self.config.ewma.fresh_exact else mask  # tokens θ̄ stands in for
        target = float(age[stand_in].mean()) if stand_in.any() else None
        report = host.old_logits_ewma_calibrate(target)
        steps, into = report["steps_per_version"], report["steps_into_version"]
        metrics[f"{PREFIX}ewma/beta"] = report["beta"]
        metrics[f"{PREFIX}ewma/age_steps"] = report["age_steps"]
        if mask.any():
            metrics[f"{PREFIX}token_age_steps/mean"] = float(age[mask].mean()) * steps + into
            metrics[f"{PREFIX}token_age_steps/max"] = float(age[mask].max()) * steps + into
        stale = mask & (age > 0)
        if stale.any():
            metrics[f"{PREFIX}token_age_steps/stale_mean"] = float(age[stale].mean()) * steps + into
        exact = fresh if self.config.ewma.fresh_exact else torch.zeros_like(fresh)
        metrics[EXACT_TOKEN_SHARE] = exact_share(exact, data[RESPONSE_MASK])
        return host.old_logits_store(batch, old)


@register_provider("loglinear")
class LogLinearProvider(OldLogitProvider):
    """AReaL's log-linear proxy (A-3PO; AReaL ``compute_prox_logp_approximations``), a negative
    control: equivalent to a widened clip of the total ratio (``verl_ext.old_logits.loglinear``). By
    default α follows AReaL (``algorithm.old_logits.loglinear.proximal_version=previous``). No token
    gets its training-engine log-prob (α = 0 gives μ), so its exact share is 0."""

    needs = ProviderNeeds(fields=(ROLLOUT_LOG_PROBS, TOKEN_VERSIONS), weights=(CURRENT,), rollout_side=_RECORD_VERSIONS)

    def compute(self, host: OldLogitHost, batch: Any, metrics: dict[str, float]) -> Any:
        data = self._fetch_with_staleness(host, batch, [ROLLOUT_LOG_PROBS, TOKEN_VERSIONS], metrics)
        with cost_meter(metrics, self.name) as cost:
            current = host.old_logits_forward(batch, CURRENT)
            cost["forward_rows"] = current.shape[0]
        alpha = loglinear_alpha(
            data[TOKEN_VERSIONS], host.old_logits_version(), self.config.loglinear.proximal_version
        )
        m = data[RESPONSE_MASK].bool()
        metrics[f"{PREFIX}loglinear/alpha_mean"] = float(alpha[m].mean()) if m.any() else 0.0
        metrics[EXACT_TOKEN_SHARE] = exact_share(torch.zeros_like(m), m)
        return host.old_logits_store(batch, loglinear_proxy(data[ROLLOUT_LOG_PROBS], current, alpha))
