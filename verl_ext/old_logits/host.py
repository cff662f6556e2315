"""verl glue for the old-logit providers: the trainer side (``OldLogitHost``) and the worker side.

The providers in ``verl_ext.old_logits`` are plain tensor logic over four calls (version,
fetch, forward under some weights, store). This module implements them for verl's v1 trainer:

- fetch/store go through TransferQueue, padded to ``(bs, L)`` exactly as verl's
  ``_compute_old_log_prob`` does;
- a forward under other weights ("ewma", "snapshot:<v>") swaps those weights into the actor's
  local parameter shards on every worker, runs verl's own ``compute_log_prob``, and swaps back;
- per-token versions come from ``extra_fields["token_global_steps"]`` (``verl_ext.old_logits.rollout_client``);
- the rollout side of the exact providers ``dedicated`` and ``interrupt``
  (``verl_ext.old_logits.precomputed``), the same for the ``hf`` and vLLM rollouts: the servers
  count the segments they serve (``verl_ext.old_logits.segment_log.ServedSegments``;
  ``counting_rollout_replicas`` gives vLLM's that count); ``DedicatedScorer`` starts the
  forward-only scorer the LLM client hands each segment to and sends it the actor's weights at
  every sync; ``InterruptScoring`` has the client log every segment in a ``SegmentLog`` actor and
  scores, at each weight sync and before the optimizer step, the logged segments with verl's own
  ``compute_log_prob`` on the trainer's current weights.

Worker-side state (``OldLogitWorkerState``: EWMA shadow, snapshot store) lives on each actor
worker as an attribute and is driven with Ray's ``__ray_call__`` (no worker subclass): the
engine's ``optimizer_step`` is wrapped on the instance so the EWMA is updated, and a snapshot
taken, at every optimizer step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.utils.tensordict_utils import list_of_dict_to_tensordict
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_ext.backends.cpu.wire import to_wire
from verl_ext.old_logits.config import ROLLOUT_SIDE_PROVIDERS, OldLogitsConfig
from verl_ext.old_logits.metrics import PREFIX, correction_by_staleness, staleness_metrics
from verl_ext.old_logits.precomputed import SegmentStore, precomputed_log_probs
from verl_ext.old_logits.providers import (
    PRECOMPUTED_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    TOKEN_VERSIONS,
)
from verl_ext.old_logits.swap import WeightSwap, local_parameters
from verl_ext.old_logits.worker import CURRENT
from verl_ext.timing import held_bytes, timed
from verl_ext.old_logits.rollout_client import TOKEN_VERSIONS_KEY

# The driver times its calls that swap weights on the workers (``weight_swap``, which on the cpu
# backend includes the copies); on CUDA the copies run asynchronously after the call returns and
# the workers time them on the compute stream.
WORKER_SWAP_HOOK = "weight_swap_gpu"
STATE_ATTR = "_verl_ext_old_logits"
CHECKPOINT_DIR = "verl_ext_old_logits"
ROLLOUT_SIDE_FILE = "rollout_side.pt"  # the segment store of `interrupt`

logger = logging.getLogger("verl_ext.old_logits")


# ----------------------------------------------------------------------------- worker side
# Each function runs inside an actor worker process via ``handle.__ray_call__.remote(fn, ...)``;
# its first argument is the Ray actor instance (verl's fused ``WorkerDict`` or a plain worker).


def _actor_worker(ray_self: Any) -> Any:
    candidates = list(getattr(ray_self, "worker_dict", {}).values()) or [ray_self]
    for worker in candidates:
        if getattr(getattr(worker, "actor", None), "engine", None) is not None:
            return worker
    raise RuntimeError("verl-ext old-logit provider: no actor engine on this worker")


def _state(ray_self: Any):
    state = getattr(_actor_worker(ray_self), STATE_ATTR, None)
    if state is None:
        raise RuntimeError("verl-ext old-logit state was not installed on this worker (install_worker_state)")
    return state


def install_worker_state(ray_self: Any, config: OldLogitsConfig, updates_per_version: int, version: int = 0) -> None:
    """Create the worker's EWMA/snapshot state over its local parameter shards (idempotent).
    ``version``: the version the actor's weights hold now."""
    from verl_ext.old_logits.swap import fsdp_resharder
    from verl_ext.old_logits.worker import OldLogitWorkerState

    worker = _actor_worker(ray_self)
    if getattr(worker, STATE_ATTR, None) is not None:
        return
    engine = worker.actor.engine
    modules = engine.module if isinstance(engine.module, (list, tuple)) else [engine.module]
    reshard = fsdp_resharder(modules)
    if reshard is not None:
        reshard()  # the parameter list must hold the sharded parameters, not gathered copies
    state = OldLogitWorkerState(
        config, local_parameters(engine.module), updates_per_version, backup_device=config.swap_backup_device,
        modules=modules, first_version=version,
    )
    original_step = engine.optimizer_step

    def optimizer_step():
        state.before_optimizer_step(state.version)
        result = original_step()
        state.after_optimizer_step()
        return result

    engine.optimizer_step = optimizer_step  # instance attribute: only this engine, only this process
    setattr(worker, STATE_ATTR, state)


