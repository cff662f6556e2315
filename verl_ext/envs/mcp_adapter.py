"""Tools of an MCP server over stdio (``pip install 'verl-ext[mcp]'``, the ``mcp<2`` SDK).

verl removed its MCP tools in PR #6300; this adapter brings an OSWorld-MCP-style server's tools
(e.g. ``@modelcontextprotocol/server-filesystem``) into the same flat-schema, never-raising
``ExternalToolset`` the OSWorld loader builds. The MCP session lives on a private event loop in a
background thread, so ``call`` is synchronous and safe to use from env code and worker threads.
``mcp`` 2.x renamed its API (``FastMCP`` -> ``MCPServer``, snake_case fields): pin ``mcp<2``.

The server runs under this module's ``__main__`` (a launcher that passes stdin/stdout through and
writes the server's exit code to stderr), because the MCP SDK neither exposes the process nor
notices that it died: a server that cannot start fails the constructor at once with its exit code
and stderr tail instead of after the start-up timeout.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from verl_ext.envs.core import tool_result
from verl_ext.envs.osworld import ExternalToolset, load_mcp_tools

_EXIT_MARK = "verl-ext mcp launcher: server exited with code "
_STDERR_TAIL = 2000  # characters of the server's stderr quoted in errors


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
        self.command = command
        self._closed = False
        self._stderr = tempfile.TemporaryFile()  # the server's stderr, read back with pread only
        launcher = ["-m", __name__, command, *(args or [])]
        self._params = StdioServerParameters(command=sys.executable, args=launcher, env=env)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-stdio", daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._ready: asyncio.Future = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        deadline = time.monotonic() + timeout_s
        while not self._started.wait(0.05):
            failure = self._server_failure()
            if failure is None and time.monotonic() > deadline:
                failure = f"MCP server {command!r} did not start within {timeout_s} s{self._stderr_tail()}"
            if failure:
                self.close()
                raise RuntimeError(failure)
        listed = self._run(self._session.list_tools()).tools
        entries = [{"name": t.name, "description": t.description or "", "inputSchema": t.inputSchema} for t in listed]
        self.toolset = ExternalToolset(load_mcp_tools(entries), self._call_remote)

    async def _serve(self) -> None:
        """Hold the stdio transport and the session open until ``close``."""
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        async with stdio_client(self._params, errlog=self._stderr) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            self._session = session
            self._started.set()
            await self._stop.wait()

    def _stderr_text(self) -> str:
        """The end of the server's stderr (where the launcher's exit line goes)."""
        # pread leaves the file offset alone: the server process writes through the same offset.
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, 4 * _STDERR_TAIL, max(0, size - 4 * _STDERR_TAIL)).decode("utf-8", errors="replace")

    def _stderr_tail(self) -> str:
        text = "\n".join(line for line in self._stderr_text().splitlines() if not line.startswith(_EXIT_MARK))
        text = text[-_STDERR_TAIL:].strip()
        return f"; its stderr ends with:\n{text}" if text else "; it wrote nothing to stderr"

    def _server_failure(self) -> str | None:
        """Why the server is gone (exit code and stderr tail, or the transport's error), or None."""
        exited = [line for line in self._stderr_text().splitlines() if line.startswith(_EXIT_MARK)]
        if exited:
            code = exited[-1].removeprefix(_EXIT_MARK)
            return f"MCP server {self.command!r} exited with code {code}{self._stderr_tail()}"
        if self._ready.done():
            error = self._ready.exception()
            cause = f"{type(error).__name__}: {error}" if error else "the session ended"
            return f"MCP server {self.command!r} stopped ({cause}){self._stderr_tail()}"
        return None

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self.timeout_s)

    def _call_remote(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError(f"this MCP toolset ({self.command!r}) was closed; start a new McpStdioToolset")
        failure = self._server_failure()
        if failure:
            raise RuntimeError(failure)
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
        """Stop the session and the server process, then the background loop. Calls made after
        ``close`` fail at once, naming the closed toolset."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                self._ready.result(self.timeout_s)
            except Exception:  # noqa: BLE001 - the server may already be gone; shutting down anyway
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_s)
        self._stderr.close()


def _launch(argv: list[str]) -> int:
    """Run the server ``argv`` with this process's stdin/stdout/stderr; report its exit code on
    stderr, where ``McpStdioToolset`` watches for it."""
    try:
        code = subprocess.call(argv)
    except OSError as exc:  # not found, not executable
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        code = 127
    print(f"{_EXIT_MARK}{code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1:]))
