"""MCP client layer: connect to Model Context Protocol servers on trio.

One `ServerConfig` describes a server reached over stdio (a subprocess in a
process group of its own) or Streamable HTTP, with OAuth (`OAuthConfig`)
when the server requires it. `open_connection` starts it, runs the handshake
and yields an `MCPSession` for tool calls, resources and prompts; a server's
questions during a call (elicitation, `MCPElicitation`) are answered by the
call's handler, or with the schema's defaults when nobody can be asked. Every
failure is an `MCPError` (the tree is drawn in
``weald.runtime.mcp._exceptions``). The official ``mcp`` SDK is the protocol
layer underneath; this package adds the transport discipline, timeouts,
error translation and frozen values the runtime needs.

Example::

    config = ServerConfig(name="time", command="python", args=["-m", "mcp_server_time"])
    async with open_connection(config) as session:
        result = await session.call_tool("get_current_time", {"timezone": "UTC"})
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._actor import MCPConnection, MCPConnectionSnapshot, MCPSupervisor, mcp_supervisor_spec
from ._config import OAuthConfig, ServerConfig, StdioLaunch, StdioLauncher, referenced_variables
from ._exceptions import (
    MCPClosedError,
    MCPConfigError,
    MCPConnectionLost,
    MCPError,
    MCPHandshakeTimeout,
    MCPNotResponding,
    MCPProtocolError,
    MCPServerError,
    MCPStartError,
    MCPTimeout,
    MCPToolError,
)
from ._names import sanitize_tool_name
from ._trace import TraceContextProvider, set_trace_context_provider

if TYPE_CHECKING:
    from ._elicitation import MCPElicitation, MCPElicitationResult, answer_with_defaults
    from ._session import MCPSession, open_connection
    from ._values import (
        MCPCapabilities,
        MCPLogMessage,
        MCPPrompt,
        MCPPromptArgument,
        MCPPromptMessage,
        MCPPromptResult,
        MCPResource,
        MCPResourceContent,
        MCPServerInfo,
        MCPSessionStatistics,
        MCPTool,
        MCPToolResult,
    )

# What needs the MCP SDK (or jsonschema) is imported on first use: a daemon
# with no MCP server configured never loads them.
_LAZY = {
    "MCPElicitation": "._elicitation",
    "MCPElicitationResult": "._elicitation",
    "answer_with_defaults": "._elicitation",
    "MCPSession": "._session",
    "open_connection": "._session",
    **dict.fromkeys(
        (
            "MCPCapabilities",
            "MCPLogMessage",
            "MCPPrompt",
            "MCPPromptArgument",
            "MCPPromptMessage",
            "MCPPromptResult",
            "MCPResource",
            "MCPResourceContent",
            "MCPServerInfo",
            "MCPSessionStatistics",
            "MCPTool",
            "MCPToolResult",
        ),
        "._values",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "MCPCapabilities",
    "MCPClosedError",
    "MCPConfigError",
    "MCPConnection",
    "MCPConnectionLost",
    "MCPConnectionSnapshot",
    "MCPElicitation",
    "MCPElicitationResult",
    "MCPError",
    "MCPHandshakeTimeout",
    "MCPLogMessage",
    "MCPNotResponding",
    "MCPPrompt",
    "MCPPromptArgument",
    "MCPPromptMessage",
    "MCPPromptResult",
    "MCPProtocolError",
    "MCPResource",
    "MCPResourceContent",
    "MCPServerError",
    "MCPServerInfo",
    "MCPSession",
    "MCPSessionStatistics",
    "MCPStartError",
    "MCPSupervisor",
    "MCPTimeout",
    "MCPTool",
    "MCPToolError",
    "MCPToolResult",
    "OAuthConfig",
    "ServerConfig",
    "StdioLaunch",
    "StdioLauncher",
    "TraceContextProvider",
    "answer_with_defaults",
    "mcp_supervisor_spec",
    "open_connection",
    "referenced_variables",
    "sanitize_tool_name",
    "set_trace_context_provider",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
