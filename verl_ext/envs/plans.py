"""Reference plans: the scripted solutions an env hands out in its reset info (``info["plans"]``:
MiniDesk's ``gui`` and ``tool`` plans, text_hybrid's ``oracle`` plan too).

Both the scripted policies (``verl_ext.envs.policies``) and the T/G action menu
(``verl_ext.envs.menu``) turn plan steps into actions; this module is the one place that does it,
so neither of them imports the other for it.
"""

from __future__ import annotations

from typing import Any

from verl_ext.envs.core import Action, GuiAction, Observation, ToolCall


def plan_step_action(step: dict[str, Any], obs: Observation) -> Action | None:
    """One step of a reference plan as an action on ``obs``: a tool call, an answer, or a GUI
    primitive on the element whose app-side key the step names (None if it is not on the page)."""
    if "tool" in step:
        return ToolCall(step["tool"], dict(step["args"]))
    if step["gui"] == "answer":
        return GuiAction("answer", text=step["text"])
    element = obs.find(step["k"])
    if element is None:
        return None
    return GuiAction(step["gui"], element=element.id, text=step.get("text"))
