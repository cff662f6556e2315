"""Env tools as verl native tools (``verl.tools.base_tool.BaseTool``), and the tool-config YAML.

``EnvTool.execute`` steps the trajectory's env with the call and returns the next observation as
text (plus a screenshot for VL models). The env is handed in by the ``hybrid_gui_tool`` agent
loop (``env=``); verl's stock ``tool_agent`` loop cannot give one, so there the tool answers with a
structured error instead of failing the rollout. It lives with the agent loops because it imports
verl; ``verl_ext.envs`` does not.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from verl_ext.envs.core import ToolCall, tool_result
from verl_ext.envs.tools import COMPUTER_USE, ToolDef

NEEDS_ENV = "this tool acts on a hybrid env: run it under the hybrid_gui_tool agent loop " \
            "(actor_rollout_ref.rollout.agent.default_agent_loop=hybrid_gui_tool)"


class EnvTool(BaseTool):
    """One env tool (``computer_use`` or an app tool) as a verl ``BaseTool``.

    YAML ``config`` keys: none required (``type: native``). The schema comes from the YAML or, when
    omitted, from the env's catalogue by ``config["name"]``.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        if tool_schema is None:
            catalogue = _catalogue()
            if config.get("name") not in catalogue:
                raise ValueError(f"EnvTool {config.get('name')!r} has no tool_schema and is not a MiniDesk tool: "
                                 "give its tool_schema in the tool config (write_tool_config(path, tools=...) does)")
            tool_schema = OpenAIFunctionToolSchema.model_validate(catalogue[config["name"]].schema())
        # BaseTool.__init__ prints every schema to stdout; set its attributes without the noise.
        self.config = config
        self.tool_schema = tool_schema
        self.name = tool_schema.function.name

    @classmethod
    def from_def(cls, tool: ToolDef) -> EnvTool:
        return cls({"type": "native", "name": tool.name}, OpenAIFunctionToolSchema.model_validate(tool.schema()))

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Step the env; metrics carry ``observation``, ``terminated``, ``truncated`` and ``info``."""
        env = kwargs.get("env")
        if env is None:
            return ToolResponse(text=json.dumps(tool_result(False, None, NEEDS_ENV))), 0.0, {}
        call = ToolCall(self.name, dict(parameters))
        obs, reward, terminated, truncated, info = await asyncio.to_thread(env.step, call)
        # ToolResponse rejects image=None, so the key is only passed when there is an image.
        image = {"image": [png_to_image(obs.screenshot)]} if kwargs.get("with_image") and obs.screenshot else {}
        response = ToolResponse(text=obs.render(include_instruction=False), **image)
        return response, reward, {"observation": obs, "terminated": terminated, "truncated": truncated, "info": info}


def png_to_image(png: bytes) -> Any:
    import io

    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


def _catalogue() -> dict[str, ToolDef]:
    from verl_ext.envs.minidesk.catalog import ALL_TOOLS

    return {COMPUTER_USE.name: COMPUTER_USE, **ALL_TOOLS}


def write_tool_config(path: str | Path, names: list[str] | None = None, tools: list[ToolDef] | None = None) -> Path:
    """Write a verl ``multi_turn.tool_config_path`` YAML listing env tools: ``tools`` (any env's
    ``ToolDef`` s), else the MiniDesk tools named in ``names`` (all by default)."""
    import yaml

    if tools is None:
        catalogue = _catalogue()
        tools = [catalogue[n] for n in names or catalogue]
    class_name = f"{EnvTool.__module__}.{EnvTool.__qualname__}"
    entries = [{"class_name": class_name, "config": {"type": "native", "name": t.name}, "tool_schema": t.schema()}
               for t in tools]
    path = Path(path)
    path.write_text(yaml.safe_dump({"tools": entries}, sort_keys=False), encoding="utf-8")
    return path
