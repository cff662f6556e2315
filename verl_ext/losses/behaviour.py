"""The behaviour log-probs μ for the policy loss function, where OPSM asks for them.

verl 0.9.1's ``verl.workers.utils.losses.ppo_loss`` hands the registered loss function
``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask``, the actor config and
``rollout_is_weights`` only: the rows' ``rollout_log_probs`` (μ, written by the rollout when
``actor_rollout_ref.rollout.calculate_log_probs=true``) are in the micro-batch ``ppo_loss`` receives
but never reach the loss function. The narrowest way to get them there without a fork: a wrapper of
``ppo_loss`` that, only when ``actor_rollout_ref.actor.policy_loss.opsm_delta`` is set and the rows
carry them, pads them exactly as ``ppo_loss`` pads its own fields and holds them in a context
variable for the duration of verl's call; the loss function reads ``behaviour_log_probs()``. Verl's
``ppo_loss`` itself runs unchanged. A post-import hook binds the wrapper as
``verl.workers.engine_workers.ppo_loss``, the name the actor worker builds its loss function from
(``partial(ppo_loss, config=actor_config)`` when it builds the model); it is listed in
``verl_ext.replacements`` with its guard. verl's distillation loss calls ``ppo_loss`` through its own
module and so does not get μ (OPSM then falls back to ``old_log_probs``, as without rollout log-probs).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("verl_ext")

TARGET_MODULE = "verl.workers.engine_workers"  # binds verl's ppo_loss into the actor's loss function
ROLLOUT_LOG_PROBS = "rollout_log_probs"

_BEHAVIOUR: ContextVar[torch.Tensor | None] = ContextVar("verl_ext_behaviour_log_probs", default=None)


def behaviour_log_probs() -> torch.Tensor | None:
    """μ, ``(bsz, response_length)`` padded as the loss function's other inputs, during a
    ``ppo_loss`` call that OPSM needs it for; None otherwise (no OPSM, or no rollout log-probs)."""
    return _BEHAVIOUR.get()


@contextmanager
def holding(log_probs: torch.Tensor | None) -> Iterator[None]:
    """Make ``behaviour_log_probs()`` return ``log_probs`` inside the block."""
    token = _BEHAVIOUR.set(log_probs)
    try:
        yield
    finally:
        _BEHAVIOUR.reset(token)


def opsm_delta_of(config: Any) -> object:
    """``config.policy_loss.opsm_delta`` of an ``ActorConfig`` (None where it has no such key)."""
    policy_loss = getattr(config, "policy_loss", None)
    return None if policy_loss is None else policy_loss.get("opsm_delta", None)


def wrap_ppo_loss(original: Callable) -> Callable:
    """verl's ``ppo_loss(config, model_output, data, dp_group=None)`` holding μ for the loss function."""
    if getattr(original, "_verl_ext_patched", False):
        return original

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        if opsm_delta_of(config) is None or ROLLOUT_LOG_PROBS not in data.keys():
            return original(config, model_output, data, dp_group)
        # the same select + pad as verl's ppo_loss does for old_log_probs: same (bsz, response_length)
        padded = data.select(ROLLOUT_LOG_PROBS).to_padded_tensor()[ROLLOUT_LOG_PROBS]
        with holding(padded):
            return original(config, model_output, data, dp_group)

    ppo_loss._verl_ext_patched = True  # type: ignore[attr-defined]
    return ppo_loss


def install(module: Any) -> None:
    """Bind the wrapper as ``module.ppo_loss`` (idempotent); ``module`` is verl's engine_workers."""
    module.ppo_loss = wrap_ppo_loss(module.ppo_loss)
