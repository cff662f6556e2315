"""The rollout side of the exact old-logit providers that score on it (``dedicated``,
``interrupt``), the same for the ``hf`` and vLLM rollouts and for every verl trainer mode.

The servers count the segments they serve (``verl_ext.old_logits.segment_log.ServedSegments``;
``counting_rollout_replicas`` gives vLLM's that count). ``DedicatedScorer`` starts the forward-only
scorer the LLM client hands each segment to and sends it the actor's weights at every sync;
``InterruptScoring`` has the client log every segment in a ``SegmentLog`` actor and scores the
segments of each version once it has ended, with verl's own ``compute_log_prob`` under that
version's weights. A provider names its rollout side in ``OldLogitProvider.rollout_side``; the
trainer's host (``verl_ext.old_logits.trainer_side``) starts it and calls:

- ``client_kwargs()``: what the version-recording LLM client needs;
- ``after_weight_sync(version)``: right after each weight sync to the rollout replicas;
- ``sync(metrics)``: before the step's old log-probs are read;
- ``before_checkpoint()``, ``state_dict()``, ``load_state_dict(state)``: checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import ray
import torch
import transfer_queue as tq
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from verl_ext.old_logits.config import KEY, OldLogitsConfig
from verl_ext.old_logits.metrics import PREFIX
from verl_ext.old_logits.precomputed import SegmentStore
from verl_ext.old_logits.trainer_side import VerlOldLogitHost, row_multiple
from verl_ext.old_logits.weight_specs import CURRENT, snapshot_spec
from verl_ext.old_logits.worker_side import send_weights_to_scorer
from verl_ext.timing import timed
from verl_ext.waits import ray_get

logger = logging.getLogger("verl_ext.old_logits")


@contextlib.contextmanager
def counting_rollout_replicas(rollout_name: str, needed: bool) -> Iterator[None]:
    """While the trainer builds its rollout replicas (every pool: colocated and standalone): where
    ``needed`` (the provider has a rollout side) on vLLM, verl's replica registry gives ``vllm``
    verl-ext's ``SegmentCountingVLLMReplica`` (verl's server with ``served_segments``), restored
    afterwards. The ``hf`` server counts natively."""
    if not needed or rollout_name != "vllm":
        yield
        return
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load() -> type:
        from verl_ext.old_logits.vllm_segments import SegmentCountingVLLMReplica

        return SegmentCountingVLLMReplica

    verls = RolloutReplicaRegistry._registry["vllm"]
    RolloutReplicaRegistry.register("vllm", load)
    try:
        yield
    finally:
        RolloutReplicaRegistry.register("vllm", verls)


def wait_until_recorded(recorded: Any, servers: Sequence[Any], version: int, timeout_s: float) -> tuple[float, bool]:
    """Waits until the LLM clients have recorded (``recorded(version)``, a Ray method) as many
    segments of ``version`` as the rollout servers served: a result may still be on its way from
    a server to its client when verl's abort returns. The servers' and the log's answers count
    against ``timeout_s`` too (a hung one is a timeout). Returns (seconds waited, timed out)."""
    start = time.perf_counter()

    def left() -> float:
        return max(0.0, timeout_s - (time.perf_counter() - start))

    try:
        served = sum(ray.get([server.served_segments.remote(version) for server in servers], timeout=left()))
        while ray.get(recorded.remote(version), timeout=left()) < served:
            if not left():
                return time.perf_counter() - start, True
            time.sleep(0.01)
    except ray.exceptions.GetTimeoutError:
        return time.perf_counter() - start, True
    return time.perf_counter() - start, False


def training_dtype(actor_config: Any) -> torch.dtype:
    """The precision of the actor's forward: FSDP's ``mixed_precision.param_dtype`` (bf16 unless
    set; the cpu backend sets fp32)."""
    from verl.utils.torch_dtypes import PrecisionType

    mixed = (actor_config.get("fsdp_config") or {}).get("mixed_precision") or {}
    return PrecisionType.to_dtype(mixed.get("param_dtype", "bf16"))


class DedicatedScorer:
    """``dedicated``: a forward-only scorer actor (``HFOldLogitScorer``) in the training engine's
    numerics. The trainer sends it the actor's weights right after each of verl's weight syncs
    (``after_weight_sync``, before generation resumes), and the LLM client has it score each
    segment as soon as the segment returns.

    Where it runs: on the host CPU on the cpu backend; on a GPU otherwise, either sharing the
    actor's first GPU with the trainer and the colocated rollout (``dedicated.gpu=shared``: the
    actor asks Ray for no GPU and sees that one card, as verl starts its vLLM servers) or on a GPU
    of its own that Ray has left free on the node (``dedicated.gpu=own``)."""

    def __init__(self, host: VerlOldLogitHost, config: OldLogitsConfig) -> None:
        from verl_ext.backends.hf.old_logit_scorer import SCORER_ACTOR_NAME, HFOldLogitScorer

        trainer = host.trainer
        self.host = host
        self.config = config.dedicated
        self.sent_version: int | None = None  # the version the scorer holds
        ref = trainer.config.actor_rollout_ref
        self.dtype = training_dtype(ref.actor)
        on_gpu = str(trainer.config.trainer.get("device", "cuda")) != "cpu"
        options = {"num_cpus": 0}
        if on_gpu and config.dedicated.gpu == "own":
            if ray.available_resources().get("GPU", 0) < 1:  # the actor would wait for one forever
                raise RuntimeError(
                    "algorithm.old_logits.dedicated.gpu=own: Ray has no free GPU for the scorer (every GPU "
                    f"it knows is taken; trainer.n_gpus_per_node={trainer.config.trainer.n_gpus_per_node}). "
                    "Use a node with a spare GPU, or algorithm.old_logits.dedicated.gpu=shared"
                )
            options["num_gpus"] = 1
        elif on_gpu:
            options.update(_share_gpu_of(trainer.actor_rollout_wg.workers[0]))
        self.actor = (
            ray.remote(HFOldLogitScorer)
            .options(name=SCORER_ACTOR_NAME, max_concurrency=1024, **options)
            .remote(
                config=ref.rollout,
                model_config=ref.model,
                servers=trainer.rollout_server_handles(),
                temperature=ref.rollout.temperature,
                sync_timeout_s=config.dedicated.sync_timeout_s,
                dtype=self.dtype,
                device="cuda" if on_gpu else "cpu",
            )
        )
        # surfaces model-loading errors here
        self._call(self.actor.get_global_steps.remote(), "start and load the model", "start_timeout_s")
        self.on_actor_gpu = 0.0
        if on_gpu:  # where the scorer landed, as a metric (dedicated.gpu=own must not share the actor's GPU)
            _, actor_gpu = _node_and_gpu(trainer.actor_rollout_wg.workers[0])
            scorer_gpu = self._call(self.actor.__ray_call__.remote(lambda _: _visible_devices()), "name its GPU")
            self.on_actor_gpu = float(scorer_gpu == actor_gpu)
            logger.info("dedicated old-logit scorer (%s) on GPU %s; the actor's first worker on GPU %s",
                        config.dedicated.gpu, scorer_gpu, actor_gpu)

    def _call(self, refs: Any, what: str, bound: str = "call_timeout_s") -> Any:
        """``ray.get`` of a call to the scorer, bounded by ``dedicated.<bound>``."""
        from verl_ext.backends.hf.old_logit_scorer import SCORER_COMPONENT

        return ray_get(refs, getattr(self.config, bound), SCORER_COMPONENT, what, f"{KEY}.dedicated.{bound}")

    def client_kwargs(self) -> dict[str, Any]:
        return {"old_logit_scorer": self.actor, "call_timeout_s": self.config.call_timeout_s}

    def after_weight_sync(self, version: int | None) -> None:
        """The actor's weights of ``version``, to the scorer (it first finishes the outgoing
        version's segments), once per version: with separate pools both pools sync each version."""
        from verl_ext.backends.hf.old_logit_scorer import SCORER_ACTOR_NAME

        if version is None or version == self.sent_version:
            return
        with timed("scorer_weight_sync"):
            self.host.on_workers(send_weights_to_scorer, SCORER_ACTOR_NAME, version, self.dtype,
                                 self.config.sync_timeout_s + self.config.call_timeout_s)
        self.sent_version = version

    def before_checkpoint(self) -> None:
        """Nothing to do: the scores travel with the rows."""

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def sync(self, metrics: dict[str, float]) -> None:
        """Nothing to score here; reports the scorer's work since the last step and its memory."""
        stats, memory = self._call([self.actor.take_stats.remote(), self.actor.memory.remote()], "report its stats")
        metrics.update({f"{PREFIX}dedicated/scorer_{name}": float(value) for name, value in stats.items()})
        metrics[f"{PREFIX}dedicated/scorer_on_actor_gpu"] = self.on_actor_gpu
        metrics.update(memory)


