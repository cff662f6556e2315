"""The trainer's side of the old-logit providers: ``OldLogitHost`` for verl's v1 trainers.

The providers in ``verl_ext.old_logits.providers`` are plain tensor logic over a few host calls
(version, fetch, forward under some weights, verl's own anchor, store). This module implements
them for verl's v1 trainer (``sync``, ``colocate_async``, ``separate_async`` alike):

- fetch/store go through TransferQueue, padded to ``(bs, L)`` exactly as verl's
  ``_compute_old_log_prob`` does;
- a forward under other weights ("ewma", "snapshot:<v>") swaps those weights into the actor's
  local parameter shards on every worker (``verl_ext.old_logits.worker_side``), runs verl's own
  ``compute_log_prob``, and swaps back. "current" is the weights of the version the trainer's
  sync window started from: the live ones, or under ``separate_async`` (where the live weights
  move on within the window) the copy the workers keep of that version;
- per-token versions come from ``extra_fields["token_global_steps"]`` (``verl_ext.old_logits.rollout_client``);
- the rollout side of the exact providers that have one lives in ``verl_ext.old_logits.rollout_side``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.workers.utils.padding import response_from_nested, response_to_nested

from verl_ext.old_logits.config import OldLogitsConfig
from verl_ext.old_logits.metrics import correction_by_staleness, staleness_metrics
from verl_ext.old_logits.precomputed import precomputed_log_probs
from verl_ext.old_logits.providers import (
    PRECOMPUTED_LOG_PROBS,
    RECORDED_TOKEN_VERSIONS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    TOKEN_VERSIONS,
    OldLogitProvider,
)
from verl_ext.old_logits.rollout_client import TOKEN_VERSIONS_KEY
from verl_ext.old_logits.weight_specs import CURRENT, snapshot_spec
from verl_ext.old_logits.worker_side import (
    calibrate_worker_ewma,
    enter_weights,
    exit_weights,
    install_worker_state,
)
from verl_ext.timing import timed

CHECKPOINT_DIR = "verl_ext_old_logits"
ROLLOUT_SIDE_FILE = "rollout_side.pt"  # the rollout side's state (interrupt: its segment store)


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
    """``OldLogitHost`` for a verl v1 trainer (``trainer``) and one step's ``KVBatchMeta``, with the
    lifecycle of what the provider requires: the actor workers' state and the rollout side.

    Args:
        trainer: the verl-ext trainer (its config, worker groups and ``global_steps``).
        config: the parsed ``algorithm.old_logits``.
        provider: the configured provider (its ``requirements`` and ``rollout_side``).
        verl_anchor: verl's own ``_compute_old_log_prob`` of this trainer mode.
    """

    def __init__(self, trainer: Any, config: OldLogitsConfig, provider: OldLogitProvider,
                 verl_anchor: Callable[[Any, dict[str, float]], Any]) -> None:
        self.trainer = trainer
        self.config = config
        self.provider = provider
        self.verl_anchor = verl_anchor
        self.rollout_side: Any = None  # verl_ext.old_logits.rollout_side, where the provider has one
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

    def start_worker_state(self, version: int) -> None:
        """Creates the EWMA/snapshot state on every actor worker, whose weights hold ``version``.
        The EWMA's decay starts from verl's optimizer steps per version for one row per trajectory,
        ``train_batch_size // ppo_mini_batch_size * ppo_epochs`` (each of the ``parameter_sync_step``
        local updates of a version takes its share of the batch), until the workers have counted
        the steps of a version (``OldLogitWorkerState.calibrate``)."""
        cfg = self.trainer.config
        actor = cfg.actor_rollout_ref.actor
        estimate = max(1, cfg.data.train_batch_size // actor.ppo_mini_batch_size) * actor.ppo_epochs
        self.on_workers(install_worker_state, self.config, estimate, version)

    def start_rollout_side(self, restored: dict[str, Any] | None = None) -> None:
        """Starts the provider's rollout side (``OldLogitProvider.rollout_side``). Call once the
        rollout servers exist and before the first weight sync (the trainer's ``on_init_end``);
        ``restored``: its ``state_dict`` from the checkpoint resumed from."""
        module, _, name = self.provider.rollout_side.partition(":")
        self.rollout_side = getattr(importlib.import_module(module), name)(self, self.config)
        if restored is not None:
            self.rollout_side.load_state_dict(restored)

    def llm_client_kwargs(self) -> dict[str, Any]:
        """Extra arguments for the version-recording LLM client (the segment log; ``dedicated``:
        the scorer)."""
        return self.rollout_side.client_kwargs() if self.rollout_side is not None else {}

    def old_logits_rollout_sync(self, metrics: dict[str, float]) -> None:
        if self.rollout_side is None:
            raise RuntimeError(
                f"algorithm.old_logits.provider={self.provider.name}: its rollout side was not started; "
                "use a verl-ext trainer (trainer.v1.trainer_mode=verl_ext_<sync|colocate_async|separate_async>)"
            )
        with timed("segment_scoring"):
            self.rollout_side.sync(metrics)

    def old_logits_verl_anchor(self, batch: Any, metrics: dict[str, float]) -> Any:
        self._base_forward_pending = False
        with timed(None):  # verl's own work, counted in no verl-ext hook
            return self.verl_anchor(batch, metrics)

    def on_workers(self, fn, *args: Any) -> list[Any]:
        workers = self.trainer.actor_rollout_wg.workers
        return ray.get([worker.__ray_call__.remote(fn, *args) for worker in workers])

    def old_logits_ewma_calibrate(self, token_age_versions: float | None) -> dict[str, float]:
        # every rank holds the same scalars
        return self.on_workers(calibrate_worker_ewma, token_age_versions, self.old_logits_version())[0]

    def old_logits_version(self) -> int:
        # tokens sampled after the weight sync that ended step s carry version s; during step s
        # the actor holds the weights of version s - 1.
        return self.trainer.global_steps - 1

    def old_logits_fetch(self, batch: Any, fields: Sequence[str]) -> dict[str, torch.Tensor]:
        unknown = set(fields) - {RESPONSE_MASK, ROLLOUT_LOG_PROBS, TOKEN_VERSIONS, RECORDED_TOKEN_VERSIONS,
                                 PRECOMPUTED_LOG_PROBS}
        if unknown:
            raise KeyError(f"old-logit fields {sorted(unknown)} are not available from verl's batch")
        # rollout log-probs always (absent when the rollout returns none): the metrics after the
        # provider compare them with its old log-probs (rollout_vs_old_metrics, correction_metrics)
        select = [RESPONSE_MASK, ROLLOUT_LOG_PROBS]
        needs_extra = bool({TOKEN_VERSIONS, RECORDED_TOKEN_VERSIONS, PRECOMPUTED_LOG_PROBS} & set(fields))
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
        recorded = all(TOKEN_VERSIONS_KEY in (row or {}) for row in extra or [])
        if TOKEN_VERSIONS in fields or (RECORDED_TOKEN_VERSIONS in fields and recorded):
            out[TOKEN_VERSIONS] = token_versions(extra, out[RESPONSE_MASK], batch.keys)
        if PRECOMPUTED_LOG_PROBS in fields:
            store = getattr(self.rollout_side, "segment_store", None)  # scores kept trainer-side (interrupt)
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
        if weights == CURRENT and self.config.separate_pools:
            # the weights of version n: live until the window's first optimizer step, a copy after it
            weights = snapshot_spec(self.old_logits_version())
        swapped = weights != CURRENT
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
