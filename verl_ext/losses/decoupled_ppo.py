"""The decoupled PPO token losses (Hilton, Cobbe, Schulman, "Batch size-invariance for policy
optimization", NeurIPS 2022, §2-3): pure torch, no verl. ``verl_ext.losses.ppo_ewma`` is the verl
``PolicyLossFn`` around it; the module docstring there has the equations and the differences from
verl's ``vanilla``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# verl clamps log-ratios at ±20 before exp (core_algos SAFETY bound); kept for equality with vanilla.
_LOG_RATIO_BOUND = 20.0


@dataclass
class TokenLosses:
    """Per-token output of ``decoupled_ppo_token_losses``; all ``(bs, L)``."""

    losses: torch.Tensor  # to aggregate with agg_loss
    log_ratio: torch.Tensor  # log r, clamped, carries the gradient
    clipped: torch.Tensor  # bool: the PPO clip is active
    clipped_lower: torch.Tensor  # bool: the dual clip (A < 0) is active
    is_weights: torch.Tensor | None  # effective IS weights (after the cap), detached
    capped: torch.Tensor | None  # bool: the cap lowered the IS weight


def decoupled_ppo_token_losses(
    log_prob: torch.Tensor,
    prox_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    is_weights: torch.Tensor | None,
    clip_low: float,
    clip_high: float,
    clip_c: float,
    variant: str = "clip",
    kl_coef: float = 0.0,
    imp_weight_cap: float | None = None,
) -> TokenLosses:
    """Per-token decoupled PPO losses (to be minimised).

    Args:
        log_prob: log π_θ, ``(bs, L)``, with gradient.
        prox_log_prob: log π_prox, ``(bs, L)``.
        advantages: ``(bs, L)``.
        is_weights: π_prox/μ after verl's rollout correction, ``(bs, L)``, or None (= 1).
        clip_low, clip_high: ε_l, ε_h.
        clip_c: dual-clip constant (> 1) for A < 0 (Ye et al. 2020, arXiv 1912.09729).
        variant: ``clip`` or ``kl`` (see module docstring).
        kl_coef: c of the ``kl`` variant.
        imp_weight_cap: cap on π_θ/μ = r·w, or None.
    """
    log_ratio = torch.clamp(log_prob - prox_log_prob, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.gt(clipped_loss, unclipped)  # for variant=kl: where the clip *would* act
    if variant == "clip":
        dual_bound = -advantages * clip_c
        pessimistic = torch.maximum(unclipped, clipped_loss)
        clipped_lower = torch.gt(pessimistic, dual_bound) & (advantages < 0)
        losses = torch.where(advantages < 0, torch.minimum(dual_bound, pessimistic), pessimistic)
    elif variant == "kl":
        clipped_lower = torch.zeros_like(clipped)
        losses = unclipped
    else:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.variant={variant!r}; expected 'clip' or 'kl'")

    capped = None
    if imp_weight_cap is not None:
        # Lower π_prox/μ so that π_θ/μ = r·w stays <= cap (the original clips π_behav the same way).
        base = is_weights if is_weights is not None else torch.ones_like(log_ratio)
        cap_weights = imp_weight_cap * torch.exp(-log_ratio.detach())
        capped = cap_weights < base
        is_weights = torch.minimum(base, cap_weights)
    if is_weights is not None:
        losses = losses * is_weights
    if variant == "kl":
        losses = losses + kl_coef * 0.5 * log_ratio.square()
    return TokenLosses(losses, log_ratio, clipped, clipped_lower, is_weights, capped)
