"""``actor_rollout_ref.actor.policy_loss`` for ``loss_mode=ppo_ewma``.

verl's config dataclasses reject unknown keys, so the loss's options live in a subclass of
``PolicyLossConfig`` selected by ``_target_``::

    actor_rollout_ref.actor.policy_loss._target_=verl_ext.losses.config.PPOEWMAPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=ppo_ewma
    +actor_rollout_ref.actor.policy_loss.variant=clip
    +actor_rollout_ref.actor.policy_loss.imp_weight_cap=100

``OPSMPolicyLossConfig`` does the same for ``loss_mode=opsm`` (a verl loss with off-policy sequence
masking, ``verl_ext.losses.opsm_loss``); ``opsm_delta`` is a key of both (null: off).

The KL-penalty variant reuses the inherited ``ppo_kl_coef``; the clip range and dual clip are
the actor's ``clip_ratio_low/high`` and ``clip_ratio_c`` as for verl's ``vanilla``.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.workers.config.actor import PolicyLossConfig

from verl_ext.losses.opsm import check_delta

VARIANTS = ("clip", "kl")


@dataclass
class PPOEWMAPolicyLossConfig(PolicyLossConfig):
    """Options of the decoupled PPO(-EWMA) loss (Hilton et al. 2022, §2-3).

    Args:
        variant: ``clip`` — (π_prox/μ)·min(r·A, clip(r)·A); ``kl`` — (π_θ/μ)·A - c·½(log r)²
            with c = ``ppo_kl_coef``.
        imp_weight_cap: cap on the total ratio π_θ/μ applied by lowering the IS weight, as the
            original's ``imp_samp_max`` (100 there); None = off (the rollout-correction
            thresholds of ``algorithm.rollout_correction`` still apply).
        opsm_delta: off-policy sequence masking threshold δ (``verl_ext.losses.opsm``); None = off.
    """

    loss_mode: str = "ppo_ewma"
    variant: str = "clip"
    imp_weight_cap: float | None = None
    opsm_delta: float | None = None

    def __post_init__(self) -> None:
        check_delta(self.opsm_delta)
        if self.variant not in VARIANTS:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss.variant={self.variant!r}; expected one of {VARIANTS}"
            )
        if self.imp_weight_cap is not None and self.imp_weight_cap <= 1.0:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss.imp_weight_cap must be > 1, got {self.imp_weight_cap}"
            )


@dataclass
class OPSMPolicyLossConfig(PolicyLossConfig):
    """Options of ``loss_mode=opsm``: a verl loss with DeepSeek-V3.2's off-policy sequence masking.

    Args:
        opsm_delta: δ, in nats per token: a sequence with negative advantage whose mean
            log(π_old/π_θ) over its response tokens exceeds δ is dropped from the loss; None = off
            (the base loss unchanged).
        opsm_base_loss: the verl loss the mask is applied to (``verl_ext.losses.opsm_loss.BASE_LOSSES``).
    """

    loss_mode: str = "opsm"
    opsm_delta: float | None = None
    opsm_base_loss: str = "vanilla"

    def __post_init__(self) -> None:
        from verl_ext.losses.opsm_loss import check_base  # imports verl's core_algos

        check_delta(self.opsm_delta)
        check_base(self.opsm_base_loss)
