"""The MCP stdio adapter against a small local FastMCP server (``mcp<2``)."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.needs_extra("mcp")  # mcp<2; skipped where absent, failed under CI (tests/conftest.py)

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

    # OSWorld-MCP's server registers its tools as "<group>.<method>" (mcp_server/server.py).
    @server.tool(name="libreoffice_calc.get_column_data")
    def get_column_data(column_name: str) -> list[str]:
        """Get all data from the specified column."""
        return [column_name + "1", column_name + "2"]

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
    assert set(schemas) == {"add", "greet", "explode", "libreoffice_calc_get_column_data"}
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


def test_dotted_osworld_mcp_names_reach_the_server(toolset):
    assert toolset.call("libreoffice_calc_get_column_data", {"column_name": "B"})["result"] == ["B1", "B2"]


def test_a_server_that_exits_at_start_up_fails_at_once_with_its_exit_code_and_stderr(tmp_path):
    from verl_ext.envs.mcp_adapter import McpStdioToolset

    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('no display :99', file=sys.stderr)\nsys.exit(3)\n")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*no display :99"):
        McpStdioToolset(sys.executable, [str(script)], timeout_s=60)
    assert time.monotonic() - started < 20  # not the 60 s start-up timeout
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 127.*No such file"):
        McpStdioToolset(str(tmp_path / "no-such-server"), timeout_s=60)


def test_calls_after_close_are_refused_at_once(tmp_path):
    from verl_ext.envs.mcp_adapter import McpStdioToolset

    script = tmp_path / "server.py"
    script.write_text(SERVER)
    tools = McpStdioToolset(sys.executable, [str(script)], timeout_s=60)
    assert tools.call("add", {"a": 1, "b": 2})["result"] == 3
    tools.close()
    started = time.monotonic()
    refused = tools.call("add", {"a": 1, "b": 2})
    assert time.monotonic() - started < 1
    assert refused["success"] is False and "was closed" in refused["error_message"]
    tools.close()  # idempotent
