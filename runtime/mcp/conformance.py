"""Client under test for the official MCP conformance suite.

Run by ``@modelcontextprotocol/conformance client --command "python -m
weald.runtime.mcp.conformance"``: the suite starts a scenario's server,
appends its URL as the last argument and names the scenario in the
``MCP_CONFORMANCE_SCENARIO`` environment variable. This client connects with
`open_connection` (Streamable HTTP), which runs the initialize handshake and
tools/list, and then does what the scenario asks:

- ``tools_call``: call ``add_numbers`` with two numbers.
- ``sse-retry``: call ``test_reconnection`` (the server drops the SSE stream
  and the SDK's transport must reconnect as the ``retry`` field says).
- anything else: call every listed tool with empty arguments.

Exit status 0 when every step succeeded, 1 otherwise (the error goes to
stderr); the suite judges conformance from what the server saw.
"""

from __future__ import annotations

import logging
import os
import sys

import trio

from ._config import ServerConfig
from ._exceptions import MCPError
from ._session import MCPSession, open_connection

__all__ = ["main"]

_TIMEOUT = 20.0  # the suite gives a client 30 s per scenario


async def _exercise(session: MCPSession, scenario: str) -> None:
    if scenario == "tools_call":
        result = await session.call_tool("add_numbers", {"a": 5, "b": 3})
    elif scenario == "sse-retry":
        result = await session.call_tool("test_reconnection", {})
    else:
        for tool in session.tools:
            result = await session.call_tool(tool.name, {})
            print(f"{tool.name}: {result.text}")
        return
    print(result.text)


async def _run(url: str, scenario: str) -> None:
    config = ServerConfig(name="conformance", url=url, call_timeout=_TIMEOUT, connect_timeout=_TIMEOUT)
    async with open_connection(config) as session:
        info = session.server_info
        print(f"connected to {info.name} {info.version} ({info.protocol_version})")
        print("tools:", ", ".join(tool.name for tool in session.tools) or "(none)")
        await _exercise(session, scenario)


def main(argv: list[str] | None = None) -> int:
    """Run one conformance scenario against the server at the URL in ``argv``.

    Returns:
        The process exit status.
    """
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m weald.runtime.mcp.conformance <server-url>", file=sys.stderr)
        return 2
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "initialize")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        trio.run(_run, args[-1], scenario)
    except MCPError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
