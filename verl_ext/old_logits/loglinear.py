"""AReaL's log-linear proximal approximation (A-3PO, arXiv 2512.06547; AReaL
``actor.prox_logp_method: loglinear``), kept as a negative control.

    log π_prox = log μ + α (log π_θ - log μ),      α = (v_prox - v_behave) / (v_θ - v_behave)

AReaL (``compute_prox_logp_approximations``) sets v_θ to the trainer's current version and
v_prox = v_θ - 1, so a token d = n - v versions old gets α = (d - 1) / d, and 0 for d ≤ 1
(the default here, ``proximal_version="previous"``). ``proximal_version="current"`` takes
v_prox = n (the weights the trainer holds) and v_θ = n + 1 (the policy being optimised):
α = d / (d + 1). Either way log r = (1 - α)(log π_θ - log μ),
so the PPO clip of r on [1 - ε_l, 1 + ε_h] is a clip of the total ratio π_θ/μ on the widened
interval ``widened_clip_bounds`` and the IS weight is (π_θ/μ)^α: no information about θ_v is added.

Difference from AReaL: AReaL evaluates the proxy inside the loss from the training forward's
log π_θ (saving the old-logit forward); here the provider evaluates it once from the pre-update
forward log π_θn, so it is a drop-in ``old_log_probs``. Both coincide on the first mini-batch,
where θ = θ_n, and that is where the identity above holds exactly.
"""

from __future__ import annotations

import torch


PROXIMAL_VERSIONS = ("previous", "current")


def loglinear_alpha(
    token_versions: torch.Tensor, current_version: int, proximal_version: str = "previous"
) -> torch.Tensor:
    """α per token, d = current_version - version; 0 for unversioned tokens.

    Args:
        token_versions: ``(bs, L)`` long, -1 where a token has no version.
        current_version: version n of the weights the trainer holds.
        proximal_version: ``"previous"`` (AReaL: v_prox = n - 1, v_θ = n; α = (d - 1)/d, 0 for
            d ≤ 1) or ``"current"`` (v_prox = n, v_θ = n + 1; α = d/(d + 1)).

    Returns:
        ``(bs, L)`` float32 α in [0, 1).
    """
    if proximal_version not in PROXIMAL_VERSIONS:
        raise ValueError(
            f"algorithm.old_logits.loglinear.proximal_version={proximal_version!r}; expected one of {PROXIMAL_VERSIONS}"
        )
    d = (current_version - token_versions).clamp(min=0).to(torch.float32)
    if proximal_version == "previous":
        alpha = torch.where(d > 1.0, (d - 1.0) / d.clamp(min=1.0), torch.zeros_like(d))
    else:
        alpha = d / (d + 1.0)
    return torch.where(token_versions >= 0, alpha, torch.zeros_like(d))


def loglinear_proxy(
    rollout_log_probs: torch.Tensor, current_log_probs: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    """log π_prox = log μ + α (log π_θ - log μ); all ``(bs, L)``."""
    return rollout_log_probs + alpha * (current_log_probs - rollout_log_probs)


def widened_clip_bounds(clip_low: float, clip_high: float, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds on the total ratio π_θ/μ equivalent to clipping r = π_θ/π_prox on
    [1 - clip_low, 1 + clip_high] under the log-linear proxy: ((1-ε_l)^{1/(1-α)}, (1+ε_h)^{1/(1-α)})."""
    exponent = 1.0 / (1.0 - alpha)
    return (1.0 - clip_low) ** exponent, (1.0 + clip_high) ** exponent
