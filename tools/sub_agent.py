"""sub_agent: delegate a task to a child agent with its own tools, model and prompt."""

from __future__ import annotations

from typing import Any

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool

__all__ = ["sub_agent"]

# The tool's own limit (agent.sub_agent_timeout) applies inside; the runner's
# outer timeout only guards against a sub-agent that ignores cancellation.
_RUNNER_TIMEOUT = 24 * 3600.0


@tool(
    name="sub_agent",
    description=(
        "Start a sub-agent to do a self-contained task and return its final answer. "
        "Use it for work that needs many steps of its own (a search across the code, a focused change). "
        "Several sub_agent calls in one response run at the same time. The sub-agent sees none of this "
        "conversation: put everything it needs in `task`. It can use at most the tools you can."
    ),
    parameters={
        "type": "object",
        "properties": {
            "task": {"type": "string", "minLength": 1, "description": "The complete task, with all context needed."},
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": 'Tool filter patterns for the sub-agent, e.g. ["read_file", "grep"]; default: yours.',
            },
            "model": {"type": "string", "description": "provider:model for the sub-agent; default: yours."},
            "system_prompt": {"type": "string", "description": "A system prompt for the sub-agent."},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Seconds before it is stopped."},
        },
        "required": ["task"],
        "additionalProperties": False,
    },
    permission="allow",
    timeout=_RUNNER_TIMEOUT,
    kind="runtime",
)
async def sub_agent(
    ctx: ToolContext,
    *,
    task: str,
    tools: list[str] | None = None,
    model: str | None = None,
    system_prompt: str | None = None,
    timeout: float | None = None,
) -> ToolResult:
    """Run a sub-agent to completion and return its answer."""
    runtime = _runtime(ctx)
    snapshot: Any = ctx.snapshot
    if snapshot is None:
        raise ToolError("sub_agent needs the calling agent's snapshot; it can only be used by an agent")
    limit = runtime.agent_config.sub_agent_timeout
    seconds = min(timeout, limit) if timeout else limit
    try:
        result = await runtime.run_sub_agent(
            parent_path=snapshot.path,
            parent_model=snapshot.model,
            parent_filter=snapshot.tool_filter,
            depth=ctx.depth + 1,
            call_id=ctx.call_id,
            task=task,
            tools=tools,
            model=model,
            system_prompt=system_prompt,
            timeout=seconds,
            emit=ctx.emit,
        )
    except TimeoutError:
        return ToolResult.error(
            f"the sub-agent did not finish within {seconds:g} s and was stopped. "
            "Give it a smaller task, or a longer timeout."
        )
    usage = {"input_tokens": result.usage.input_tokens, "output_tokens": result.usage.output_tokens}
    data = {"turn_id": result.turn_id, "steps": result.steps, "usage": usage}
    if not result.ok:
        return ToolResult.error(
            f"the sub-agent stopped without finishing: {result.error}. Its last words: {result.text or '(none)'}",
            data=data,
        )
    return ToolResult.success(result.text or "(the sub-agent answered with no text)", data=data)


def _runtime(ctx: ToolContext) -> Any:
    runtime = getattr(ctx.session, "runtime", None)
    if runtime is None:
        raise ToolError("this tool needs a running agent session")
    return runtime
