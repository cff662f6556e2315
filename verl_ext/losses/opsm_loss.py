"""OPSM inside verl's policy losses: the ``opsm`` loss mode (verl's own loss, ``vanilla`` by default,
with the mask) and ``apply_opsm``, which ``ppo_ewma`` calls. The rule: ``verl_ext.losses.opsm``.

``loss_mode=opsm`` calls the verl loss named by ``policy_loss.opsm_base_loss`` with
``rollout_is_weights`` multiplied by the mask: every verl loss in ``BASE_LOSSES`` multiplies its
per-token losses by ``rollout_is_weights`` just before aggregating them (tested against verl's source),
so this is the mask on the per-token losses with verl's clip, aggregation and metrics untouched.
π_old is μ from ``verl_ext.losses.behaviour`` when the rows carry ``rollout_log_probs``, else the
loss's ``old_log_prob`` (``actor/opsm/behaviour_is_rollout`` says which).
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from verl_ext.losses.behaviour import behaviour_log_probs, opsm_delta_of
from verl_ext.losses.opsm import DELTA_KEY, check_delta, opsm_mask, opsm_stats

BASE_KEY = "actor_rollout_ref.actor.policy_loss.opsm_base_loss"
# verl 0.9.1 losses whose per-token losses are multiplied by rollout_is_weights right before agg_loss
# (geo_mean takes their log; bypass_mode has its own rollout-correction path; ppo_ewma applies OPSM itself)
BASE_LOSSES = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "dro", "cispo")


def check_base(name: object) -> str:
    if name not in BASE_LOSSES:
        raise ValueError(
            f"{BASE_KEY}={name!r}: expected one of {BASE_LOSSES} (verl losses that weight each token's loss by "
            f"rollout_is_weights); for ppo_ewma set loss_mode=ppo_ewma and its own opsm_delta instead"
        )
    return str(name)


def apply_opsm(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The OPSM mask ``(bsz, L)`` and its metrics for one loss call; ``(None, {})`` when
    ``opsm_delta`` is null. μ from ``behaviour_log_probs()``, else ``old_log_prob``."""
    delta = check_delta(opsm_delta_of(config))
    if delta is None:
        return None, {}
    behaviour = behaviour_log_probs()
    from_rollout = behaviour is not None
    if behaviour is None:
        behaviour = old_log_prob
    elif behaviour.shape != log_prob.shape:
        raise ValueError(
            f"{DELTA_KEY}: the rows' rollout_log_probs pad to {tuple(behaviour.shape)}, the loss's log-probs to "
            f"{tuple(log_prob.shape)}; the rollout wrote log-probs for other tokens than the response mask holds"
        )
    result = opsm_mask(behaviour.to(log_prob.device), log_prob, advantages, response_mask, delta)
    mask = result.mask if result.mask.dim() == 2 else result.mask.unsqueeze(-1).expand_as(log_prob)
    stats = opsm_stats(result, response_mask)
    stats["behaviour_is_rollout"] = torch.tensor(float(from_rollout))
    values = torch.stack([v.detach().float().cpu() for v in stats.values()]).tolist()  # one sync
    return mask, {f"actor/opsm/{k}": v for k, v in zip(stats, values, strict=True)}


def compute_policy_loss_opsm(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl ``PolicyLossFn`` for ``loss_mode=opsm``: ``policy_loss.opsm_base_loss`` (default
    ``vanilla``) with the OPSM mask folded into ``rollout_is_weights``. Arguments as verl's vanilla."""
    if config is None:
        raise ValueError("loss_mode=opsm needs the actor config (verl's ppo_loss passes it)")
    base = check_base(config.policy_loss.get("opsm_base_loss", "vanilla"))
    mask, metrics = apply_opsm(old_log_prob, log_prob, advantages, response_mask, config)
    if mask is not None:
        rollout_is_weights = mask if rollout_is_weights is None else rollout_is_weights * mask
    pg_loss, base_metrics = get_policy_loss_fn(base)(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    return pg_loss, {**base_metrics, **metrics}
