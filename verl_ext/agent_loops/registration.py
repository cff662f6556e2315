"""Registers verl-ext's agent loops into verl's agent-loop registry (imported by the plugin hook
when verl imports ``verl.experimental.agent_loop``)."""

from verl_ext.agent_loops.decision_turn import DecisionTurnAgentLoop
from verl_ext.agent_loops.hybrid_gui_tool import HybridGuiToolAgentLoop

__all__ = ["DecisionTurnAgentLoop", "HybridGuiToolAgentLoop"]
