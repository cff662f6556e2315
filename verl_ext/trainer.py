"""verl-ext's v1 trainers: verl's three trainer modes (``sync``, ``colocate_async``,
``separate_async``) plus the same verl-ext hooks, written once in ``VerlExtTrainerMixin``.

Select with ``trainer.v1.trainer_mode=verl_ext_sync`` (or ``verl_ext_colocate_async``,
``verl_ext_separate_async``); fragments never pick the mode. verl compares ``trainer_mode`` with
the string "sync" in several places to choose sync or async behaviour, so each class rewrites
``trainer_mode`` to the mode it extends before verl's constructor reads it; its own settings live
under ``trainer.v1.verl_ext``. What differs between the modes is only where the rollout servers,
their LLM client and their weight syncs are (the three small classes at the end).

Hooks added on top of verl:
- start-up checks (``verl_ext.validation``, the same ``verl-ext doctor`` and the driver run), this
  machine's readiness for the config's accelerator, and for ``dvreward`` a probe of the judge
  (``verl_ext.rewards.dvreward.startup.probe_judge``), before verl builds anything;
- ``trainer.v1.verl_ext.replay_poll_interval``: verl's replay buffer polls TransferQueue every
  2 s, which dominates a step on the cpu backend;
- per-token weight versions: the LLM client records which weight version produced each
  response token (``extra_fields["token_global_steps"]``, see ``verl_ext.old_logits.rollout_client``);
- old-logit providers (``algorithm.old_logits.provider``): ``_compute_old_log_prob`` delegates to
  the provider (``verl_ext.old_logits``) through its host (``verl_ext.old_logits.trainer_side``);
  the default ``current`` runs verl's own step, untouched; what a provider requires (worker state,
  a rollout side started in ``on_init_end`` before the first weight sync, verl's bypass loss) is
  read from its declaration, never from its name;
- step-aware advantages: for the estimators in ``verl_ext.advantages`` the advantage step
  fetches each row's step metadata (``extra_fields``) from TransferQueue and computes token
  advantages with ``verl_ext.advantages.verl_glue``; verl's own estimators run unchanged;
  ``trainer.v1.verl_ext.dump_advantages_dir`` writes each step's estimator inputs (response mask,
  scores, critic values, the rows' step metadata) and token advantages/returns to
  ``<dir>/step_<n>.pt`` (``torch.load``), to audit an estimator on real rows;
- agent-loop failures: when most runs since the last batch failed, the run stops with the first
  error and the count (``verl_ext.agent_loops.failures``) instead of training on what is left;
- group-level reward post-processors (``verl_ext.rewards.postprocess``, e.g.
  ``algorithm.path_length_reward``) run on the rewards before any estimator;
- faults are not answers: rows whose episode faulted (step metadata ``valid=False``) or that the
  reward manager flags as unscorable (``dvreward``'s ``dv_valid=0``) are kept out of their group's
  statistics and the loss, for every estimator (``verl_ext.advantages.validity``); a batch where
  every row is such a row stops the run with the reasons; episode and DVReward judge metrics are
  logged every step;
- group signal (verl's estimators): ``verl_ext/groups/uniform_reward_share``, the share of the batch's
  rollout groups whose rows all got the same reward, so that a group-relative estimator gives them
  advantage 0 (a run that is not learning shows whether GRPO had anything to compare);
- learning signal (every estimator): ``verl_ext/signal/*``, the shares of rows and tokens whose
  advantage is 0 and of single-row groups; a step where no row carries signal stops the run with
  the cause (``verl_ext.advantages.signal``) unless ``trainer.v1.verl_ext.stop_on_zero_signal=false``;
- verl-ext's own cost: every hook above times itself (``verl_ext.timing``); each step logs
  ``verl_ext/time/<hook>``, ``verl_ext/mem/<what>/*_bytes`` (the workers' reports come back with
  the version-publishing call), ``verl_ext/time/total`` and its ``share_of_step`` of verl's
  ``timing_s/step``.
"""

from __future__ import annotations

import contextlib
import logging
import os

import transfer_queue as tq
from omegaconf import open_dict
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from verl_ext import faults, replacements, validation
from verl_ext.advantage_step import exclude_invalid_rewards, step_aware_estimator, uniform_reward_groups
from verl_ext.rewards.env_rewards import training_batch_metrics
from verl_ext.old_logits.rollout_client import VersionedFullyAsyncLLMServerClient, VersionedLLMServerClient
from verl_ext.timing import accumulate, hook_timer, step_metrics, timed

logger = logging.getLogger("verl_ext")


