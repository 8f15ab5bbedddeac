"""recall: read a message of the agent's own history again, by its sequence number.

When an agent's context grows too large, old tool outputs are pruned from it
and replaced by a stub naming their sequence number; the full messages stay
in the store (``history/<key>/<seq:08d>``, see ``weald.runtime.agents.agent``).
This tool brings one back, a page at a time for long ones: a page is at most
what the agent's context can hold at that moment (the call's output limit,
see `weald.tools.ToolConfig.max_output_bytes`), or ``limit`` characters.
"""

from __future__ import annotations

from typing import Any

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._taskstore import runtime_store

__all__ = ["recall"]

# Characters of a message one call returns at most; ``offset`` pages through longer ones.
_PAGE = 40_000
# What the page's header and hint take of the output limit, in characters (at most).
_FRAMING = 400


def _history_key(ctx: ToolContext) -> str:
    # The agent layer's history_key: the session id at the top, "<session>.<agent>" below it.
    return ctx.session_id if ctx.depth == 0 else f"{ctx.session_id}.{ctx.agent_id}"


@tool(
    name="recall",
    description=(
        "Read again a message of your own conversation that was pruned from your context to save space "
        "(a pruned tool output says which seq to give). Long messages come a page at a time: pass offset "
        "to read on, and limit to read only so many characters."
    ),
    parameters={
        "type": "object",
        "properties": {
            "seq": {"type": "integer", "minimum": 0, "description": "The message's sequence number (from the stub)."},
            "offset": {"type": "integer", "minimum": 0, "description": "The character to start at (default 0)."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "description": "At most this many characters (default: as many as your context holds now).",
            },
        },
        "required": ["seq"],
        "additionalProperties": False,
    },
    permission="allow",
    timeout=10.0,
    kind="runtime",
)
def recall(ctx: ToolContext, seq: int, offset: int = 0, limit: int | None = None) -> ToolResult:
    """Return a stored message of the calling agent's history, from ``offset``, at most ``limit`` characters."""
    store = runtime_store(ctx, "recall")
    entry: Any = store.get("history", f"{_history_key(ctx)}/{seq:08d}")
    message = entry.get("message") if isinstance(entry, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("content"), str):
        raise ToolError(
            f"there is no message {seq} in your history; give the seq a pruned output's stub names "
            '(it reads: call recall with {"seq": N})'
        )
    content: str = message["content"]
    if offset > len(content):
        raise ToolError(f"offset {offset} is past the end of message {seq}, which has {len(content)} characters")
    size = min(_PAGE, max(_FRAMING, ctx.config.max_output_bytes - _FRAMING))
    page = content[offset : offset + min(size, limit or size)]
    end = offset + len(page)
    source = message.get("name") or message.get("role") or "message"
    header = f"[message {seq} ({source}), characters {offset}-{end} of {len(content)}]"
    hints = [f"call recall with seq {seq} and offset {end} for the rest"] if end < len(content) else []
    return ToolResult.success(f"{header}\n{page}", hints=hints)
