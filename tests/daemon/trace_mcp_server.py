"""An MCP server over Streamable HTTP that tells what trace context a tool call came with.

Run as ``python trace_mcp_server.py PORT``: serves on 127.0.0.1:PORT at ``/mcp``.
Its tool ``trace`` answers a JSON object: the ``traceparent`` header of the
HTTP request that carried the call, and the call's ``params._meta.traceparent``.
"""

from __future__ import annotations

import json
import sys
import warnings

from mcp import MCPDeprecationWarning
from mcp.server.mcpserver import Context, MCPServer

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

server = MCPServer("tracer")


@server.tool()
def trace(ctx: Context) -> str:
    """Say which trace context this call came with."""
    headers = ctx.headers or {}
    meta = ctx.request_context.meta
    carried = meta.get("traceparent") if isinstance(meta, dict) else getattr(meta, "traceparent", None)
    if carried is None and meta is not None and hasattr(meta, "model_extra"):
        carried = (meta.model_extra or {}).get("traceparent")
    return json.dumps({"header": headers.get("traceparent"), "meta": carried})


if __name__ == "__main__":
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
