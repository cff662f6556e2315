"""The old-logit providers' preconditions: what each needs of the config for its old log-probs to
carry a learning signal, run at start-up by ``verl_ext.validation`` and rendered into
docs/reference/validation.md (``verl_ext.preconditions``). A provider added elsewhere adds its
entries to ``PRECONDITIONS`` here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl_ext.gpu_checks import select
from verl_ext.old_logits.config import STALENESS_KEY, TRAINER_MODES, OldLogitsConfig
from verl_ext.old_logits.providers import OldLogitProvider, build_provider
from verl_ext.preconditions import Precondition, verl_ext_trainer
from verl_ext.trainer_modes import TRAINER_MODE_KEY, base_trainer_mode

PROVIDER_KEY = "algorithm.old_logits.provider"
KIND = "old_logit_provider"
ROLLOUT_NAME_KEY = "actor_rollout_ref.rollout.name"
DISAGGREGATION_KEY = "actor_rollout_ref.rollout.disaggregation.enabled"
SEGMENT_COUNTING_ROLLOUTS = ("hf", "vllm")


def configured_provider(config: Any) -> OldLogitProvider | None:
    """The provider ``algorithm.old_logits`` configures, built as the trainer builds it; None without
    that section or under a trainer mode verl-ext does not know (verl's to refuse).

    Raises:
        ValueError, TypeError: the section does not parse or names no registered provider.
    """
    section = select(config, "algorithm.old_logits")
    mode = base_trainer_mode(config)
    if section is None or mode not in TRAINER_MODES:
        return None
    return build_provider(OldLogitsConfig.from_config(section, select(config, STALENESS_KEY), mode))


def _provider_check(problems: Callable[[OldLogitProvider, Any], list[str]]) -> Callable[[Any], list[str]]:
    """A check of the configured provider; a section that does not parse is ``old_logits_settings``'s
    to name."""

    def check(config: Any) -> list[str]:
        try:
            provider = configured_provider(config)
        except (TypeError, ValueError):
            return []
        return [] if provider is None else problems(provider, config)

    return check


def _staleness_bound(name: str, settings: str, resolve: Callable[[OldLogitProvider], object]) -> Precondition:
    def problems(provider: OldLogitProvider, config: Any) -> list[str]:
        try:
            resolve(provider)
        except ValueError as exc:
            return [str(exc)]
        return []

    return Precondition(KIND, name, f"a staleness bound (`{STALENESS_KEY}`) or explicit {settings}: they default to "
                        "the bound, and without one the provider cannot size its state",
                        (STALENESS_KEY, *(f"algorithm.old_logits.{s}" for s in settings.split(" / "))),
                        _provider_check(problems))


def _stale_tokens(name: str, cost: str) -> Precondition:
    """Refused under a synchronous trainer: the provider's cost buys the old log-probs of ``current``."""

    def problems(provider: OldLogitProvider, config: Any) -> list[str]:
        if provider.config.stale_tokens:
            return []
        mode = select(config, TRAINER_MODE_KEY, "sync")
        return [f"{PROVIDER_KEY}={name} with {TRAINER_MODE_KEY}={mode}: a synchronous trainer samples every token with "
                f"the current weights, so there is nothing stale to score, while {name} {cost} for the same old "
                f"log-probs as `current`: use {PROVIDER_KEY}=current, or {TRAINER_MODE_KEY}=verl_ext_colocate_async "
                "(or verl_ext_separate_async) for stale tokens"]

    return Precondition(KIND, name, f"stale tokens, i.e. an async trainer mode: under a sync mode it {cost} for the "
                        "old log-probs `current` computes", (PROVIDER_KEY, TRAINER_MODE_KEY), _provider_check(problems))


def _stale_tokens_to_differ(name: str, baseline: str, under_sync: str) -> Precondition:
    """Stated, not refused: under a sync mode the provider costs little and gives ``baseline``'s old log-probs."""
    return Precondition(KIND, name, f"stale tokens, i.e. an async trainer mode, to differ from `{baseline}`: under a "
                        f"sync mode {under_sync}", (PROVIDER_KEY, TRAINER_MODE_KEY),
                        not_at_start_up=f"not refused, the old log-probs of `{baseline}` still carry a learning signal")


def _segment_counting_rollout(name: str) -> Precondition:
    def problems(provider: OldLogitProvider, config: Any) -> list[str]:
        found = []
        engine = str(select(config, ROLLOUT_NAME_KEY, ""))
        if engine not in SEGMENT_COUNTING_ROLLOUTS:
            supported = " or ".join(f"{ROLLOUT_NAME_KEY}={e}" for e in SEGMENT_COUNTING_ROLLOUTS)
            found.append(
                f"{PROVIDER_KEY}={name} is supported with {supported}, not {ROLLOUT_NAME_KEY}={engine!r} (verl-ext has "
                f"no segment-counting server for that engine). Use {PROVIDER_KEY}=snapshot (exact, any rollout) or ewma")
        if select(config, DISAGGREGATION_KEY):
            found.append(
                f"{PROVIDER_KEY}={name} with {DISAGGREGATION_KEY}=true: verl's prefill/decode replicas have no "
                f"segment-counting server; turn disaggregation off or use {PROVIDER_KEY}=snapshot")
        return found

    return Precondition(KIND, name, f"a rollout engine whose servers count the segments they serve "
                        f"({' or '.join(SEGMENT_COUNTING_ROLLOUTS)}), without prefill/decode disaggregation: every "
                        "segment must be scored before its weights move", (ROLLOUT_NAME_KEY, DISAGGREGATION_KEY),
                        _provider_check(problems))


def _bf16_snapshot_problems(config: Any) -> list[str]:
    """``snapshot.dtype=bf16`` is exact only if the actor's forward casts its parameters to bfloat16:
    FSDP mixed precision with ``param_dtype`` bf16 (verl's default when unset); Megatron's
    parameters are the model's own (bf16 models stay as they are: only float32 is narrowed)."""
    strategy = str(select(config, "actor_rollout_ref.actor.strategy", "fsdp"))
    if strategy not in ("fsdp", "fsdp2"):
        return []
    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    param_dtype = str(select(config, key, None) or "bf16")
    if param_dtype in ("bf16", "bfloat16"):
        return []
    return [f"algorithm.old_logits.snapshot.dtype=bf16 stores the snapshots in bfloat16, exact only when the actor's "
            f"forward computes with bfloat16 parameters, but {key}={param_dtype}: set {key}=bf16, or "
            "algorithm.old_logits.snapshot.dtype=param (snapshots in the parameters' own dtype)"]


def _bf16_forward(provider: OldLogitProvider, config: Any) -> list[str]:
    return _bf16_snapshot_problems(config) if provider.config.snapshot.dtype == "bf16" else []


_IGNORED = "ignores it (old log-probs are recomputed with the current weights, no old_logits/* metric)"
PRECONDITIONS: tuple[Precondition, ...] = (
    Precondition(KIND, "current", "none beyond verl's: any trainer mode, verl's own included (it is verl's anchor); "
                 "under an async mode a stale token gets the current weights' log-prob, not its own version's",
                 (PROVIDER_KEY,), not_at_start_up="nothing to refuse"),
    *(verl_ext_trainer(KIND, name, _IGNORED)
      for name in ("rollout", "snapshot", "dedicated", "interrupt", "ewma", "loglinear")),
    Precondition(KIND, "rollout", "the loss runs in verl's bypass mode (π_prox = μ): the trainer sets "
                 "`actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode`, replacing any other loss (ppo_ewma "
                 "included), with a warning", (PROVIDER_KEY, "actor_rollout_ref.actor.policy_loss.loss_mode"),
                 not_at_start_up="not refused, the trainer switches the loss"),
    _staleness_bound("snapshot", "snapshot.max_versions", lambda p: p.requirements()),
    Precondition(KIND, "snapshot", "with `snapshot.dtype=bf16`, an actor forward in bfloat16 (FSDP "
                 "`mixed_precision.param_dtype=bf16`): otherwise the snapshots are not the weights the forward uses",
                 ("algorithm.old_logits.snapshot.dtype", "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"),
                 _provider_check(_bf16_forward)),
    _stale_tokens_to_differ("snapshot", "current", "it keeps no copies and scores every token with the current weights"),
    _segment_counting_rollout("dedicated"),
    _stale_tokens("dedicated", "runs a forward-only scorer that receives every weight version and scores every "
                  "segment"),
    _staleness_bound("interrupt", "interrupt.max_versions", lambda p: p.config.interrupt_max_versions()),
    _segment_counting_rollout("interrupt"),
    _stale_tokens("interrupt", "re-scores each turn's whole prefix at every weight sync (several times the tokens "
                  "the batch holds)"),
    _staleness_bound("ewma", "ewma.max_com / ewma.beta",
                     lambda p: p.config.ewma_max_com() if p.config.ewma.calibrated else p.config.ewma_beta()),
    _stale_tokens_to_differ("ewma", "current", "with `ewma.fresh_exact=true` (the default) every token is fresh and gets "
                               "the current weights' log-prob; `fresh_exact=false` gives the EWMA weights' (PPO-EWMA "
                               "of synchronous training)"),
    _stale_tokens_to_differ("loglinear", "rollout", "every token has staleness 0, so α = 0 and the proxy is μ "
                            "(after a forward it does not use)"),
)

