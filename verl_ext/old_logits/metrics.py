"""Metrics of old-logit providers: staleness, approximation quality, threshold entanglement, cost.

Names are prefixed ``old_logits/``. All functions take padded
``(bs, L)`` tensors and a response mask and return ``dict[str, float]``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PREFIX = "old_logits/"


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.bool()
    return float(x[m].float().mean()) if m.any() else 0.0


def approximation_errors(
    approx_log_probs: torch.Tensor, exact_log_probs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How well an approximate proximal log-prob matches the exact old logits (as
    AReaL ``prox_logp_method: metrics``), Δ = log π_approx - log π_exact per token:

    * ``abs_error`` = mean |Δ|,
    * ``rel_error`` = mean |Δ| / |log π_exact|,
    * ``imp_weight_error`` = mean |e^Δ - 1| (the error of the importance weight it induces),
    plus the maxima of the first and last.
    """
    delta = (approx_log_probs - exact_log_probs).float()
    imp = torch.expm1(delta).abs()
    m = mask.bool()
    return {
        f"{PREFIX}abs_error": _masked_mean(delta.abs(), m),
        f"{PREFIX}abs_error_max": float(delta.abs()[m].max()) if m.any() else 0.0,
        f"{PREFIX}rel_error": _masked_mean(delta.abs() / exact_log_probs.float().abs().clamp(min=1e-8), m),
        f"{PREFIX}imp_weight_error": _masked_mean(imp, m),
        f"{PREFIX}imp_weight_error_max": float(imp[m].max()) if m.any() else 0.0,
    }


def staleness_metrics(
    token_versions: torch.Tensor, current_version: int, mask: torch.Tensor, max_bucket: int = 8
) -> dict[str, float]:
    """Histogram of token staleness d = current_version - version over mask-1 tokens.

    Returns ``stale/version_gap_{mean,max}``, ``stale/frac_d{k}`` for k < max_bucket,
    ``stale/frac_d{max_bucket}+`` and ``stale/partial_frac`` (rows whose tokens span several
    versions, i.e. partial rollouts).
    """
    m = mask.bool() & (token_versions >= 0)
    d = (current_version - token_versions)[m]
    out: dict[str, float] = {}
    if d.numel() == 0:
        return out
    out[f"{PREFIX}stale/version_gap_mean"] = float(d.float().mean())
    out[f"{PREFIX}stale/version_gap_max"] = float(d.max())
    counts = torch.bincount(d.clamp(min=0, max=max_bucket), minlength=max_bucket + 1).float() / d.numel()
    for k in range(max_bucket):
        out[f"{PREFIX}stale/frac_d{k}"] = float(counts[k])
    out[f"{PREFIX}stale/frac_d{max_bucket}+"] = float(counts[max_bucket])
    big = torch.iinfo(torch.long).max
    vmax = torch.where(m, token_versions, torch.full_like(token_versions, -1)).max(dim=-1).values
    vmin = torch.where(m, token_versions, torch.full_like(token_versions, big)).min(dim=-1).values
    has = m.any(dim=-1)
    out[f"{PREFIX}stale/partial_frac"] = float((vmax[has] != vmin[has]).float().mean())
    return out


