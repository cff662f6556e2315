"""The preconditions of verl-ext's policy losses (``verl_ext.preconditions``)."""

from __future__ import annotations

from typing import Any

from verl_ext.gpu_checks import select
from verl_ext.preconditions import SELECTORS, TRAINER_MODE_KEY, Precondition

KIND = "loss"
LOSS_KEY = SELECTORS[KIND]
ROLLOUT_IS_KEY = "algorithm.rollout_correction.rollout_is"
OPSM_DELTA_KEY = "actor_rollout_ref.actor.policy_loss.opsm_delta"
ROLLOUT_LOG_PROBS_KEY = "actor_rollout_ref.rollout.calculate_log_probs"


def _importance_weights(config: Any) -> list[str]:
    """Stale tokens without verl's rollout correction: the loss would never see μ."""
    from verl_ext.trainer_modes import base_trainer_mode

    mode = base_trainer_mode(config)
    if mode == "sync" or select(config, ROLLOUT_IS_KEY) is not None:
        return []
    return [f"{ROLLOUT_IS_KEY}=None: {LOSS_KEY}=ppo_ewma takes its importance weight π_prox/μ from verl's rollout "
            f"correction, and under {TRAINER_MODE_KEY}={select(config, TRAINER_MODE_KEY)} tokens are sampled by older "
            f"weights (μ), so without it the loss clips around π_prox as if the tokens were its own: set "
            f"{ROLLOUT_IS_KEY}=token (plugins/loss/ppo_ewma.yaml sets it)"]


def _rollout_log_probs(config: Any) -> list[str]:
    """OPSM's π_old is the sampling policy: without the rollout's log-probs it would fall back to
    old_log_probs and no longer see the train/inference mismatch."""
    if select(config, OPSM_DELTA_KEY) is None or select(config, ROLLOUT_LOG_PROBS_KEY):
        return []
    return [f"{ROLLOUT_LOG_PROBS_KEY}={select(config, ROLLOUT_LOG_PROBS_KEY)} with {OPSM_DELTA_KEY}="
            f"{select(config, OPSM_DELTA_KEY)} ({LOSS_KEY}={select(config, LOSS_KEY)}): off-policy sequence masking "
            f"thresholds the mean log(pi_old/pi_theta) with pi_old the sampling policy, the rollout's log-probs, which "
            f"the rows then do not carry (old_log_probs would stand in, blind to the train/inference mismatch): set "
            f"{ROLLOUT_LOG_PROBS_KEY}=true (plugins/loss/opsm.yaml sets it), or {OPSM_DELTA_KEY}=null"]


_OPSM_CONDITION = (f"with `{OPSM_DELTA_KEY}` set, the rollout's log-probs (`{ROLLOUT_LOG_PROBS_KEY}=true`): "
                   "off-policy sequence masking measures each sequence's drift from the sampling policy")

PRECONDITIONS: tuple[Precondition, ...] = (
    Precondition(KIND, "opsm", _OPSM_CONDITION, (OPSM_DELTA_KEY, ROLLOUT_LOG_PROBS_KEY), _rollout_log_probs),
    Precondition(KIND, "ppo_ewma", _OPSM_CONDITION, (OPSM_DELTA_KEY, ROLLOUT_LOG_PROBS_KEY), _rollout_log_probs),
    Precondition(KIND, "ppo_ewma", f"under an async trainer mode (stale tokens), verl's rollout correction "
                 f"(`{ROLLOUT_IS_KEY}` token or sequence): it carries the decoupled objective's weight π_prox/μ",
                 (ROLLOUT_IS_KEY, TRAINER_MODE_KEY), _importance_weights),
    Precondition(KIND, "ppo_ewma", "an old-logit provider whose π_prox is not the current weights' (`ewma`, "
                 "`snapshot`, `dedicated`, `interrupt`, `loglinear` with stale tokens, or `ewma` with "
                 "`fresh_exact=false`): with `current`, or every token fresh, it is verl's `vanilla` loss bit for bit "
                 "(`variant=clip`, no `imp_weight_cap`); with `rollout` the trainer replaces it by `bypass_mode`",
                 ("algorithm.old_logits.provider", "algorithm.old_logits.ewma.fresh_exact", TRAINER_MODE_KEY),
                 not_at_start_up="not refused, vanilla PPO's learning signal remains"),
)
