"""`open_connection` and `MCPSession`: one live connection to one MCP server.

Task layout inside ``open_connection`` (one trio nursery)::

    nursery
    ├── runner     the transport, a tap on its inbound stream, the SDK's
    │              ClientSession; handshake, then waits for close or loss
    ├── delivery   calls on_log and refreshes the tool list (on_tools_changed)
    ├── watchdog   pings the server when a request times out, and every
    │              ping_interval seconds, idle or not; a ping not
    │              answered within ping_timeout ends the connection as not
    │              responding (hung)
    └── (the caller's ``async with`` body)

Requests from the server (``elicitation/create``, ``sampling/createMessage``)
are answered in tasks of the SDK's, by the handlers of the tool call they
belong to (see `MCPSession.call_tool`); ``roots/list`` by the ``roots``
function given to `open_connection`. OAuth, when the config has ``auth``, is an
``httpx2.Auth`` on the HTTP client (``_auth``).

The SDK (``mcp`` 2.x) is the protocol layer: JSON-RPC framing, request
correlation, progress, cancellation. It runs on anyio, which runs on trio's
backend here. Everything it raises is translated at this boundary into the
`MCPError` tree.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, TypeVar, cast

import anyio
import httpx2
import mcp
import mcp_types as types
import pydantic
import trio
from mcp.client import Transport
from mcp.client.auth import TokenStorage
from mcp.client.session import ClientRequestContext
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from weald.runtime._version import VERSION

from ._auth import MemoryTokenStorage, build_oauth
from ._config import ServerConfig
from ._elicitation import (
    DECLINE,
    ElicitationHandler,
    MCPElicitation,
    MCPElicitationResult,
    answer_with_defaults,
    wait_elicitation,
)
from ._exceptions import (
    MCPClosedError,
    MCPConfigError,
    MCPConnectionLost,
    MCPError,
    MCPHandshakeTimeout,
    MCPNotResponding,
    MCPProtocolError,
    MCPServerError,
    MCPStartError,
    MCPTimeout,
    MCPToolError,
)
from ._names import register_tool_names
from ._sampling import MCPSampling, MCPSamplingMessage, SamplingHandler, SamplingRefused, refuse_sampling
from ._stdio import (
    ReadReceive,
    ReadSend,
    StdioServer,
    WriteSend,
    describe_exit,
    open_stdio_transport,
)
from ._values import (
    MCPCapabilities,
    MCPLogMessage,
    MCPPrompt,
    MCPPromptResult,
    MCPResource,
    MCPResourceContent,
    MCPServerInfo,
    MCPSessionStatistics,
    MCPTool,
    MCPToolResult,
    capabilities_from_wire,
    prompt_from_wire,
    prompt_result_from_wire,
    resource_content_from_wire,
    resource_from_wire,
    server_info_from_wire,
    tool_from_wire,
    tool_result_from_wire,
)

__all__ = ["MCPSession", "ProgressCallback", "open_connection"]

logger = logging.getLogger("weald.runtime.mcp")

T = TypeVar("T")

ProgressCallback = Callable[[float, float | None, str | None], None]
ToolsChangedCallback = Callable[[tuple[MCPTool, ...]], None]
LogCallback = Callable[[MCPLogMessage], None]
AuthorizationCallback = Callable[[str], None]
#: Called with ``(kind, data)`` for the server's other notifications, in wire
#: order: ``resources_changed`` ({}), ``prompts_changed`` ({}) and
#: ``resource_updated`` ({"uri": ...}).
NoticeCallback = Callable[[str, Mapping[str, Any]], None]
RootsFunction = Callable[[], Sequence[str]]

# Bounds, stated where they are used.
LOG_BUFFER = 256  # log messages waiting for on_log; beyond this they are dropped
MAX_PAGES = 1000  # pages one listing may take; a cursor loop is a protocol error
CLOSE_TIMEOUT = 5.0  # graceful close of an HTTP session (the DELETE)
SETTLE_TIMEOUT = 1.0  # for the runner to record why a connection broke
EXIT_CODE_WAIT = 0.25  # for a dead server's exit status, to put it in an error
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's own defaults
# An elicitation is answered ``cancel`` this long before its tool call's
# deadline (a quarter of what is left, if less), so the server can still
# finish the call with that answer.
ELICITATION_MARGIN = 2.0

# What the SDK's dispatcher and HTTP transport say when they fail a request
# because the connection, not the server, ended it (JSON-RPC code -32000,
# which servers also use for errors of their own, hence the message check).
_SDK_CLOSED_MESSAGES = ("Connection closed",)

# The server's notifications passed on to ``on_notice``, by kind.
_NOTICES: Final = {
    "notifications/resources/list_changed": "resources_changed",
    "notifications/prompts/list_changed": "prompts_changed",
    "notifications/resources/updated": "resource_updated",
}
_SDK_STREAM_FAILURE_PREFIX = "SSE stream"

_State = Literal["starting", "open", "lost", "closed"]


class _CallRoute:
    """A tool call in flight, for the server's requests that come during it."""

    __slots__ = ("deadline", "handler", "sampler", "tool")

    def __init__(
        self, tool: str, handler: ElicitationHandler | None, deadline: float, sampler: SamplingHandler | None = None
    ) -> None:
        self.tool = tool
        self.handler = handler
        self.sampler = sampler
        self.deadline = deadline


# The tool call the current task is making. The SDK's Streamable HTTP
# transport carries the sender's context to the POST that reads the call's
# response stream, and on to the messages it receives, so a request the server
# sends on that stream is matched to its call exactly (see `MCPSession._tap`).
_current_call: contextvars.ContextVar[_CallRoute | None] = contextvars.ContextVar("weald_mcp_call", default=None)
# The W3C trace context of that call, for the ``traceparent`` header of its HTTP request.
_traceparent: contextvars.ContextVar[str | None] = contextvars.ContextVar("weald_mcp_traceparent", default=None)


async def _add_traceparent(request: httpx2.Request) -> None:
    """Put the current tool call's trace context on its HTTP request (when it has one)."""
    traceparent = _traceparent.get()
    if traceparent is not None:
        request.headers["traceparent"] = traceparent


def _client_info() -> types.Implementation:
    return types.Implementation(name="weald", version=VERSION)


class _NoPublicConstructor(type):
    """Metaclass for classes only this package creates (trio's idiom)."""

    def __call__(cls, *_args: object, **_kwargs: object) -> NoReturn:
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} has no public constructor")

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc,no-any-return]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _failures(exc: BaseException) -> list[BaseException]:
    """The leaves of ``exc`` that are not cancellations."""
    return [leaf for leaf in _leaves(exc) if not isinstance(leaf, trio.Cancelled)]