def _share_gpu_of(worker: Any) -> dict[str, Any]:
    """Ray options for an actor on ``worker``'s node that sees ``worker``'s GPU without asking Ray
    for one (verl's ``vLLMReplica.launch_servers`` places its servers this way). The visible
    device is set in the process's environment before it starts: verl's imports read CUDA's
    device list, after which a change would be ignored."""
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_visible_devices_keyword

    node_id, gpu = _node_and_gpu(worker)
    env = {var: "1" for var in get_platform().ray_noset_envvars()}
    env[get_visible_devices_keyword()] = gpu
    return {
        "scheduling_strategy": ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        "runtime_env": {"env_vars": env},
    }


def _node_and_gpu(worker: Any) -> tuple[str, str]:
    """(Ray node id, the physical GPU Ray gave ``worker``, as CUDA_VISIBLE_DEVICES names it)."""
    from verl.utils.device import get_resource_name

    return ray.get(worker.__ray_call__.remote(
        lambda self: (ray.get_runtime_context().get_node_id(),
                      str(ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]))
    ))


def _visible_devices() -> str:
    """The devices this process sees (CUDA_VISIBLE_DEVICES or the platform's equivalent)."""
    from verl.utils.device import get_visible_devices_keyword

    return os.environ.get(get_visible_devices_keyword(), "")


