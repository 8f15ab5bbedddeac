"""ask_user: ask whoever drives the agent a question and wait for the answer."""

from __future__ import annotations

from typing import Any

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool

__all__ = ["ask_user"]


@tool(
    name="ask_user",
    description=(
        "Ask the user a question and wait for the answer. Use it when you cannot go on without a decision "
        "or a fact only the user has; offer `choices` when the answer is one of a few options. "
        "From a sub-agent, the question goes up to the user too."
    ),
    parameters={
        "type": "object",
        "properties": {
            "question": {"type": "string", "minLength": 1, "description": "The question, self-contained."},
            "choices": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Possible answers to choose from (optional).",
            },
        },
        "required": ["question"],
        "additionalProperties": False,
    },
    permission="allow",
    timeout=3600.0,
    kind="runtime",
)
async def ask_user(ctx: ToolContext, *, question: str, choices: list[str] | None = None) -> ToolResult:
    """Ask, wait, and return the answer as the result."""
    runtime: Any = getattr(ctx.session, "runtime", None)
    snapshot: Any = ctx.snapshot
    if runtime is None or snapshot is None:
        raise ToolError("ask_user needs a running agent session")
    try:
        answer = await runtime.ask_user(snapshot.path, question, choices or ())
    except RuntimeError as exc:
        return ToolResult.error(f"the question got no answer: {exc}")
    return ToolResult.success(f"The user answered: {answer}", data={"answer": answer})
