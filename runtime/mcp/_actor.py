"""`MCPConnection`: one MCP server as a supervised actor; `MCPSupervisor`: the ``mcp`` subtree.

::

    /mcp (MCPSupervisor, one_for_one, backoff per child)
    ├── /mcp/everything   MCPConnection
    └── /mcp/time         MCPConnection

An `MCPConnection` owns one `MCPSession` for its whole life: a long-lived
``run_io`` task holds ``open_connection``'s ``async with`` open, so the
server process (or HTTP session) lives exactly as long as the actor. Every
request to the server runs as a ``run_io`` task of its own, so requests run
concurrently and the actor's mailbox is never held by server I/O; results
come back to the actor as messages, in its own context.

How a tool call travels::

    agent's tool runner                 MCPConnection actor              loop
    ToolRoute(ctx, **args) --tell CallTool(reply)--> start run_io -----> session.call_tool
          await reply  <------------ reply completed <-- io task ends --'
                                      (_Finished: bookkeeping)

Failure model (each incarnation of the actor is one connection, as in OTP):

- the server dies or its connection breaks: requests in flight end with
  `MCPConnectionLost`, the actor crashes, its tools are unregistered, and its
  supervisor restarts it after a backoff; the new actor reconnects and
  registers the tools again;
- a request outlives ``call_timeout``: the session pings the server; if it
  answers within ``ping_timeout`` the tool is merely slow, the request ends
  with `MCPTimeout` (an error result) and the connection stays;
- the server hangs (a ping, after a timeout or the periodic one while
  requests are in flight, goes unanswered): the session ends the connection
  (for stdio, killing the process group), every request in flight ends
  with `MCPNotResponding`, and the actor crashes as for a lost connection,
  so it is restarted after its backoff;
- the server never starts, or does not finish its handshake within
  ``connect_timeout``: the actor reports why (with the stderr tail) and
  crashes, so restarts go through the backoff like any crash;
- the server needs a person to authorize (OAuth, browser mode): the actor
  publishes ``mcp.auth_required`` with the URL (status ``authorizing``);
  the tools are registered once the person has authorized, and if nobody
  does within ``auth.authorization_timeout`` the start fails like any other.

Connecting never blocks the tree (OTP's rule: ``init`` returns at once, the
slow work follows): ``on_start`` only starts the connection task and
returns, so the supervisor starts every connection at once, they connect
concurrently, and the supervisor's mailbox (restarts, ``servers``) is never
held by a server's handshake. A server's tools appear in the registry when
it is connected (agents see them from their next step) and stay there while
it restarts, so a call to one meets a clear "restarting, retry in N s" rather
than "no such tool".
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import shlex
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

import attrs
import outcome
import trio
from weald.runtime import (
    REDACTED,
    Actor,
    ActorDeadError,
    Future,
    IOCancelledError,
    IOHandle,
    is_secret_name,
    redact,
    redact_text,
    register_secret,
)
from weald.supervisors import Backoff, ChildSpec, Supervisor
from weald.tools import Permission, ToolRegistry

from ._config import ServerConfig
from ._exceptions import (
    MCPClosedError,
    MCPConfigError,
    MCPConnectionLost,
    MCPError,
    MCPNotResponding,
    MCPTimeout,
)
from ._names import sanitize_tool_name

# The MCP SDK (and jsonschema) load with the first connection, not with this
# module: a daemon with no MCP server configured runs an empty MCPSupervisor
# and never imports them (about 40 MiB).
if TYPE_CHECKING:
    from types import TracebackType

    from ._registry import CallTool, ToolRoute
    from ._session import MCPSession
    from ._values import (
        MCPLogMessage,
        MCPPrompt,
        MCPPromptResult,
        MCPResource,
        MCPResourceContent,
        MCPServerInfo,
        MCPSessionStatistics,
        MCPTool,
    )

__all__ = ["ConnectionStatus", "MCPConnection", "MCPConnectionSnapshot", "MCPSupervisor", "mcp_supervisor_spec"]

logger = logging.getLogger("weald.runtime.mcp")

T = TypeVar("T")

ConnectionStatus = Literal["connecting", "authorizing", "running", "restarting", "failed", "stopped"]

# How long on_stop/on_failure wait for the connection to close: the stdio
# shutdown (stdin EOF, SIGTERM, SIGKILL of the group) takes about 6 s at
# most, an HTTP close 5 s.
CLOSE_WAIT = 8.0
# A connection child's shutdown in its supervisor: CLOSE_WAIT plus margin.
CONNECTION_SHUTDOWN = 10.0
# The restart backoff of MCP connections unless configured otherwise.
DEFAULT_BACKOFF = Backoff(initial=0.5, factor=2.0, cap=30.0, reset_after=60.0)


def default_start_rate() -> float:
    """Server starts per second unless configured: four per CPU.

    A server's start is a burst of CPU (an interpreter loading its packages:
    about half a CPU-second for a Python server); forty at once would leave
    the daemon's own start a fortieth of the machine. Four per CPU per
    second keeps every CPU busy with starts and the daemon responsive.
    """
    return 4.0 * (os.cpu_count() or 1)


class StartGate:
    """Spaces server starts out to at most ``rate`` per second, first come first served.

    A start waits for its turn only, and holds nothing after it: a server
    that hangs in its handshake delays no other. Used on the loop thread only.
    """

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ValueError(f"the MCP start rate must be a positive number of starts per second, got {rate!r}")
        self._interval = 1.0 / rate
        self._next = -math.inf

    async def wait_turn(self) -> None:
        """Sleep until this start's turn (at once when starts are spaced out enough already)."""
        now = trio.current_time()
        turn = max(now, self._next)
        self._next = turn + self._interval
        await trio.sleep_until(turn)


_request_ids = itertools.count(1)


