"""The preconditions of the advantage estimators (``verl_ext.preconditions``): verl-ext's step-aware
ones and the verl group estimators whose group size verl-ext checks.

The agent-loop conditions read which loops a run uses (``verl_ext.config_data.agent_loops``: the rows'
``agent_name``, else ``default_agent_loop``); a loop of your own is assumed to write what it must.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from verl_ext.advantages import ESTIMATORS, estimator_registry
from verl_ext.advantages.estimator_registry import OPTIONAL_STEP_FIELDS, StepFieldNeed
from verl_ext.gpu_checks import select
from verl_ext.preconditions import SELECTORS, Precondition, verl_ext_trainer

KIND = "estimator"
ESTIMATOR_KEY = SELECTORS[KIND]
N_KEY = "actor_rollout_ref.rollout.n"
LOOP_KEYS = ("actor_rollout_ref.rollout.agent.default_agent_loop", "agent_name of data.train_files",
             "actor_rollout_ref.rollout.agent.agent_loop_config_path")


def _hybrid_gui_tool_leaves_out(loop_kwargs: dict[str, Any]) -> frozenset[str]:
    from verl_ext.agent_loops.menu_rollouts import recorded_fields

    return OPTIONAL_STEP_FIELDS - recorded_fields(loop_kwargs)


# The shipped agent loops (by class) that write verl_ext.steps.StepMetadata: the per-step fields
# they leave out, given their kwargs (the agent_loop_config_path entry).
STEP_METADATA_LOOPS: dict[str, Callable[[dict[str, Any]], frozenset[str]]] = {
    "verl_ext.agent_loops.hybrid_gui_tool.HybridGuiToolAgentLoop": _hybrid_gui_tool_leaves_out,
    "verl_ext.agent_loops.text_env.TextEnvAgentLoop": lambda loop_kwargs: OPTIONAL_STEP_FIELDS,
}
# How to make hybrid_gui_tool record each optional field (named in the refusals).
RECORDING_ROLLOUT = {
    "action_match": "the hybrid_gui_tool loop records it with rollout: semi_online (action_format: menu, text_hybrid "
                    "tasks; recipes/text_hybrid/run_cpu.sh ADV=step_grouped)",
    "role": "the hybrid_gui_tool loop records it with rollout: plan_execute (action_format: menu, text_hybrid "
            "tasks; recipes/text_hybrid/run_cpu.sh ADV=himac or ADV=hiper)",
}

# What a group of one (rollout.n = 1) leaves of each group estimator's advantage: verl's, then the
# step-aware ones' (``register_estimator(..., group_of_one=...)``).
VERL_GROUP_OF_ONE = {
    "grpo": "the advantage is the raw score (mean 0, std 1): no baseline",
    "rloo": "the advantage is the raw score (the leave-one-out mean of no other rollout is 0): no baseline",
}
GROUP_OF_ONE = {**VERL_GROUP_OF_ONE, **estimator_registry.GROUP_OF_ONE}


def _group_size(name: str, effect: str) -> Precondition:
    def check(config: Any) -> list[str]:
        n = int(select(config, N_KEY, 1))
        if n >= 2:
            return []
        return [f"{N_KEY}={n}: {ESTIMATOR_KEY}={name} compares the rollouts of one prompt, and with one rollout per "
                f"prompt {effect}: set {N_KEY} to 2 or more (the recipes use 4 or 8)"]

    return Precondition(KIND, name, f"groups of two or more rollouts of one prompt (`{N_KEY}` >= 2); with n = 1 "
                        f"{effect}", (N_KEY,), check)


def _loops(config: Any) -> Iterator[tuple[str, str, str]]:
    """``(name, class path, where it is set)`` of each agent loop the run uses whose class is known."""
    from verl_ext.config_data import agent_loops

    for name, (target, source) in agent_loops(config).items():
        if target is not None:  # unregistered: plugins_registered names it
            yield name, target, source


def _loop_kwargs(config: Any) -> dict[str, dict[str, Any]]:
    """The constructor kwargs of each agent loop named in ``agent_loop_config_path`` (none unset)."""
    from omegaconf import OmegaConf

    from verl_ext.config_data import agent_loop_file

    try:
        entries = agent_loop_file(config)
    except Exception:  # noqa: BLE001 - agent_loop_settings reports an unreadable file
        return {}
    return {str(e.name): OmegaConf.to_container(e, resolve=True) for e in entries if "name" in e}


def _left_out(config: Any) -> Iterator[tuple[str, str, frozenset[str]]]:
    """``(loop name, where it is set, optional per-step fields it leaves out)`` of each shipped
    step-metadata loop the run uses."""
    kwargs = _loop_kwargs(config)
    for loop, target, source in _loops(config):
        if target in STEP_METADATA_LOOPS:
            yield loop, source, STEP_METADATA_LOOPS[target](kwargs.get(loop, {}))


def _step_metadata(name: str) -> Precondition:
    def check(config: Any) -> list[str]:
        return [f"{ESTIMATOR_KEY}={name} needs per-step metadata, but agent loop {loop!r} ({source}) is verl's own "
                "and writes none (a single-turn task has no steps): use a step-aware loop (text_env, hybrid_gui_tool, "
                "or one that writes verl_ext.steps.StepMetadata: docs/howto/bring_your_own_env.md), or a verl "
                f"estimator such as {ESTIMATOR_KEY}=grpo"
                for loop, target, source in _loops(config)
                if target.startswith("verl.") and target not in STEP_METADATA_LOOPS]

    return Precondition(KIND, name, "an agent loop that writes per-step metadata (`verl_ext.steps.StepMetadata`: "
                        "text_env, hybrid_gui_tool or your own); verl's loops write none. Each step's rows must be "
                        "consistent (checked at run time: the estimator names the trajectories)", LOOP_KEYS, check)


def _per_step_field(name: str, need: StepFieldNeed) -> Precondition:
    """A per-step field the shipped step-aware loops do not record (``STEP_METADATA_LOOPS``)."""

    def check(config: Any) -> list[str]:
        return [f"{ESTIMATOR_KEY}={name} needs {need.need}, but agent loop {loop!r} ({source}) records no "
                f"{need.field}: {RECORDING_ROLLOUT[need.field]}; {need.fix}"
                for loop, source, left_out in _left_out(config) if need.field in left_out]

    return Precondition(KIND, name, f"{need.need}: an agent loop that sets `StepMetadata.{need.field}` (text_env does "
                        f"not; {RECORDING_ROLLOUT[need.field]}); checked again at run time on every step", LOOP_KEYS,
                        check)


def _critic(name: str, reads: str) -> Precondition:
    def check(config: Any) -> list[str]:
        enable = select(config, "critic.enable")
        if enable:
            return []
        return [f"critic.enable={enable}: {ESTIMATOR_KEY}={name} reads the critic's per-step values and stops at the "
                "first advantage without them: set critic.enable=true and critic.model.path"]

    return Precondition(KIND, name, f"a critic (`critic.enable=true`): {reads}", ("critic.enable",), check)


_NO_STEP_METADATA = "passes estimators no step metadata (the run stops at the first advantage, after a rollout)"
PRECONDITIONS: tuple[Precondition, ...] = (
    *(_group_size(name, effect) for name, effect in GROUP_OF_ONE.items()),
    *(verl_ext_trainer(KIND, name, _NO_STEP_METADATA) for name in ESTIMATORS),
    *(_step_metadata(name) for name in ESTIMATORS),
    *(_per_step_field(name, need) for name, needs in estimator_registry.STEP_FIELDS.items() for need in needs),
    *(_critic(name, reads) for name, reads in estimator_registry.CRITIC.items()),
)