def set_worker_version(ray_self: Any, version: int) -> None:
    _state(ray_self).set_version(version)


def publish_worker_version(ray_self: Any, version: int) -> dict[str, float]:
    """Publishes ``version`` and returns this worker's ``verl_ext/time/*`` and ``verl_ext/mem/*``
    of the step (the trainer calls it once per actor update)."""
    state = _state(ray_self)
    state.on_version_published(version)
    return state.report()


def enter_weights(ray_self: Any, spec: str) -> None:
    state = _state(ray_self)
    if state.active is not None:
        raise RuntimeError(f"old-logit weights {spec!r} requested while another swap is active")
    with timed(WORKER_SWAP_HOOK, device_only=True):
        context = state.weights(spec)
        context.__enter__()
    state.active = context
    if isinstance(context, WeightSwap):
        state.swap_backup_bytes = held_bytes("swap_backup", context.backup)


def exit_weights(ray_self: Any) -> None:
    state = _state(ray_self)
    context, state.active = state.active, None
    if context is not None:
        with timed(WORKER_SWAP_HOOK, device_only=True):
            context.__exit__(None, None, None)


def send_weights_to_scorer(ray_self: Any, scorer_name: str, version: int | None, dtype: torch.dtype) -> None:
    """Sends the actor's full weights (``get_per_tensor_param``, which every rank must iterate:
    FSDP gathers each tensor collectively) to the ``dedicated`` scorer, from rank 0, cast to the
    scorer's ``dtype`` as FSDP's mixed precision casts them for the forward."""
    params, peft_config = _actor_worker(ray_self).actor.engine.get_per_tensor_param()
    if peft_config is not None:
        raise NotImplementedError(
            "algorithm.old_logits.provider=dedicated: LoRA adapters must be merged for the scorer "
            "(actor_rollout_ref.model.lora.merge=True)"
        )
    sender = int(os.environ.get("RANK", 0)) == 0
    state = {}
    for name, tensor in params:  # every rank takes part in each gather; rank 0 keeps the tensors
        if sender:  # cast where the tensor is (on a GPU: half the bytes to copy to the host for bf16)
            cast = tensor.detach().to(dtype=dtype if tensor.is_floating_point() else tensor.dtype)
            state[name] = to_wire(cast.to("cpu"))
    if sender:
        ray.get(ray.get_actor(scorer_name).update_weights.remote(state, version))


def calibrate_worker_ewma(ray_self: Any, token_age_versions: float | None) -> dict[str, float]:
    return _state(ray_self).ewma_calibrate(token_age_versions)


def save_worker_state(ray_self: Any, folder: str) -> None:
    rank = int(os.environ.get("RANK", 0))
    os.makedirs(folder, exist_ok=True)
    torch.save(_state(ray_self).state_dict(), os.path.join(folder, f"rank_{rank}.pt"))