@attrs.frozen
class MCPConnectionSnapshot:
    """One MCP server's connection as the daemon shows it; no secrets inside.

    Attributes:
        path: the connection actor's path (``/mcp/<server>``).
        server: the configured server name.
        transport: ``"stdio"`` or ``"http"``.
        endpoint: the command line or URL, known secrets cut out, URL query
            and credentials redacted.
        headers: the configured HTTP header names, every value redacted.
        env: the names of the extra environment variables (values hidden).
        status: ``connecting`` (start-up: its turn to start, see
            `StartGate`; spawning or reaching it, the handshake, the first
            tools/list), ``authorizing`` (waiting for a
            person to authorize weald, see ``mcp.auth_required``),
            ``running`` (connected; its tools are registered),
            ``restarting`` (the connection was lost; a restart follows at
            ``retry_at``), ``failed`` (the last start failed; a retry
            follows at ``retry_at``) or ``stopped``.
        tools: the registered names of the server's tools, sorted.
        calls_in_flight: tool calls waiting for the server.
        requests_in_flight: other requests (resources, prompts) waiting.
        restarts: how many times the connection was restarted.
        failed_starts: consecutive failed starts (0 once connected).
        attempt: the backoff's count of consecutive restarts (0 until the
            first; it starts over once the server stayed up a while).
        retry_at: when the next attempt starts (a `time.time` value), while
            ``restarting`` or ``failed``; None otherwise.
        consecutive_timeouts: requests that timed out since the server last
            answered (informational: a server that still answers pings is
            slow, not hung, and keeps its connection).
        last_error: why the connection last failed, with the server's stderr
            tail when there is one; None if it never failed.
        server_info: who the server said it is, once connected.
        session: the live session's counters (the last session's once it ended).
    """

    path: str
    server: str
    transport: Literal["stdio", "http"]
    endpoint: str
    headers: Mapping[str, str] = attrs.field(hash=False)
    env: tuple[str, ...]
    status: ConnectionStatus
    tools: tuple[str, ...]
    calls_in_flight: int
    requests_in_flight: int
    restarts: int
    failed_starts: int
    consecutive_timeouts: int
    last_error: str | None
    server_info: MCPServerInfo | None
    session: MCPSessionStatistics | None
    attempt: int = 0
    retry_at: float | None = None


class _ServerRecord:
    """What one server's connection shows, kept across the actor's restarts.

    Each restart makes a new `MCPConnection` (a new connection, as in OTP);
    the supervisor hands every incarnation the same record, so restarts and
    the last error stay visible while the actor is down or starting over.
    Touched only on the loop thread (by the actor and its supervisor).
    """

    __slots__ = (
        "attempt",
        "calls_in_flight",
        "config",
        "consecutive_timeouts",
        "failed_starts",
        "last_error",
        "path",
        "requests_in_flight",
        "retry_at",
        "server_info",
        "session",
        "starts",
        "statistics",
        "status",
        "subscriptions",
        "tools",
    )

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.path = ""
        self.starts = 0
        self.failed_starts = 0
        self.attempt = 0
        self.retry_at: float | None = None
        self.subscriptions: set[str] = set()  # resource URIs, subscribed again by every incarnation
        self.status: ConnectionStatus = "connecting"
        self.last_error: str | None = None
        self.server_info: MCPServerInfo | None = None
        self.tools: tuple[str, ...] = ()
        self.session: MCPSession | None = None
        self.statistics: MCPSessionStatistics | None = None
        self.calls_in_flight = 0
        self.requests_in_flight = 0
        self.consecutive_timeouts = 0

    def snapshot(self, restarts: int | None = None) -> MCPConnectionSnapshot:
        config = self.config
        session = self.session
        return MCPConnectionSnapshot(
            path=self.path,
            server=config.name,
            transport=config.transport,
            endpoint=_endpoint(config),
            headers=dict.fromkeys(config.headers, REDACTED),
            env=tuple(sorted(config.env)),
            status=self.status,
            tools=self.tools,
            calls_in_flight=self.calls_in_flight,
            requests_in_flight=self.requests_in_flight,
            restarts=max(self.starts - 1, 0) if restarts is None else restarts,
            failed_starts=self.failed_starts,
            consecutive_timeouts=self.consecutive_timeouts,
            last_error=self.last_error,
            server_info=self.server_info,
            session=_redacted_statistics(session.statistics() if session is not None else self.statistics),
            attempt=self.attempt,
            retry_at=self.retry_at if self.status in ("restarting", "failed") else None,
        )

    def unavailable(self) -> str:
        """Why a call cannot reach the server now, and when to try again: for the model."""
        name = self.config.name
        status = self.status
        if status in ("restarting", "failed") and self.retry_at is not None:
            left = self.retry_at - time.time()
            when = f"retry in {math.ceil(left)} s" if left > 0 else "retrying now"
            message = f"MCP server {name!r} is restarting (attempt {self.attempt}, {when}); try again then."
            if self.last_error:
                message += f" It last failed with: {_first_line(self.last_error)}"
            return message
        if status == "authorizing":
            return (
                f"MCP server {name!r} is waiting for a person to authorize weald (see the mcp.auth_required "
                "event); try again once they have."
            )
        if status == "failed" and self.retry_at is None:
            return (
                f"MCP server {name!r} cannot start until its configuration is fixed and the daemon reloads it "
                f"(weald reload): {_first_line(self.last_error or 'its configuration is wrong')}"
            )
        if status == "stopped":
            return f"MCP server {name!r} was stopped; its tools are not available."
        attempt = f" (attempt {self.attempt + 1})" if self.attempt else ""
        return (
            f"MCP server {name!r} is connecting{attempt}, within its connect_timeout of "
            f"{self.config.connect_timeout:g} s; try again in a moment."
        )


async def _subscribe(session: MCPSession, *, uri: str) -> None:
    await session.subscribe_resource(uri)


def _succeeded(future: Future[Any]) -> bool:
    try:
        future.get(timeout=0)
    except Exception:
        return False
    return True


#: The most characters of one server log message kept in its ``mcp.log`` event.
LOG_DATA_CHARS = 2000


