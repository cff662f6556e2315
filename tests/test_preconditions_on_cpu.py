"""Every precondition a plugin declares (``verl_ext.preconditions``): a config that violates it is
refused at start-up with its key, value and fix; only the selected plugins' preconditions run; every
registered estimator, loss and provider declares at least one; the docs section is the rendered one."""

from __future__ import annotations

import pytest

from verl_ext import registry, validation
from verl_ext.compose import compose
from verl_ext.advantages import ESTIMATORS
from verl_ext.doc_sections import section_of
from verl_ext.old_logits.providers import PROVIDER_REGISTRY
from verl_ext.preconditions import (
    DOCS_PAGE,
    SECTION_HEADING,
    Precondition,
    declared,
    precondition_problems,
    render_section,
)

from .messages import assert_names
from .test_validation_on_cpu import base, problems, single_turn_data  # noqa: F401 - fixtures and their helper

SYNC, ASYNC = "trainer.v1.trainer_mode=verl_ext_sync", "trainer.v1.trainer_mode=verl_ext_colocate_async"
N1 = "actor_rollout_ref.rollout.n=1"
GROUP_ESTIMATORS = ("grpo", "rloo", "gigpo", "hgpo", "step_grouped", "himac")
STEP_ESTIMATORS = tuple(ESTIMATORS)
NO_BOUND = "trainer.v1.sampler.max_off_policy_threshold=null"


def _estimator(name: str) -> str:
    return f"+plugins/advantage={name}" if name in ESTIMATORS else f"algorithm.adv_estimator={name}"