def ratio_out_of_band(log_ratio: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    """Bool ``(bs, L)``: token ratio e^{log_ratio} outside [lower, upper] (token-level IcePop/RS band)."""
    return (log_ratio < torch.log(torch.tensor(lower))) | (log_ratio > torch.log(torch.tensor(upper)))


def discrepancy_mask_by_cause(
    old_log_probs: torch.Tensor,
    exact_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    lower: float,
    upper: float,
) -> dict[str, float]:
    """Splits the tokens a discrepancy band [lower, upper] on ρ = π_old/μ removes by cause: with the exact old logits the band sees numerics only; what the provider's
    old logits add (or remove) is staleness entangled into ρ (docs/explanation/old_logit_problem.md).

    Returns fractions of mask-1 tokens: ``mask/frac`` (out of band with the provider's old),
    ``mask/numerics_frac`` (out of band with exact old), ``mask/staleness_frac`` (out with the
    provider's old, in with exact), ``mask/rescued_frac`` (in with the provider's, out with exact).
    """
    m = mask.bool()
    proxy_out = ratio_out_of_band(old_log_probs - rollout_log_probs, lower, upper)
    exact_out = ratio_out_of_band(exact_log_probs - rollout_log_probs, lower, upper)
    return {
        f"{PREFIX}mask/frac": _masked_mean(proxy_out, m),
        f"{PREFIX}mask/numerics_frac": _masked_mean(exact_out, m),
        f"{PREFIX}mask/staleness_frac": _masked_mean(proxy_out & ~exact_out, m),
        f"{PREFIX}mask/rescued_frac": _masked_mean(~proxy_out & exact_out, m),
    }


def correction_by_staleness(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    token_versions: torch.Tensor,
    current_version: int,
    mask: torch.Tensor,
    is_threshold: float | None,
    band: tuple[float, float] | None,
) -> dict[str, float]:
    """What verl's rollout correction does to fresh and to stale tokens, from any provider's old
    logits (no exact reference needed). On a fresh token (d = 0) every provider's old logits are
    π_train(θ_n), exact, so the band and the truncation act on numerics only; on stale tokens they
    act on numerics plus whatever staleness the provider left in ρ̂ = π_old/μ. The excess of the
    stale rate over the fresh rate estimates the share removed *because of staleness* (about 0 for
    an exact provider; the staleness verl's recomputed old log-probs leave in ρ̂ for ``current``).

    Args:
        old_log_probs, rollout_log_probs: ``(bs, L)`` log π_old and log μ.
        token_versions: ``(bs, L)`` long, -1 = no version.
        current_version: n, the version of the weights that computed ``current`` old logits.
        mask: ``(bs, L)`` response mask (before rejection).
        is_threshold: token IS truncation threshold (``rollout_is_threshold``), or None.
        band: token rejection band (``rollout_rs=token_k1``, ``rollout_rs_threshold`` "lo_hi"; verl
            bounds μ/π_old with it), or None.

    Returns:
        ``correction/{masked,truncated}_{fresh,stale}`` (fractions of the fresh / stale tokens),
        ``correction/{masked,truncated}_staleness_excess`` (stale minus fresh; with tokens of both
        kinds), ``correction/kl_{fresh,stale}`` (KL(μ‖π_old) per token, k3 estimator
        ρ̂ - 1 - log ρ̂ over tokens sampled from μ: on fresh tokens the train/inference numerics
        mismatch alone), ``correction/abs_log_ratio_p99_{fresh,stale}`` (the 99th percentile of
        |log ρ̂|: the band half-width at which 1% of the group would fire), ``correction/stale_token_frac``
        and ``correction/abs_log_ratio_max_{fresh,stale}``
        (the largest |log ρ̂| in each group: numerics alone on exact old logits, so on a backend whose
        rollout shares the trainer's numerics, 0 up to rounding exactly where the provider is exact).
    """
    m = mask.bool() & (token_versions >= 0)
    d = current_version - token_versions
    groups = {"fresh": m & (d == 0), "stale": m & (d > 0)}
    log_rho = (old_log_probs - rollout_log_probs).float()
    removed = {}
    if band is not None:
        removed["masked"] = ratio_out_of_band(-log_rho, *band)  # verl's token_k1 statistic is log(μ/π_old)
    if is_threshold is not None:
        removed["truncated"] = log_rho > torch.log(torch.tensor(float(is_threshold)))
    out = {f"{PREFIX}correction/stale_token_frac": _masked_mean(groups["stale"], m)}
    kl_k3 = torch.expm1(log_rho) - log_rho
    for name, group in groups.items():
        if group.any():
            out[f"{PREFIX}correction/abs_log_ratio_max_{name}"] = float(log_rho[group].abs().max())
            out[f"{PREFIX}correction/kl_{name}"] = _masked_mean(kl_k3, group)
            out[f"{PREFIX}correction/abs_log_ratio_p99_{name}"] = float(torch.quantile(log_rho[group].abs(), 0.99))
    for kind, hit in removed.items():
        for name, group in groups.items():
            if group.any():
                out[f"{PREFIX}correction/{kind}_{name}"] = _masked_mean(hit, group)
        if groups["fresh"].any() and groups["stale"].any():
            out[f"{PREFIX}correction/{kind}_staleness_excess"] = (
                out[f"{PREFIX}correction/{kind}_stale"] - out[f"{PREFIX}correction/{kind}_fresh"]
            )
    return out


@contextmanager
def cost_meter(metrics: dict[str, float], name: str) -> Iterator[dict[str, float]]:
    """Times a provider's work into ``old_logits/{name}/time_s``; the body may add counters to the
    yielded dict (e.g. ``forward_rows``, ``extra_bytes``), which are logged under the same prefix."""
    counters: dict[str, float] = {}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    yield counters
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    metrics[f"{PREFIX}{name}/time_s"] = time.perf_counter() - start
    for key, value in counters.items():
        metrics[f"{PREFIX}{name}/{key}"] = float(value)
