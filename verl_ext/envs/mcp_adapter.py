"""Tools of an MCP server over stdio (``pip install 'verl-ext[mcp]'``, the ``mcp<2`` SDK).

verl removed its MCP tools in PR #6300; this adapter brings an OSWorld-MCP-style server's tools
(e.g. ``@modelcontextprotocol/server-filesystem``) into the same flat-schema, never-raising
``ExternalToolset`` the OSWorld loader builds. The MCP session lives on a private event loop in a
background thread, so ``call`` is synchronous and safe to use from env code and worker threads.
``mcp`` 2.x renamed its API (``FastMCP`` -> ``MCPServer``, snake_case fields): pin ``mcp<2``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from verl_ext.envs.core import tool_result
from verl_ext.envs.osworld import ExternalToolset, load_mcp_tools


class McpStdioToolset:
    """Start ``command args`` as an MCP stdio server, list its tools, call them.

    Args:
        command / args / env: the server process (no shell is involved).
        timeout_s: per call (and for start-up); a slow call comes back as a failed result.
    """

    def __init__(self, command: str, args: list[str] | None = None, env: dict[str, str] | None = None,
                 timeout_s: float = 30.0):
        from mcp import StdioServerParameters

        self.timeout_s = timeout_s
        self._params = StdioServerParameters(command=command, args=list(args or []), env=env)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-stdio", daemon=True)
        self._thread.start()
        self._ready: asyncio.Future = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._started.wait(timeout_s)
        if self._session is None:
            self.close()
            raise RuntimeError(f"MCP server {command!r} did not start within {timeout_s} s")
        listed = self._run(self._session.list_tools()).tools
        entries = [{"name": t.name, "description": t.description or "", "inputSchema": t.inputSchema} for t in listed]
        self.toolset = ExternalToolset(load_mcp_tools(entries), self._call_remote)

    async def _serve(self) -> None:
        """Hold the stdio transport and the session open until ``close``."""
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        async with stdio_client(self._params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            self._session = session
            self._started.set()
            await self._stop.wait()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self.timeout_s)

    def _call_remote(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self._run(self._session.call_tool(name, arguments))
        text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
        if result.isError:
            return tool_result(False, None, text or "MCP tool error")
        structured = result.structuredContent
        if isinstance(structured, dict) and set(structured) == {"result"}:  # FastMCP wraps plain returns
            structured = structured["result"]
        return tool_result(True, structured if structured is not None else text, "")

    def schemas(self) -> list[dict[str, Any]]:
        return self.toolset.schemas()

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """``{success, result, error_message}``; never raises."""
        return self.toolset.call(name, arguments)

    def close(self) -> None:
        """Stop the session and the server process, then the background loop."""
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                self._ready.result(self.timeout_s)
            except Exception:  # noqa: BLE001 - the server may already be gone; shutting down anyway
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_s)