# (kind, plugin, words of its condition) -> (overrides that violate it, what the refusal names).
# "single_turn" stands for the arithmetic data, whose rows name no agent loop.
CASES: dict[tuple[str, str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {
    **{("estimator", name, "rollout.n"): ((_estimator(name), SYNC, N1),
                                          (N1, f"algorithm.adv_estimator={name}", "set actor_rollout_ref.rollout.n to 2"))
       for name in GROUP_ESTIMATORS},
    **{("estimator", name, "verl-ext trainer mode"): (
        (_estimator(name), "trainer.v1.trainer_mode=sync"),
        (f"algorithm.adv_estimator={name} needs a verl-ext trainer", "trainer.v1.trainer_mode=sync",
         "set trainer.v1.trainer_mode=verl_ext_sync")) for name in STEP_ESTIMATORS},
    **{("estimator", name, "per-step metadata"): (
        (_estimator(name), SYNC, "single_turn"),
        (f"algorithm.adv_estimator={name} needs per-step metadata", "'single_turn_agent'",
         "actor_rollout_ref.rollout.agent.default_agent_loop", "use a step-aware loop")) for name in STEP_ESTIMATORS},
    ("estimator", "step_grouped", "action_match"): (
        (_estimator("step_grouped"), SYNC),
        ("algorithm.adv_estimator=step_grouped", "'text_env'", "records no action_match", "StepMetadata.action_match")),
    **{("estimator", name, "role="): (
        (_estimator(name), SYNC), (f"algorithm.adv_estimator={name}", "'text_env'", "records no role",
                                   "StepMetadata.role")) for name in ("himac", "hiper")},
    ("estimator", "hiper", "critic"): ((_estimator("hiper"), SYNC),
                                       ("critic.enable=None", "algorithm.adv_estimator=hiper", "set critic.enable=true")),
    ("loss", "ppo_ewma", "rollout correction"): (
        ("+plugins/loss=ppo_ewma", ASYNC, "algorithm.rollout_correction.rollout_is=null"),
        ("algorithm.rollout_correction.rollout_is=None", "loss_mode=ppo_ewma",
         "trainer.v1.trainer_mode=verl_ext_colocate_async", "set algorithm.rollout_correction.rollout_is=token")),
    **{("loss", name, "rollout's log-probs"): (
        (f"+plugins/loss={name}", SYNC, "actor_rollout_ref.actor.policy_loss.opsm_delta=0.5",
         "actor_rollout_ref.rollout.calculate_log_probs=false"),
        ("actor_rollout_ref.rollout.calculate_log_probs=False", "actor_rollout_ref.actor.policy_loss.opsm_delta=0.5",
         f"loss_mode={name}", "set actor_rollout_ref.rollout.calculate_log_probs=true")) for name in ("opsm", "ppo_ewma")},
    **{("old_logit_provider", name, "verl-ext trainer mode"): (
        (f"+plugins/old_logits={name}", "trainer.v1.trainer_mode=colocate_async"),
        (f"algorithm.old_logits.provider={name} needs a verl-ext trainer", "trainer.v1.trainer_mode=colocate_async",
         "set trainer.v1.trainer_mode=verl_ext_colocate_async"))
       for name in ("rollout", "snapshot", "dedicated", "interrupt", "ewma", "loglinear")},
    **{("old_logit_provider", name, "staleness bound"): (
        (f"+plugins/old_logits={name}", ASYNC, NO_BOUND),
        ("trainer.v1.sampler.max_off_policy_threshold is null", f"set algorithm.old_logits.{setting} explicitly"))
       for name, setting in (("snapshot", "snapshot.max_versions"), ("interrupt", "interrupt.max_versions"),
                             ("ewma", "ewma.max_com"))},
    ("old_logit_provider", "snapshot", "bfloat16"): (
        ("+plugins/old_logits=snapshot", ASYNC, "algorithm.old_logits.snapshot.dtype=bf16"),
        ("actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
         "set actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16", "snapshot.dtype=param")),
    **{("old_logit_provider", name, "segments they serve"): (
        (f"+plugins/old_logits={name}", ASYNC, "actor_rollout_ref.rollout.name=sglang"),
        (f"algorithm.old_logits.provider={name}", "actor_rollout_ref.rollout.name='sglang'",
         "Use algorithm.old_logits.provider=snapshot")) for name in ("dedicated", "interrupt")},
    **{("old_logit_provider", name, "stale tokens, i.e. an async trainer mode:"): (
        (f"+plugins/old_logits={name}", SYNC),
        (f"algorithm.old_logits.provider={name} with trainer.v1.trainer_mode=verl_ext_sync",
         "use algorithm.old_logits.provider=current", "trainer.v1.trainer_mode=verl_ext_colocate_async"))
       for name in ("dedicated", "interrupt")},
}


def _target(case: tuple[str, str, str]) -> Precondition:
    kind, name, words = case
    found = [p for p in declared() if (p.kind, p.plugin) == (kind, name) and words in p.condition]
    assert len(found) == 1, f"{case}: {len(found)} preconditions match"
    return found[0]


@pytest.mark.parametrize("case", sorted(CASES), ids="-".join)
def test_a_config_that_violates_a_precondition_is_refused_naming_key_value_and_fix(case, base, single_turn_data):
    overrides, parts = CASES[case]
    args = [*base, *(a for o in overrides for a in (single_turn_data if o == "single_turn" else [o]))]
    config = compose(args, None, "ppo_trainer")
    own = _target(case).check(config)
    assert own, f"{case}: the precondition finds nothing wrong with {overrides}"
    assert_names(own[0], *parts)
    assert own[0] in validation.problems(config)  # refused at start-up


def test_every_checked_precondition_has_a_violating_case():
    cases = {id(_target(case)) for case in CASES}
    unchecked = [(p.kind, p.plugin, p.condition) for p in declared() if p.check is not None and id(p) not in cases]
    assert not unchecked, unchecked


def test_the_base_config_with_a_group_estimator_passes(base):
    assert problems(*base, SYNC, "+plugins/advantage=gigpo") == []


def test_only_the_selected_plugins_preconditions_run(base):
    """rollout.n=1 breaks the group estimators, not verl's default gae."""
    config = compose([*base, SYNC, N1], None, "ppo_trainer")
    assert config.algorithm.adv_estimator == "gae"
    assert precondition_problems(config) == []


def test_every_registered_estimator_loss_and_provider_declares_a_precondition():
    registered = {("estimator", name) for name in ESTIMATORS} | {
        ("old_logit_provider", name) for name in PROVIDER_REGISTRY} | {
        ("loss", spec.name) for spec in registry.PLUGINS if spec.kind == "policy_loss"}
    declaring = {(p.kind, p.plugin) for p in declared()}
    assert registered <= declaring, sorted(registered - declaring)


def test_a_precondition_is_checked_or_says_where_instead():
    with pytest.raises(ValueError, match="say where it is checked instead"):
        Precondition("loss", "x", "a condition", ("k",))


def test_the_docs_section_is_the_rendered_declarations():
    assert section_of(DOCS_PAGE.read_text(), SECTION_HEADING) == render_section(), "run: python -m verl_ext.preconditions --write"


@pytest.mark.parametrize("extra", [
    ("+plugins/loss=opsm", "+plugins/old_logits=ewma", ASYNC),
    ("+plugins/loss=opsm", SYNC, "actor_rollout_ref.actor.policy_loss.opsm_base_loss=gspo"),
    ("+plugins/loss=ppo_ewma", "+plugins/old_logits=snapshot", ASYNC, "actor_rollout_ref.actor.policy_loss.opsm_delta=0.5",
     "actor_rollout_ref.rollout.calculate_log_probs=true"),
], ids=["opsm-ewma", "opsm-gspo", "ppo_ewma-snapshot"])
def test_opsm_passes_the_start_up_checks_with_an_old_logit_provider_and_with_ppo_ewma(base, extra):
    assert problems(*base, *extra) == []


@pytest.fixture(scope="module")
def text_hybrid_data(tmp_path_factory) -> list[str]:
    """Overrides for text_hybrid data: rows name the hybrid_gui_tool loop."""
    from verl_ext.data import main as prepare_data

    data = tmp_path_factory.mktemp("text_hybrid_data")
    prepare_data(["text_hybrid", str(data), "--train-size", "4", "--val-size", "2"])
    return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/val.parquet"]


@pytest.mark.parametrize(("estimator", "field", "rollout"), [("step_grouped", "action_match", "semi_online"),
                                                             ("himac", "role", "plan_execute"),
                                                             ("hiper", "role", "plan_execute")])
def test_the_hybrid_loop_feeds_an_estimator_with_the_rollout_that_records_its_field(
        estimator, field, rollout, base, text_hybrid_data, tmp_path):
    def refusals(loop_rollout: str) -> list[str]:
        loops = tmp_path / f"{loop_rollout}.yaml"
        loops.write_text("- name: hybrid_gui_tool\n  _target_: verl_ext.agent_loops.hybrid_gui_tool.HybridGuiToolAgentLoop\n"
                         f"  action_format: menu\n  rollout: {loop_rollout}\n")
        config = compose([*base, *text_hybrid_data, SYNC, _estimator(estimator),
                          f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"], None, "ppo_trainer")
        return [p for c in declared() if c.plugin == estimator and f"StepMetadata.{field}" in c.condition
                for p in c.check(config)]

    assert refusals(rollout) == []
    found = refusals("free")
    assert len(found) == 1
    assert_names(found[0], f"algorithm.adv_estimator={estimator}", "'hybrid_gui_tool'", f"records no {field}",
                 f"rollout: {rollout}")
