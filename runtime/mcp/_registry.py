"""MCP tools as weald tools: the schema check, the routed tool function, and the model's error texts.

Every server tool becomes a `weald.tools.Tool` whose function does not talk to
the server: it sends the owning `MCPConnection` actor a `CallTool` message
and awaits the reply future the actor completes. So the actor sees, counts
and can cut off every call, and a tool object stays valid across restarts of
its connection (it finds the actor by path at call time).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import jsonschema
import trio
from weald.runtime import ActorDeadError, Future, redact_text
from weald.tools import Permission, Tool, ToolContext, ToolResult

from ._elicitation import AgentElicitor, ElicitationHandler
from ._exceptions import MCPClosedError, MCPConnectionLost, MCPError, MCPNotResponding, MCPTimeout, MCPToolError
from ._sampling import AgentSampler, SamplingHandler, SamplingPolicy
from ._trace import trace_context
from ._values import MCPTool, MCPToolResult

if TYPE_CHECKING:
    from weald.runtime import ActorSystem, Ref

__all__ = [
    "TOOL_TIMEOUT_GRACE",
    "CallTool",
    "CancelCall",
    "NotConnected",
    "ToolRoute",
    "build_tool",
    "error_result",
    "progress_event",
    "settle",
    "settle_error",
    "tool_parameters",
]

T = TypeVar("T")

logger = logging.getLogger("weald.runtime.mcp")

# A tool's own deadline (the tool runner's) is this much longer than the
# connection's request deadline plus the ping that follows a timeout, so the
# connection's fires first: its result says "timed out after N s" or "not
# responding". The runner's deadline is the backstop for a connection that
# cannot even answer.
TOOL_TIMEOUT_GRACE = 2.0

_PERMISSIVE_SCHEMA: Mapping[str, Any] = {"type": "object"}

_call_ids = itertools.count(1)

ProgressCallback = Callable[[float, float | None, str | None], None]


class NotConnected(MCPConnectionLost):
    """The connection is not up (starting, restarting, or gone); the request was never sent."""


class CallTool:
    """Message to an `MCPConnection`: run ``tool`` with ``arguments`` and complete ``reply``."""

    __slots__ = (
        "arguments",
        "call_id",
        "on_elicitation",
        "on_progress",
        "on_sampling",
        "registered_name",
        "reply",
        "tool",
        "traceparent",
    )

    def __init__(
        self,
        tool: str,
        registered_name: str,
        arguments: Mapping[str, object],
        reply: Future[MCPToolResult],
        on_progress: ProgressCallback | None,
        *,
        on_elicitation: ElicitationHandler | None = None,
        on_sampling: SamplingHandler | None = None,
        traceparent: str | None = None,
    ) -> None:
        self.traceparent = traceparent
        self.call_id = next(_call_ids)
        self.tool = tool
        self.registered_name = registered_name
        self.arguments = arguments
        self.reply = reply
        self.on_progress = on_progress
        self.on_elicitation = on_elicitation
        self.on_sampling = on_sampling


class CancelCall:
    """Message to an `MCPConnection`: the caller gave up on call ``call_id``; cancel it."""

    __slots__ = ("call_id",)

    def __init__(self, call_id: int) -> None:
        self.call_id = call_id


def settle(future: Future[T], value: T) -> None:
    """Complete ``future`` with ``value`` unless something completed it first."""
    with contextlib.suppress(queue.Full):
        future.set(value)


def settle_error(future: Future[Any], error: BaseException) -> None:
    """Fail ``future`` with ``error`` unless something completed it first."""
    with contextlib.suppress(queue.Full):
        future.set_exception((type(error), error, error.__traceback__))


def tool_parameters(schema: Mapping[str, object]) -> tuple[Mapping[str, Any], Any, str | None]:
    """Check a server's input schema and return what to register.

    Any valid JSON Schema of type object is kept as sent, checked by the
    validator of the draft its ``$schema`` names (2020-12 when none). A schema
    without a ``type`` gets ``"type": "object"`` (models require it). Anything
    else is replaced by a permissive object schema, and the note returned
    says so, for the description: a tool with a broken schema is still
    useful, and the server checks its own arguments.

    Returns:
        ``(parameters, validator, note)``; ``note`` is None when the schema was kept.
    """
    candidate: dict[str, Any] = dict(schema)
    candidate.setdefault("type", "object")
    validator_class = jsonschema.validators.validator_for(candidate, default=jsonschema.Draft202012Validator)
    problem = _schema_problem(validator_class, candidate)
    if problem is None:
        return candidate, validator_class(candidate), None
    note = (
        f"Note: the server's input schema for this tool is not valid JSON Schema ({problem}); "
        "weald accepts any JSON object as its arguments and the server checks them."
    )
    return _PERMISSIVE_SCHEMA, jsonschema.Draft202012Validator(_PERMISSIVE_SCHEMA), note


def _schema_problem(validator_class: Any, schema: Mapping[str, Any]) -> str | None:
    if schema["type"] != "object":
        return f"its type is {schema['type']!r}, not 'object'"
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None


def build_tool(
    tool: MCPTool,
    name: str,
    route: ToolRoute,
    *,
    permission: Permission,
    call_timeout: float,
) -> Tool:
    """Make the weald `Tool` for one server tool, registered as ``name``.

    ``call_timeout`` is the longest the connection may take to answer a call
    (its request deadline plus the ping that judges a timed-out server); the
    tool's own timeout allows `TOOL_TIMEOUT_GRACE` more.
    """
    parameters, validator, note = tool_parameters(tool.input_schema)
    description = tool.description or f"The tool {tool.name!r} of the MCP server {tool.server!r}."
    if note is not None:
        description = f"{description}\n\n{note}"
    return Tool(
        name=name,
        description=description,
        parameters=parameters,
        fn=route,
        is_async=True,
        permission=permission,
        timeout=call_timeout + TOOL_TIMEOUT_GRACE,
        kind="mcp",
        _validator=validator,
    )


class ToolRoute:
    """The function of a registered MCP tool: routes each call through the connection actor.

    Holds no reference to the actor, only its path: after a restart the new
    actor lives at the same path, so a `Tool` an agent kept from before still
    works. Calls made while no actor is there, or while it is not connected,
    end at once with an error result saying why and when to try again
    (``unavailable``).

    Attributes:
        server: the configured server name.
        tool: the tool's name on the server.
        name: the registered name (what the model calls).
        path: the connection actor's path.
        unavailable: says why the server cannot take a call now and when it
            can (``MCP server 'x' is restarting (attempt 3, retry in 4 s);
            try again then.``); called on the loop thread.
        sampling: the server's sampling policy (``ask``, ``allow``, ``deny``).
    """

    __slots__ = ("name", "path", "sampling", "server", "system", "tool", "unavailable")

    def __init__(
        self,
        system: ActorSystem,
        path: str,
        server: str,
        tool: str,
        name: str,
        *,
        unavailable: Callable[[], str] | None = None,
        sampling: SamplingPolicy = "ask",
    ) -> None:
        self.system = system
        self.sampling: SamplingPolicy = sampling
        self.path = path
        self.server = server
        self.tool = tool
        self.name = name
        self.unavailable = unavailable

    def __repr__(self) -> str:
        return f"<ToolRoute {self.name} -> {self.path}>"

    async def __call__(self, ctx: ToolContext, /, **arguments: object) -> ToolResult:
        """Run the call on the connection actor and turn its outcome into a `ToolResult`.

        Runs in the caller's trio task (the tool runner's). Cancelling it
        (the runner's timeout or an abort) tells the actor to cancel the call
        on the server too. If the server asks for input during the call
        (elicitation), the person driving the calling agent is asked
        (`AgentElicitor`); outside an agent session, SEP-1034 defaults apply.

        Each progress notification of the call is emitted as an ``output``
        event (see `progress_event`), so it reaches the event bus as
        ``tool.output``, where clients already show a running tool's output.
        """
        ref = self.system.whereis(self.path)
        if ref is None:
            return error_result(self.server, self.name, self._not_connected())

        def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ctx.emit("output", progress_event(progress, total, message))

        reply: Future[MCPToolResult] = Future()
        traceparent = None
        provider = trace_context()
        if provider is not None:
            try:
                traceparent = provider(ctx, self.server, self.tool, self.path)
            except Exception:  # tracing never fails a call: it goes without a trace context
                logger.exception("the trace context of %s could not be made", self.name)
        call = CallTool(
            self.tool,
            self.name,
            arguments,
            reply,
            on_progress,
            on_elicitation=_elicitor(ctx),
            on_sampling=_sampler(ctx, self.sampling),
            traceparent=traceparent,
        )
        try:
            ref.tell(call)
        except ActorDeadError:
            return error_result(self.server, self.name, self._not_connected())
        try:
            result = await _reply_or_exit(reply, ref, self.server, self.name)
        except trio.Cancelled:
            with contextlib.suppress(ActorDeadError):
                ref.tell(CancelCall(call.call_id))
            raise
        except MCPError as exc:
            return error_result(self.server, self.name, exc)
        structured = result.structured_content
        return ToolResult(
            ok=not result.is_error,
            output=result.text,
            data=dict(structured) if structured is not None else None,
            images=result.images,
        )

    def _not_connected(self) -> NotConnected:
        if self.unavailable is not None:
            return NotConnected(self.unavailable(), server=self.server)
        return NotConnected(
            f"MCP server {self.server!r} is not connected (it is starting or being restarted); try again in a moment.",
            server=self.server,
        )


def progress_event(progress: float, total: float | None, message: str | None) -> dict[str, Any]:
    r"""The ``output`` event data of one progress notification.

    Shaped as a shell tool's output (``stream``, ``text``) so that clients
    rendering ``tool.output`` show it as a line, with the numbers beside for
    clients that draw a progress bar::

        {"stream": "progress", "text": "step 2 of 4 (2/4)\n",
         "progress": 2, "total": 4, "message": "step 2 of 4"}
    """
    count = f"{progress:g}/{total:g}" if total is not None else f"{progress:g}"
    text = f"{message} ({count})" if message else f"progress {count}"
    return {"stream": "progress", "text": f"{text}\n", "progress": progress, "total": total, "message": message}


def _sampler(ctx: ToolContext, policy: SamplingPolicy) -> AgentSampler | None:
    """Who runs the server's sampling requests during this call: the calling agent's model, if there is one."""
    runtime = getattr(ctx.session, "runtime", None)
    agent_path = getattr(ctx.snapshot, "path", None)
    if runtime is None or not isinstance(agent_path, str) or not agent_path:
        return None
    session_path = getattr(runtime, "session_path", None)
    return AgentSampler(runtime, agent_path, session_path if isinstance(session_path, str) else agent_path, policy)


def _elicitor(ctx: ToolContext) -> AgentElicitor | None:
    """Who answers the server's questions during this call: the calling agent's person, if there is one."""
    runtime = getattr(ctx.session, "runtime", None)
    agent_path = getattr(ctx.snapshot, "path", None)
    if runtime is None or not isinstance(agent_path, str) or not agent_path:
        return None
    session_path = getattr(runtime, "session_path", None)
    return AgentElicitor(runtime, agent_path, session_path if isinstance(session_path, str) else agent_path)


async def _reply_or_exit(reply: Future[MCPToolResult], ref: Ref[Any], server: str, name: str) -> MCPToolResult:
    """Wait for ``reply``, or for the actor to end without completing it.

    The actor completes every call it accepted, even when it crashes or
    stops; but a call still in its mailbox when it ended, or any call of an
    actor that was killed, is never answered: the actor's exit answers it.
    """
    try:
        async with trio.open_nursery() as nursery:

            async def watch(future: Future[Any]) -> None:
                # Only the arrival matters here; the outcome is read below.
                with contextlib.suppress(Exception):
                    await future
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch, reply)
            nursery.start_soon(watch, ref.exited())
    except BaseExceptionGroup as group:
        # Cancelled from outside (the runner's deadline, an abort): both watchers
        # raise Cancelled and the nursery groups them; callers expect a bare Cancelled.
        cancelled, others = group.split(trio.Cancelled)
        if others is None and cancelled is not None:
            first: BaseException = cancelled
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None
        raise
    if reply.done():
        return reply.get()
    raise MCPConnectionLost(
        f"MCP server {server!r}: its connection ended before answering {name}",
        server=server,
    )


def error_result(server: str, name: str, error: MCPError) -> ToolResult:
    """The error result a model reads when a call to an MCP tool did not produce a result.

    Says what happened and what to do next; the underlying error (with the
    server's stderr tail, secrets cut out) goes in ``data`` for programs.
    """
    if isinstance(error, MCPNotResponding):
        message = (
            f"MCP server {server!r} is not responding (it did not answer a ping within {error.ping_timeout:g} s), "
            f"so {name} did not complete. The server is being restarted; try again in a moment."
        )
    elif isinstance(error, NotConnected):
        message = f"{name} did not run: {error}"
    elif isinstance(error, MCPConnectionLost):
        message = (
            f"MCP server {server!r} disconnected while running tool {name}; the call did not complete. "
            "The server is being restarted; try again in a moment."
        )
    elif isinstance(error, MCPTimeout):
        message = (
            f"MCP server {server!r} did not answer {name}: timed out after {error.timeout:g} s; "
            "the call was cancelled. The server may be overloaded or stuck: try again later, "
            "with a smaller request, or another way."
        )
    elif isinstance(error, MCPClosedError):
        message = (
            f"MCP server {server!r} was shut down while running tool {name}; the call did not complete. "
            "Its tools are no longer available."
        )
    elif isinstance(error, MCPToolError):
        message = (
            f"MCP server {server!r} rejected the call to {name}: {error.error_message}. "
            "Check the arguments against the tool's parameters and call it again."
        )
    else:
        message = f"MCP server {server!r} failed while running {name}: {error}. Try again, or another approach."
    data = {"server": server, "tool": name, "error": redact_text(str(error)), "kind": type(error).__name__}
    return ToolResult.error(redact_text(message), data=data)