def load_worker_state(ray_self: Any, folder: str) -> bool:
    """Restore the state saved next to a checkpoint; returns whether a file was found. A missing
    file is passed on as ``None`` so the EWMA's ``on_missing_state`` policy decides."""
    path = os.path.join(folder, f"rank_{int(os.environ.get('RANK', 0))}.pt")
    state = torch.load(path, weights_only=False) if os.path.exists(path) else None
    _state(ray_self).load_state_dict(state)
    return state is not None


# ----------------------------------------------------------------------------- trainer side


@dataclass
class StepReads:
    """What this step's old-logit work read from TransferQueue for one batch (``keys``), so that
    storing the old log-probs and the metrics after it do not read the same fields again: every
    read is a round trip to the storage units."""

    keys: list
    nested_mask: Any  # response_mask as stored: rows of their own lengths (response_to_nested needs it)
    padded: dict[str, torch.Tensor] = field(default_factory=dict)  # response_mask, rollout_log_probs, old_log_probs
    extra: list | None = None  # the rows' extra_fields, when read

    def serves(self, batch: Any, names: Sequence[str], with_extra: bool = False) -> bool:
        return (list(batch.keys) == self.keys and all(n in self.padded for n in names)
                and (self.extra is not None or not with_extra))


class VerlOldLogitHost:
    """``OldLogitHost`` for a verl v1 trainer (``trainer``) and one step's ``KVBatchMeta``."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.rollout_side: DedicatedScorer | InterruptScoring | None = None
        self._base_forward_pending = False
        self.reads: StepReads | None = None  # set by old_logits_fetch, cleared by start_step
        self.forwarded_rows = 0  # rows that went through an old-log-prob forward this step

    def start_step(self) -> None:
        """A step's old-logit work starts: nothing read for an earlier batch is reused."""
        self.reads = None
        self.forwarded_rows = 0

    def _reads_for(self, batch: Any, names: Sequence[str], with_extra: bool = False) -> StepReads | None:
        """This step's reads when they hold ``names`` (and the rows' extra_fields) for ``batch``."""
        reads = self.reads
        return reads if reads is not None and reads.serves(batch, names, with_extra) else None

    def start_worker_state(self, config: OldLogitsConfig) -> None:
        """Creates the EWMA/snapshot state on every actor worker. The EWMA's decay starts from
        verl's optimizer steps per version for one row per trajectory, ``train_batch_size //
        ppo_mini_batch_size * ppo_epochs`` (each of the ``parameter_sync_step`` local updates of a
        version takes its share of the batch), until the workers have counted the steps of a
        version (``OldLogitWorkerState.calibrate``)."""
        cfg = self.trainer.config
        actor = cfg.actor_rollout_ref.actor
        estimate = max(1, cfg.data.train_batch_size // actor.ppo_mini_batch_size) * actor.ppo_epochs
        self.on_workers(install_worker_state, config, estimate, self.old_logits_version())

    def start_rollout_side(self, config: OldLogitsConfig, restored: dict[str, Any] | None = None) -> None:
        """Starts the rollout side of ``dedicated`` / ``interrupt``. Call once the rollout servers
        exist and before the first weight sync (the trainer's ``on_init_end``); ``restored``: its
        ``state_dict`` from the checkpoint resumed from (``interrupt``)."""
        if config.provider == "dedicated":
            self.rollout_side = DedicatedScorer(self, config)
        elif config.provider == "interrupt":
            self.rollout_side = InterruptScoring(self, config)
        if self.rollout_side is not None and restored is not None:
            self.rollout_side.load_state_dict(restored)

    def llm_client_kwargs(self) -> dict[str, Any]:
        """Extra arguments for the version-recording LLM client (the segment log; ``dedicated``:
        the scorer)."""
        return self.rollout_side.client_kwargs() if self.rollout_side is not None else {}

    def old_logits_rollout_sync(self, metrics: dict[str, float]) -> None:
        if self.rollout_side is None:
            raise RuntimeError(
                "algorithm.old_logits.provider=dedicated/interrupt: the rollout side was not started; "
                "use trainer.v1.trainer_mode=verl_ext_colocate_async or verl_ext_sync"
            )
        with timed("segment_scoring"):
            self.rollout_side.sync(metrics)

    def on_workers(self, fn, *args: Any) -> list[Any]:
        workers = self.trainer.actor_rollout_wg.workers
        return ray.get([worker.__ray_call__.remote(fn, *args) for worker in workers])

    def old_logits_ewma_calibrate(self, token_age_versions: float | None) -> dict[str, float]:
        return self.on_workers(calibrate_worker_ewma, token_age_versions)[0]  # every rank holds the same scalars

    def old_logits_version(self) -> int:
        # tokens sampled after the weight sync that ended step s carry version s; during step s
        # the actor holds the weights of version s - 1.
        return self.trainer.global_steps - 1

    def old_logits_fetch(self, batch: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]:
        unknown = set(fields) - {RESPONSE_MASK, ROLLOUT_LOG_PROBS, TOKEN_VERSIONS, PRECOMPUTED_LOG_PROBS}
        if unknown:
            raise KeyError(f"old-logit fields {sorted(unknown)} are not available from verl's batch")
        # rollout log-probs always (absent when the rollout returns none): the metrics after the
        # provider compare them with its old log-probs (rollout_vs_old_metrics, correction_metrics)
        select = [RESPONSE_MASK, ROLLOUT_LOG_PROBS]
        needs_extra = TOKEN_VERSIONS in fields or PRECOMPUTED_LOG_PROBS in fields
        if needs_extra:
            select.append("extra_fields")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=select)
        extra = data.pop("extra_fields").tolist() if needs_extra else None
        nested_mask = data[RESPONSE_MASK]
        padded = data.to_padded_tensor()
        if ROLLOUT_LOG_PROBS in fields and ROLLOUT_LOG_PROBS not in padded.keys():
            raise KeyError("the rows carry no rollout_log_probs, which the selected old-logit provider needs")
        out = {name: padded[name] for name in (RESPONSE_MASK, ROLLOUT_LOG_PROBS) if name in padded.keys()}
        self.reads = StepReads(list(batch.keys), nested_mask, dict(out), extra)
        if TOKEN_VERSIONS in fields:
            out[TOKEN_VERSIONS] = token_versions(extra, out[RESPONSE_MASK], batch.keys)
        if PRECOMPUTED_LOG_PROBS in fields:
            store = self.rollout_side.store if isinstance(self.rollout_side, InterruptScoring) else None
            out[PRECOMPUTED_LOG_PROBS] = precomputed_log_probs(extra, out[RESPONSE_MASK], store)
        return out

    def expect_base_forward(self) -> None:
        """A provider's ``compute`` starts: its first forward stands in for verl's own old-log-prob
        forward (verl's work, counted in no verl-ext hook); every further one is an extra forward
        (``verl_ext/time/extra_forwards``: one per weight version beyond the first)."""
        self._base_forward_pending = True

    def old_logits_forward(self, batch: Any, weights: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        hook = None if self._base_forward_pending else "extra_forwards"
        self._base_forward_pending = False
        with timed(hook):
            return self.log_probs(batch, weights, rows)

    def log_probs(self, batch: Any, weights: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``old_logits_forward`` without its timing (callers time it as their own hook). With
        ``rows``, the forward covers those rows only (padded with other rows of ``batch`` to what
        verl's dispatch and micro-batches need): a version present in a few rows costs a few rows'
        forward, not the batch's. Returns ``[len(rows) or batch rows, batch response width]``."""
        batch.extra_info.update(
            {
                "calculate_entropy": False,
                "compute_loss": False,
                "temperature": self.trainer.config.actor_rollout_ref.rollout.temperature,
            }
        )
        picked, micro = (None, None) if rows is None else self._rows_to_forward(rows.tolist(), len(batch))
        forwarded = batch if picked is None else batch.select_keys([batch.keys[i] for i in picked])
        if micro is not None:
            forwarded.extra_info["micro_batch_size_per_gpu"] = micro
        swapped = weights != "current"
        if swapped:
            with timed("weight_swap"):
                self.on_workers(enter_weights, weights)
        try:
            self.trainer.actor_rollout_wg.compute_log_prob(forwarded)
        finally:
            if swapped:
                with timed("weight_swap"):
                    self.on_workers(exit_weights)
        self.forwarded_rows += len(forwarded)
        data = tq.kv_batch_get(keys=forwarded.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "response_mask"])
        # the worker returns log-probs over prompt + response; keep the response part, as verl does
        data["log_probs"] = response_from_nested(data["log_probs"], data["response_mask"])
        log_probs = data.to_padded_tensor()["log_probs"]
        if rows is None:
            return log_probs
        if picked is None:
            return log_probs[rows]
        # back to the batch's width (0 past each row's end, as a full batch read pads)
        width = self._response_width(batch)
        log_probs = torch.nn.functional.pad(log_probs, (0, width - log_probs.shape[1]))
        position = {row: i for i, row in enumerate(picked)}
        return log_probs[[position[row] for row in rows.tolist()]]

    def _rows_to_forward(self, rows: list[int], n_batch: int) -> tuple[list[int] | None, int | None]:
        """(the batch rows a forward over ``rows`` runs on, ascending: ``rows`` plus the fewest
        others that make the count a multiple verl accepts, or None when that is the whole batch;
        the micro-batch size that subset needs, or None to keep the batch's)."""
        multiple, micro = row_multiple(self.trainer, len(rows))
        count = -(-len(rows) // multiple) * multiple
        if count >= n_batch:
            return None, None
        chosen = set(rows)
        fill = [i for i in range(n_batch) if i not in chosen][: count - len(chosen)]
        return sorted(chosen.union(fill)), micro

    def _response_width(self, batch: Any) -> int:
        """The padded response width of ``batch`` (this step's reads where they hold it)."""
        reads = self._reads_for(batch, [RESPONSE_MASK])
        if reads is not None:
            return reads.padded[RESPONSE_MASK].shape[1]
        mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        return mask.to_padded_tensor()["response_mask"].shape[1]

    def correction_metrics(self, batch: Any) -> dict[str, float]:
        """After any provider (``current`` included): per-token staleness (``stale/*``, from the
        recorded versions rather than verl's per-trajectory lower bound) and what the rollout
        correction removes from fresh vs stale tokens (``metrics.correction_by_staleness``).
        Empty when the rows carry no rollout log-probs or no versions."""
        reads = self._reads_for(batch, ["old_log_probs", ROLLOUT_LOG_PROBS], with_extra=True)
        if reads is not None:
            extra, padded = reads.extra, reads.padded
        else:
            fields = ["old_log_probs", "rollout_log_probs", "response_mask", "extra_fields"]
            # as verl's _compute_advantage: a field the rows lack (no rollout log-probs) is left out
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
            if not {"rollout_log_probs", "extra_fields"} <= set(data.keys()):
                return {}
            extra = data.pop("extra_fields").tolist()
            padded = data.to_padded_tensor()
        mask = padded["response_mask"]
        if any(TOKEN_VERSIONS_KEY not in (row or {}) for row in extra):
            return {}
        versions = token_versions(extra, mask, batch.keys)
        n = self.old_logits_version()
        is_threshold, band = rollout_correction_thresholds(self.trainer.config.algorithm.get("rollout_correction"))
        out = staleness_metrics(versions, n, mask, max_bucket=8)
        out.update(correction_by_staleness(
            padded["old_log_probs"], padded["rollout_log_probs"], versions, n, mask, is_threshold, band
        ))
        return out

    def old_logits_store(self, batch: Any, old_log_probs: torch.Tensor) -> Any:
        reads = self._reads_for(batch, [])
        if reads is None:
            mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
            nested_mask = mask["response_mask"]
        else:
            nested_mask = reads.nested_mask
        fields = TensorDict({"old_log_probs": response_to_nested(old_log_probs, nested_mask)}, batch_size=len(batch))
        stored = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        if reads is not None:  # as reading it back would give it (0 past each row's length)
            reads.padded["old_log_probs"] = fields.to_padded_tensor()["old_log_probs"]
        return stored

    def rollout_vs_old_metrics(self, batch: Any) -> dict[str, float]:
        """verl's rollout-vs-trainer diagnostics (``training/rollout_probs_diff_*``), computed
        against the provider's old log-probs: with an exact provider they measure the pure
        train/inference discrepancy. From what this step read and stored where it can."""
        from verl import DataProto
        from verl.utils.debug.metrics import calculate_debug_metrics

        reads = self._reads_for(batch, ["old_log_probs", ROLLOUT_LOG_PROBS, RESPONSE_MASK])
        if reads is not None:
            padded = {k: reads.padded[k] for k in ("old_log_probs", ROLLOUT_LOG_PROBS, RESPONSE_MASK)}
            padded["responses"] = padded[RESPONSE_MASK]  # calculate_debug_metrics reads only its width
            return calculate_debug_metrics(DataProto(batch=TensorDict(padded, batch_size=len(batch))))
        fields = ["old_log_probs", "rollout_log_probs", "response_mask", "responses"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        return calculate_debug_metrics(DataProto(batch=data.to_padded_tensor()))


def rollout_correction_thresholds(correction: Any) -> tuple[float | None, tuple[float, float] | None]:
    """(token IS truncation threshold, token_k1 rejection band) of verl's
    ``algorithm.rollout_correction``; None where that part is off, or not token-level (a
    sequence-level IS threshold or other rejection modes are not split by token)."""
    if correction is None or correction.get("bypass_mode", False):
        return None, None
    threshold = correction.get("rollout_is_threshold")
    is_threshold = float(threshold) if correction.get("rollout_is") == "token" and isinstance(threshold, (int, float)) else None
    band = None
    if correction.get("rollout_rs") == "token_k1" and correction.get("rollout_rs_threshold") is not None:
        low, _, high = str(correction.get("rollout_rs_threshold")).partition("_")
        band = (float(low), float(high)) if high else (1.0 / float(low), float(low))
    return is_threshold, band


def token_versions(extra_fields: list[dict], response_mask: torch.Tensor, keys: Sequence[str]) -> torch.Tensor:
    """``(bs, L)`` long tensor of the weight version of each response token (-1: none).

    Raises ``ValueError`` naming the rows whose rollout recorded no versions: a provider that
    needs versions must not guess them (``verl_ext.old_logits.rollout_client`` records them; agent loops
    must copy ``extra_fields["token_global_steps"]`` into their output).
    """
    bs, length = response_mask.shape
    out = torch.full((bs, length), -1, dtype=torch.long)
    missing = []
    for i, fields in enumerate(extra_fields):
        versions = (fields or {}).get(TOKEN_VERSIONS_KEY)
        if versions is None:
            if bool(response_mask[i].any()):
                missing.append(keys[i])
            continue
        n = min(len(versions), length)
        out[i, :n] = torch.tensor([-1 if v is None else int(v) for v in versions[:n]], dtype=torch.long)
    if missing:
        raise ValueError(
            f"rows {missing[:5]} carry no per-token weight versions (extra_fields['{TOKEN_VERSIONS_KEY}']); "
            "run a verl_ext trainer (it installs the version-recording LLM client) with an agent loop that "
            "forwards TokenOutput.extra_fields (single_turn_agent, hybrid_gui_tool, text_env do)"
        )
    return torch.where(response_mask.bool(), out, torch.full_like(out, -1))


# ----------------------------------------------------------------------------- rollout side


def _require_supported_rollout(trainer: Any, provider: str) -> None:
    """The start-up check (``verl_ext.validation``) refuses this already; kept for trainers built
    some other way."""
    from verl_ext.validation import rollout_side_problems

    problems = rollout_side_problems(provider, str(trainer.config.actor_rollout_ref.rollout.name))
    if problems:
        raise NotImplementedError(problems[0])


@contextlib.contextmanager
def counting_rollout_replicas(rollout_name: str, provider: str) -> Iterator[None]:
    """While the trainer builds its rollout replicas: with ``dedicated`` / ``interrupt`` on vLLM,
    verl's replica registry gives ``vllm`` verl-ext's ``SegmentCountingVLLMReplica`` (verl's
    server with ``served_segments``), restored afterwards. The ``hf`` server counts natively."""
    if provider not in ROLLOUT_SIDE_PROVIDERS or rollout_name != "vllm":
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
    a server to its client when verl's abort returns. Returns (seconds waited, timed out)."""
    start = time.perf_counter()
    served = sum(ray.get([server.served_segments.remote(version) for server in servers]))
    while ray.get(recorded.remote(version)) < served:
        if time.perf_counter() - start > timeout_s:
            return time.perf_counter() - start, True
        time.sleep(0.01)
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
        from verl_ext.backends.cpu.rollout import SCORER_ACTOR_NAME, HFOldLogitScorer

        trainer = host.trainer
        _require_supported_rollout(trainer, "dedicated")
        self.host = host
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
                servers=trainer.llm_server_manager.server_handles,
                temperature=ref.rollout.temperature,
                sync_timeout_s=config.dedicated.sync_timeout_s,
                dtype=self.dtype,
                device="cuda" if on_gpu else "cpu",
            )
        )
        ray.get(self.actor.get_global_steps.remote())  # surfaces model-loading errors here
        self.on_actor_gpu = 0.0
        if on_gpu:  # where the scorer landed, as a metric (dedicated.gpu=own must not share the actor's GPU)
            _, actor_gpu = _node_and_gpu(trainer.actor_rollout_wg.workers[0])
            scorer_gpu = ray.get(self.actor.__ray_call__.remote(lambda _: _visible_devices()))
            self.on_actor_gpu = float(scorer_gpu == actor_gpu)
            logger.info("dedicated old-logit scorer (%s) on GPU %s; the actor's first worker on GPU %s",
                        config.dedicated.gpu, scorer_gpu, actor_gpu)

    def client_kwargs(self) -> dict[str, Any]:
        return {"old_logit_scorer": self.actor}

    def after_weight_sync(self, version: int | None) -> None:
        """The actor's weights of ``version``, to the scorer (it first finishes the outgoing
        version's segments)."""
        from verl_ext.backends.cpu.rollout import SCORER_ACTOR_NAME

        with timed("scorer_weight_sync"):
            self.host.on_workers(send_weights_to_scorer, SCORER_ACTOR_NAME, version, self.dtype)

    def sync(self, metrics: dict[str, float]) -> None:
        """Nothing to score here; reports the scorer's work since the last step and its memory."""
        stats, memory = ray.get([self.actor.take_stats.remote(), self.actor.memory.remote()])
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
    """``interrupt``: the LLM clients log every segment (``SegmentLog``, kept); at each step, after
    verl's abort has paused generation and before the first optimizer step, the trainer takes the
    logged segments (all of the version it still holds: the aborted prefixes and the calls that
    finished since the last sync), scores them with verl's ``compute_log_prob`` on its current
    weights and keeps the results in a ``SegmentStore`` that the rows' ``old_logit_segments`` are
    resolved against. The store is saved with each checkpoint and restored on resume."""

    PARTITION = "verl_ext_old_logit_segments"

    def __init__(self, host: VerlOldLogitHost, config: OldLogitsConfig) -> None:
        from verl_ext.old_logits.segment_log import SEGMENT_LOG_ACTOR_NAME, SegmentLog

        _require_supported_rollout(host.trainer, "interrupt")
        self.host = host
        self.store = SegmentStore(config.interrupt_max_versions())
        self.sync_timeout_s = config.interrupt.sync_timeout_s
        self.servers = host.trainer.llm_server_manager.server_handles
        self.segment_log = ray.remote(SegmentLog).options(name=SEGMENT_LOG_ACTOR_NAME, num_cpus=0).remote()

    def client_kwargs(self) -> dict[str, Any]:
        return {"segment_log": self.segment_log}

    def after_weight_sync(self, version: int | None) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"segment_store": self.store.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.store.load_state_dict(state["segment_store"])

    def sync(self, metrics: dict[str, float]) -> None:
        start = time.perf_counter()
        version = self.host.old_logits_version()
        waited, timed_out = wait_until_recorded(self.segment_log.recorded, self.servers, version, self.sync_timeout_s)
        if timed_out:
            logger.warning(
                "verl-ext interrupt: after %.0f s (algorithm.old_logits.interrupt.sync_timeout_s) the clients had "
                "not recorded every segment of version %d the servers served; scoring what arrived, the rest stay "
                "unscored", waited, version,
            )
        segments, late = ray.get(self.segment_log.take.remote(version))
        current = [seg for seg in segments if seg["version"] == version]
        if len(current) < len(segments):
            others = sorted({seg["version"] for seg in segments if seg["version"] != version}, key=str)
            logger.warning(
                "verl-ext interrupt: %d logged segments of versions %s, not the trainer's %d, cannot be scored "
                "exactly; left unscored", len(segments) - len(current), others, version,
            )
        if late:
            logger.warning(
                "verl-ext interrupt: %d segments reached the segment log after their version's sync; left unscored "
                "(algorithm.old_logits.interrupt.on_missing decides)", late,
            )
        for seg, log_probs in zip(current, self._score(current), strict=True):
            self.store.put(seg["segment_id"], version, log_probs)
        evicted = self.store.evict(version)
        metrics.update(
            {
                f"{PREFIX}interrupt/segments": float(len(current)),
                f"{PREFIX}interrupt/segment_tokens": float(sum(len(seg["token_ids"]) for seg in current)),
                # the forward covers prompt + earlier prefixes too: the cost of re-scoring prefixes
                f"{PREFIX}interrupt/forward_tokens": float(
                    sum(len(seg["prompt_ids"]) + len(seg["token_ids"]) for seg in current)
                ),
                f"{PREFIX}interrupt/unscorable_segments": float(len(segments) - len(current) + late),
                f"{PREFIX}interrupt/late_segments": float(late),
                f"{PREFIX}interrupt/stored_segments": float(len(self.store)),
                f"{PREFIX}interrupt/evicted_segments": float(evicted),
                f"{PREFIX}interrupt/sync_wait_s": waited,
                f"{PREFIX}interrupt/sync_timeouts": float(timed_out),
                f"{PREFIX}interrupt/sync_time_s": time.perf_counter() - start,
            }
        )

    def _score(self, segments: list[dict[str, Any]]) -> list[torch.Tensor]:
        """log-probs of each segment's tokens given its prompt, by the actor workers' own
        ``compute_log_prob`` (rows written to a TransferQueue partition of their own)."""
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
            log_probs = self.host.log_probs(meta, CURRENT)  # timed as segment_scoring, not as a provider forward
        finally:
            tq.kv_clear(keys=keys, partition_id=self.PARTITION)
        return [log_probs[i, : len(seg["token_ids"])] for i, seg in enumerate(segments)]


def row_multiple(trainer: Any, n_rows: int) -> tuple[int, int | None]:
    """(the row count a batch of about ``n_rows`` for the actor's ``compute_log_prob`` must be a
    multiple of, the micro-batch size to use or None with dynamic batch sizes). verl splits a batch
    evenly over the dp ranks and, without dynamic batch sizes, each rank's share into equal
    micro-batches; the micro-batch is at most the configured ``log_prob_micro_batch_size_per_gpu``,
    sized so that little padding is needed."""
    wg = trainer.actor_rollout_wg
    if "actor" not in wg._dispatch_info:
        wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
    dp = max(wg._dispatch_info["actor"]) + 1
    if trainer.config.actor_rollout_ref.actor.use_dynamic_bsz:
        return dp, None
    configured = trainer.config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
    per_rank = -(-n_rows // dp)
    micro_batches = -(-per_rank // configured)
    micro = -(-per_rank // micro_batches)
    return dp * micro, micro


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
