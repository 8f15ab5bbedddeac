"""Exceptions raised by the MCP client layer.

Every exception derives from `MCPError`; catch that to handle anything this
package raises. The tree, most general first::

    MCPError
    ├── MCPConfigError (also ValueError)   a ServerConfig is invalid; nothing was started
    ├── MCPStartError                      the server never became ready
    │   └── MCPHandshakeTimeout (also MCPTimeout)
    ├── MCPConnectionLost                  the server broke: it exited, crashed or the
    │   │                                  HTTP stream failed; the session is unusable
    │   └── MCPNotResponding               ... it hung: it did not answer a ping in time,
    │                                      so the connection was closed
    ├── MCPClosedError                     the session was closed by its owner (stopped,
    │                                      not broke) and a call raced the close
    ├── MCPTimeout                         a request outlived its deadline; the session
    │                                      stays usable (the server is merely slow)
    ├── MCPServerError                     the server answered with a JSON-RPC error
    │   └── MCPToolError                   ... to a tools/call request
    └── MCPProtocolError                   the server sent something the protocol forbids

A tool that runs and fails is not an exception: it comes back as an
`MCPToolResult` with ``is_error`` set, because the model should read it.
"""

from __future__ import annotations

__all__ = [
    "MCPClosedError",
    "MCPConfigError",
    "MCPConnectionLost",
    "MCPError",
    "MCPHandshakeTimeout",
    "MCPNotResponding",
    "MCPProtocolError",
    "MCPServerError",
    "MCPStartError",
    "MCPTimeout",
    "MCPToolError",
]


class MCPError(Exception):
    """Base class for every error raised by `weald.runtime.mcp`.

    Attributes:
        server: The configured name of the server involved, or ``None`` when
            the error is not about one server (a bad config has no server yet).
    """

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message)
        self.server = server


class MCPConfigError(MCPError, ValueError):
    """A `ServerConfig` is invalid; nothing was started or changed."""


class MCPStartError(MCPError):
    """The server failed to start or to complete the MCP handshake.

    Attributes:
        exit_code: The server process's exit status when it exited before it
            was ready (negative: killed by that signal), else ``None``.
        stderr_tail: The last lines the server wrote to stderr (stdio only;
            bounded), empty when there were none.
    """

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, server=server)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class MCPTimeout(MCPError):
    """A request outlived its deadline.

    For a tool call the request was cancelled (``notifications/cancelled`` was
    sent) and the session stays usable: a slow server is not a broken one.

    Attributes:
        timeout: The deadline that expired, in seconds.
    """

    def __init__(self, message: str, *, server: str | None = None, timeout: float) -> None:
        super().__init__(message, server=server)
        self.timeout = timeout


class MCPHandshakeTimeout(MCPStartError, MCPTimeout):
    """The server did not complete the handshake within ``connect_timeout``."""

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        timeout: float,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        # Both bases' __init__ would call the next one in the MRO with
        # arguments it does not take; set the attributes of both here.
        MCPError.__init__(self, message, server=server)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self.timeout = timeout


class MCPConnectionLost(MCPError):
    """The connection to the server broke; the session cannot be used again.

    Requests in flight when it broke end with this error at once; whether
    their side effects happened on the server is unknown.

    Attributes:
        exit_code: The server process's exit status if it is known (stdio).
        stderr_tail: The last lines the server wrote to stderr (stdio).
    """

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, server=server)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class MCPNotResponding(MCPConnectionLost):
    """The server stopped answering: it did not answer a ``ping`` within ``ping_timeout``.

    A request timing out alone does not raise this (a tool may just be
    slow); a server that cannot even answer a ping is hung, so its
    connection was closed (for stdio, its process group killed) and every
    request in flight ended with this error.

    Attributes:
        ping_timeout: How long the ping waited, in seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        ping_timeout: float,
        exit_code: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, server=server, exit_code=exit_code, stderr_tail=stderr_tail)
        self.ping_timeout = ping_timeout


class MCPClosedError(MCPError):
    """The session was closed by its owner before or while a request ran."""


class MCPServerError(MCPError):
    """The server answered a request with a JSON-RPC error.

    Attributes:
        code: The JSON-RPC error code.
        error_message: The server's own message, unchanged.
        data: The error's optional ``data`` member, as sent.
    """

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        code: int,
        error_message: str,
        data: object = None,
    ) -> None:
        super().__init__(message, server=server)
        self.code = code
        self.error_message = error_message
        self.data = data


class MCPToolError(MCPServerError):
    """The server rejected a tools/call request with a JSON-RPC error.

    Typical causes are an unknown tool name or arguments that do not match
    the tool's input schema. (A tool that ran and failed is an
    `MCPToolResult` with ``is_error`` set instead.)

    Attributes:
        tool: The name of the tool that was called.
    """

    def __init__(
        self,
        message: str,
        *,
        server: str | None = None,
        tool: str,
        code: int,
        error_message: str,
        data: object = None,
    ) -> None:
        super().__init__(message, server=server, code=code, error_message=error_message, data=data)
        self.tool = tool


class MCPProtocolError(MCPError):
    """The server sent a message or result that violates the MCP protocol."""
