"""Every name of verl (or torch) that verl-ext replaces or overrides, in one inventory.

Most of verl-ext goes through verl's registries; what does not is listed here: the runtime patches
(``verl_ext.patches``, each guarded by the verl source line it exists because of), the instance
attributes and module functions the verl-ext trainers swap, and the private methods of verl's v1
trainers that the verl-ext trainers override. Each entry names the target, what verl-ext does to it,
the verl-ext code, why, the upstream change that would remove it and the test that fails when it
stops working. Its guard is the target's parameters: ``problems`` names every target whose
signature is no longer what the replacement calls or is called with (the patches: whose source no
longer holds their line). ``verl-ext doctor`` prints the inventory; the verl-ext trainers refuse to
start on another verl version when a guard fails; ``tests/test_replacements_on_cpu.py`` checks every
guard against the installed verl. The why and the removal of each patch: ``patches/README.md``.

Importing this module imports nothing heavy; ``problems`` imports the targets.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from verl_ext import VERL_VERSION

TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
SEPARATE_ASYNC = "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync"


@dataclass(frozen=True)
class Replacement:
    """One verl name verl-ext replaces or overrides.

    Attributes:
        target: ``module:qualified.name`` in verl (or torch).
        how: what verl-ext does to it (a patch, a scoped swap, an instance attribute, an override).
        where: the verl-ext code that does it.
        why: what verl lacks that makes it necessary.
        upstream: the verl change that would remove it.
        test: the test that fails when verl stops using the name or the replacement stops working.
        parameters: the target's parameter names the replacement relies on (its guard).
        patch: the ``verl_ext.patches`` name of a patch, whose guard is the verl source line it exists
            because of (``Patch.snippet``) instead.
    """

    target: str
    how: str
    where: str
    why: str
    upstream: str
    test: str
    parameters: tuple[str, ...] | None = None
    patch: str | None = None


def _override(method: str, parameters: tuple[str, ...], why: str, owner: str = TRAINER_BASE) -> Replacement:
    return Replacement(f"{owner}.{method}", "overridden by the verl-ext trainers (calls verl's)",
                       f"verl_ext/trainer.py (VerlExtTrainerMixin.{method})", why,
                       "a trainer hook at that point", "tests/e2e (every verl-ext trainer run)", ("self", *parameters))


def _patches() -> tuple[Replacement, ...]:
    from verl_ext import patches

    scopes = {"the cpu backend": patches.PATCHES, "every backend": (*patches.ENGINE_PATCHES, *patches.TRAINER_PATCHES),
              "wherever vLLM runs": patches.VLLM_PATCHES}
    return tuple(
        Replacement(p.replaces, f"patch `{p.name}` ({scope}, verl {VERL_VERSION} only)", "verl_ext/patches/__init__.py",
                    f"[its page](../../patches/{p.name.removesuffix('_server').removesuffix('_adapter')}.md)",
                    "its page", "tests/backends/test_patches_on_cpu.py (the patched line exists; the patch takes effect)",
                    patch=p.name)
        for scope, group in scopes.items() for p in group)


OTHERS: tuple[Replacement, ...] = (
    Replacement(
        "verl.trainer.ppo.v1.trainer_base:compute_advantage_for_multi_trajectories",
        "swapped for the duration of each _compute_advantage call, then restored",
        "verl_ext/trainer.py (VerlExtTrainerMixin._compute_advantage)",
        "its arguments carry no step metadata: reward post-processors, invalid-row exclusion and the "
        "step-aware estimators run in its place without copying verl's method",
        "an advantage hook that receives the batch's extra_fields",
        "tests/backends/test_patches_on_cpu.py::test_advantage_hook_runs_the_step_aware_estimator_inside_verls_compute_advantage",
        ("data", "batch_keys", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")),
    Replacement(
        "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.sample",
        "wrapped as an instance attribute of the buffer each verl-ext trainer builds",
        "verl_ext/trainer.py (_build_replay_buffer) + verl_ext/agent_loops/failures.py",
        "the agent-loop failure rate is checked between verl's sampling and its use of the batch",
        "a post-sample hook, or failed runs' errors carried by the replay buffer",
        "tests/e2e/test_agent_loop_failures_e2e.py::test_a_run_whose_agent_loops_all_fail_stops_with_the_first_error",
        ("self", "global_steps", "partition_id", "batch_size")),
    Replacement(
        "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync.sample",
        "wrapped as an instance attribute of the buffer each verl-ext trainer builds",
        "verl_ext/trainer.py (_build_replay_buffer) + verl_ext/agent_loops/failures.py",
        "as ReplayBuffer.sample, for the async trainers' buffer",
        "a post-sample hook, or failed runs' errors carried by the replay buffer",
        "tests/e2e/test_separate_async_e2e.py (every run samples through the wrapper)",
        ("self", "global_steps", "partition_id", "batch_size")),
    Replacement(
        "verl.checkpoint_engine.base:CheckpointEngineManager.update_weights",
        "wrapped as an instance attribute of the verl-ext trainers' checkpoint managers (rollout-side providers)",
        "verl_ext/trainer.py (_after_each_weight_sync)",
        "the dedicated scorer must hold each version before generation resumes; no after-sync callback",
        "an after-weight-sync hook on CheckpointEngineManager",
        "tests/backends/test_patches_on_cpu.py::test_dedicated_scorer_gets_each_version_in_verls_weight_sync_before_generation_resumes",
        ("self", "global_steps")),
    Replacement(
        "verl.workers.engine.base:BaseEngine.optimizer_step",
        "wrapped as an instance attribute of each actor engine (providers with worker state)",
        "verl_ext/old_logits/worker_side.py (install_worker_state)",
        "the EWMA update and the snapshot copy happen at every optimizer step; no optimizer-step callback",
        "a post-optimizer-step hook on BaseEngine",
        "tests/old_logits (test_old_logit_state_wraps_the_optimizer_step_verls_train_batch_calls)",
        ("self",)),
    Replacement(
        "verl.utils.config:validate_config",
        "wrapped by a post-import hook (verl-ext's start-up checks first, then verl's)",
        "verl_ext/plugin.py + verl_ext/validation.py (wrap_verl_validate_config)",
        "the one place verl-ext sees the config in the driver under verl's own trainer modes",
        "a config-validation hook in main_ppo",
        "tests/test_validation_on_cpu.py::test_case1_main_ppo_refuses_it_in_the_driver_before_ray",
        ("config", "use_reference_policy", "use_critic")),
    Replacement(
        "verl.workers.engine_workers:ppo_loss",
        "rebound by a post-import hook to a wrapper that calls verl's (with opsm_delta set, the rows' rollout "
        "log-probs held for the loss function's call)",
        "verl_ext/losses/behaviour.py (wrap_ppo_loss, installed by verl_ext/plugin.py)",
        "verl's ppo_loss passes the loss function old_log_probs, advantages, response_mask and rollout_is_weights "
        "only: off-policy sequence masking thresholds against the behaviour log-probs, which never reach it",
        "rollout_log_probs passed to the PolicyLossFn",
        "tests/losses/test_opsm_on_cpu.py::test_verls_ppo_loss_hands_the_rows_rollout_log_probs_to_the_opsm_loss",
        ("config", "model_output", "data", "dp_group")),
    Replacement(
        "verl.workers.rollout.replica:RolloutReplicaRegistry.register",
        "called to register verl-ext's counting vLLM replica as 'vllm' while the trainer builds (rollout-side "
        "providers), then verl's loader again",
        "verl_ext/old_logits/rollout_side.py (counting_rollout_replicas)",
        "each server counts the segments it served per version before a result leaves it",
        "a served-request counter on verl's rollout servers",
        "tests/backends/test_patches_on_cpu.py::test_rollout_side_providers_get_verls_vllm_replica_with_counting_servers_while_the_trainer_builds",
        ("name", "loader")),
)

# the private methods of verl's v1 trainers the verl-ext trainers override (each calls verl's)
OVERRIDES: tuple[Replacement, ...] = (
    _override("_setup", (), "the old-logit host and the rollout side are built next to verl's workers"),
    _override("_setup", (), "as PPOTrainer._setup, for the separate_async trainer's own", SEPARATE_ASYNC),
    _override("_compute_old_log_prob", ("batch", "metrics"), "the old-logit provider supplies the old log-probs"),
    _override("_compute_old_log_prob", ("batch", "metrics"), "as PPOTrainer._compute_old_log_prob, for verl's window "
              "anchor", SEPARATE_ASYNC),
    _override("_update_actor", ("batch", "metrics"), "the provider's version bookkeeping around each update"),
    _override("_compute_metrics", ("batch", "metrics", "timing_raw", "global_steps", "epoch"),
              "verl-ext's per-step metrics and hook times join verl's"),
    _override("_save_checkpoint", (), "verl-ext's state is written, atomically, before verl marks a checkpoint complete"),
    _override("_load_checkpoint", (), "verl-ext's state is restored and checked against its manifest"),
    _override("_compute_advantage", ("batch", "metrics"), "the scoped swap of compute_advantage_for_multi_trajectories"),
    _override("_build_replay_buffer", (), "the sample wrapper and the cpu backend's poll interval"),
)


def inventory() -> tuple[Replacement, ...]:
    """Every replacement: the patches, the swaps and wrappers, the overridden trainer methods."""
    return (*_patches(), *OTHERS, *OVERRIDES)


def resolve(target: str) -> object:
    """The object ``module:qualified.name`` names (verl's own where verl-ext rebound it)."""
    module, _, qualified = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in qualified.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__wrapped__", obj)


def problem(replacement: Replacement) -> str | None:
    """Why ``replacement``'s guard fails against the installed verl (None: it holds)."""
    if replacement.patch is not None:  # the verl source line it exists because of
        from verl_ext import patches

        patch = next(p for p in patches.ALL if p.name == replacement.patch)
        try:
            return None if patch.snippet_in_module_file() else f"{replacement.target}: the line {patch.name} patches is gone"
        except OSError as exc:
            return f"{replacement.target}: {exc}"
    try:
        found = tuple(inspect.signature(resolve(replacement.target)).parameters)
    except (ImportError, AttributeError) as exc:
        return f"{replacement.target}: not found ({exc!r})"
    if found != replacement.parameters:
        return f"{replacement.target}: parameters {found}, verl-ext relies on {replacement.parameters}"
    return None


def problems(replacements: tuple[Replacement, ...] | None = None) -> list[str]:
    """The replacements (default: all) whose guard fails against the installed verl."""
    return [p for p in map(problem, inventory() if replacements is None else replacements) if p is not None]


class VerlChangedError(RuntimeError):
    """The installed verl is not the one verl-ext is built for, and a name verl-ext replaces changed."""


def assert_targets_unchanged() -> None:
    """The verl-ext trainers' start-up guard. On the verl verl-ext is built for, the tests check every
    guard; on another, a swap or override whose target changed would fail somewhere inside a step,
    so the trainer refuses to start naming each one. (A patch is skipped with a warning instead.)"""
    import importlib.metadata

    from verl_ext import __version__

    found = importlib.metadata.version("verl")
    if found == VERL_VERSION:
        return
    changed = problems((*OTHERS, *OVERRIDES))
    if changed:
        raise VerlChangedError(f"verl-ext {__version__} is built for verl {VERL_VERSION}, found verl {found}, where "
                               "these names verl-ext replaces changed (verl_ext/replacements.py):\n  " + "\n  ".join(changed))


# ------------------------------------------------------------------------------------ the docs

SECTION_HEADING = "## Runtime patches and replacements"


def render_section() -> str:
    """The "Runtime patches and replacements" section of docs/explanation/architecture.md."""
    rows = ["| replaced name | how | verl-ext code | why | removed upstream by | test |", "|---|---|---|---|---|---|"]
    for r in inventory():
        cells = (f"`{r.target}`", r.how, f"`{r.where}`", r.why, r.upstream, f"`{r.test}`")
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return (
        f"{SECTION_HEADING}\n\n"
        "Every name of verl (or torch) that verl-ext replaces or overrides, generated from the inventory in\n"
        "`verl_ext/replacements.py` (`python -m verl_ext.replacements --write`). Each has a guard: the\n"
        "target's parameters, or for a patch the verl line it exists because of; `verl-ext doctor` prints\n"
        "whether each holds, and on another verl version the verl-ext trainers refuse to start where a swap or\n"
        "override's target changed. `patches/README.md` has each patch's page.\n\n"
        + "\n".join(rows) + "\n\n"
        "Registry writes without a register function (additions, not replacements):\n"
        "`verl.workers.rollout.base._ROLLOUT_REGISTRY[(\"hf\", \"async\")]` (`verl_ext/backends/hf/registration.py`).\n"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from verl_ext.doc_sections import DOCS, write_section

    parser = argparse.ArgumentParser(prog="python -m verl_ext.replacements", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the section in docs/explanation/architecture.md")
    if parser.parse_args(argv).write:
        write_section(DOCS / "explanation" / "architecture.md", SECTION_HEADING, render_section())
    else:
        sys.stdout.write(render_section())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