class InterruptScoring:
    """``interrupt``: the LLM clients log every segment (``SegmentLog``, kept); once a version has
    ended (verl's weight sync aborted its partial generations and moved the servers on), the trainer
    takes the version's logged segments (the aborted prefixes and the calls that finished), scores
    them with verl's ``compute_log_prob`` under that version's weights and keeps the results in a
    ``SegmentStore`` that the rows' ``old_logit_segments`` are resolved against.

    When: where generation pauses for training (verl's ``sync`` and ``colocate_async``), at the
    start of the step, while the trainer still holds the version (``sync``); with separate pools
    (``separate_async``), whose rollout never pauses, right after the sync that ends the version,
    under the workers' copy of it (``after_weight_sync``), and at a checkpoint for the segments of
    the running version recorded so far (``before_checkpoint``: restored rows name them). The store
    is saved with each checkpoint and restored on resume."""

    PARTITION = "verl_ext_old_logit_segments"

    def __init__(self, host: VerlOldLogitHost, config: OldLogitsConfig) -> None:
        from verl_ext.old_logits.segment_log import SEGMENT_LOG_ACTOR_NAME, SegmentLog

        self.host = host
        self.after_sync = config.separate_pools
        self.segment_store = SegmentStore(config.interrupt_max_versions())
        self.sync_timeout_s = config.interrupt.sync_timeout_s
        self.call_timeout_s = config.interrupt.call_timeout_s
        self.servers = host.trainer.rollout_server_handles()
        self.segment_log = ray.remote(SegmentLog).options(name=SEGMENT_LOG_ACTOR_NAME, num_cpus=0).remote()
        self._pending: dict[str, float] = {}  # metrics of the scoring after a sync, logged at the next step
        self._ended: int | None = None  # the last version scored after its sync

    def client_kwargs(self) -> dict[str, Any]:
        return {"segment_log": self.segment_log, "call_timeout_s": self.call_timeout_s}

    def _take(self, ref: Any, version: int) -> Any:
        """A ``take`` of the segment log's segments of ``version``, bounded."""
        from verl_ext.old_logits.segment_log import SEGMENT_LOG_COMPONENT

        return ray_get(ref, self.call_timeout_s, SEGMENT_LOG_COMPONENT, f"hand over the segments of version {version}",
                       f"{KEY}.interrupt.call_timeout_s")

    def after_weight_sync(self, version: int | None) -> None:
        """Separate pools: the sync to ``version`` ended ``version - 1``: score its segments."""
        if not self.after_sync or version is None or version - 1 == self._ended or version < 1:
            return
        with timed("segment_scoring"):
            self._score_ended(version - 1, self._pending)
        self._ended = version - 1

    def before_checkpoint(self) -> None:
        """Separate pools: the running version's segments recorded so far, scored now so that the
        finished rows a checkpoint restores find theirs (its later segments are scored after its
        sync, as usual)."""
        if not self.after_sync:
            return
        version = self.host.old_logits_version()
        with timed("segment_scoring"):
            segments = self._take(self.segment_log.take_recorded.remote(version), version)
            self._store(segments, version, self._pending)

    def state_dict(self) -> dict[str, Any]:
        return {"segment_store": self.segment_store.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.segment_store.load_state_dict(state["segment_store"])

    def sync(self, metrics: dict[str, float]) -> None:
        """Before the step's old log-probs are read: where generation paused for the step, score
        the version the trainer holds (it ended with verl's abort); with separate pools, report
        what the scoring after the last sync did."""
        if self.after_sync:
            metrics.update(self._pending)
            self._pending = {}
            return
        self._score_ended(self.host.old_logits_version(), metrics)

    def _score_ended(self, version: int, metrics: dict[str, float]) -> None:
        """Scores every logged segment of ``version``, which has ended, and closes it."""
        start = time.perf_counter()
        waited, timed_out = wait_until_recorded(self.segment_log.recorded, self.servers, version, self.sync_timeout_s)
        if timed_out:
            logger.warning(
                "verl-ext interrupt: after %.0f s (algorithm.old_logits.interrupt.sync_timeout_s) the clients had "
                "not recorded every segment of version %d the servers served, or a rollout server or the segment "
                "log did not answer; scoring what arrived, the rest stay unscored", waited, version,
            )
        segments, late = self._take(self.segment_log.take.remote(version), version)
        if late:
            logger.warning(
                "verl-ext interrupt: %d segments reached the segment log after their version's sync; left unscored "
                "(algorithm.old_logits.interrupt.on_missing decides)", late,
            )
        self._store(segments, version, metrics, late)
        metrics.update({
            f"{PREFIX}interrupt/evicted_segments": float(self.segment_store.evict(version)),
            f"{PREFIX}interrupt/sync_wait_s": waited,
            f"{PREFIX}interrupt/sync_timeouts": float(timed_out),
            f"{PREFIX}interrupt/sync_time_s": time.perf_counter() - start,
        })

    def _store(self, segments: list[dict[str, Any]], version: int, metrics: dict[str, float], late: int = 0) -> None:
        """Scores the ``segments`` of ``version`` under its weights into the store; segments of other
        versions cannot be scored exactly and stay unscored. Adds the counts to ``metrics``."""
        current = [seg for seg in segments if seg["version"] == version]
        if len(current) < len(segments):
            others = sorted({seg["version"] for seg in segments if seg["version"] != version}, key=str)
            logger.warning(
                "verl-ext interrupt: %d logged segments of versions %s, not the ended version %d, cannot be scored "
                "exactly; left unscored", len(segments) - len(current), others, version,
            )
        for seg, log_probs in zip(current, self._score(current, version), strict=True):
            self.segment_store.put(seg["segment_id"], version, log_probs)

        def add(name: str, value: float) -> None:
            metrics[f"{PREFIX}interrupt/{name}"] = metrics.get(f"{PREFIX}interrupt/{name}", 0.0) + value

        add("segments", float(len(current)))
        add("segment_tokens", float(sum(len(seg["token_ids"]) for seg in current)))
        # the forward covers prompt + earlier prefixes too: the cost of re-scoring prefixes
        add("forward_tokens", float(sum(len(seg["prompt_ids"]) + len(seg["token_ids"]) for seg in current)))
        add("unscorable_segments", float(len(segments) - len(current) + late))
        add("late_segments", float(late))
        metrics[f"{PREFIX}interrupt/stored_segments"] = float(len(self.segment_store))

    def _score(self, segments: list[dict[str, Any]], version: int) -> list[torch.Tensor]:
        """log-probs of each segment's tokens given its prompt under the weights of ``version``, by
        the actor workers' own ``compute_log_prob`` (rows written to a TransferQueue partition of
        their own)."""
        if not segments:
            return []
        rows = [_segment_row(seg) for seg in segments]
        # verl splits a batch evenly over the dp ranks and, without dynamic batch sizes, each
        # rank's share into equal micro-batches: pad with copies of the last row
        multiple, micro = row_multiple(self.host.trainer, len(rows))
        rows += [rows[-1]] * (-len(rows) % multiple)
        keys = [f"verl_ext_segment_{i}" for i in range(len(rows))]
        meta = tq.kv_batch_put(keys=keys, partition_id=self.PARTITION, fields=list_of_dict_to_tensordict(rows))
        if micro is not None:
            meta.extra_info["micro_batch_size_per_gpu"] = micro
        try:
            # the trainer holds `version` where generation paused for the step; with separate pools its
            # weights have moved on and the workers' copy serves (timed as segment_scoring)
            log_probs = self.host.log_probs(meta, snapshot_spec(version) if self.after_sync else CURRENT)
        finally:
            tq.kv_clear(keys=keys, partition_id=self.PARTITION)
        return [log_probs[i, : len(seg["token_ids"])] for i, seg in enumerate(segments)]


def _segment_row(segment: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One segment as a training row, in the layout verl's agent loop writes to TransferQueue."""
    prompts = torch.tensor(segment["prompt_ids"], dtype=torch.int64)
    responses = torch.tensor(segment["token_ids"], dtype=torch.int64)
    input_ids = torch.cat([prompts, responses])
    response_mask = torch.ones_like(responses)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "loss_mask": response_mask,
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "position_ids": torch.arange(input_ids.numel(), dtype=torch.int64),
    }
