"""Decoupled PPO with a proximal policy: the PPO-EWMA loss.

Hilton, Cobbe, Schulman, "Batch size-invariance for policy optimization" (NeurIPS 2022), §2
(decoupled objectives) and §3 (EWMA proximal policy); revised for heterogeneous async RL as in
Guan et al., "Missing Old Logits in Asynchronous Agentic RL" (arXiv 2605.12070). Per token, with π_prox carried by ``old_log_prob`` (whatever the old-logit
provider wrote: θ̄ for PPO-EWMA, θ_v for the exact providers) and μ the behaviour (inference)
policy:

    clip:  (π_prox/μ) · min(r·A, clip(r, 1-ε_l, 1+ε_h)·A),     r = π_θ/π_prox
    kl:    (π_prox/μ) · r·A - c · ½ (log r)²                     (= (π_θ/μ)·A - c·KL-penalty)

The IS factor π_prox/μ arrives as verl's ``rollout_is_weights``: computed by verl's
rollout-correction machinery (``algorithm.rollout_correction``: TIS / IcePop / rejection
thresholds on ρ = π_prox/μ), so its thresholds act on numerics while ε acts on staleness + update.

Differences from verl's ``vanilla`` (which it equals bit for bit when ``imp_weight_cap`` is None
and ``variant=clip``, tested):
  * ``imp_weight_cap``: the original's ``imp_samp_max`` — the total ratio π_θ/μ is capped by
    lowering the (detached) IS weight to cap / r where r·w would exceed it.
  * ``variant=kl``: Hilton's decoupled KL-penalty objective (the original's ``pi_kl`` term).
  * extra metrics: anchor lag, approx KL, IS masking and cap fractions.
  * ``opsm_delta``: DeepSeek-V3.2's off-policy sequence masking on the per-token losses
    (``verl_ext.losses.opsm``; π_old = μ where the rows carry rollout log-probs).
Dual-clip (``clip_ratio_c``) is kept as in ``vanilla``.
"""

from __future__ import annotations

from typing import Any

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import agg_loss
from verl.workers.config import ActorConfig

from verl_ext.losses.config import PPOEWMAPolicyLossConfig
from verl_ext.losses.decoupled_ppo import TokenLosses, decoupled_ppo_token_losses
from verl_ext.losses.opsm_loss import apply_opsm


def compute_policy_loss_ppo_ewma(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: ActorConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl ``PolicyLossFn`` for ``loss_mode=ppo_ewma``; called by ``verl.workers.utils.losses.ppo_loss``.

    Args:
        old_log_prob: log π_prox from the old-logit provider, ``(bs, L)``.
        log_prob: log π_θ, ``(bs, L)``.
        advantages: ``(bs, L)``.
        response_mask: bool ``(bs, L)`` (rejection-sampled tokens already removed by verl).
        loss_agg_mode: verl's ``agg_loss`` mode.
        config: the worker's ``ActorConfig``; options under ``config.policy_loss``
            (``PPOEWMAPolicyLossConfig``; a plain ``PolicyLossConfig`` gives the defaults).
        rollout_is_weights: π_prox/μ from verl's rollout correction, ``(bs, L)``, or None.

    Returns:
        (scalar loss aggregated with ``config.global_batch_info``, metrics of python floats).
    """
    if config is None:
        raise ValueError("loss_mode=ppo_ewma needs the actor config (verl's ppo_loss passes it)")
    options = config.policy_loss  # a plain PolicyLossConfig has none of the options: their defaults
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    variant = options.get("variant", PPOEWMAPolicyLossConfig.variant)
    out = decoupled_ppo_token_losses(
        log_prob=log_prob,
        prox_log_prob=old_log_prob,
        advantages=advantages,
        is_weights=rollout_is_weights,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_c=config.get("clip_ratio_c", 3.0),
        variant=variant,
        kl_coef=options.get("ppo_kl_coef", 0.0),
        imp_weight_cap=options.get("imp_weight_cap", PPOEWMAPolicyLossConfig.imp_weight_cap),
    )
    opsm, opsm_metrics = apply_opsm(old_log_prob, log_prob, advantages, response_mask, config)
    losses = out.losses if opsm is None else out.losses * opsm  # OPSM (opsm_delta): drop, keep the denominator
    pg_loss = agg_loss(
        loss_mat=losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
    )
    return pg_loss, {**_metrics(out, response_mask), **opsm_metrics}


def _metrics(out: TokenLosses, mask: torch.Tensor) -> dict[str, float]:
    log_r = out.log_ratio.detach()
    stats = {
        "actor/pg_clipfrac": out.clipped.float(),
        "actor/ppo_kl": -log_r,
        "actor/pg_clipfrac_lower": out.clipped_lower.float(),
        "actor/ppo_ewma/approx_kl": 0.5 * log_r.square(),  # Hilton's approxkl
        "actor/ppo_ewma/prox_lag": log_r.abs(),  # nats between π_θ and the anchor; first mini-batch: the anchor's lag
    }
    if out.is_weights is not None:
        stats["actor/ppo_ewma/is_weight_mean"] = out.is_weights
        # zero weights come only from an IcePop threshold ("lo_hi" rollout_is_threshold); token TIS never
        # zeroes one, and verl's rejection (rollout_rs) drops tokens from the mask before the loss:
        # what the correction removes, by cause, is old_logits/correction/* (trainer side)
        stats["actor/ppo_ewma/is_masked_frac"] = (out.is_weights == 0).float()
    if out.capped is not None:
        stats["actor/ppo_ewma/is_cap_frac"] = out.capped.float()  # total ratio above imp_weight_cap
    means = torch.stack([verl_F.masked_mean(v, mask) for v in stats.values()])
    return dict(zip(stats, means.tolist(), strict=True))  # one device sync for all metrics
