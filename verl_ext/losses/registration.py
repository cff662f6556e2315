"""Registers verl-ext's policy losses in verl's registry (imported by ``verl_ext.plugin`` when
``verl.trainer.ppo.core_algos`` is imported, in every process)."""

from verl.trainer.ppo.core_algos import register_policy_loss

from verl_ext.losses.opsm_loss import compute_policy_loss_opsm
from verl_ext.losses.ppo_ewma import compute_policy_loss_ppo_ewma

register_policy_loss("ppo_ewma")(compute_policy_loss_ppo_ewma)  # type: ignore[arg-type]
register_policy_loss("opsm")(compute_policy_loss_opsm)  # type: ignore[arg-type]