def _describe_failure(exc: BaseException) -> str:
    if isinstance(exc, httpx2.HTTPError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"HTTP error: {first}"
    if isinstance(exc, mcp.MCPError):
        return f"{exc.message} (JSON-RPC error {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _with_tail(message: str, tail: str) -> str:
    return f"{message}\n--- last lines of the server's stderr ---\n{tail}" if tail else message


class _ProgressRelay:
    """Hands progress notifications to a synchronous callback, in order.

    The SDK delivers each notification from a task of its own, and trio may
    run such tasks in any order, so a value lower than one already delivered
    is a reordering and is dropped (progress only grows, by the spec). If the
    callback raises, the call is cancelled and `MCPSession.call_tool`
    re-raises the exception.
    """

    def __init__(self, callback: ProgressCallback, scope: trio.CancelScope) -> None:
        self._callback = callback
        self._scope = scope
        self._last: float | None = None
        self.error: Exception | None = None

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if self.error is not None or (self._last is not None and progress < self._last):
            return
        self._last = progress
        try:
            self._callback(progress, total, message)
        except Exception as exc:
            self.error = exc
            self._scope.cancel()


class _Probe:
    """One ping of the server, shared by everyone who wants its verdict."""

    __slots__ = ("alive", "done")

    def __init__(self) -> None:
        self.done = trio.Event()
        # Until the ping says otherwise; a probe cut short (the session
        # closing) must not condemn the server.
        self.alive = True


class MCPSession(metaclass=_NoPublicConstructor):
    """A live connection to one MCP server, created by `open_connection`.

    Every method may be called from any task in the trio run that opened
    the session, concurrently. Requests take ``timeout`` seconds at most
    (default: the config's ``call_timeout``) and raise `MCPTimeout` after;
    the session stays usable, unless the server then fails to answer a
    ``ping`` within the config's ``ping_timeout``: that server is hung, not
    slow, so the connection is lost and every request in flight, the timed
    out one included, raises `MCPNotResponding` (an `MCPConnectionLost`).
    The server is also pinged every ``ping_interval`` seconds, idle or not,
    so a hang is found before anyone calls it and before long deadlines run
    out. If the server dies, every request in flight and every later one
    raises `MCPConnectionLost`; after the ``async with`` block they raise
    `MCPClosedError`.
    """

    def __init__(
        self,
        config: ServerConfig,
        on_tools_changed: ToolsChangedCallback | None,
        on_log: LogCallback | None,
        *,
        on_elicitation: ElicitationHandler | None,
        auth_storage: TokenStorage | None,
        on_authorization: AuthorizationCallback | None,
        on_notice: NoticeCallback | None = None,
        roots: RootsFunction | None = None,
    ) -> None:
        self._config = config
        self._on_tools_changed = on_tools_changed
        self._on_log = on_log
        self._on_notice = on_notice
        self._roots = roots
        self._samplings = 0
        self._samplings_refused = 0
        self._on_elicitation: ElicitationHandler = on_elicitation or answer_with_defaults
        self._auth_storage = auth_storage
        self._on_authorization = on_authorization
        self._auth_error: Exception | None = None
        self._routes: list[_CallRoute] = []  # tool calls in flight, oldest first
        self._related: dict[types.RequestId, _CallRoute] = {}  # server request id -> its call (HTTP)
        self._elicitations = 0
        self._elicitations_unrouted = 0
        self._state: _State = "starting"
        self._lost_reason: str | None = None
        self._not_responding = False  # lost because a ping went unanswered
        self._client: mcp.ClientSession | None = None
        self._stdio: StdioServer | None = None
        self._last_http_error: str | None = None
        self._first_post_status: int | None = None  # of the first POST (initialize): 404/405 means HTTP+SSE
        self._legacy_sse = False  # speaking the 2024-11-05 HTTP+SSE transport
        self._server_info: MCPServerInfo | None = None
        self._capabilities: MCPCapabilities | None = None
        self._tools: tuple[MCPTool, ...] = ()
        self._tools_by_name: dict[str, MCPTool] = {}
        self._tools_by_registered_name: dict[str, MCPTool] = {}
        self._done = trio.Event()  # close requested or connection lost
        self._lost = trio.Event()
        self._runner_finished = trio.Event()
        self._runner_scope: trio.CancelScope | None = None
        self._delivery_scope = trio.CancelScope()
        self._watch_scope = trio.CancelScope()
        self._probe: _Probe | None = None  # the ping running or wanted next
        self._probe_wanted = trio.Event()
        self._requests_in_flight = 0
        self._pings = 0
        self._pings_unanswered = 0
        self._log_send, self._log_receive = trio.open_memory_channel[MCPLogMessage](LOG_BUFFER)
        # Capacity 1: list_changed notifications that arrive while a refresh
        # is pending fold into it.
        self._refresh_send, self._refresh_receive = trio.open_memory_channel[None](1)
        self._calls_started = 0
        self._calls_in_flight = 0
        self._calls_succeeded = 0
        self._calls_tool_errors = 0
        self._calls_failed = 0
        self._calls_timed_out = 0
        self._refreshes = 0
        self._refresh_failures = 0
        self._messages_received = 0
        self._invalid_messages = 0
        self._logs_dropped = 0

    # -- public surface -------------------------------------------------

    @property
    def config(self) -> ServerConfig:
        """The config this session was opened with."""
        return self._config

    @property
    def tools(self) -> tuple[MCPTool, ...]:
        """The server's tools, as of the last tools/list (kept current on list_changed)."""
        return self._tools

    @property
    def server_info(self) -> MCPServerInfo:
        """The server's name, version and instructions, and the negotiated protocol."""
        assert self._server_info is not None  # set before the session is handed out
        return self._server_info

    @property
    def capabilities(self) -> MCPCapabilities:
        """The capabilities the server declared in its initialize result."""
        assert self._capabilities is not None  # set before the session is handed out
        return self._capabilities

    def statistics(self) -> MCPSessionStatistics:
        """Return a frozen snapshot of this session's state and counters."""
        state: Literal["open", "lost", "closed"] = "open" if self._state == "starting" else self._state
        return MCPSessionStatistics(
            server=self._config.name,
            transport=self._config.transport,
            state=state,
            tools=len(self._tools),
            calls_started=self._calls_started,
            calls_in_flight=self._calls_in_flight,
            calls_succeeded=self._calls_succeeded,
            calls_tool_errors=self._calls_tool_errors,
            calls_failed=self._calls_failed,
            calls_timed_out=self._calls_timed_out,
            tool_list_refreshes=self._refreshes,
            tool_list_refresh_failures=self._refresh_failures,
            messages_received=self._messages_received,
            invalid_messages=self._invalid_messages,
            log_messages_dropped=self._logs_dropped,
            elicitations=self._elicitations,
            elicitations_unrouted=self._elicitations_unrouted,
            samplings=self._samplings,
            samplings_refused=self._samplings_refused,
            legacy_sse=self._legacy_sse,
            pings=self._pings,
            pings_unanswered=self._pings_unanswered,
            pid=self._stdio.pid if self._stdio is not None else None,
            exit_code=self._stdio.exit_code if self._stdio is not None else None,
            lost_reason=(
                self._stdio.describe_loss(self._lost_reason)
                if self._stdio is not None and self._lost_reason is not None and not self._not_responding
                else self._lost_reason
            ),
        )

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, object] | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        on_elicitation: ElicitationHandler | None = None,
        on_sampling: SamplingHandler | None = None,
        timeout: float | None = None,
        traceparent: str | None = None,
    ) -> MCPToolResult:
        """Call a tool and return its result.

        Args:
            name: The tool's name on the server, or its registered name
                (``mcp__<server>__<tool>``); a name that is neither is sent
                as it is, for the server to judge.
            arguments: The tool's arguments (a JSON object).
            on_progress: Called as ``on_progress(progress, total, message)``
                for each progress notification of this call, in increasing
                order of ``progress``. It runs in one of the SDK's tasks and
                must not block; if it raises, the call is cancelled and the
                exception propagates from here.
            on_elicitation: Answers the server's ``elicitation/create``
                requests that come during this call (an `AgentElicitor` asks
                the person driving an agent). It must answer before the
                call's deadline; ``ELICITATION_MARGIN`` seconds before it, the
                server gets ``cancel``. None: the session's handler
                (`open_connection`'s ``on_elicitation``). Over Streamable HTTP
                a request is matched to its call exactly; over stdio the
                protocol does not say, so it goes to the handler of the calls
                in flight if they all have the same one (handlers compare with
                ``==``: an `AgentElicitor` per session), and is declined if
                calls of different handlers are in flight, so that nobody
                answers another session's question.
            on_sampling: Runs the server's ``sampling/createMessage``
                requests that come during this call (an `AgentSampler` runs
                them on the calling agent's model), routed as
                ``on_elicitation`` is. None: they are refused (no model to
                run them on). Never asked when the config's ``sampling`` is
                ``deny``: the capability is not declared then.
            timeout: Seconds to wait for the result; defaults to the config's
                ``call_timeout``. When it runs out the server is pinged, to
                tell a slow tool from a hung server.
            traceparent: A W3C trace context for the call: sent as
                ``params._meta.traceparent`` and, over HTTP, as the request's
                ``traceparent`` header.

        Returns:
            The result; a tool that ran and failed has ``is_error`` set.

        Raises:
            MCPTimeout: No result within ``timeout``; the call was cancelled
                on the server, which still answers pings, and the session is
                still usable.
            MCPNotResponding: The server stopped answering (no result, and
                no answer to a ping within ``ping_timeout``); the connection
                is lost.
            MCPToolError: The server rejected the call (unknown tool, invalid
                arguments) with a JSON-RPC error.
            MCPConnectionLost: The server died or the connection broke.
            MCPClosedError: The session was closed.
            MCPProtocolError: The server's answer violates the protocol.
        """
        tool = self._tools_by_name.get(name) or self._tools_by_registered_name.get(name)
        wire_name = tool.name if tool is not None else name
        limit = self._config.call_timeout if timeout is None else timeout
        self._calls_started += 1
        self._calls_in_flight += 1
        try:
            result = await self._call_tool(
                wire_name,
                arguments,
                on_progress=on_progress,
                on_elicitation=on_elicitation,
                on_sampling=on_sampling,
                limit=limit,
                traceparent=traceparent,
            )
        except MCPTimeout:
            self._calls_timed_out += 1
            raise
        except BaseException:
            self._calls_failed += 1
            raise
        finally:
            self._calls_in_flight -= 1
        outcome = tool_result_from_wire(result)
        if outcome.is_error:
            self._calls_tool_errors += 1
        else:
            self._calls_succeeded += 1
        return outcome

    async def _call_tool(
        self,
        name: str,
        arguments: Mapping[str, object] | None,
        *,
        on_progress: ProgressCallback | None,
        on_elicitation: ElicitationHandler | None,
        on_sampling: SamplingHandler | None,
        limit: float,
        traceparent: str | None = None,
    ) -> types.CallToolResult:
        with trio.CancelScope(deadline=trio.current_time() + limit) as scope:
            relay = _ProgressRelay(on_progress, scope) if on_progress is not None else None
            # `_meta` takes more than the SDK's type names (progressToken): the trace context rides there too.
            meta = cast("types.RequestParamsMeta", {"traceparent": traceparent}) if traceparent is not None else None

            async def call(client: mcp.ClientSession) -> types.CallToolResult:
                return await client.call_tool(name, dict(arguments or {}), progress_callback=relay, meta=meta)

            route = _CallRoute(name, on_elicitation, scope.deadline, on_sampling)
            self._routes.append(route)
            token = _current_call.set(route)
            # The transport carries this task's context to the POST it makes for the call (see `_current_call`).
            trace_token = _traceparent.set(traceparent)
            try:
                result = await self._request(f"tools/call {name!r}", call, tool=name)
            finally:
                _traceparent.reset(trace_token)
                _current_call.reset(token)
                self._routes.remove(route)
                for request_id in [key for key, value in self._related.items() if value is route]:
                    del self._related[request_id]
        if relay is not None and relay.error is not None:
            raise relay.error
        if scope.cancelled_caught:
            raise await self._timed_out(f"tools/call {name!r}", limit)
        return result

    async def list_resources(self, *, timeout: float | None = None) -> tuple[MCPResource, ...]:
        """List the server's resources, following pagination to the end.

        Raises:
            MCPTimeout: The whole listing took longer than ``timeout``.
            MCPServerError: The server answered with an error (for example,
                it has no resources capability).
            MCPConnectionLost: The connection broke.
            MCPClosedError: The session was closed.
        """

        async def page(client: mcp.ClientSession, cursor: str | None) -> types.ListResourcesResult:
            return await client.list_resources(params=_page_params(cursor))

        items = await self._with_timeout(
            "resources/list", timeout, lambda client: _paginate(client, page, "resources/list")
        )
        return tuple(resource_from_wire(item) for item in _resources(items))

    async def read_resource(self, uri: str, *, timeout: float | None = None) -> tuple[MCPResourceContent, ...]:
        """Read one resource; a resource may come in several parts.

        Raises:
            MCPTimeout: No answer within ``timeout``.
            MCPServerError: The server answered with an error (for example,
                the resource does not exist).
            MCPProtocolError: A binary part is not valid base64.
            MCPConnectionLost: The connection broke.
            MCPClosedError: The session was closed.
        """

        async def read(client: mcp.ClientSession) -> types.ReadResourceResult:
            return await client.read_resource(uri)

        result = await self._with_timeout(f"resources/read {uri!r}", timeout, read)
        try:
            return tuple(resource_content_from_wire(content) for content in result.contents)
        except ValueError as exc:
            raise MCPProtocolError(f"MCP server {self._config.name!r}: {exc}", server=self._config.name) from exc

    async def list_prompts(self, *, timeout: float | None = None) -> tuple[MCPPrompt, ...]:
        """List the server's prompt templates, following pagination to the end.

        Raises:
            MCPTimeout: The whole listing took longer than ``timeout``.
            MCPServerError: The server answered with an error.
            MCPConnectionLost: The connection broke.
            MCPClosedError: The session was closed.
        """

        async def page(client: mcp.ClientSession, cursor: str | None) -> types.ListPromptsResult:
            return await client.list_prompts(params=_page_params(cursor))

        items = await self._with_timeout(
            "prompts/list", timeout, lambda client: _paginate(client, page, "prompts/list")
        )
        return tuple(prompt_from_wire(item) for item in _prompts(items))

    async def get_prompt(
        self,
        name: str,
        arguments: Mapping[str, str] | None = None,
        *,
        timeout: float | None = None,
    ) -> MCPPromptResult:
        """Render a prompt template with the given arguments.

        Raises:
            MCPTimeout: No answer within ``timeout``.
            MCPServerError: The server answered with an error (unknown
                prompt, missing argument).
            MCPConnectionLost: The connection broke.
            MCPClosedError: The session was closed.
        """

        async def get(client: mcp.ClientSession) -> types.GetPromptResult:
            return await client.get_prompt(name, dict(arguments or {}))

        result = await self._with_timeout(f"prompts/get {name!r}", timeout, get)
        return prompt_result_from_wire(result)

    async def wait_lost(self) -> NoReturn:
        """Wait until the connection is lost, then raise `MCPConnectionLost`.

        Meant for the task that owns the session: it learns at once that the
        server died even while no request is in flight. It never returns; if
        the session is closed instead, it waits until it is cancelled.

        Raises:
            MCPConnectionLost: Always, once the connection is lost.
        """
        await self._lost.wait()
        raise await self._loss_error(None)

    # -- requests ---------------------------------------------------------

    async def _with_timeout(
        self,
        what: str,
        timeout: float | None,
        call: Callable[[mcp.ClientSession], Awaitable[T]],
    ) -> T:
        limit = self._config.call_timeout if timeout is None else timeout
        with trio.move_on_after(limit):
            return await self._request(what, call)
        raise await self._timed_out(what, limit)

    async def _request(
        self,
        what: str,
        call: Callable[[mcp.ClientSession], Awaitable[T]],
        *,
        tool: str | None = None,
    ) -> T:
        """Run one SDK request, translating what it raises into `MCPError`s."""
        client = await self._require_open(what)
        self._requests_in_flight += 1
        try:
            return await call(client)
        except mcp.MCPError as exc:
            raise await self._translate(exc, what, tool) from exc
        except pydantic.ValidationError as exc:
            raise MCPProtocolError(
                f"MCP server {self._config.name!r} sent an invalid result for {what}: {exc}",
                server=self._config.name,
            ) from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise await self._loss_error(what) from exc
        except RuntimeError as exc:
            # The SDK raises RuntimeError when a tool's structured content
            # does not match its declared output schema.
            if self._state in ("lost", "closed"):
                raise await self._loss_error(what) from exc
            raise MCPProtocolError(
                f"MCP server {self._config.name!r} sent an invalid result for {what}: {exc}",
                server=self._config.name,
            ) from exc
        finally:
            self._requests_in_flight -= 1

    async def _require_open(self, what: str) -> mcp.ClientSession:
        if self._state == "open" and self._client is not None:
            return self._client
        raise await self._loss_error(what)

    async def _translate(self, exc: mcp.MCPError, what: str, tool: str | None) -> MCPError:
        sdk_closed = exc.code == types.CONNECTION_CLOSED and exc.message in _SDK_CLOSED_MESSAGES
        if sdk_closed or self._state in ("lost", "closed"):
            return await self._loss_error(what)
        if exc.code == types.CONNECTION_CLOSED and exc.message.startswith(_SDK_STREAM_FAILURE_PREFIX):
            # Streamable HTTP: this request's response stream broke; the
            # session itself may still work.
            return MCPConnectionLost(
                f"MCP server {self._config.name!r}: the response stream of {what} broke: {exc.message}",
                server=self._config.name,
            )
        message = f"MCP server {self._config.name!r} returned an error for {what}: {exc.message}"
        if tool is not None:
            return MCPToolError(
                message,
                server=self._config.name,
                tool=tool,
                code=exc.code,
                error_message=exc.message,
                data=exc.data,
            )
        return MCPServerError(
            message,
            server=self._config.name,
            code=exc.code,
            error_message=exc.message,
            data=exc.data,
        )

    async def _timed_out(self, what: str, limit: float) -> MCPTimeout | MCPConnectionLost | MCPClosedError:
        """The error for a request that outlived its deadline, once a ping has judged the server.

        `MCPTimeout` if the server answers the ping (it is slow, not hung);
        if it does not, the connection is lost as not responding and this is
        the `MCPNotResponding` every request in flight gets.
        """
        if self._state == "open":
            await self._check_alive()
        if self._not_responding:
            return await self._loss_error(what)
        return self._timeout(what, limit)

    def _timeout(self, what: str, limit: float) -> MCPTimeout:
        return MCPTimeout(
            f"MCP server {self._config.name!r} did not answer {what} within {limit:g} s; the request was cancelled",
            server=self._config.name,
            timeout=limit,
        )

    async def _loss_error(self, what: str | None) -> MCPConnectionLost | MCPClosedError:
        """The error for a request that the end of the connection cut off."""
        if self._state == "open":
            # The SDK saw the connection end before the runner recorded why.
            with trio.move_on_after(SETTLE_TIMEOUT):
                await self._runner_finished.wait()
        if self._state == "closed":
            during = f" ({what})" if what else ""
            return MCPClosedError(
                f"MCP session with {self._config.name!r} is closed{during}",
                server=self._config.name,
            )
        if self._not_responding:
            return self._not_responding_error(what)
        stdio = self._stdio
        if stdio is not None and stdio.exit_code is None:
            with trio.move_on_after(EXIT_CODE_WAIT):
                await stdio.wait_exited()
        reason = self._lost_reason or "the connection closed"
        if stdio is not None:
            reason = stdio.describe_loss(reason)
        tail = stdio.stderr_tail() if stdio is not None else ""
        during = f" during {what}" if what else ""
        return MCPConnectionLost(
            _with_tail(f"MCP server {self._config.name!r}: connection lost{during}: {reason}", tail),
            server=self._config.name,
            exit_code=stdio.exit_code if stdio is not None else None,
            stderr_tail=tail,
        )

    def _not_responding_error(self, what: str | None) -> MCPNotResponding:
        stdio = self._stdio
        tail = stdio.stderr_tail() if stdio is not None else ""
        limit = self._config.ping_timeout
        during = f"; {what} did not complete" if what else ""
        return MCPNotResponding(
            _with_tail(
                f"MCP server {self._config.name!r} is not responding: it did not answer a ping within "
                f"{limit:g} s{during}, so its connection was closed",
                tail,
            ),
            server=self._config.name,
            ping_timeout=limit,
            stderr_tail=tail,
        )

    # -- the watchdog -----------------------------------------------------

    async def _check_alive(self) -> bool:
        """Have the watchdog ping the server (or join the ping under way); whether it answered."""
        if self._probe is None:
            self._probe = _Probe()
            self._probe_wanted.set()
        probe = self._probe
        await probe.done.wait()
        return probe.alive

    async def _watch(self) -> None:
        """Ping the server on request, and every ``ping_interval`` seconds, idle or not.

        Runs in the `open_connection` nursery until the session closes. The
        pings run here, not in the requests' tasks, so that a caller giving
        up cannot cut a ping short for the others waiting on its verdict. A
        ping not answered within ``ping_timeout`` marks the connection lost
        as not responding, which ends it like any other loss.
        """
        with self._watch_scope:
            try:
                while self._state in ("starting", "open"):
                    with trio.move_on_after(self._config.ping_interval):
                        await self._probe_wanted.wait()
                    self._probe_wanted = trio.Event()
                    probe = self._probe
                    if probe is None:
                        # Idle or not: a hung server (SIGSTOP, a deadlock)
                        # is found before anyone calls it.
                        probe = self._probe = _Probe()
                    probe.alive = await self._ping()
                    self._probe = None
                    if not probe.alive:
                        self._mark_not_responding()
                    probe.done.set()
            finally:
                if self._probe is not None:  # closing: release whoever waits
                    self._probe.done.set()
                    self._probe = None

    async def _ping(self) -> bool:
        """Whether the server answered a ping within ``ping_timeout``.

        An error answer is an answer; a connection that breaks meanwhile is
        reported by the loss, not as a hang.
        """
        client = self._client
        if self._state != "open" or client is None:
            return True
        self._pings += 1
        with trio.move_on_after(self._config.ping_timeout):
            with contextlib.suppress(
                mcp.MCPError, pydantic.ValidationError, anyio.BrokenResourceError, anyio.ClosedResourceError
            ):
                await client.send_ping()
            return True
        self._pings_unanswered += 1
        return False

    def _mark_not_responding(self) -> None:
        if self._state == "open":
            self._not_responding = True
            self._mark_lost(
                f"the server is not responding: it did not answer a ping within {self._config.ping_timeout:g} s"
            )

    # -- state --------------------------------------------------------

    def _mark_lost(self, reason: str) -> None:
        if self._state in ("starting", "open"):
            if self._state == "open":
                logger.warning("MCP server %r: connection lost: %s", self._config.name, reason)
            self._state = "lost"
            self._lost_reason = reason
            self._done.set()
            self._lost.set()

    def _close_nowait(self) -> None:
        if self._state in ("starting", "open"):
            self._state = "closed"
        self._done.set()
        self._delivery_scope.cancel()
        self._watch_scope.cancel()
        if self._runner_scope is not None:
            # Bound the graceful part of closing (the HTTP DELETE); the stdio
            # shutdown runs shielded and bounds itself.
            self._runner_scope.deadline = min(self._runner_scope.deadline, trio.current_time() + CLOSE_TIMEOUT)

    def _set_tools(self, wire_tools: list[types.Tool]) -> tuple[MCPTool, ...]:
        names = register_tool_names(self._config.name, [tool.name for tool in wire_tools])
        tools = tuple(tool_from_wire(self._config.name, names[tool.name], tool) for tool in wire_tools)
        self._tools = tools
        self._tools_by_name = {tool.name: tool for tool in tools}
        self._tools_by_registered_name = {tool.registered_name: tool for tool in tools}
        return tools

    # -- the runner task --------------------------------------------------

    async def _run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the transport and the SDK session for the session's lifetime.

        Runs in the `open_connection` nursery. Before ``started`` every
        failure is raised as an `MCPStartError`; after it, a failure marks
        the connection lost instead of raising, so the caller's block and the
        other tasks carry on and learn of it from their requests.
        """
        started = False
        deadline = trio.current_time() + self._config.connect_timeout
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                self._runner_scope = scope
                while True:
                    try:
                        async with contextlib.AsyncExitStack() as stack:
                            client = await self._connect(stack)
                            await self._handshake(client)
                            self._client = client
                            self._state = "open"
                            scope.deadline = math.inf
                            started = True
                            task_status.started()
                            await self._done.wait()
                    except BaseException as exc:
                        failures = _failures(exc)
                        if not failures or not all(isinstance(f, Exception) for f in failures):
                            raise  # cancellation, KeyboardInterrupt and the like pass through
                        cause = failures[0]
                        if isinstance(cause, MCPStartError | MCPConfigError):  # not spawned; auth's env unset
                            raise cause from cause.__cause__
                        if not started and self._falls_back_to_sse():
                            continue  # the same deadline covers both attempts
                        if not started:
                            raise self._start_error(cause) from cause
                        if self._state == "closed":
                            logger.warning("MCP server %r: error while closing: %s", self._config.name, cause)
                        self._mark_lost(_describe_failure(cause))
                    break
            if not started and scope.cancelled_caught:
                raise self._handshake_timeout()
        finally:
            self._runner_finished.set()

    def _falls_back_to_sse(self) -> bool:
        """After a failed Streamable HTTP start: whether to try the legacy HTTP+SSE transport instead.

        The spec's backwards compatibility rule: a POST of the initialize
        request answered 404 or 405 means a server of the 2024-11-05
        HTTP+SSE transport; a GET of the same URL opens its event stream.
        """
        if self._config.url is None or self._legacy_sse or self._first_post_status not in (404, 405):
            return False
        logger.info(
            "MCP server %r answered the Streamable HTTP initialize with HTTP %s; trying the HTTP+SSE transport",
            self._config.name,
            self._first_post_status,
        )
        self._legacy_sse = True
        self._last_http_error = None
        # The first attempt's reader saw its stream end and marked the
        # connection lost; nothing else runs before the start, so start over.
        self._state = "starting"
        self._lost_reason = None
        self._done = trio.Event()
        self._lost = trio.Event()
        return True

    def _http_client(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """The HTTP client of either transport: the config's headers, our timeouts, the status noted."""
        return httpx2.AsyncClient(
            headers={**dict(self._config.headers), **(headers or {})},
            timeout=timeout or HTTP_TIMEOUT,
            event_hooks={"request": [_add_traceparent], "response": [self._note_http_response]},
            auth=auth,
        )

    async def _connect(self, stack: contextlib.AsyncExitStack) -> mcp.ClientSession:
        transport: Transport
        if self._config.command is not None:
            transport = self._stdio_transport()
        else:
            assert self._config.url is not None
            auth = None
            if self._config.auth is not None:
                auth = build_oauth(
                    self._config.auth,
                    server=self._config.name,
                    server_url=self._config.url,
                    storage=self._auth_storage if self._auth_storage is not None else MemoryTokenStorage(),
                    announce=self._announce_authorization,
                    wait=self._waiting_on_a_person,
                    on_error=self._note_auth_error,
                )
            if self._legacy_sse:
                transport = sse_client(self._config.url, httpx_client_factory=self._http_client, auth=auth)
            else:
                http = await stack.enter_async_context(self._http_client(auth=auth))
                transport = streamable_http_client(self._config.url, http_client=http)
        upstream, write = await stack.enter_async_context(transport)
        tapped_send, tapped_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        # Normally closed by the tap and the SDK; these cover a failed start.
        stack.callback(tapped_receive.close)
        stack.callback(tapped_send.close)
        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(self._tap, upstream, tapped_send)
        # Unwinds before the nursery: the tap is cancelled once the SDK is done.
        stack.callback(nursery.cancel_scope.cancel)
        return await stack.enter_async_context(
            mcp.ClientSession(
                tapped_receive,
                write,
                client_info=_client_info(),
                elicitation_callback=self._elicit,
                # Declaring a capability is passing its callback (the SDK's rule).
                sampling_callback=self._sample if self._config.sampling != "deny" else None,
                list_roots_callback=self._list_roots if self._roots is not None else None,
            )
        )

    async def _note_http_response(self, response: httpx2.Response) -> None:
        # The SDK turns an HTTP error into a generic JSON-RPC error and drops
        # the status; keep the last one so a failed start can name it.
        if self._first_post_status is None and response.request.method == "POST":
            self._first_post_status = response.status_code
        if response.status_code >= 400:
            self._last_http_error = f"HTTP {response.status_code} {response.reason_phrase}"

    def _note_auth_error(self, exc: Exception) -> None:
        # The SDK's transport ends the connection with a generic error when
        # an authorization flow fails; keep the reason for the start error.
        self._auth_error = exc

    def _announce_authorization(self, url: str) -> None:
        if self._on_authorization is not None:
            self._on_authorization(url)
        else:
            logger.warning("MCP server %r needs authorization: open %s", self._config.name, url)

    @contextlib.contextmanager
    def _waiting_on_a_person(self) -> Iterator[None]:
        """Hold the start-up deadline while a person authorizes; it resumes with what was left."""
        scope = self._runner_scope
        if scope is None or self._state != "starting" or math.isinf(scope.deadline):
            yield
            return
        left = scope.deadline - trio.current_time()
        scope.deadline = math.inf
        try:
            yield
        finally:
            if self._state == "starting":  # closing sets a deadline of its own
                scope.deadline = trio.current_time() + max(left, 0.0)

    @contextlib.asynccontextmanager
    async def _stdio_transport(self) -> AsyncIterator[tuple[ReadReceive, WriteSend]]:
        async with open_stdio_transport(self._config, on_lost=self._mark_lost, on_stderr_line=self._stderr_line) as (
            server,
            read_receive,
            write_send,
        ):
            self._stdio = server
            yield read_receive, write_send

    async def _handshake(self, client: mcp.ClientSession) -> None:
        result = await client.initialize()
        self._server_info = server_info_from_wire(result)
        self._capabilities = capabilities_from_wire(result.capabilities)
        level = self._config.log_level
        if level is not None and result.capabilities.logging is not None:
            request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=level))  # type: ignore[arg-type]
            try:
                await client.send_request(request, types.EmptyResult)
            except mcp.MCPError as exc:  # a server that cannot set its level still serves
                logger.warning("MCP server %r refused logging/setLevel %s: %s", self._config.name, level, exc.message)
        if result.capabilities.tools is not None:

            async def page(client: mcp.ClientSession, cursor: str | None) -> types.ListToolsResult:
                return await client.list_tools(params=_page_params(cursor))

            self._set_tools(_wire_tools(await _paginate(client, page, "tools/list")))

    def _start_error(self, cause: BaseException) -> MCPStartError:
        name = self._config.name
        stdio = self._stdio
        exit_code = stdio.exit_code if stdio is not None else None
        tail = stdio.stderr_tail() if stdio is not None else ""
        if self._auth_error is not None:
            why = f"authorization failed: {_describe_failure(self._auth_error)}"
        elif isinstance(cause, mcp.MCPError) and cause.code == types.CONNECTION_CLOSED:
            if exit_code is not None:
                why = f"the server process {describe_exit(exit_code)} before completing the handshake"
            else:
                why = f"the connection closed during the handshake ({self._lost_reason or cause.message})"
        elif isinstance(cause, mcp.MCPError):
            why = f"the server refused the handshake (initialize, tools/list): {_describe_failure(cause)}"
            if self._last_http_error is not None:
                why += f" after {self._last_http_error}"
        elif isinstance(cause, httpx2.HTTPError | OSError):
            why = f"could not reach {self._config.url}: {_describe_failure(cause)}"
        else:
            why = _describe_failure(cause)
        if self._legacy_sse:
            why += (
                f" (the Streamable HTTP initialize was answered HTTP {self._first_post_status}, "
                "so the legacy HTTP+SSE transport was tried too)"
            )
        return MCPStartError(
            _with_tail(f"MCP server {name!r} failed to start: {why}", tail),
            server=name,
            exit_code=exit_code,
            stderr_tail=tail,
        )

    def _handshake_timeout(self) -> MCPHandshakeTimeout:
        stdio = self._stdio
        tail = stdio.stderr_tail() if stdio is not None else ""
        limit = self._config.connect_timeout
        return MCPHandshakeTimeout(
            _with_tail(
                f"MCP server {self._config.name!r} did not complete the handshake within {limit:g} s (connect_timeout)",
                tail,
            ),
            server=self._config.name,
            timeout=limit,
            exit_code=stdio.exit_code if stdio is not None else None,
            stderr_tail=tail,
        )

    async def _tap(self, upstream: AsyncIterable[SessionMessage | Exception], downstream: ReadSend) -> None:
        """Pass inbound messages to the SDK, noting notifications in wire order.

        The SDK hands notifications to callbacks from a task each, and trio
        may run those in any order; here they are seen in the order the
        server sent them. The end of the inbound stream is the end of the
        connection.
        """
        async with downstream:
            try:
                async for item in upstream:
                    self._observe(item, getattr(upstream, "last_context", None))
                    await downstream.send(item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the SDK session is gone: we are closing
        self._mark_lost("the server closed the connection")

    def _observe(self, item: SessionMessage | Exception, sender: contextvars.Context | None) -> None:
        if isinstance(item, Exception):
            self._invalid_messages += 1
            return
        self._messages_received += 1
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            # Streamable HTTP: a request on a tool call's response stream
            # arrives with that call's context (see _current_call).
            route = sender.get(_current_call) if sender is not None else None
            if route is not None and route in self._routes:
                self._related[message.id] = route
            return
        if not isinstance(message, types.JSONRPCNotification):
            return
        if message.method == "notifications/tools/list_changed":
            with contextlib.suppress(trio.WouldBlock):
                self._refresh_send.send_nowait(None)
        elif message.method in _NOTICES:
            self._notice(_NOTICES[message.method], message.params or {})
        elif message.method == "notifications/message" and self._on_log is not None:
            try:
                params = types.LoggingMessageNotificationParams.model_validate(message.params or {})
            except pydantic.ValidationError:
                self._invalid_messages += 1
                return
            self._emit_log(
                MCPLogMessage(
                    server=self._config.name,
                    source="notification",
                    level=str(params.level),
                    logger=params.logger,
                    data=params.data,
                )
            )

    def _notice(self, kind: str, params: Mapping[str, Any]) -> None:
        if self._on_notice is None:
            return
        data: dict[str, Any] = {}
        if kind == "resource_updated":
            uri = params.get("uri")
            if not isinstance(uri, str):
                self._invalid_messages += 1
                return
            data["uri"] = uri
        try:
            self._on_notice(kind, data)
        except Exception:  # a callback's bug must not end the connection; the log says so
            logger.exception("MCP server %r: handling its %s notification failed", self._config.name, kind)

    def _stderr_line(self, line: str) -> None:
        if self._on_log is not None:
            self._emit_log(
                MCPLogMessage(server=self._config.name, source="stderr", level="info", logger=None, data=line)
            )

    def _emit_log(self, message: MCPLogMessage) -> None:
        try:
            self._log_send.send_nowait(message)
        except trio.WouldBlock:
            self._logs_dropped += 1

    # -- requests from the server -------------------------------------------

    async def _elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """Answer ``elicitation/create``; runs in a task of the SDK's (see `call_tool`)."""
        self._elicitations += 1
        route, handler = self._route_elicitation(context.request_id)
        tool = route.tool if route is not None else None
        if isinstance(params, types.ElicitRequestURLParams):
            request = MCPElicitation(self._config.name, params.message, "url", url=params.url, tool=tool)
        else:
            schema = dict(params.requested_schema)
            request = MCPElicitation(self._config.name, params.message, "form", schema, tool=tool)
        if handler is None:
            self._elicitations_unrouted += 1
            logger.warning(
                "MCP server %r asked for input while calls of different sessions were in flight, and stdio does "
                "not say which call it belongs to; declined it so that nobody answers another session's question",
                self._config.name,
            )
            result = DECLINE
        else:
            now = trio.current_time()
            deadline = route.deadline if route is not None else now + self._config.call_timeout
            deadline -= min(ELICITATION_MARGIN, max(deadline - now, 0.0) / 4)
            try:
                result = await wait_elicitation(handler, request, deadline)
            except Exception as exc:  # a handler's bug: the server hears of it, and so does the log
                logger.exception("MCP server %r: answering its elicitation failed", self._config.name)
                return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the client failed to answer: {exc}")
        return _elicit_result(result)

    async def _sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        """Answer ``sampling/createMessage``; runs in a task of the SDK's, routed as an elicitation is."""
        self._samplings += 1
        # No call, or calls of several sessions over stdio (which does not say whose): nobody may answer.
        route = self._route(context.request_id)
        sampler = route.sampler if route is not None and route.sampler is not None else refuse_sampling
        request = MCPSampling(
            server=self._config.name,
            messages=tuple(_sampling_message(message) for message in params.messages),
            system_prompt=params.system_prompt,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            tool=route.tool if route is not None else None,
        )
        deadline = route.deadline if route is not None else trio.current_time() + self._config.call_timeout
        now = trio.current_time()
        deadline -= min(ELICITATION_MARGIN, max(deadline - now, 0.0) / 4)
        try:
            with trio.fail_after(max(deadline - now, 0.0)):
                result = await sampler(request)
        except SamplingRefused as exc:
            self._samplings_refused += 1
            return types.ErrorData(code=-1, message=str(exc))
        except trio.TooSlowError:
            self._samplings_refused += 1
            return types.ErrorData(
                code=-1, message="the sampling request was not answered before its tool call's deadline"
            )
        except Exception as exc:  # the model failed: the server hears why, so does the log
            logger.warning("MCP server %r: its sampling request failed: %s", self._config.name, exc)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the client's model failed: {exc}")
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=result.text),
            model=result.model,
            stop_reason=_stop_reason(result.stop_reason),
        )

    def _route(self, request_id: types.RequestId) -> _CallRoute | None:
        """The call a server request belongs to: exactly (HTTP), or the one call, or the calls of one session."""
        route = self._related.pop(request_id, None)
        if route is not None:
            return route
        routes = list(self._routes)
        if routes and all(r.sampler == routes[0].sampler and r.handler == routes[0].handler for r in routes):
            return routes[0]
        return None

    async def _list_roots(self, context: ClientRequestContext) -> types.ListRootsResult:  # noqa: ARG002 - SDK's signature
        """Answer ``roots/list`` with the directories the ``roots`` function names now."""
        assert self._roots is not None  # the capability is declared only with it
        roots = [
            types.Root(uri=Path(path).as_uri(), name=Path(path).name or path)  # type: ignore[arg-type]
            for path in self._roots()
        ]
        return types.ListRootsResult(roots=roots)

    async def notify_roots_changed(self) -> None:
        """Tell the server the roots changed (``notifications/roots/list_changed``); it asks again.

        Raises:
            MCPConnectionLost: The connection broke.
            MCPClosedError: The session was closed.
        """
        client = await self._require_open("notifications/roots/list_changed")
        try:
            await client.send_notification(types.RootsListChangedNotification())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise await self._loss_error("notifications/roots/list_changed") from exc

    async def subscribe_resource(self, uri: str, *, timeout: float | None = None) -> None:
        """Subscribe to updates of one resource (``resources/subscribe``); each comes to ``on_notice``.

        Raises:
            MCPServerError: The server refused (no subscribe capability, unknown URI).
            MCPTimeout, MCPConnectionLost, MCPClosedError: As for any request.
        """

        async def subscribe(client: mcp.ClientSession) -> object:
            request = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri))
            return await client.send_request(request, types.EmptyResult)

        await self._with_timeout(f"resources/subscribe {uri!r}", timeout, subscribe)

    async def unsubscribe_resource(self, uri: str, *, timeout: float | None = None) -> None:
        """End a subscription (``resources/unsubscribe``); see `subscribe_resource`."""

        async def unsubscribe(client: mcp.ClientSession) -> object:
            request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
            return await client.send_request(request, types.EmptyResult)

        await self._with_timeout(f"resources/unsubscribe {uri!r}", timeout, unsubscribe)

    def _route_elicitation(self, request_id: types.RequestId) -> tuple[_CallRoute | None, ElicitationHandler | None]:
        """The call a server request belongs to, and who answers it (None: nobody may)."""
        route = self._related.pop(request_id, None)
        if route is not None:
            return route, route.handler or self._on_elicitation
        routes = list(self._routes)
        if not routes:
            return None, self._on_elicitation
        handlers = [r.handler or self._on_elicitation for r in routes]
        if all(handler == handlers[0] for handler in handlers):
            return routes[0], handlers[0]
        return None, None

    # -- the delivery task ------------------------------------------------

    async def _deliver(self) -> None:
        """Run ``on_log`` and ``on_tools_changed`` in this task, in order.

        Runs in the `open_connection` nursery, so an exception from either
        callback propagates out of the ``async with`` block (after the block
        is cancelled), as any failure of a task in a nursery does.
        """
        with self._delivery_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._deliver_logs)
                nursery.start_soon(self._refresh_tools)

    async def _deliver_logs(self) -> None:
        async for message in self._log_receive:
            assert self._on_log is not None  # nothing is queued without it
            self._on_log(message)

    async def _refresh_tools(self) -> None:
        async for _ in self._refresh_receive:
            if self._state != "open":
                continue

            async def page(client: mcp.ClientSession, cursor: str | None) -> types.ListToolsResult:
                return await client.list_tools(params=_page_params(cursor))

            try:
                wire_tools = await self._with_timeout(
                    "tools/list", None, lambda client: _paginate(client, page, "tools/list")
                )
            except (MCPConnectionLost, MCPClosedError):
                continue  # reported to every request and to wait_lost()
            except MCPError as exc:
                self._refresh_failures += 1
                logger.warning(
                    "MCP server %r: could not refresh the tool list after list_changed; keeping the old one: %s",
                    self._config.name,
                    exc,
                )
                continue
            tools = self._set_tools(_wire_tools(wire_tools))
            self._refreshes += 1
            if self._on_tools_changed is not None:
                self._on_tools_changed(tools)


