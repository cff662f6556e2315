"""verl-ext's v1 trainers: verl's ``sync`` and ``colocate_async`` trainers plus verl-ext hooks.

Select with ``trainer.v1.trainer_mode=verl_ext_sync`` (or ``verl_ext_colocate_async``); the
``plugins/`` fragments do this for you. verl compares ``trainer_mode`` with the string "sync" in
several places to choose sync or async behaviour, so each class rewrites ``trainer_mode`` to the
mode it extends before verl's constructor reads it; its own settings live under
``trainer.v1.verl_ext``.

Hooks added on top of verl:
- start-up check that every plugin the config names is registered (``verl_ext.doctor``);
- ``trainer.v1.verl_ext.replay_poll_interval``: verl's replay buffer polls TransferQueue every
  2 s, which dominates a step on the cpu backend;
- per-token weight versions: the LLM client records which weight version produced each
  response token (``extra_fields["token_global_steps"]``, see ``verl_ext.rollout_client``).
"""

from __future__ import annotations

import logging

from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext.doctor import assert_config_plugins
from verl_ext.rollout_client import VersionedFullyAsyncLLMServerClient, VersionedLLMServerClient

logger = logging.getLogger("verl_ext")


class VerlExtTrainerMixin:
    """Shared verl-ext behaviour; combined with one of verl's v1 trainers below."""

    base_mode: str  # the verl trainer mode this class extends

    def __init__(self, config, *args, **kwargs):
        assert_config_plugins(config)
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.base_mode
        self.verl_ext_config = config.trainer.v1.get("verl_ext", {}) or {}
        super().__init__(config, *args, **kwargs)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        poll_interval = self.verl_ext_config.get("replay_poll_interval")
        if poll_interval is not None:
            buffer.poll_interval = float(poll_interval)
        return buffer


@register_trainer("verl_ext_sync")
class VerlExtTrainerSync(VerlExtTrainerMixin, PPOTrainerSync):
    """verl's synchronous trainer (colocated rollout, no partial rollouts) with verl-ext hooks."""

    base_mode = "sync"

    def get_llm_client(self):
        return self.llm_server_manager.get_client(client_cls=VersionedLLMServerClient)


@register_trainer("verl_ext_colocate_async")
class VerlExtTrainerColocateAsync(VerlExtTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer (abort/resume partial rollouts) with verl-ext hooks."""

    base_mode = "colocate_async"

    def get_llm_client(self):
        return self.llm_server_manager.get_client(client_cls=VersionedFullyAsyncLLMServerClient)
