"""The trace context MCP tool calls carry (W3C ``traceparent``): who makes it.

Kept apart from the tool routing (`_registry`) so that setting it imports
nothing of the MCP SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from weald.tools import ToolContext

__all__ = ["TraceContextProvider", "set_trace_context_provider", "trace_context"]

TraceContextProvider = Callable[["ToolContext", str, str, str], str | None]
"""``provider(ctx, server, tool, path)``: the W3C ``traceparent`` an MCP tool call carries, or None.

``ctx`` is the calling tool's context, ``server`` and ``tool`` the server's
name and the tool's name there, ``path`` the connection actor's path.
"""

_trace_context: list[TraceContextProvider] = []  # at most one; set by whoever exports traces


def set_trace_context_provider(provider: TraceContextProvider | None) -> None:
    """Make MCP tool calls carry a W3C trace context: the `TraceContextProvider` returns its ``traceparent``.

    Called on the loop thread, in the calling tool's task, as each call
    starts; the call sends what it returns as ``params._meta.traceparent``
    and, over HTTP, as the ``traceparent`` header of its request. None
    removes it (calls carry none). The daemon sets one when telemetry is on.
    """
    _trace_context.clear()
    if provider is not None:
        _trace_context.append(provider)


def trace_context() -> TraceContextProvider | None:
    """The provider set by `set_trace_context_provider`, if any."""
    return _trace_context[0] if _trace_context else None