def _sampling_message(message: types.SamplingMessage) -> MCPSamplingMessage:
    """A server's sampling message as text and images (audio, tool blocks: described in the text)."""
    blocks = message.content if isinstance(message.content, list) else [message.content]
    texts: list[str] = []
    images: list[tuple[str, str]] = []
    for block in blocks:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            images.append((block.mime_type, block.data))
        elif isinstance(block, types.AudioContent):
            texts.append(f"[audio: {block.mime_type}]")
        else:
            texts.append(f"[{getattr(block, 'type', 'content')}]")
    role: Literal["user", "assistant"] = "assistant" if message.role == "assistant" else "user"
    return MCPSamplingMessage(role=role, text="\n".join(texts), images=tuple(images))


def _stop_reason(reason: str) -> str:
    """Our stop reason in the sampling result's words (``endTurn``, ``maxTokens``, ``stopSequence``)."""
    return {"end_turn": "endTurn", "max_tokens": "maxTokens", "stop_sequence": "stopSequence"}.get(reason, reason)


def _elicit_result(result: MCPElicitationResult) -> types.ElicitResult:
    content = dict(result.content) if result.action == "accept" and result.content is not None else None
    return types.ElicitResult(action=result.action, content=content)


def _page_params(cursor: str | None) -> types.PaginatedRequestParams | None:
    return types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None