def _log_data(data: object) -> object:
    """A log message's data for an event: secrets cut out, bounded in size."""
    if isinstance(data, str):
        text = redact_text(data)
        return text if len(text) <= LOG_DATA_CHARS else text[:LOG_DATA_CHARS] + "..."
    cleaned = redact(data)
    encoded = json.dumps(cleaned, ensure_ascii=False, default=str)
    return cleaned if len(encoded) <= LOG_DATA_CHARS else encoded[:LOG_DATA_CHARS] + "..."


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _redacted_statistics(statistics: MCPSessionStatistics | None) -> MCPSessionStatistics | None:
    if statistics is None or statistics.lost_reason is None:
        return statistics
    return attrs.evolve(statistics, lost_reason=redact_text(statistics.lost_reason))


def _endpoint(config: ServerConfig) -> str:
    if config.command is not None:
        return redact_text(shlex.join([config.command, *config.args]))
    assert config.url is not None
    parts = urllib.parse.urlsplit(config.url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    if parts.username or parts.password:
        netloc = f"{REDACTED}@{netloc}"
    query = REDACTED if parts.query else ""
    return redact_text(urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, "")))


def _register_config_secrets(config: ServerConfig) -> None:
    # So a token echoed in an error or a stderr tail is cut from every output:
    # the whole value, and its parts ("Bearer <token>" shows the token alone).
    # Values that use ${VAR} are registered once expanded (ServerConfig.resolved).
    for name, value in [*config.headers.items(), *config.env.items()]:
        if is_secret_name(name) and "${" not in value:
            for secret in {value, *value.split()}:
                register_secret(secret)


# -- messages (per-call objects: slots, as pykka's envelopes) ---------------------------


class _InFlight:
    """One request the actor started and has not seen finish."""

    __slots__ = ("handle", "kind", "reply", "what")

    def __init__(self, kind: Literal["call", "request"], what: str, reply: Future[Any]) -> None:
        self.kind = kind
        self.what = what
        self.reply = reply
        self.handle: IOHandle | None = None


class _Finished:
    """A request's io task ended (its reply is already completed): bookkeeping."""

    __slots__ = ("error", "request_id")

    def __init__(self, request_id: int, error: BaseException | None) -> None:
        self.request_id = request_id
        self.error = error


class _ConnectionEnded:
    """The connection task ended; handling this crashes the actor with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Connected:
    """The connection task opened the session (handshake and tools/list done): register the tools."""

    __slots__ = ("session",)

    def __init__(self, session: MCPSession) -> None:
        self.session = session


class _RootsChanged:
    """The roots changed: tell the server (``notifications/roots/list_changed``)."""

    __slots__ = ()


class _ToolsChanged:
    """The server's tool list changed (``notifications/tools/list_changed``, re-fetched)."""

    __slots__ = ("tools",)

    def __init__(self, tools: tuple[MCPTool, ...]) -> None:
        self.tools = tools


# -- the connection actor ------------------------------------------------------------------


