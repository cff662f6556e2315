"""Hybrid GUI + tool environments in a real (headless) browser: MiniDesk and MiniWoB++.

Importing this package is cheap (no selenium, no verl): the browser stack loads when an env is
built. Entry points: ``verl_ext.envs.pool.make_env`` / ``get_pool``, the types below, and
``verl-ext eval`` (``verl_ext.envs.eval_cli``).
"""

from verl_ext.envs.core import (
    Action,
    ActionError,
    Element,
    EnvFault,
    GuiAction,
    HybridEnv,
    Observation,
    TaskSpec,
    ToolCall,
    action_from_call,
)

__all__ = [
    "Action", "ActionError", "Element", "EnvFault", "GuiAction", "HybridEnv", "Observation", "TaskSpec", "ToolCall",
    "action_from_call",
]