_Page = types.ListToolsResult | types.ListResourcesResult | types.ListPromptsResult
_Item = types.Tool | types.Resource | types.Prompt


async def _paginate(
    client: mcp.ClientSession,
    fetch: Callable[[mcp.ClientSession, str | None], Awaitable[_Page]],
    what: str,
) -> list[_Item]:
    """Fetch every page of a listing, following ``nextCursor``."""
    items: list[_Item] = []
    seen: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        result = await fetch(client, cursor)
        if isinstance(result, types.ListToolsResult):
            items.extend(result.tools)
        elif isinstance(result, types.ListResourcesResult):
            items.extend(result.resources)
        else:
            items.extend(result.prompts)
        cursor = result.next_cursor
        if cursor is None:
            return items
        if cursor in seen:
            raise MCPProtocolError(f"{what}: the server repeated the pagination cursor {cursor!r}")
        seen.add(cursor)
    raise MCPProtocolError(f"{what}: more than {MAX_PAGES} pages")


def _wire_tools(items: list[_Item]) -> list[types.Tool]:
    # A tool listed twice (across pages) counts once, first listing kept.
    unique: dict[str, types.Tool] = {}
    for item in items:
        if isinstance(item, types.Tool):
            unique.setdefault(item.name, item)
    return list(unique.values())