class MCPConnection(Actor):
    """One configured MCP server, connected for the actor's lifetime.

    On start it begins connecting, in a task of its own, and returns at
    once. Once connected it registers each server tool in ``registry`` as a
    weald `Tool` named ``mcp__<server>__<tool>`` (kind ``mcp``, permission
    ``permission``, timeout ``call_timeout`` plus ``ping_timeout`` and a short grace), whose
    function routes every call through this actor. On
    ``notifications/tools/list_changed`` it re-registers the new list. When
    it ends, the server's connection is closed (for stdio: its whole process
    group is killed) before its supervisor hears of it; after a crash its
    tools stay registered for the incarnation that follows (a call meanwhile
    is told when the server will be back), after a stop they are
    unregistered.

    Through ``ref.proxy()``: `snapshot`, and the non-blocking requests
    `list_resources`, `read_resource`, `list_prompts`, `get_prompt`.

    Events (source: the actor's path): ``mcp.connected`` (server, transport,
    tools count and names, server_info), ``mcp.disconnected`` (server,
    during ``start`` or ``session``, reason with the stderr tail, stderr_tail,
    exit_code, attempt), ``mcp.tools_changed`` (server, tools, added, removed)
    and ``mcp.auth_required`` (server, url: the authorization URL a person
    must open, redirect_uri, timeout, message; OAuth in browser mode). OAuth
    tokens live in the store (namespace ``mcp_auth``, keyed by server URL)
    and are registered as secrets, so they appear in no event or snapshot.

    Args:
        config: the server; it must be enabled.
        registry: where the server's tools are registered.
        permission: the default permission of its tools (``ask``: a human
            approves each call, since an MCP server is third-party code).

    Raises:
        MCPConfigError: the config is disabled (the actor does not start).
    """

    def __init__(
        self,
        config: ServerConfig,
        registry: ToolRegistry,
        *,
        permission: Permission = "ask",
        _record: _ServerRecord | None = None,
        _gate: StartGate | None = None,
        _roots: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        super().__init__()
        if not config.enabled:
            raise MCPConfigError(f"MCP server {config.name!r} is disabled in its config", server=config.name)
        _register_config_secrets(config)
        self._config = config
        self._registry = registry
        self._permission: Permission = permission
        self._record = _record if _record is not None else _ServerRecord(config)
        self._gate = _gate
        self._roots = _roots
        self._session: MCPSession | None = None
        self._inflight: dict[int, _InFlight] = {}
        self._registered: dict[str, ToolRoute] = {}  # registered name -> our tool function
        self._reported = False  # mcp.disconnected already published for this incarnation
        self._closed: trio.Event | None = None
        self._connection: IOHandle | None = None
        self._gave_up = False  # its configuration cannot work: stopped as failed, not restarted

    @property
    def server(self) -> str:
        """The configured server name."""
        return self._config.name

    # -- lifecycle -----------------------------------------------------------------------

    def on_start(self) -> None:
        """Start connecting in a task of its own and return at once; runs in the actor's task.

        The connection task spawns or reaches the server, runs the handshake
        and the first tools/list within ``connect_timeout`` (time spent
        waiting for a person to authorize does not count), then tells this
        actor, which registers the tools. If the start fails or times out,
        the actor reports why (``mcp.disconnected`` with the stderr tail,
        status ``failed``) and crashes, so its supervisor restarts it after
        the backoff. Returning at once is OTP's ``handle_continue`` idiom:
        a supervisor starts its children one after another and waits for
        each ``on_start``, so a handshake awaited here would hold every
        other server, and the supervisor's mailbox, behind it.
        """
        record = self._record
        record.path = self.path
        record.starts += 1
        record.status = "connecting"
        record.retry_at = None
        record.session = None
        record.calls_in_flight = record.requests_in_flight = record.consecutive_timeouts = 0
        self._closed = trio.Event()
        self._connection = self.run_io(
            self._connection_main, reply=self._connection_ended, name=f"mcp connection {self.server}"
        )

    def on_stop(self) -> Any:
        """After a normal stop: fail what is in flight, unregister the tools, close the connection.

        Runs in the actor's task (shielded); returns once the server is
        gone (for stdio, its process group), at most `CLOSE_WAIT` seconds.
        """
        error = MCPClosedError(f"the connection to MCP server {self.server!r} was stopped", server=self.server)
        self._go_down("failed" if self._gave_up else "stopped", error, reason="stopped")
        return self._wait_closed()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,  # noqa: ARG002 - pykka's hook signature
        exception_value: BaseException | None,
        traceback: TracebackType | None,  # noqa: ARG002
    ) -> Any:
        """After a crash: as `on_stop`, with in-flight requests failed as disconnected.

        A server that stopped responding fails them with its `MCPNotResponding`
        (the session has usually done so already). The supervisor hears of
        the crash only after this returns, so a restarted connection never
        overlaps the old server process.
        """
        error = exception_value if exception_value is not None else MCPConnectionLost("unknown failure")
        lost: MCPConnectionLost
        if isinstance(error, MCPNotResponding):
            lost = error
        else:
            lost = MCPConnectionLost(
                f"MCP server {self.server!r} disconnected; the request did not complete. "
                "The server is being restarted; try again in a moment.",
                server=self.server,
                exit_code=getattr(error, "exit_code", None),
                stderr_tail=getattr(error, "stderr_tail", ""),
            )
        status: ConnectionStatus = "failed" if self._record.status == "failed" else "restarting"
        self._go_down(status, lost, reason=str(error), error=error)
        return self._wait_closed()

    def _go_down(
        self,
        status: ConnectionStatus,
        pending: MCPError,
        *,
        reason: str,
        error: BaseException | None = None,
    ) -> None:
        # Runs before any io task can see its cancellation, so every
        # in-flight reply gets this actor's account of the end. The hooks
        # cancel the io tasks themselves rather than rely on when the
        # runtime does: the server must be gone before the supervisor hears.
        from ._registry import settle_error

        for entry in self._inflight.values():
            settle_error(entry.reply, pending)
            if entry.handle is not None:
                entry.handle.cancel()
        cut = len(self._inflight)
        self._inflight.clear()
        if self._connection is not None:
            self._connection.cancel()
        if status == "stopped" or self._gave_up:
            self._unregister_all()
        # Else the tools stay for the next incarnation, which re-syncs them:
        # a call meanwhile is told when the server is back (`unavailable`).
        record = self._record
        if record.session is not None:
            record.statistics = record.session.statistics()
        record.session = None
        record.status = status
        record.calls_in_flight = record.requests_in_flight = 0
        self._session = None
        if error is not None:
            record.last_error = redact_text(str(error))
        if not self._reported:
            self._reported = True
            self._publish(
                "mcp.disconnected",
                during="session",
                reason=redact_text(reason),
                stderr_tail=redact_text(getattr(error, "stderr_tail", "") or ""),
                exit_code=getattr(error, "exit_code", None),
                requests_cut=cut,
                restarting=error is not None,
            )

    def _on_killed(self) -> None:
        # The runtime's hook for a killed actor (no on_stop/on_failure runs):
        # answer what is in flight and take the tools down, without blocking.
        lost = MCPConnectionLost(
            f"the connection to MCP server {self.server!r} was killed; the request did not complete",
            server=self.server,
        )
        self._go_down("stopped", lost, reason="killed")

    async def _wait_closed(self) -> None:
        closed = self._closed
        if closed is None:
            return
        with trio.move_on_after(CLOSE_WAIT):
            await closed.wait()
            return
        logger.warning("MCP server %r: its connection did not close within %g s", self.server, CLOSE_WAIT)

    # -- the connection task -----------------------------------------------------------------

    async def _connection_main(self) -> NoReturn:
        """Hold the connection open until the server is lost or the actor ends (then close it)."""
        from ._auth import StoreTokenStorage
        from ._session import open_connection

        assert self._closed is not None
        config = self._config
        storage = StoreTokenStorage(self.system.store, config.url) if config.auth and config.url else None
        try:
            if self._gate is not None:
                await self._gate.wait_turn()  # connect_timeout counts from here
            async with open_connection(
                config,
                on_tools_changed=self._tools_changed_nowait,
                on_log=self._log_nowait,
                auth_storage=storage,
                on_authorization=self._authorization_required,
                on_notice=self._notice_nowait,
                roots=self._roots,
            ) as session:
                with contextlib.suppress(ActorDeadError):
                    self.actor_ref.tell(_Connected(session))
                await session.wait_lost()
        finally:
            self._closed.set()

    def _authorization_required(self, url: str) -> None:
        # Called by the session (loop thread) once it listens for the code.
        auth = self._config.auth
        assert auth is not None
        if self._record.status == "connecting":
            self._record.status = "authorizing"
        self._publish(
            "mcp.auth_required",
            url=url,
            redirect_uri=auth.redirect_uri,
            timeout=auth.authorization_timeout,
            message=(
                f"MCP server {self.server!r} needs authorization: open the URL in a browser on this machine "
                f"within {auth.authorization_timeout:g} s"
            ),
        )

    def _connection_ended(self, result: outcome.Outcome[NoReturn]) -> _ConnectionEnded:
        # Runs on the loop thread when the connection task ends; the message
        # crashes the actor (after reporting a failed start as such).
        assert isinstance(result, outcome.Error)
        return _ConnectionEnded(result.error)

    def _log_nowait(self, message: MCPLogMessage) -> None:
        # Called by the session's delivery task, in order; must not block or raise.
        # Stderr lines are kept as the tail shown when the server fails, not published.
        if message.source != "notification":
            return
        self._publish(
            "mcp.log",
            level=message.level,
            logger=message.logger,
            data=_log_data(message.data),
        )

    def _notice_nowait(self, kind: str, data: Mapping[str, Any]) -> None:
        # Called by the task reading the server, in wire order; must not block.
        self._publish(f"mcp.{kind}", **data)

    def _tools_changed_nowait(self, tools: tuple[MCPTool, ...]) -> None:
        # Called by the session's delivery task; must not block or raise.
        with contextlib.suppress(ActorDeadError):
            self.actor_ref.tell(_ToolsChanged(tools))

    def _start_failed(self, error: BaseException, *, restarting: bool = True) -> None:
        record = self._record
        record.failed_starts += 1
        record.status = "failed"
        record.last_error = redact_text(str(error))
        record.retry_at = None
        self._reported = True
        self._publish(
            "mcp.disconnected",
            during="start",
            reason=redact_text(str(error)),
            stderr_tail=redact_text(getattr(error, "stderr_tail", "") or ""),
            exit_code=getattr(error, "exit_code", None),
            attempt=record.failed_starts,
            restarting=restarting,
        )

    def _connected(self, session: MCPSession) -> None:
        self._session = session
        record = self._record
        record.session = session
        record.server_info = session.server_info
        record.failed_starts = 0
        self._sync_tools(session.tools)
        self._sweep_stale_tools()
        record.status = "running"
        for uri in sorted(record.subscriptions):  # a new connection: subscribe again
            self._resubscribe(uri)
        self._publish(
            "mcp.connected",
            transport=self._config.transport,
            tools=len(self._registered),
            tool_names=sorted(self._registered),
            server_info=attrs.asdict(session.server_info),
            restarts=max(record.starts - 1, 0),
        )

    # -- messages ----------------------------------------------------------------------------

    def on_receive(self, message: Any) -> None:
        """Handle the actor's own messages; an unknown message is logged and dropped."""
        from ._registry import CallTool, CancelCall

        if isinstance(message, CallTool):
            self._start_call(message)
        elif isinstance(message, _Finished):
            self._finished(message)
        elif isinstance(message, CancelCall):
            entry = self._inflight.get(message.call_id)
            if entry is not None and entry.handle is not None:
                entry.handle.cancel()
        elif isinstance(message, _ToolsChanged):
            self._tools_changed(message.tools)
        elif isinstance(message, _Connected):
            self._connected(message.session)
        elif isinstance(message, _RootsChanged):
            if self._session is not None:
                self._request("notifications/roots/list_changed", lambda session: session.notify_roots_changed())
        elif isinstance(message, _ConnectionEnded):
            if self._session is None and isinstance(message.error, MCPConfigError):
                # Its configuration cannot work (a ${VAR} that is not set): trying again changes
                # nothing, so it stops as failed, with the reason, until a reload gives it another.
                self._gave_up = True
                self._start_failed(message.error, restarting=False)
                self.actor_ref.stop(block=False)
                return
            if self._session is None:
                self._start_failed(message.error)  # never connected: spawn, handshake, timeout or authorization
            raise message.error
        else:
            logger.warning("%s dropped an unexpected message: %r", self, message)

    def _start_call(self, call: CallTool) -> None:
        from ._registry import NotConnected, settle_error

        session = self._session
        if session is None:
            settle_error(call.reply, NotConnected(self._record.unavailable(), server=self.server))
            return

        async def run(session: MCPSession) -> Any:
            return await session.call_tool(
                call.tool,
                call.arguments,
                on_progress=call.on_progress,
                on_elicitation=call.on_elicitation,
                on_sampling=call.on_sampling,
                traceparent=call.traceparent,
            )

        self._start(call.call_id, "call", f"tool {call.registered_name}", call.reply, run)

    def _start(
        self,
        request_id: int,
        kind: Literal["call", "request"],
        what: str,
        reply: Future[Any],
        run: Callable[[MCPSession], Awaitable[Any]],
    ) -> None:
        session = self._session
        assert session is not None
        entry = _InFlight(kind, what, reply)
        self._inflight[request_id] = entry
        entry.handle = self.run_io(run, session, reply=partial(self._io_finished, request_id, entry), name=what)
        self._count_in_flight()

    def _io_finished(self, request_id: int, entry: _InFlight, result: outcome.Outcome[Any]) -> _Finished:
        # Runs on the loop thread as the io task ends, even if the actor has
        # ended meanwhile (killed, say): so the reply is always completed.
        from ._registry import settle, settle_error

        if isinstance(result, outcome.Value):
            settle(entry.reply, result.value)
            return _Finished(request_id, None)
        assert isinstance(result, outcome.Error)
        error = result.error
        if isinstance(error, IOCancelledError):
            # Cancelled by its caller (no one waits) or as the actor ends
            # (the hooks answered first, unless it was killed).
            error = MCPConnectionLost(
                f"the connection to MCP server {self.server!r} ended before {entry.what} completed",
                server=self.server,
            )
        settle_error(entry.reply, error)
        return _Finished(request_id, error)

    def _finished(self, message: _Finished) -> None:
        if self._inflight.pop(message.request_id, None) is None:
            return
        self._count_in_flight()
        error = message.error
        record = self._record
        # Hangs are not judged here: the session pings the server when a
        # request times out and ends the connection if it does not answer.
        if isinstance(error, MCPTimeout):
            record.consecutive_timeouts += 1
        elif error is None or not isinstance(error, MCPConnectionLost | MCPClosedError):
            record.consecutive_timeouts = 0  # the server answered (a result or an error)

    def _count_in_flight(self) -> None:
        calls = sum(1 for entry in self._inflight.values() if entry.kind == "call")
        self._record.calls_in_flight = calls
        self._record.requests_in_flight = len(self._inflight) - calls

    # -- tools in the registry -----------------------------------------------------------------

    def _tools_changed(self, tools: tuple[MCPTool, ...]) -> None:
        before = set(self._registered)
        self._sync_tools(tools)
        after = set(self._registered)
        self._publish(
            "mcp.tools_changed",
            tools=sorted(after),
            added=sorted(after - before),
            removed=sorted(before - after),
        )

    def _sync_tools(self, tools: Iterable[MCPTool]) -> None:
        from ._registry import ToolRoute, build_tool

        wanted: dict[str, MCPTool] = {}
        for tool in tools:
            wanted[self._name_for(tool)] = tool
        for name in set(self._registered) - set(wanted):
            self._unregister(name)
        for name, tool in wanted.items():
            route = ToolRoute(
                self.system,
                self.path,
                self.server,
                tool.name,
                name,
                unavailable=self._record.unavailable,
                sampling=self._config.sampling,
            )
            weald_tool = build_tool(
                tool,
                name,
                route,
                permission=self._permission,
                # A timed-out call waits for the ping that judges the server.
                call_timeout=self._config.call_timeout + self._config.ping_timeout,
            )
            self._registry.register(weald_tool, replace=True)
            self._registered[name] = route
        self._record.tools = tuple(sorted(self._registered))

    def _name_for(self, tool: MCPTool) -> str:
        """The tool's registered name, unless another server's or a built-in tool holds it."""
        name = tool.registered_name
        existing = self._registry.get(name)
        if existing is None or self._owns(existing.fn):
            return name
        taken = set(self._registry.names()) - set(self._registered)
        alternative = sanitize_tool_name(self.server, tool.name, taken=taken)
        logger.warning(
            "MCP server %r: the tool name %s is taken by another tool; registered %s instead",
            self.server,
            name,
            alternative,
        )
        return alternative

    def _owns(self, fn: object) -> bool:
        from ._registry import ToolRoute

        return isinstance(fn, ToolRoute) and fn.path == self.path and fn.server == self.server

    def _sweep_stale_tools(self) -> None:
        # A previous incarnation that was killed (no on_stop) left its tools.
        for tool in self._registry.select():
            if self._owns(tool.fn) and tool.name not in self._registered:
                self._registry.unregister(tool.name)

    def _unregister(self, name: str) -> None:
        route = self._registered.pop(name)
        current = self._registry.get(name)
        if current is not None and current.fn is route:
            self._registry.unregister(name)

    def _unregister_all(self) -> None:
        for name in list(self._registered):
            self._unregister(name)
        self._record.tools = ()

    # -- the public API (through ref.proxy()) ---------------------------------------------------

    def snapshot(self) -> MCPConnectionSnapshot:
        """A frozen view of this connection; header values and known secrets are redacted."""
        return self._record.snapshot()

    def list_resources(self) -> Future[tuple[MCPResource, ...]]:
        """Start resources/list; returns a future of the server's resources.

        Not ``async def`` on purpose: an ``async def`` proxy method would
        hold this actor's mailbox until the server answered (up to
        ``call_timeout``), stalling every tool call and the crash of a lost
        connection behind it. This returns as soon as the request has
        started, and the request runs as an io task like a tool call.
        Through the proxy the outer future resolves at once with the inner
        one, which resolves with the result::

            resources = await (await ref.proxy().list_resources())
            resources = ref.proxy().list_resources().get().get(timeout=30)  # from a thread

        The inner future fails with `MCPError`s: `NotConnected` (an
        `MCPConnectionLost`) if the connection is not up, `MCPTimeout`,
        `MCPServerError`, `MCPConnectionLost` if the server dies meanwhile
        and `MCPClosedError` if the connection is stopped.
        """
        return self._request("resources/list", lambda session: session.list_resources())

    def read_resource(self, uri: str) -> Future[tuple[MCPResourceContent, ...]]:
        """Start resources/read of ``uri``; a future of its parts (see `list_resources`)."""
        return self._request(f"resources/read {uri!r}", lambda session: session.read_resource(uri))

    def subscribe(self, uri: str) -> Future[None]:
        """Start resources/subscribe of ``uri``; each update is published as ``mcp.resource_updated``.

        The subscription is kept across restarts: every new connection
        subscribes again. The future is as `list_resources`'s; a failed
        subscribe is not kept.
        """
        self._record.subscriptions.add(uri)
        reply = self._request(f"resources/subscribe {uri!r}", partial(_subscribe, uri=uri))
        reply._on_done(lambda done: self._subscribe_failed(uri) if not _succeeded(done) else None)
        return reply

    def unsubscribe(self, uri: str) -> Future[None]:
        """Start resources/unsubscribe of ``uri`` and forget the subscription (see `subscribe`)."""
        self._record.subscriptions.discard(uri)
        return self._request(f"resources/unsubscribe {uri!r}", lambda session: session.unsubscribe_resource(uri))

    def _subscribe_failed(self, uri: str) -> None:
        # Runs where the request ended (the loop thread).
        self._record.subscriptions.discard(uri)

    def _resubscribe(self, uri: str) -> None:
        def done(reply: Future[None]) -> None:
            if not _succeeded(reply):
                logger.warning(
                    "MCP server %r: subscribing again to %s failed; the subscription is dropped", self.server, uri
                )
                self._subscribe_failed(uri)

        self._request(f"resources/subscribe {uri!r}", partial(_subscribe, uri=uri))._on_done(done)

    def list_prompts(self) -> Future[tuple[MCPPrompt, ...]]:
        """Start prompts/list; a future of the server's prompt templates (see `list_resources`)."""
        return self._request("prompts/list", lambda session: session.list_prompts())

    def get_prompt(self, name: str, arguments: Mapping[str, str] | None = None) -> Future[MCPPromptResult]:
        """Start prompts/get of ``name``; a future of the rendered prompt (see `list_resources`)."""
        args = dict(arguments or {})
        return self._request(f"prompts/get {name!r}", lambda session: session.get_prompt(name, args))

    def _request(self, what: str, run: Callable[[MCPSession], Awaitable[T]]) -> Future[T]:
        from ._registry import NotConnected, settle_error

        reply: Future[T] = Future()
        if self._session is None:
            settle_error(reply, NotConnected(self._record.unavailable(), server=self.server))
            return reply
        self._start(next(_request_ids), "request", what, reply, run)
        return reply

    # -- helpers ---------------------------------------------------------------------------------

    def _publish(self, topic: str, **data: Any) -> None:
        self.system.events.publish(topic, self.path, {"server": self.server, **data})