class VerlExtTrainerMixin:
    """Shared verl-ext behaviour; combined with one of verl's v1 trainers below."""

    base_mode: str  # the verl trainer mode this class extends

    def __init__(self, config, *args, **kwargs):
        from verl_ext.old_logits import OldLogitsConfig, build_provider
        from verl_ext.rewards.dvreward.startup import probe_configured_judge as probe_dvreward_judge

        replacements.assert_targets_unchanged()
        validation.assert_valid(config, machine=True)
        probe_dvreward_judge(config)  # the judge answers (the keys and question sets were checked above)
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.base_mode
        self.verl_ext_config = config.trainer.v1.get("verl_ext", {}) or {}
        self.old_logits_config = OldLogitsConfig.from_config(
            config.algorithm.get("old_logits", None), config.trainer.v1.sampler.get("max_off_policy_threshold"),
            self.base_mode,
        )
        self.old_logit_provider = build_provider(self.old_logits_config)
        self._old_logit_needs = self.old_logit_provider.requirements()
        self._old_logit_host = None  # built on first use, once the worker groups exist
        self._worker_hook_reports: dict[str, float] = {}  # the workers' verl_ext/* of this step
        self._restored_rollout_side = None  # the rollout side's state from the checkpoint resumed from
        self._step_has_signal = False  # whether a local update of this step had a non-zero advantage
        if self.old_logit_provider.bypass_loss:
            _switch_to_bypass_loss(config, self.old_logit_provider.name)
        _count_agent_loop_failures(config)
        super().__init__(config, *args, **kwargs)

    def fit(self, agent_loop_manager):
        try:
            return super().fit(agent_loop_manager)
        finally:
            self._stop_dataloader_workers()

    def _stop_dataloader_workers(self) -> None:
        """verl's ``fit`` returns with the training iterator, and its prefetching worker processes,
        still alive; when the driver exits, Ray SIGKILLs them and torch's SIGCHLD handler in the
        TaskRunner prints ``RuntimeError: DataLoader worker (pid N) is killed by signal: Killed``.
        Joining them here ends a good run without that traceback."""
        iterator, self.train_dataloader_it = self.train_dataloader_it, None
        if hasattr(iterator, "_shutdown_workers"):  # only the multi-process iterator has workers
            iterator._shutdown_workers()

    # ------------------------------------------------------------------ old-logit providers
    def _host(self):
        from verl_ext.old_logits.trainer_side import VerlOldLogitHost

        if self._old_logit_host is None:
            self._old_logit_host = VerlOldLogitHost(
                self, self.old_logits_config, self.old_logit_provider,
                verl_anchor=super()._compute_old_log_prob,
            )
            if self._old_logit_needs.worker_state:
                # first called before fit (a resume's _load_checkpoint, else on_init_end), where the
                # workers' weights hold version global_steps: the checkpoint's, or 0
                with timed("worker_state_setup"):
                    self._old_logit_host.start_worker_state(self.global_steps)
        return self._old_logit_host

    def rollout_server_handles(self) -> list:
        """Every rollout server this trainer generates with (the exact providers' rollout side
        waits on their served-segment counts)."""
        return list(self.llm_server_manager.server_handles)

    def _weight_sync_managers(self) -> list:
        """verl's checkpoint managers that sync weights to rollout replicas."""
        return [self.checkpoint_manager]

    def _setup(self):
        from verl_ext.old_logits.rollout_side import counting_rollout_replicas

        # a rollout side on vLLM: verl's vLLM servers that count the segments they serve
        with counting_rollout_replicas(str(self.config.actor_rollout_ref.rollout.name),
                                       self.old_logit_provider.rollout_side is not None):
            super()._setup()

    def on_init_end(self):
        host = self._host()  # before fit: the workers' weights hold version global_steps
        if self.old_logit_provider.rollout_side is not None:  # before the first weight sync
            host.start_rollout_side(self._restored_rollout_side)
            for manager in self._weight_sync_managers():
                _after_each_weight_sync(manager, host.rollout_side.after_weight_sync)
        super().on_init_end()

    def _llm_client_kwargs(self) -> dict:
        return self._old_logit_host.llm_client_kwargs() if self._old_logit_host is not None else {}

    def _compute_old_log_prob(self, batch, metrics):
        host = self._host()
        with timed("old_logits"):
            host.start_step()
            host.expect_base_forward()
            batch = self.old_logit_provider.compute(host, batch, metrics)  # verl's own metrics too (actor/entropy)
            # rows through old-log-prob forwards over the batch's rows: 1.0 is verl's one pass
            metrics["old_logits/forward_passes"] = host.forwarded_rows / max(1, len(batch))
            metrics.update(host.rollout_vs_old_metrics(batch))
        if not self.old_logits_config.stale_tokens:
            # verl's sync trainer: every token is fresh and its old logits exact; no old_logits/* to report
            for key in [k for k in metrics if k.startswith("old_logits/")]:
                del metrics[key]
            return batch
        # per-token staleness and what the rollout correction removes from fresh vs stale tokens
        with timed("version_bookkeeping"):
            metrics.update(host.correction_metrics(batch))
        return batch

    def _update_actor(self, batch, metrics):
        faults.crash_point("update", self.global_steps)
        if not self._old_logit_needs.worker_state:
            return super()._update_actor(batch, metrics)
        from verl_ext.old_logits.worker_side import publish_worker_version, set_worker_version

        host = self._host()
        with timed("version_bookkeeping"):
            host.on_workers(set_worker_version, self.global_steps - 1)
        batch = super()._update_actor(batch, metrics)
        if self.local_trigger_step == self.parameter_sync_step - 1:  # the window's last local update
            with timed("version_bookkeeping"):
                reports = host.on_workers(publish_worker_version, self.global_steps)
            accumulate(self._worker_hook_reports, reports)
        return batch

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        hooks = hook_timer().collect()
        accumulate(hooks, [self._worker_hook_reports])
        self._worker_hook_reports = {}
        metrics.update(step_metrics(hooks, timing_raw.get("step")))

    def _old_logits_checkpoint_folder(self) -> str:
        from verl_ext.old_logits.trainer_side import CHECKPOINT_DIR

        return os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}", CHECKPOINT_DIR)

    def _save_checkpoint(self):
        """verl-ext's state first, then verl's checkpoint: verl marks a checkpoint complete last
        (``latest_checkpointed_iteration.txt``), so a complete checkpoint always holds complete
        verl-ext state and a save cut short anywhere resumes from the one before
        (``verl_ext.checkpoint_files``; the kill tests stop the trainer at ``verl_ext.faults``)."""
        from verl_ext.checkpoint_files import save_file, write_manifest
        from verl_ext.old_logits.trainer_side import ROLLOUT_SIDE_FILE
        from verl_ext.old_logits.worker_side import save_worker_state

        rollout_side = self._old_logit_host.rollout_side if self._old_logit_host is not None else None
        if rollout_side is not None:
            rollout_side.before_checkpoint()
        folder = self._old_logits_checkpoint_folder()
        records = []
        with timed("worker_state_checkpoint"):
            if self._old_logit_needs.worker_state:
                records += self._host().on_workers(save_worker_state, folder)
            faults.crash_point("verl_ext_checkpoint", self.global_steps)
            state = rollout_side.state_dict() if rollout_side is not None else None
            if state is not None:  # e.g. interrupt's segment store: restored rows name its segments
                records.append(save_file(state, os.path.join(folder, ROLLOUT_SIDE_FILE)))
            if records:
                write_manifest(folder, self.global_steps, records)
        if not faults.armed("verl_checkpoint"):
            return super()._save_checkpoint()
        save_actor = self.actor_rollout_wg.save_checkpoint

        def save_actor_then_crash(*args, **kwargs):
            result = save_actor(*args, **kwargs)
            faults.crash_point("verl_checkpoint", self.global_steps)
            return result

        with _replace_attr(self.actor_rollout_wg, "save_checkpoint", save_actor_then_crash):
            return super()._save_checkpoint()

    def _load_checkpoint(self):
        from verl_ext.checkpoint_files import load_file, read_manifest
        from verl_ext.old_logits.trainer_side import ROLLOUT_SIDE_FILE
        from verl_ext.old_logits.worker_side import load_worker_state

        super()._load_checkpoint()
        if self.global_steps == 0:
            return
        folder = self._old_logits_checkpoint_folder()
        manifest = read_manifest(folder, self.global_steps)  # refuses a torn or mismatched folder
        restored = []
        if self._old_logit_needs.worker_state:
            with timed("worker_state_checkpoint"):
                found = self._host().on_workers(load_worker_state, folder, self.global_steps, manifest)
            restored += [f"rank_{rank}.pt {sha[:12]}" for rank, sha in enumerate(found) if sha is not None]
            if not all(found):
                logger.warning("verl-ext: resumed without old-logit state in %s (policy: %s)", folder,
                               self.old_logits_config.ewma.on_missing_state)
        # dedicated's scores travel with the rows; interrupt's segment store comes back here
        if manifest is not None and ROLLOUT_SIDE_FILE in manifest["files"]:
            # handed to the rollout side when on_init_end starts it
            self._restored_rollout_side, sha = load_file(folder, ROLLOUT_SIDE_FILE, manifest)
            restored.append(f"{ROLLOUT_SIDE_FILE} {sha[:12]}")
        elif self.old_logit_provider.rollout_side is not None:
            logger.warning(
                "verl-ext: resumed without %s: rows generated before the checkpoint may name segments this run "
                "never scored; their stale tokens meet algorithm.old_logits.%s.on_missing",
                os.path.join(folder, ROLLOUT_SIDE_FILE), self.old_logit_provider.name,
            )
        if restored:  # what the kill tests compare with the manifest, bit for bit
            print(f"verl-ext: restored the state of global_step_{self.global_steps}, verified against its "
                  f"manifest: {', '.join(restored)}", flush=True)

    def _compute_advantage(self, batch, metrics):
        from verl_ext.advantages import ESTIMATORS, validity
        from verl_ext.rewards import postprocess
        from verl_ext.rewards.dvreward.metrics import training_metrics as dvreward_metrics

        algorithm = self.config.algorithm
        step_aware = algorithm.adv_estimator in ESTIMATORS
        validity_key = validity.flag_key(self.config.reward)  # a reward manager that flags faults
        with timed("step_metadata"):  # every row's extra_fields, and the episode / judge metrics from them
            rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
            # `pop` gives the NonTensorStack (as verl's _validate reads it); `rows["extra_fields"]` is a plain list
            extra_fields = rows.pop("extra_fields").tolist()
            real_rows = [f for f, tag in zip(extra_fields, batch.tags) if not tag.get("is_padding")]
            metrics.update(training_batch_metrics(real_rows))
            metrics.update(dvreward_metrics(real_rows))
        dump_dir = self.verl_ext_config.get("dump_advantages_dir")
        dump = os.path.join(dump_dir, f"step_{self.global_steps}.pt") if dump_dir else None
        estimate = (step_aware_estimator(extra_fields, dump) if step_aware
                    else trainer_base.compute_advantage_for_multi_trajectories)

        def compute(data, *args, **kwargs):
            # group-level reward post-processors first: every estimator sees their rewards
            with timed("reward_postprocess"):
                metrics.update(postprocess.apply(data, extra_fields, algorithm, validity_key))
                invalid = exclude_invalid_rewards(data, extra_fields, validity_key, step_aware, metrics, self.config)
                if not step_aware:  # verl's estimators group by uid: a group of equal rewards has no signal
                    metrics.update(uniform_reward_groups(data))
            with timed("advantages" if step_aware else None):  # verl's own estimators are verl's time
                advantages = estimate(data, *args, **kwargs)
            with timed("reward_postprocess"):
                data = validity.zero_out(advantages, invalid)
            with timed("signal_check"):
                self._check_signal(data, invalid, metrics)
            return data

        # verl's _compute_advantage does KL-in-reward, rollout correction and the write-back to
        # TransferQueue around one call to `compute_advantage_for_multi_trajectories`; swap in
        # reward post-processing + the (step-aware) estimator for that one call instead of
        # copying the method.
        with _replace_attr(trainer_base, "compute_advantage_for_multi_trajectories", compute):
            return super()._compute_advantage(batch, metrics)

    def _check_signal(self, data, invalid, metrics: dict) -> None:
        """Log what carries signal in the batch's advantages and stop a step where nothing does
        (``verl_ext.advantages.signal``), for verl's estimators and verl-ext's alike. A step of
        ``separate_async`` is ``parameter_sync_step`` local updates, each with its own advantages:
        the step stops only if none of them carried signal."""
        from verl_ext.advantages import signal

        uids = [str(u) for u in data.non_tensor_batch["uid"]]
        report = signal.measure(data.batch["advantages"], data.batch["response_mask"], uids,
                                signal.trainable_rows(uids, invalid))
        metrics.update(report.metrics())
        if self.local_trigger_step == 0:
            self._step_has_signal = False
        self._step_has_signal = self._step_has_signal or report.has_signal or not report.rows
        last_update = self.local_trigger_step == self.parameter_sync_step - 1
        if last_update and not self._step_has_signal and self.verl_ext_config.get("stop_on_zero_signal", True):
            raise signal.NoSignalError(report.cause(str(self.config.algorithm.adv_estimator), self.parameter_sync_step))

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        poll_interval = self.verl_ext_config.get("replay_poll_interval")
        if poll_interval is not None:
            buffer.poll_interval = float(poll_interval)
        from verl_ext.agent_loops.failures import sample_checking_failures

        # this buffer only (listed in patches/README.md)
        buffer.sample = sample_checking_failures(buffer.sample, self._check_agent_loop_failures)
        return buffer

    def _check_agent_loop_failures(self, partition_id: str) -> None:
        """Stop with the first error when most agent-loop runs since the last batch failed
        (``verl_ext.agent_loops.failures``), before verl trains on, or fails on, what is left."""
        from verl_ext.agent_loops.failures import check_failure_rate

        manager = getattr(self, "agent_loop_manager", None)
        if hasattr(manager, "pop_run_counts"):  # a user's own manager class counts nothing
            with timed("failure_check"):
                check_failure_rate(manager.pop_run_counts(), partition_id)


