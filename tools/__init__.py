"""weald's tools: the tool contract and the built-in tools.

Importing this package registers every built-in tool in `default_registry`.
"""

from __future__ import annotations

import logging as _logging

from weald.tools._contract import (
    AbortSignal,
    Permission,
    Tool,
    ToolConfig,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    default_registry,
    describe_exception,
    invoke,
    tool,
    validate_arguments,
)
from weald.tools._session import SessionServices

__all__ = [
    "AbortSignal",
    "Permission",
    "SessionServices",
    "Tool",
    "ToolConfig",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolResult",
    "default_registry",
    "describe_exception",
    "invoke",
    "tool",
    "validate_arguments",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
