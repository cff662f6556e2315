"""The MCP stdio adapter against a small local FastMCP server (``mcp<2``)."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("mcp.server.fastmcp", reason="pip install 'verl-ext[mcp]' (mcp<2)")

SERVER = textwrap.dedent('''
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("fake-osworld")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def greet(name: str, punctuation: str | None = None) -> str:
        """Greet someone."""
        return "Hello " + name + (punctuation or ".")

    @server.tool()
    def explode(reason: str) -> str:
        """Always fails."""
        raise ValueError(reason)

    server.run()
''')


@pytest.fixture(scope="module")
def toolset(tmp_path_factory):
    from verl_ext.envs.mcp_adapter import McpStdioToolset

    script = tmp_path_factory.mktemp("mcp") / "server.py"
    script.write_text(SERVER)
    tools = McpStdioToolset(sys.executable, [str(script)])
    yield tools
    tools.close()


def test_tools_are_listed_with_flat_schemas(toolset):
    from verl.tools.schemas import OpenAIFunctionToolSchema

    schemas = {s["function"]["name"]: s for s in toolset.schemas()}
    assert set(schemas) == {"add", "greet", "explode"}
    greet = schemas["greet"]["function"]["parameters"]
    assert greet["required"] == ["name"] and "(optional)" in greet["properties"]["punctuation"]["description"]
    for schema in schemas.values():
        parsed = OpenAIFunctionToolSchema.model_validate(schema).model_dump(exclude_unset=True, exclude_none=True)
        assert parsed["function"]["parameters"] == schema["function"]["parameters"]


def test_calls_are_normalised_and_never_raise(toolset):
    assert toolset.call("add", {"a": 2, "b": "3"}) == {"success": True, "result": 5, "error_message": ""}
    assert toolset.call("greet", {"name": "Ada"})["result"] == "Hello Ada."
    failed = toolset.call("explode", {"reason": "disk full"})
    assert failed["success"] is False and "disk full" in failed["error_message"]
    assert "missing required" in toolset.call("add", {"a": 1})["error_message"]
    assert "unknown tool" in toolset.call("rm_rf", {})["error_message"]
