"""The public surface of weald.runtime.mcp (as httpx's test_exported_members)."""

from __future__ import annotations

import types

import pytest
import weald.runtime.mcp as mcp_layer


def test_all_is_sorted_and_lists_exactly_the_public_names():
    assert mcp_layer.__all__ == sorted(mcp_layer.__all__)
    # dir(): what needs the MCP SDK is imported on first use (module __getattr__), so not yet in vars().
    helpers = {"TYPE_CHECKING", "Any"}
    public = {
        name
        for name in dir(mcp_layer)
        if not name.startswith("_") and not isinstance(getattr(mcp_layer, name), types.ModuleType)
    } - helpers
    assert public == set(mcp_layer.__all__)
    assert set(mcp_layer.__all__) == {
        "MCPCapabilities",
        "MCPConnection",
        "MCPConnectionSnapshot",
        "MCPClosedError",
        "MCPElicitation",
        "MCPElicitationResult",
        "MCPConfigError",
        "MCPConnectionLost",
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
        "MCPSupervisor",
        "MCPSessionStatistics",
        "MCPStartError",
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
    }


def test_every_exception_derives_from_mcp_error():
    errors = [getattr(mcp_layer, name) for name in mcp_layer.__all__ if name.endswith("Error")]
    errors += [mcp_layer.MCPTimeout, mcp_layer.MCPConnectionLost, mcp_layer.MCPHandshakeTimeout]
    errors += [mcp_layer.MCPNotResponding]
    assert all(issubclass(error, mcp_layer.MCPError) for error in errors)


def test_sessions_have_no_public_constructor():
    with pytest.raises(TypeError, match="no public constructor"):
        mcp_layer.MCPSession()