def _after_each_weight_sync(checkpoint_manager, hook) -> None:
    """Runs ``hook(global_steps)`` right after each of verl's weight syncs to the rollout replicas
    (an instance attribute of this trainer's checkpoint manager; listed in patches/README.md):
    the ``dedicated`` scorer gets the same version in the same sync, before generation resumes.
    verl calls ``update_weights`` synchronously (``auto_await``); a call without a version
    (``_validate`` re-sending the current weights) changes nothing the hook needs."""
    update_weights = checkpoint_manager.update_weights

    def update_weights_then_hook(global_steps=None):
        result = update_weights(global_steps)
        if global_steps is not None:
            hook(global_steps)
        return result

    checkpoint_manager.update_weights = update_weights_then_hook


def _switch_to_bypass_loss(config, provider: str) -> None:
    """A provider whose π_old is μ (``OldLogitProvider.bypass_loss``). verl v1's bypass mode only
    copies the log-probs and leaves the loss unchanged; switch the loss to verl's ``bypass_mode`` too
    (before the workers build their actor config from this config)."""
    with open_dict(config):
        correction = config.algorithm.rollout_correction
        correction.bypass_mode = True
        policy_loss = config.actor_rollout_ref.actor.policy_loss
        if policy_loss.loss_mode != "bypass_mode":
            logger.warning("verl-ext: old_logits.provider=%s: policy_loss.loss_mode %s -> bypass_mode", provider,
                           policy_loss.loss_mode)
            policy_loss.loss_mode = "bypass_mode"
        policy_loss.rollout_correction = correction


