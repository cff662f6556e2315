"""The preconditions of verl-ext's policy losses (``verl_ext.preconditions``)."""

from __future__ import annotations

from typing import Any

from verl_ext.gpu_checks import select
from verl_ext.preconditions import SELECTORS, TRAINER_MODE_KEY, Precondition

KIND = "loss"
LOSS_KEY = SELECTORS[KIND]
ROLLOUT_IS_KEY = "algorithm.rollout_correction.rollout_is"


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


PRECONDITIONS: tuple[Precondition, ...] = (
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
