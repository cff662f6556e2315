"""``HFOldLogitScorer``, the ``dedicated`` old-logit provider's scorer (``verl_ext.old_logits.precomputed``):
a forward-only copy of the policy, on the host CPU or on a GPU, that receives every weight version
in the same sync as the rollout servers (of any engine) and scores each segment as the LLM client
hands it over. It is the ``hf`` rollout server (``verl_ext.backends.hf.rollout``) with its
generation replaced by scoring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import torch
from verl.workers.config import HFModelConfig, RolloutConfig

from verl_ext.backends.hf.rollout import HFRolloutServer
from verl_ext.backends.hf.wire import WireTensor
from verl_ext.timing import held_bytes

logger = logging.getLogger("verl_ext.hf_rollout")  # the hf server's logger: one name for both

# The named Ray actor of the ``dedicated`` old-logit scorer (created by the trainer).
SCORER_ACTOR_NAME = "verl_ext_old_logit_scorer"
SCORER_COMPONENT = f"the dedicated old-logit scorer (Ray actor {SCORER_ACTOR_NAME})"


class HFOldLogitScorer(HFRolloutServer):
    """The ``dedicated`` old-logit scorer: a forward-only copy of the policy (runs as a named Ray
    actor, ``SCORER_ACTOR_NAME``), for any rollout engine.

    It inherits the ``hf`` server's model loading (transformers, sdpa) and weight updates, and
    computes in the *training* engine's numerics rather than the rollout's: ``dtype`` is the
    actor's FSDP ``mixed_precision.param_dtype`` (fp32 on the cpu backend, bf16 on GPUs), on
    ``device`` (the host CPU on the cpu backend, a GPU otherwise). With FSDP2 on one GPU the
    actor's forward is this forward: the same transformers model code and sdpa attention, the
    fp32 master weights cast to bf16. The trainer sends it every weight version right after verl's
    sync of the rollout servers, from the actor's own gathered weights
    (``verl_ext.old_logits.rollout_side.DedicatedScorer``).

    Ordering: a weight update that changes the version first waits until this scorer has scored
    as many segments of the outgoing version as the rollout servers returned
    (``served_segments``: the ``hf`` server and verl-ext's vLLM server count them before they
    return them), so a segment still on its way to the client (an aborted prefix) is scored with
    its own weights. After ``sync_timeout_s`` it logs and moves on; a segment whose version the
    scorer no longer holds is refused (``None``), never scored with other weights.

    Args:
        servers: the rollout servers' actor handles (for ``served_segments``).
        temperature: the trainer's ``actor_rollout_ref.rollout.temperature`` (verl divides the
            logits by it when it computes old log-probs).
        sync_timeout_s: ``algorithm.old_logits.dedicated.sync_timeout_s``.
        dtype, device: the training engine's precision and where the scorer runs.
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        servers: list[Any],
        temperature: float,
        sync_timeout_s: float,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        super().__init__(config=config, model_config=model_config, replica_rank=0, dtype=dtype, device=device,
                         quantization=None)
        self.servers = servers
        self.temperature = float(temperature)
        self.sync_timeout_s = sync_timeout_s
        self._scored: dict[int, int] = {}
        self._loading = False  # new weights are being copied in; scores would mix versions
        self._stats = self._empty_stats()

    async def memory(self) -> dict[str, float]:
        """``verl_ext/mem/dedicated_scorer/{gpu,host}_bytes``: the scorer's weights."""
        return held_bytes("dedicated_scorer", self.engine.model.state_dict().values())

    @staticmethod
    def _empty_stats() -> dict[str, float]:
        return {"segments": 0, "tokens": 0, "score_time_s": 0.0, "refused": 0, "sync_wait_s": 0.0, "sync_timeouts": 0}

    async def score(self, prompt_ids: list[int], token_ids: list[int], version: int | None) -> list[float] | None:
        """log π_θv(token_ids[t] | prompt_ids + token_ids[:t]) for every t, or None when this
        scorer does not hold version ``version`` (then the tokens stay unscored)."""
        start = time.perf_counter()
        log_probs = await asyncio.to_thread(self._score, list(prompt_ids), list(token_ids), version)
        if log_probs is None:
            self._stats["refused"] += 1
            logger.warning(
                "old-logit scorer holds version %s, was asked to score a segment of version %s: left unscored",
                self.global_steps, version,
            )
            return None
        self._scored[version] = self._scored.get(version, 0) + 1
        self._stats["segments"] += 1
        self._stats["tokens"] += len(token_ids)
        self._stats["score_time_s"] += time.perf_counter() - start
        return log_probs

    def _score(self, prompt_ids: list[int], token_ids: list[int], version: int | None) -> list[float] | None:
        with self.engine.lock, torch.inference_mode():
            if self._loading or version is None or version != self.global_steps:
                return None
            ids = torch.tensor([prompt_ids + token_ids], dtype=torch.long, device=self.engine.model.device)
            logits = self.engine.model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1 : -1].float()
            log_probs = (logits / self.temperature).log_softmax(dim=-1)
            return log_probs.gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1).cpu().tolist()

    async def update_weights(self, named_tensors: dict[str, WireTensor], global_steps: int | None) -> int:
        moving = global_steps is not None and global_steps != self.global_steps
        if moving and self.global_steps is not None:
            await self._wait_until_scored(self.global_steps)
        self._loading = moving
        try:
            return await super().update_weights(named_tensors, global_steps)
        finally:
            self._loading = False

    async def _wait_until_scored(self, version: int) -> None:
        start = time.perf_counter()
        served: list[int | str] = ["?"]  # "?" while a rollout server has not answered

        async def scored_all() -> None:
            while True:
                served[0] = sum(await asyncio.gather(*[s.served_segments.remote(version) for s in self.servers]))
                if self._scored.get(version, 0) >= served[0]:
                    return
                await asyncio.sleep(0.01)

        try:  # the servers' answers count against the same bound: a hung server is a timeout too
            await asyncio.wait_for(scored_all(), self.sync_timeout_s)
        except asyncio.TimeoutError:
            self._stats["sync_timeouts"] += 1
            logger.warning(
                "old-logit scorer: %d of %s segments of version %s scored after %.0f s "
                "(algorithm.old_logits.dedicated.sync_timeout_s; '?': a rollout server did not answer); "
                "moving to the next version, the rest stay unscored",
                self._scored.get(version, 0), served[0], version, self.sync_timeout_s,
            )
        self._scored.pop(version, None)
        self._stats["sync_wait_s"] += time.perf_counter() - start

    async def take_stats(self) -> dict[str, float]:
        """Counters since the last call (segments and tokens scored, time, refusals, sync waits)."""
        stats, self._stats = self._stats, self._empty_stats()
        return stats