# -- the mcp supervisor ------------------------------------------------------------------------


def _child_id(config: ServerConfig) -> str:
    return config.name.replace("/", "_")


class MCPSupervisor(Supervisor):
    """The ``mcp`` supervisor: one `MCPConnection` per enabled server, ``one_for_one``.

    Each child restarts after an exponential backoff (``backoff``, capped)
    and is retried for ever: a server that never starts, or keeps dying, is
    reported (``mcp.disconnected``, the snapshot's ``last_error``) and tried
    again every ``backoff.cap`` seconds at most, without this supervisor
    ever giving up and escalating to the root, because the daemon must keep
    running whatever its MCP servers do. Marking a server "failed" after N
    attempts was the alternative; it was rejected because the usual causes
    (a network outage, a package still installing, an expired token being
    replaced) go away on their own, and a retry every 30 s costs nothing.

    The restart intensity is derived from the backoff (see `intensity_for`)
    so that backoff-spaced restarts can never exceed it, however many
    servers fail at once; it still trips if something restarts a child
    without its backoff, which would be a bug.

    While it runs, and if any server is enabled, the model's tools for
    resources (``mcp_list_resources``, ``mcp_read_resource``) are registered
    beside the servers' tools.

    Through ``ref.proxy()``, besides `Supervisor`'s API: `servers`, `unavailable`, `roots_changed`.

    Args:
        configs: the servers; disabled ones are skipped.
        registry: where their tools are registered.
        permission: default permission of their tools.
        backoff: restart backoff of every connection.
        start_rate: server starts (and restarts) per second at most (see
            `StartGate`); default `default_start_rate`.
        roots: returns the directories servers may work in (the agents'
            working directories), for their ``roots/list``; with it the
            ``roots`` capability is declared. Call `roots_changed` when
            what it returns changes.

    Raises:
        MCPConfigError: two enabled servers share a name.
        ValueError: the backoff cannot bound restarts (``initial <= 0`` or ``factor < 1``).
    """

    def __init__(
        self,
        configs: Iterable[ServerConfig],
        registry: ToolRegistry,
        *,
        permission: Permission = "ask",
        backoff: Backoff = DEFAULT_BACKOFF,
        start_rate: float | None = None,
        roots: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        enabled = [config for config in configs if config.enabled]
        self._gate = StartGate(start_rate if start_rate is not None else default_start_rate())
        self._registry = registry
        self._permission: Permission = permission
        self._backoff = backoff
        self._roots = roots
        self._resource_tools: list[str] = []
        self._records: dict[str, _ServerRecord] = {}
        specs: list[ChildSpec] = []
        for config in enabled:
            child_id = _child_id(config)
            if child_id in self._records:
                raise MCPConfigError(f"two MCP servers are named {config.name!r}", server=config.name)
            self._records[child_id] = _ServerRecord(config)
            specs.append(self._spec(child_id))
        max_restarts, max_seconds = self.intensity_for(backoff, len(specs))
        super().__init__(specs, strategy="one_for_one", max_restarts=max_restarts, max_seconds=max_seconds)

    def _spec(self, child_id: str) -> ChildSpec:
        """The connection's child spec. Transient: one that gives up (its configuration cannot work) stays stopped."""
        record = self._records[child_id]
        return ChildSpec(
            child_id,
            MCPConnection,
            args=(record.config, self._registry),
            kwargs={"permission": self._permission, "_record": record, "_gate": self._gate, "_roots": self._roots},
            restart="transient",
            shutdown=CONNECTION_SHUTDOWN,
            backoff=self._backoff,
        )

    async def update_servers(self, configs: Iterable[ServerConfig]) -> dict[str, list[str]]:
        """Make the servers those of ``configs`` (OTP's ``config_change``): a reload of the configuration.

        A server no longer there (or disabled) is stopped and forgotten; a
        new one is started; one whose configuration changed is stopped and
        started with the new one; one that gave up (`failed`, a ``${VAR}``
        not set) is tried again; the others are left running. Call
        `load_connection_modules` first (in a worker thread) when any is enabled.

        Returns:
            The server names ``started``, ``stopped``, ``restarted`` and ``retried``.

        Raises:
            MCPConfigError: two enabled servers share a name (nothing was changed).
        """
        wanted: dict[str, ServerConfig] = {}
        for config in configs:
            if config.enabled:
                child_id = _child_id(config)
                if child_id in wanted:
                    raise MCPConfigError(f"two MCP servers are named {config.name!r}", server=config.name)
                wanted[child_id] = config
        report: dict[str, list[str]] = {"started": [], "stopped": [], "restarted": [], "retried": []}
        replaced: dict[str, str] = {}  # child id -> "restarted" or "retried"
        for child_id, record in list(self._records.items()):
            new = wanted.get(child_id)
            gave_up = record.status == "failed" and record.retry_at is None
            if new is not None and new == record.config and not gave_up:
                continue
            await self.terminate_child(child_id)
            self.delete_child(child_id)
            del self._records[child_id]
            if new is None:
                report["stopped"].append(record.config.name)
            else:
                replaced[child_id] = "retried" if new == record.config else "restarted"
        for child_id, config in wanted.items():
            if child_id in self._records:
                continue
            self._records[child_id] = _ServerRecord(config)
            await self.start_child(self._spec(child_id))
            report[replaced.get(child_id, "started")].append(config.name)
        self._max_restarts, self._max_seconds = self.intensity_for(self._backoff, len(self._records))
        if self._records and not self._resource_tools:
            self._register_resource_tools()
        elif not self._records:
            self._unregister_resource_tools()
        return report

    @staticmethod
    def intensity_for(backoff: Backoff, children: int) -> tuple[int, float]:
        """Restart intensity ``(max_restarts, max_seconds)`` that backoff-spaced restarts never exceed.

        The supervisor counts restarts in a sliding window of ``max_seconds``
        and records each when the crash arrives. Between two consecutive
        crashes of one child lie at least its backoff delay before the
        restart, and delays never shrink (``factor >= 1``) except after the
        child stayed up ``reset_after`` seconds. So in any window of ``W``
        seconds one child can crash at most ``1 + m`` times, where ``m`` is
        the largest count whose first delays sum to no more than ``W``
        (``d1 + ... + dm <= W``), the densest case being a child that
        crashes at once from its first restart on. Choosing ``W <=
        reset_after`` keeps a reset from packing a fresh run into the same
        window (the gap before it is longer than ``W``). Children back off
        independently, so ``children * (1 + m)`` bounds them all; one more
        per child absorbs clock rounding.

        With the default backoff (0.5 s doubling to a 30 s cap, W = 30 s:
        0.5 + 1 + 2 + 4 + 8 = 15.5 <= 30 < 31.5) that is 7 restarts per
        child per 30 s.

        Raises:
            ValueError: ``initial <= 0`` or ``factor < 1``: no bound exists.
        """
        if not backoff.initial > 0 or backoff.factor < 1:
            raise ValueError(
                f"the MCP restart backoff must have initial > 0 and factor >= 1 to bound restarts, got {backoff!r}"
            )
        window = min(backoff.cap, backoff.reset_after)
        total = 0.0
        delays = 0
        attempt = 1
        while True:
            delay = backoff.delay(attempt)
            if delay >= backoff.cap or backoff.factor == 1:
                # Every later delay equals this one: count them at once.
                delays += int((window - total) // delay) if total + delay <= window else 0
                break
            if total + delay > window:
                break
            total += delay
            delays += 1
            attempt += 1
        per_child = delays + 2
        return max(children, 1) * per_child, float(window)

    def on_start(self) -> Any:
        """Register the resource tools, then start every connection (each returns at once)."""
        if self._records:
            self._register_resource_tools()
        return super().on_start()

    def _register_resource_tools(self) -> None:
        from ._resource_tools import resource_tools

        for tool in resource_tools(self.system, self.path):
            self._registry.register(tool, replace=True)
            self._resource_tools.append(tool.name)

    def on_stop(self) -> Any:
        """Unregister the resource tools, then stop every connection, last started first."""
        self._unregister_resource_tools()
        return super().on_stop()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Any:
        """As `on_stop`, after a crash (a restart registers the tools again)."""
        self._unregister_resource_tools()
        return super().on_failure(exception_type, exception_value, traceback)

    def _unregister_resource_tools(self) -> None:
        for name in self._resource_tools:
            self._registry.unregister(name)
        self._resource_tools.clear()

    def roots_changed(self) -> None:
        """Tell every connected server that the roots changed (it asks for them again)."""
        for info in self.which_children():
            if info.ref is not None:
                with contextlib.suppress(ActorDeadError):
                    info.ref.tell(_RootsChanged())

    def unavailable(self, server: str) -> str:
        """Why ``server`` cannot take a request now and when it can, for the model."""
        record = next((r for r in self._records.values() if r.config.name == server), None)
        if record is None:
            return f"there is no MCP server named {server!r}"
        if record.status == "running":
            return f"MCP server {server!r} is running; try again"
        return record.unavailable()

    def on_restart_scheduled(self, child_id: str, attempt: int, delay: float) -> None:
        """Note when the server comes back, for `servers` and for calls to its tools meanwhile."""
        record = self._records.get(child_id)
        if record is not None:
            record.attempt = attempt
            record.retry_at = time.time() + delay
            if record.status not in ("failed", "stopped"):
                record.status = "restarting"

    def servers(self) -> tuple[MCPConnectionSnapshot, ...]:
        """Every server's connection snapshot, in start order, running or not.

        Built from what each connection keeps across restarts, with the
        restart counts this supervisor keeps; it asks no child anything, so
        it answers at once even while a connection is starting.
        """
        restarts = {info.id: info.restarts for info in self.which_children()}
        return tuple(
            record.snapshot(restarts.get(child_id, max(record.starts - 1, 0)))
            for child_id, record in self._records.items()
        )


def load_connection_modules() -> None:
    """Import what a connection needs (the MCP SDK, jsonschema), if not yet done.

    Importing reads files: `mcp_supervisor_spec` calls this, where the
    daemon builds its tree, so that no connection imports on the loop.
    """
    import importlib

    for module in ("._auth", "._registry", "._resource_tools", "._session"):
        importlib.import_module(module, __package__)


def mcp_supervisor_spec(
    configs: Iterable[ServerConfig],
    registry: ToolRegistry,
    *,
    child_id: str = "mcp",
    permission: Permission = "ask",
    backoff: Backoff = DEFAULT_BACKOFF,
    start_rate: float | None = None,
    roots: Callable[[], Sequence[str]] | None = None,
) -> ChildSpec:
    """The `ChildSpec` of the daemon's ``mcp`` subtree, to start under the root.

    ::

        system.root.proxy().start_child(mcp_supervisor_spec(configs, registry)).get()

    With an enabled server among ``configs`` it imports the MCP SDK
    (`load_connection_modules`); with none, nothing of it is loaded.

    Its shutdown allows every connection its own `CONNECTION_SHUTDOWN`,
    since they stop one after the other (last started first). The arguments
    after ``registry`` are `MCPSupervisor`'s; ``child_id`` is the subtree's
    name under its parent.
    """
    configs = list(configs)
    enabled = sum(1 for config in configs if config.enabled)
    if enabled:
        load_connection_modules()
    return ChildSpec(
        child_id,
        MCPSupervisor,
        args=(configs, registry),
        kwargs={"permission": permission, "backoff": backoff, "start_rate": start_rate, "roots": roots},
        shutdown=CONNECTION_SHUTDOWN * max(enabled, 1) + 1.0,
    )
