"""Session-scoped services that tool calls share, owned by the session's tool runner."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

__all__ = ["SessionServices"]


@attrs.frozen
class SessionServices:
    """What outlives one tool call but belongs to one agent session.

    The tool runner creates one per session and hands it to every call as
    ``ctx.session``. The objects inside are thread-safe (thread tools and
    async tools share them).

    Attributes:
        output_dir: where untruncated tool output is saved.
        ledger: the `ReadLedger`: which files this session has read, and
            their state when read; edits of unread or changed files are refused.
        jobs: the `JobTable` of background shell commands, or None.
        runtime: handles into the runtime for tools that talk to it
            (sub-agents, questions to the user, the task store); None outside an agent.
        spill: the session's `SpillBudget`, bounding the output saved in
            ``output_dir``; None: default bounds for each call alone.
        editor: session id -> the `weald.tools._editor.EditorBridge` of the
            editor driving that session through ACP, or None; None (no
            lookup): no editor ever drives it. Thread-safe.
    """

    output_dir: Path = attrs.field(converter=Path)
    ledger: Any = None
    jobs: Any = None
    runtime: Any = None
    spill: Any = None
    editor: Callable[[str], Any] | None = None