def _resources(items: list[_Item]) -> list[types.Resource]:
    return [item for item in items if isinstance(item, types.Resource)]


def _prompts(items: list[_Item]) -> list[types.Prompt]:
    return [item for item in items if isinstance(item, types.Prompt)]


def _reraise_collapsed(group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """Re-raise the one exception in a (nested) single-member group.

    trio wraps whatever leaves a nursery in an ExceptionGroup, including the
    caller's own exception from the ``async with`` body; callers of
    `open_connection` should see ``MCPTimeout``, not a group holding it. The
    exception's ``__context__`` is restored so its traceback reads as if the
    group never existed.
    """
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if exc is group:
        raise group
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context


@contextlib.asynccontextmanager
async def open_connection(
    config: ServerConfig,
    *,
    on_tools_changed: ToolsChangedCallback | None = None,
    on_log: LogCallback | None = None,
    on_elicitation: ElicitationHandler | None = None,
    auth_storage: TokenStorage | None = None,
    on_authorization: AuthorizationCallback | None = None,
    on_notice: NoticeCallback | None = None,
    roots: RootsFunction | None = None,
) -> AsyncIterator[MCPSession]:
    """Connect to an MCP server and keep the connection for the ``async with`` block.

    On entry: start the server (stdio) or reach it (Streamable HTTP), run
    the initialize handshake and fetch the tool list, all within the
    config's ``connect_timeout``. On exit (normal, error or cancellation):
    close the connection; for stdio, close the server's stdin, then SIGTERM
    and, after a short grace, SIGKILL its whole process group, so nothing it
    started outlives the session.

    Must run inside trio.

    Args:
        config: Which server, and the timeouts to use.
        on_tools_changed: Called with the new tool list each time the server
            sends ``notifications/tools/list_changed`` and the list has been
            re-fetched. Runs in the session's delivery task; must not block.
            If it raises, the block is cancelled and the exception
            propagates from the ``async with``.
        on_log: Called with each log notification the server sends and each
            line it writes to stderr (stdio), in order. Same task and
            failure rule as ``on_tools_changed``. At most 256 messages wait
            for it; more are dropped and counted in `MCPSession.statistics`.
        on_elicitation: Answers ``elicitation/create`` requests that no
            tool call's own handler answers (see `MCPSession.call_tool`).
            Default: `answer_with_defaults`, SEP-1034's answer when nobody
            can be asked (accept with the schema's defaults when they make a
            valid answer, else decline). Either way the ``elicitation``
            capability (form and URL mode) is declared.
        auth_storage: Where OAuth tokens and the client registration are
            kept (config ``auth``); default: in memory, for this session only.
        on_authorization: Called with the authorization URL a person must
            open (``auth.redirect_mode = "browser"``), once weald listens on
            the redirect URI; must not block. Default: a log warning.
        on_notice: Called with ``(kind, data)`` for the server's
            ``resources/list_changed`` (``resources_changed``),
            ``prompts/list_changed`` (``prompts_changed``) and
            ``resources/updated`` (``resource_updated``, data ``{"uri"}``)
            notifications, in wire order, from the task reading the
            server; must not block. An exception from it is logged.
        roots: Returns the directories the server may work in, for its
            ``roots/list`` requests; with it the ``roots`` capability (with
            ``listChanged``) is declared, see `MCPSession.notify_roots_changed`.

    The ``sampling`` capability is declared unless the config's
    ``sampling`` is ``deny``; requests are run by the handler of the tool
    call they come during (`MCPSession.call_tool`'s ``on_sampling``).

    Yields:
        The open session.

    Raises:
        MCPConfigError: The config is disabled.
        MCPStartError: The server could not be started or reached, exited
            or refused the handshake; it carries the exit status and the
            tail of its stderr when there are any.
        MCPHandshakeTimeout: Start-up took longer than ``connect_timeout``
            (not counting time spent waiting for a person to authorize).
        MCPConfigError: An environment variable that ``auth`` names is unset,
            or one a ``${NAME}`` uses (without a default).
    """
    if not config.enabled:
        raise MCPConfigError(f"MCP server {config.name!r} is disabled in its config", server=config.name)
    config = config.resolved()  # ${VAR} expanded here, for this connection only
    session = MCPSession._create(
        config,
        on_tools_changed,
        on_log,
        on_elicitation=on_elicitation,
        auth_storage=auth_storage,
        on_authorization=on_authorization,
        on_notice=on_notice,
        roots=roots,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session._run)
            nursery.start_soon(session._deliver)
            nursery.start_soon(session._watch)
            try:
                yield session
            finally:
                session._close_nowait()
    except BaseExceptionGroup as group:
        _reraise_collapsed(group)
