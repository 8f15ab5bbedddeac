"""weald's tools: the tool contract and the built-in tools.

Importing this package registers every built-in tool in `default_registry`.
"""

from __future__ import annotations

import logging as _logging

# The built-in tools: importing their modules registers them in default_registry.
# (Module imports, not `from ... import name`: the Tool objects must not hide the modules.)
from weald.tools import ask_user as _ask_user  # noqa: F401
from weald.tools import debug_state as _debug_state  # noqa: F401
from weald.tools import edit_file as _edit_file  # noqa: F401
from weald.tools import fetch as _fetch  # noqa: F401
from weald.tools import glob as _glob  # noqa: F401
from weald.tools import grep as _grep  # noqa: F401
from weald.tools import memory as _memory  # noqa: F401
from weald.tools import read_file as _read_file  # noqa: F401
from weald.tools import recall as _recall  # noqa: F401
from weald.tools import shell as _shell  # noqa: F401
from weald.tools import skills as _skills  # noqa: F401
from weald.tools import sub_agent as _sub_agent  # noqa: F401
from weald.tools import tasks as _tasks  # noqa: F401
from weald.tools import write_file as _write_file  # noqa: F401
from weald.tools._bwrap import SANDBOX_ENABLE_HINT, SandboxStatus, sandbox_status
from weald.tools._contract import (
    AbortSignal,
    PatternMatcher,
    Permission,
    PermissionScope,
    Tool,
    ToolConfig,
    ToolContext,
    ToolError,
    ToolImage,
    ToolRegistry,
    ToolResult,
    default_registry,
    describe_exception,
    invoke,
    tool,
    validate_arguments,
)
from weald.tools._editor import EDITOR_METHODS, EditorBridge, EditorError
from weald.tools._jobs import JobInfo, JobOutput, JobTable, nursery_spawner
from weald.tools._ledger import ReadLedger
from weald.tools._limits import limit_output, within_limits
from weald.tools._process import find_executable
from weald.tools._session import SessionServices
from weald.tools._spill import (
    SPILL_NAMESPACE,
    SpillBudget,
    SpillLedger,
    SpillLimits,
    SpillRow,
    forget_spill,
    remove_spill_dir,
    session_spill,
    spill_key,
    sweep_spill_dirs,
)

__all__ = [
    "EDITOR_METHODS",
    "SANDBOX_ENABLE_HINT",
    "SPILL_NAMESPACE",
    "AbortSignal",
    "EditorBridge",
    "EditorError",
    "JobInfo",
    "JobOutput",
    "JobTable",
    "PatternMatcher",
    "Permission",
    "PermissionScope",
    "ReadLedger",
    "SandboxStatus",
    "SessionServices",
    "SpillBudget",
    "SpillLedger",
    "SpillLimits",
    "SpillRow",
    "Tool",
    "ToolConfig",
    "ToolContext",
    "ToolError",
    "ToolImage",
    "ToolRegistry",
    "ToolResult",
    "default_registry",
    "describe_exception",
    "find_executable",
    "forget_spill",
    "invoke",
    "limit_output",
    "nursery_spawner",
    "remove_spill_dir",
    "sandbox_status",
    "session_spill",
    "spill_key",
    "sweep_spill_dirs",
    "tool",
    "validate_arguments",
    "within_limits",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())
