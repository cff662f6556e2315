"""Every toolcua_hybrid script gives HGPO the context its prompts really hold.

HGPO (He et al., ICLR 2026) keys its groups by a step's last k <= K+1 observations because the
policy sees the last K (verl-agent's history window): ``algorithm.hgpo.history_length`` must be the
agent loop's ``history_window`` in the one-row-per-turn layout, and cover the whole episode
(``max_steps - 1``) in the trajectory layout, where every prompt holds all earlier turns.
Each script is composed as a user runs it (``tests/test_recipe_scripts.py``'s dry run).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from .test_recipe_scripts import REPO, dry_run  # noqa: F401 - dry_run is a fixture

SCRIPTS = sorted((REPO / "recipes/toolcua_hybrid").glob("run_*.sh"))


def hgpo_window_problem(config) -> str | None:
    """Why ``config``'s HGPO history does not match its agent loop's prompts, or None."""
    from verl_ext.agent_loops.hybrid_gui_tool import HybridGuiToolAgentLoop

    defaults = {p.name: p.default for p in inspect.signature(HybridGuiToolAgentLoop.__init__).parameters.values()}
    loops = OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    loop = {**defaults, **next(entry for entry in loops if entry.name == "hybrid_gui_tool")}
    history = config.algorithm.hgpo.history_length
    if loop["layout"] == "per_turn" and history != loop["history_window"]:
        return f"per_turn layout with history_window={loop['history_window']} but algorithm.hgpo.history_length={history}"
    if loop["layout"] == "trajectory" and history < loop["max_steps"] - 1:
        return (f"trajectory layout (prompts hold all {loop['max_steps']} steps) but "
                f"algorithm.hgpo.history_length={history} < max_steps - 1")
    return None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_hgpo_history_matches_the_agent_loop_context(script: Path, dry_run):  # noqa: F811
    code, out, err = dry_run(script, [])
    assert code == 0, err[-4000:]
    config = OmegaConf.create(out)
    assert config.algorithm.adv_estimator == "hgpo"
    assert hgpo_window_problem(config) is None