def _count_agent_loop_failures(config) -> None:
    """Select verl-ext's agent-loop manager (verl's TransferQueue manager whose workers count
    failed runs) unless the config names its own."""
    from verl_ext.agent_loops.failures import MANAGER_CLASS

    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        if not agent.get("agent_loop_manager_class"):
            agent.agent_loop_manager_class = MANAGER_CLASS


@contextlib.contextmanager
def _replace_attr(owner, name: str, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


@register_trainer("verl_ext_sync")
class VerlExtTrainerSync(VerlExtTrainerMixin, PPOTrainerSync):
    """verl's synchronous trainer (colocated rollout, no partial rollouts) with verl-ext hooks."""

    base_mode = "sync"

    def get_llm_client(self):
        return self.llm_server_manager.get_client(client_cls=VersionedLLMServerClient, **self._llm_client_kwargs())


@register_trainer("verl_ext_colocate_async")
class VerlExtTrainerColocateAsync(VerlExtTrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer (abort/resume partial rollouts) with verl-ext hooks."""

    base_mode = "colocate_async"

    def get_llm_client(self):
        return self.llm_server_manager.get_client(
            client_cls=VersionedFullyAsyncLLMServerClient, **self._llm_client_kwargs()
        )


@register_trainer("verl_ext_separate_async")
class VerlExtTrainerSeparateAsync(VerlExtTrainerMixin, PPOTrainerSeparateAsync):
    """verl's asynchronous trainer with separate pools (rollout on its own GPUs never pauses,
    partial rollouts resume across weight versions, idle trainer GPUs lent to rollout through
    ``trainer.v1.separate_async.hybrid_rollout``) with verl-ext hooks. Its weights reach the
    standalone pool through a checkpoint engine (``actor_rollout_ref.rollout.checkpoint_engine``;
    ``host_memory`` on the cpu backend or where both pools share one device)."""

    base_mode = "separate_async"

    def get_llm_client(self):
        return self.standalone_server_manager.get_client(
            client_cls=VersionedFullyAsyncLLMServerClient, **self._llm_client_kwargs()
        )

    def rollout_server_handles(self) -> list:
        return super().rollout_server_handles() + list(self.standalone_server_manager.server_handles)

    def _weight_sync_managers(self) -> list:
        return [self.standalone_checkpoint_manager, *super()._weight_sync_managers()]
