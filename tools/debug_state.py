"""debug_state: the agent looks at itself - status, queues, usage, events, its place in the tree."""

from __future__ import annotations

import json
from typing import Any

from weald.runtime import redact
from weald.tools._bwrap import sandbox_status
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool

__all__ = ["debug_state", "describe_sandbox", "describe_state"]


@tool(
    name="debug_state",
    description=(
        "Inspect your own runtime state: status, model, working directory, pending prompts, running tool calls, "
        "enabled tools, token usage, how full your context window is, recent events and messages, restart "
        "count, your place in the supervision tree, and how your shell commands are sandboxed. Use it to "
        "understand failures or restarts."
    ),
    parameters={
        "type": "object",
        "properties": {
            "events": {"type": "integer", "minimum": 0, "maximum": 200, "description": "Recent events to show."},
            "messages": {"type": "integer", "minimum": 0, "maximum": 50, "description": "Recent messages to show."},
        },
        "additionalProperties": False,
    },
    permission="allow",
    timeout=10.0,
    kind="runtime",
)
def debug_state(ctx: ToolContext, *, events: int = 20, messages: int = 10) -> ToolResult:
    """Report the agent's state, from its snapshot at the moment of the call."""
    runtime: Any = getattr(ctx.session, "runtime", None)
    if runtime is None or ctx.snapshot is None:
        raise ToolError("debug_state needs a running agent session")
    state = describe_state(ctx.snapshot, runtime, events=events, messages=messages)
    state["shell_sandbox"] = describe_sandbox(ctx)
    return ToolResult.success(json.dumps(state, indent=2, default=str), data=state)


def describe_sandbox(ctx: ToolContext) -> str:
    """How this agent's shell commands run: in the bubblewrap sandbox (and with what network), or why not.

    Blocks the first time in a process (bubblewrap is tried once); this tool runs in a worker thread.
    """
    option = ctx.config.option
    mode = str(option("shell", "sandbox", "auto"))
    if mode == "off":
        return 'off ([tools.shell] sandbox = "off"): process groups only'
    status = sandbox_status()
    if not status.available:
        refused = "shell refuses every command" if mode == "required" else "process groups only"
        return f"unavailable ({status.reason}): {refused}"
    network = option("shell", "network", False)
    allowed = "on" if network is True else "off" if not network else f"only for {', '.join(map(str, network))}"
    return (
        "bubblewrap: the project and /tmp writable, the rest read-only, credentials and the daemon's state "
        f"hidden, its own PID namespace; network {allowed}"
    )


def _context(snapshot: Any) -> dict[str, Any] | None:
    """The context's size against the model's window (None for a snapshot without one)."""
    stats = getattr(snapshot, "context", None)
    if stats is None:
        return None
    return {
        "tokens": stats.tokens,
        "input_budget": stats.input_budget,
        "context_window": stats.context_window,
        "output_reserve": stats.output_reserve,
        "window_source": stats.window_source,
        "chars_ratio": stats.chars_ratio,
        "calibrated": stats.calibrated,
        "last_input_tokens": stats.last_input_tokens,
        "fixed_tokens": stats.fixed_tokens,
        "messages": stats.messages,
        "summarized": stats.summarized,
        "compactions": stats.compactions,
        "pruned_before": stats.pruned_before,
    }


def describe_state(snapshot: Any, runtime: Any, *, events: int = 20, messages: int = 10) -> dict[str, Any]:
    """The debug_state report as plain data, secrets removed (also served by the daemon)."""
    recent = runtime.recent_events(source=snapshot.path, limit=events) if events else []
    state = {
        "agent": snapshot.path,
        "session_id": snapshot.session_id,
        "status": snapshot.status,
        "model": snapshot.model,
        "working_dir": snapshot.working_dir,
        "depth": snapshot.depth,
        "turn": {"id": snapshot.turn_id, "step": snapshot.step},
        "queues": {
            "pending_prompts": list(snapshot.pending_prompts),
            "running_tool_calls": list(snapshot.running_tool_calls),
            "open_questions": list(snapshot.open_questions),
            "open_permissions": list(snapshot.open_permissions),
        },
        "tools": list(snapshot.tools),
        "usage": {
            "input_tokens": snapshot.usage.input_tokens,
            "output_tokens": snapshot.usage.output_tokens,
            "cache_read_tokens": snapshot.usage.cache_read_tokens,
            "cache_write_tokens": snapshot.usage.cache_write_tokens,
        },
        "context": _context(snapshot),
        "restarts": snapshot.restarts,
        "message_count": snapshot.message_count,
        "messages": [
            {"role": m.role, "content": m.content[:500], "tool_calls": [c.name for c in m.tool_calls]}
            for m in list(snapshot.messages)[-messages:]
        ]
        if messages
        else [],
        "recent_events": [{"seq": e.seq, "topic": e.topic, "source": e.source, "data": e.data} for e in recent],
        "tree": runtime.tree_place(snapshot.path),
    }
    redacted: dict[str, Any] = redact(state)
    return redacted
