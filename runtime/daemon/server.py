"""The JSON-RPC 2.0 front of the daemon: one JSON object per line, over a Unix socket or stdio.

Each connection is served by tasks on the trio loop, under the ``/server``
actor (stopping the actor closes the listener and every connection). Each
request runs in its own task, so a long ``agent.prompt`` never holds up the
next request; replies carry the request's id. Events, questions and
permission requests reach clients as notifications (``event``,
``ask_user.question``, ``permission.request``).

Bad input never takes anything down: malformed JSON or invalid UTF-8
(-32700), a request of the wrong shape (-32600), an id already in flight on
the connection (-32600, naming the id), an unknown method (-32601), wrong
params (-32602, naming the field) and a message over
``limits.max_message_bytes`` (16 MB by default; -32600) each get an error
reply, and the connection and the requests in flight on it carry on. Clients
over ``limits.max_connections``, a connection whose unfinished line would
take the input buffered for all connections over ``limits.max_buffered_bytes``,
and clients arriving while the process is out of file descriptors get one
error line (-32003, naming the limit) and are closed (``_front``). A
client that disconnects mid-turn loses nothing: the turn goes on and its
result lands in the history. ``agent.prompt`` goes through the daemon's turn
gate (``limits.max_concurrent_turns``), so it may wait for a slot first.

Stopping (`Server.stop_accepting`, then `Server.wait_replies_written`, then
the actor's stop): the listener closes and new turns are refused, the
daemon aborts running turns, every request in flight gets its reply written
to its client, and only then do connections close and the socket go.

The socket is created owner-only (0600) in an owner-only directory; a
client whose uid differs from the daemon's is refused at accept time.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import socket
import stat
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import msgspec
import trio
from weald.runtime import (
    Actor,
    ActorDeadError,
    Event,
    Future,
    StoreError,
    Stub,
    WealdError,
    make_private_dirs,
    mask_url,
    redact,
    redact_secret_values,
)
from weald.runtime._codec import msgspec_convert
from weald.runtime._version import VERSION
from weald.runtime.agents.agent import Agent, AgentRecord, TurnResult, history_key
from weald.runtime.agents.session import RuntimeView, agent_path
from weald.runtime.daemon._front import (
    LIMIT_REACHED,
    Acceptor,
    InputBudget,
    OverBudget,
    TooLarge,
    default_max_connections,
    over_budget_message,
    read_lines,
)
from weald.runtime.daemon._index import MODEL_SLOTS
from weald.runtime.daemon._retention import GcReport
from weald.runtime.llm import Image
from weald.supervisors import SupervisorBase

__all__ = [
    "ERRORS",
    "MAX_MESSAGE_BYTES",
    "SHUTDOWN_REASON",
    "ClusterPort",
    "Server",
    "ServerSnapshot",
    "SocketInUseError",
    "prepare_socket",
]

SHUTDOWN_REASON = "the daemon is shutting down"
"""Why turns and waiting prompts end when the daemon stops."""
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The default of ``limits.max_message_bytes``."""
_MAX_CONCURRENT_REQUESTS = 256
_OUTBOX = 4096
_COALESCE_BYTES = 64 * 1024  # queued messages joined into one write, up to about this much

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
APP_ERROR = -32000
NOT_FOUND = -32001
FAULTS_DISABLED = -32002
NOT_OWNER = -32004  # a node asked about a session another node runs (see `_cluster`)
UNTRUSTED_CONFIG = -32005  # agent.start: the project file is nested in another project and not trusted (`_trust`)

ERRORS = {
    PARSE_ERROR: "parse error",
    INVALID_REQUEST: "invalid request",
    METHOD_NOT_FOUND: "method not found",
    INVALID_PARAMS: "invalid params",
    INTERNAL_ERROR: "internal error",
    APP_ERROR: "request failed",
    NOT_FOUND: "not found",
    FAULTS_DISABLED: "fault injection is not enabled",
    NOT_OWNER: "the session is on another node",
    UNTRUSTED_CONFIG: "the project's configuration file is not trusted",
    LIMIT_REACHED: "a limit of the daemon was reached",
}


class SocketInUseError(WealdError):
    """A live daemon already serves on the socket."""


class RPCError(Exception):
    """An error reply: code, message, optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


# -- params of every method (unknown fields are errors) ----------------------------------------


class _Params(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class NoParams(_Params):
    pass


class SessionMCPServer(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An MCP server of one session alone (``agent.start``'s ``mcp_servers``; an editor's, through ACP)."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    url: str | None = None
    headers: dict[str, str] = {}


class AgentStartParams(_Params):
    working_dir: str
    model: str | None = None
    tools: list[str] | None = None
    system_prompt: str | None = None
    agent_id: str | None = None
    record: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None
    asleep: bool | None = None  # None: asleep when hibernation is on (`Sessions.start_asleep`)
    mcp_servers: Annotated[list[SessionMCPServer], msgspec.Meta(max_length=32)] | None = None
    project: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = None
    # Stopped when the connection that started it closes (and never restored): `weald run`'s own agent.
    ephemeral: bool = False
    # A line that says what the agent is for (`weald run` gives its first prompt); agent.list shows it.
    title: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    # Trust the working directory's project file if it is nested and not trusted (as `weald trust`), then start.
    trust_config: bool = False


class ConfigTrustParams(_Params):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    sha256: Annotated[str, msgspec.Meta(max_length=80)] | None = None  # the digest shown: the file must still have it


class ConfigUntrustParams(_Params):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


MAX_BATCH_STARTS = 1000
"""The most starts one ``agents.start`` request may carry."""


class AgentsStartParams(_Params):
    # Each entry is checked on its own, as an agent.start's params: one bad entry fails alone.
    agents: list[Any]


class AgentParams(_Params):
    agent_id: str


_TRACEPARENT = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


class PromptImage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    mime_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    data: Annotated[str, msgspec.Meta(min_length=1)]  # base64


class AgentPromptParams(_Params):
    agent_id: str
    text: str
    # The same key runs one turn however often the prompt is sent (a client's retry).
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    timeout: Annotated[float, msgspec.Meta(ge=0)] | None = None
    images: Annotated[list[PromptImage], msgspec.Meta(max_length=32)] | None = None
    # W3C trace context: the turn's trace continues the caller's (when telemetry is on).
    traceparent: Annotated[str, msgspec.Meta(pattern=_TRACEPARENT)] | None = None


class AgentHistoryParams(_Params):
    agent_id: str
    limit: Annotated[int, msgspec.Meta(ge=0)] | None = None  # the last N messages; 0: none, None: all (capped)
    before: Annotated[int, msgspec.Meta(ge=0)] | None = None  # only messages with a lower seq (the next page)


class DebugStateParams(_Params):
    agent_id: str | None = None
    events: int = 20
    messages: int = 10


class TreeParams(_Params):
    path: str = "/"
    depth: int | None = None
    # Subtrees drawn as their top node alone, with how many children it has (``/sessions`` at 100,000).
    collapse: list[str] = msgspec.field(default_factory=list)


class AgentSendParams(_Params):
    agent_id: str
    text: str


PAGE_MAX = 500
"""The most rows one ``sessions.page`` or ``actors.list`` reply holds."""

AGENT_LIST_PAGE_MAX = 10_000
"""The most rows one page of ``agent.list`` holds (``limit``)."""
_AGENT_LIST_PAGE = 1000  # the rows a page of agent.list has without a limit; the whole list is built of them


class AgentListParams(_Params):
    limit: Annotated[int, msgspec.Meta(ge=1, le=AGENT_LIST_PAGE_MAX)] | None = None  # None (and no after): all
    # The id the page starts after (the previous page's next_after); any text but NUL (not a key on PostgreSQL).
    after: Annotated[str, msgspec.Meta(max_length=1000, pattern=r"^[^\x00]*$")] | None = None
    stopped: bool = True  # stopped sessions too
    long: bool = False  # each session's spill_bytes too
    # This one session's row only (a page of one or none): what `weald agent stop` and ACP look up.
    agent_id: Annotated[str, msgspec.Meta(max_length=1000, pattern=r"^[^\x00]*$")] | None = None


class SessionsPageParams(_Params):
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=0, le=PAGE_MAX)] = 50
    state: Literal["active", "awake", "asleep", "stopped"] = "active"
    project: str | None = None
    model: str | None = None
    search: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    sort: Literal["state", "started", "id", "project", "model"] = "state"
    order: Literal["asc", "desc"] | None = None  # None: the sort's own (awake first, newest first)


class ActorsListParams(_Params):
    prefix: str = "/"
    search: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    sort: Literal["path", "kind", "status", "mailbox", "handled", "restarts", "memory"] = "mailbox"
    order: Literal["asc", "desc"] | None = None  # None: numbers largest first, names a to z
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=0, le=PAGE_MAX)] = 50


class ActorPathParams(_Params):
    path: str


class EventsQueryParams(_Params):
    topic: str | None = None  # a shell-style pattern: "fault.*"
    source: str | None = None  # a path prefix: "/sessions/a1"
    exclude: list[str] = msgspec.field(default_factory=list)  # topic patterns to leave out: ["agent.message_delta"]
    limit: Annotated[int, msgspec.Meta(ge=0, le=5000)] = 200
    before: Annotated[int, msgspec.Meta(ge=0)] | None = None  # only events with a lower seq (the next page back)


class MetricsSeriesParams(_Params):
    since: Annotated[int, msgspec.Meta(ge=0)] = 0


class TasksListParams(_Params):
    agent_id: str | None = None
    working_dir: str | None = None
    view: str = "all"
    scope: Literal["project", "session"] = "project"


class PermissionRespondParams(_Params):
    request_id: str
    decision: Literal["allow", "deny", "allow_always"]
    # With "deny": why, for the model, instead of "denied by the user".
    message: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class ClientAttachParams(_Params):
    """``client.attach``: the editor behind this connection (``weald acp``) drives ``agent_id``, offering these."""

    agent_id: str
    read_text_file: bool = False
    write_text_file: bool = False
    terminal: bool = False


class ClientError(msgspec.Struct, kw_only=True):
    """The error an editor answered (JSON-RPC's; its other fields are ignored)."""

    message: str
    code: int = INTERNAL_ERROR


class ClientRespondParams(_Params):
    """``client.respond``: the editor's answer to a ``client.request``: its result, or its error."""

    request_id: str
    result: Any = None
    error: ClientError | None = None


class OpenPromptsParams(_Params):
    agent_id: str | None = None  # None: every agent's


class ActorSnapshotParams(_Params):
    path: str


class AskUserRespondParams(_Params):
    question_id: str
    answer: str | None = None
    # No answer, and why: the question fails with this reason (no one could be asked, say).
    decline: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)] | None = None


class EventsSubscribeParams(_Params):
    agent_id: str | None = None
    topics: list[str] = msgspec.field(default_factory=lambda: ["*"])


class EventsUnsubscribeParams(_Params):
    subscription: str


MAX_ADOPT = 10_000
"""The most sessions one ``cluster.adopt`` or ``cluster.handover`` names."""


class ClusterAdoptParams(_Params):
    agent_ids: Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_ADOPT)]


class ClusterHandoverParams(_Params):
    agent_ids: Annotated[list[str], msgspec.Meta(min_length=1, max_length=MAX_ADOPT)]
    to: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    timeout: Annotated[float, msgspec.Meta(ge=0)] = 300.0


class FaultInjectParams(_Params):
    fault: dict[str, Any]


class FaultClearParams(_Params):
    id: str | None = None


class McpServerParams(_Params):
    server: str


class McpReadParams(_Params):
    server: str
    uri: str


class McpPromptParams(_Params):
    server: str
    name: str
    arguments: dict[str, str] = msgspec.field(default_factory=dict)


_encoder = msgspec.json.Encoder()


def _is_top_agent(path: str) -> bool:
    """Whether ``path`` is a session's top-level agent (``/sessions/<id>/agent``)."""
    parts = path.split("/")
    return len(parts) == 4 and path == agent_path(parts[2])


def _plain(value: Any) -> Any:
    """Turn results (attrs, msgspec structs, paths) into JSON-ready data."""
    return msgspec.to_builtins(value, enc_hook=_enc_hook)


def _enc_hook(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value, recurse=False)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, BaseException):
        return repr(value)
    return repr(value)


# -- the socket ------------------------------------------------------------------------------------


def prepare_socket(path: Path) -> None:
    """Make ``path`` ready to bind: owner-only directory, stale socket removed, live one refused.

    Raises:
        SocketInUseError: a daemon answers on it.
        WealdError: something that is not a socket is in the way.
    """
    make_private_dirs(path.parent)
    if not path.exists() and not path.is_symlink():
        return
    mode = path.lstat().st_mode
    if not stat.S_ISSOCK(mode):
        msg = f"{path} exists and is not a socket; remove it or choose another socket path"
        raise WealdError(msg)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            path.unlink(missing_ok=True)  # a dead daemon's socket: safe to replace
            return
        raise
    else:
        msg = f"a weald daemon is already running on {path}; stop it first or use another --socket"
        raise SocketInUseError(msg)
    finally:
        probe.close()


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


# -- a connection ------------------------------------------------------------------------------------


class Connection:
    """One client: its outgoing queue, its subscriptions, the agents it listens to."""

    _ids = itertools.count(1)

    def __init__(self, server: Server, send: trio.abc.SendStream, peer: str) -> None:
        self.server = server
        self.id = next(self._ids)
        self.peer = peer
        self._stream = send
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](_OUTBOX)
        self.interests: dict[str, int] = {}  # agent id (or "*") -> how many reasons
        self.ephemeral: set[str] = set()  # agents it started ephemeral: stopped when it closes
        self.subscriptions: dict[str, Any] = {}
        self.dropped = 0
        self.requests = 0
        self.limiter = trio.CapacityLimiter(_MAX_CONCURRENT_REQUESTS)
        self.in_flight_ids: set[str | int] = set()  # ids of the requests read and not yet answered
        self.nursery: trio.Nursery | None = None  # the connection's own; set when it is served
        # Invariant: written <= queued; the writer wakes `_sent` after each write and when it ends.
        self.queued = 0
        self.written = 0
        self.ended = False
        self._sent = trio.lowlevel.ParkingLot()

    async def writer(self) -> None:
        try:
            async for first in self._out_recv:
                # What else is queued goes in the same write (pipelined replies: one send, not one each).
                parts = [first]
                size = len(first)
                while size < _COALESCE_BYTES:
                    try:
                        more = self._out_recv.receive_nowait()
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                    parts.append(more)
                    size += len(more)
                await self._stream.send_all(first if len(parts) == 1 else b"".join(parts))
                self.written += len(parts)
                self._sent.unpark_all()
        finally:
            self.ended = True
            self._sent.unpark_all()

    async def reply(self, payload: dict[str, Any]) -> None:
        await self.send_line(_encoder.encode(payload) + b"\n")

    async def send_line(self, data: bytes) -> None:
        """Queue one encoded message for the writer (waits while the outbox is full)."""
        await self._out_send.send(data)
        self.queued += 1

    def notify(self, method: str, params: Any) -> None:
        """Send a notification if the client keeps up; otherwise drop and count it."""
        data = _encoder.encode({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n"
        try:
            self._out_send.send_nowait(data)
        except trio.WouldBlock:
            self.dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        else:
            self.queued += 1

    async def wait_written(self) -> None:
        """Wait until everything queued so far is written to the client (or the client is gone)."""
        target = self.queued
        while self.written < target and not self.ended:
            await self._sent.park()

    def interested_in(self, agent_id: str) -> bool:
        return agent_id in self.interests or "*" in self.interests

    def watch(self, agent_id: str) -> None:
        self.interests[agent_id] = self.interests.get(agent_id, 0) + 1

    def unwatch(self, agent_id: str) -> None:
        left = self.interests.get(agent_id, 0) - 1
        if left <= 0:
            self.interests.pop(agent_id, None)
        else:
            self.interests[agent_id] = left

    def close(self) -> None:
        for sub in self.subscriptions.values():
            sub.close()
        self.subscriptions.clear()
        self._out_send.close()


@attrs.frozen
class ServerSnapshot:
    """The server actor's state for introspection."""

    path: str
    status: str
    socket: str | None
    connections: int
    requests: int
    refused: int


Handler = Callable[[Connection, Any], Awaitable[Any]]

# Methods that stream to, or wait on behalf of, one client connection.
_CONNECTION_METHODS = frozenset({"events.subscribe", "events.unsubscribe", "agent.prompt"})


class _NoStream(trio.abc.SendStream):
    """The send side of the in-process connection (`Server.call_nowait`): nothing is ever sent."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _ignore(_: Any) -> None:
    """An I/O task's reply that tells the actor nothing: the task reported its own outcome."""


class Server(Actor):
    """Serves the daemon's JSON-RPC API on a Unix socket (and/or stdio).

    Args:
        daemon: the `weald.runtime.daemon.tree.Daemon` it fronts.
        socket_path: where to listen, or None.
        stdio: serve one connection on stdin/stdout instead.
    """

    def __init__(self, daemon: Any, socket_path: Path | None = None, stdio: bool = False, cluster: Any = None) -> None:
        super().__init__()
        self._daemon = daemon
        self._socket_path = socket_path
        self._stdio = stdio
        # A node's port for fronts (`ClusterPort`: its bound socket, the secret, TLS), or None.
        self._cluster = cluster
        self._connections: dict[int, Connection] = {}
        self._requests = 0
        self._refused = 0
        self._permissions: dict[
            str, tuple[str, str, dict[str, Any]]
        ] = {}  # request id -> (runner path, agent id, data)
        self._questions: dict[str, tuple[str, str, dict[str, Any]]] = {}  # question id -> (agent path, agent id, data)
        self._subscription_ids = itertools.count(1)
        self._listening = trio.Event()
        self._max_message_bytes: int = daemon.config.limits.max_message_bytes
        limits = daemon.config.limits
        self._max_connections: int = limits.max_connections or default_max_connections()
        self._budget = InputBudget(limits.max_buffered_bytes)  # partial lines of every connection
        self._acceptor: Acceptor | None = None  # set while the socket listens
        self._accepting = trio.CancelScope()  # cancelled to stop accepting connections
        self._accepting_fronts = trio.CancelScope()  # the same, on a node's port for fronts
        self._stopping = False  # True once stop_accepting ran: new turns are refused
        self._socket_id: tuple[int, int] | None = None  # (device, inode) of the socket we bound
        # Invariant: _in_flight counts requests read and not yet answered; _answered wakes at 0.
        self._in_flight = 0
        self._answered = trio.lowlevel.ParkingLot()
        # In-process callers' requests (`call_nowait`) run on this connection; nothing is sent on it.
        self._local = Connection(self, _NoStream(), "local")
        # actors.list: each actor's last mailbox length and how many lists in a row saw it grow.
        self._mailboxes: dict[str, tuple[int, int]] = {}
        self._memory: dict[str, tuple[Any, float, Any]] = {}  # path -> (its ref, when, its memory estimate)
        self._methods: dict[str, tuple[type[_Params], Handler]] = {
            "agent.start": (AgentStartParams, self._agent_start),
            "agents.start": (AgentsStartParams, self._agents_start),
            "agent.prompt": (AgentPromptParams, self._agent_prompt),
            "agent.abort": (AgentParams, self._agent_abort),
            "agent.stop": (AgentParams, self._agent_stop),
            "agent.send": (AgentSendParams, self._agent_send),
            "agent.hibernate": (AgentParams, self._agent_hibernate),
            "agent.wake": (AgentParams, self._agent_wake),
            "agent.list": (AgentListParams, self._agent_list),
            "sessions.page": (SessionsPageParams, self._sessions_page),
            "agent.history": (AgentHistoryParams, self._agent_history),
            "agent.compact": (AgentParams, self._agent_compact),
            "debug_state": (DebugStateParams, self._debug_state),
            "tree": (TreeParams, self._tree),
            "tasks.list": (TasksListParams, self._tasks_list),
            "permission.list": (OpenPromptsParams, self._permission_list),
            "permission.respond": (PermissionRespondParams, self._permission_respond),
            "ask_user.list": (OpenPromptsParams, self._ask_user_list),
            "ask_user.respond": (AskUserRespondParams, self._ask_user_respond),
            "client.attach": (ClientAttachParams, self._client_attach),
            "client.respond": (ClientRespondParams, self._client_respond),
            "actor.snapshot": (ActorSnapshotParams, self._actor_snapshot),
            "actor.restart": (ActorPathParams, self._actor_restart),
            "actors.list": (ActorsListParams, self._actors_list),
            "observer.url": (NoParams, self._observer_url),
            "events.subscribe": (EventsSubscribeParams, self._events_subscribe),
            "events.unsubscribe": (EventsUnsubscribeParams, self._events_unsubscribe),
            "events.query": (EventsQueryParams, self._events_query),
            "metrics.series": (MetricsSeriesParams, self._metrics_series),
            "fault.inject": (FaultInjectParams, self._fault_inject),
            "fault.clear": (FaultClearParams, self._fault_clear),
            "fault.list": (NoParams, self._fault_list),
            "mcp.servers": (NoParams, self._mcp_servers),
            "mcp.resources.list": (McpServerParams, self._mcp_resources_list),
            "mcp.resources.read": (McpReadParams, self._mcp_resources_read),
            "mcp.resources.subscribe": (McpReadParams, self._mcp_resources_subscribe),
            "mcp.resources.unsubscribe": (McpReadParams, self._mcp_resources_unsubscribe),
            "mcp.prompts.list": (McpServerParams, self._mcp_prompts_list),
            "mcp.prompts.get": (McpPromptParams, self._mcp_prompts_get),
            "daemon.status": (NoParams, self._daemon_status),
            "daemon.stop": (NoParams, self._daemon_stop),
            "history.gc": (NoParams, self._history_gc),
            "config.reload": (NoParams, self._config_reload),
            "config.trust": (ConfigTrustParams, self._config_trust),
            "config.untrust": (ConfigUntrustParams, self._config_untrust),
            "config.trusted": (NoParams, self._config_trusted),
            "cluster.adopt": (ClusterAdoptParams, self._cluster_adopt),
            "cluster.handover": (ClusterHandoverParams, self._cluster_handover),
            "cluster.load": (NoParams, self._cluster_load),
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def on_start(self) -> Any:
        """Bind the socket (or stdio) and start serving; ready when this returns."""
        return self._start()

    async def _start(self) -> None:
        self.run_io(self._watch_prompts, reply=_crash_on_error, name="prompt router")
        if self._socket_path is not None:
            listener = self._listen(self._socket_path)
            # The listener ending on an error crashes the server, so its supervisor restarts it.
            self.run_io(self._serve_socket, listener, reply=_crash_on_error, name="socket listener")
        if self._stdio:
            self.run_io(self._serve_stdio, name="stdio")
        if self._cluster is not None:
            self.run_io(self._serve_cluster, reply=_crash_on_error, name="cluster listener")

    def on_receive(self, message: Any) -> None:
        """An I/O task of the server failed: crash, to be restarted."""
        if isinstance(message, _Failed):
            msg = f"the server's {message.what} failed: {message.error!r}"
            raise WealdError(msg) from message.error

    def on_stop(self) -> None:
        """Close every connection; remove the socket file if it is still the one this server bound.

        Runs in the server's own context (the loop thread) when it stops.
        A socket another daemon bound at the same path meanwhile (ours no
        longer answered, so it was stale to that one) is left alone.
        """
        for conn in list(self._connections.values()):
            conn.close()
        if self._socket_path is not None and self._socket_id is not None:
            with contextlib.suppress(OSError):
                found = self._socket_path.lstat()
                if (found.st_dev, found.st_ino) == self._socket_id:
                    self._socket_path.unlink()

    def stop_accepting(self) -> None:
        """Close the listener and refuse new turns; connections and requests in flight carry on.

        The first step of the daemon's shutdown; runs in the server's own
        context (the loop thread).
        """
        self._stopping = True
        self._accepting.cancel()
        self._accepting_fronts.cancel()

    async def wait_replies_written(self) -> None:
        """Wait until every request in flight is answered and every answer is written to its client.

        The daemon calls it after aborting the running turns, so that each
        pending ``agent.prompt`` gets its reply before connections close.
        It waits as long as that takes: the caller bounds it with a deadline.
        """
        while self._in_flight:
            await self._answered.park()
        async with trio.open_nursery() as nursery:
            for conn in list(self._connections.values()):
                nursery.start_soon(conn.wait_written)

    def _listen(self, path: Path) -> socket.socket:
        """The listening socket, non-blocking (`Acceptor` waits on it through trio)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        old = os.umask(0o177)  # the socket is born owner-only; no window where others may connect
        try:
            sock.bind(str(path))
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        bound = os.lstat(path)
        self._socket_id = (bound.st_dev, bound.st_ino)
        sock.listen(512)
        return sock

    def snapshot(self) -> ServerSnapshot:
        """Connections and request counts."""
        return ServerSnapshot(
            path=self.path,
            status=self._status,
            socket=str(self._socket_path) if self._socket_path else None,
            connections=len(self._connections),
            requests=self._requests,
            refused=self._refused,
        )

    # -- serving ------------------------------------------------------------------------------

    async def _serve_socket(self, listener: socket.socket) -> None:
        # Connections live in the outer nursery: they outlast the listener,
        # which closes when the daemon stops accepting (`stop_accepting`).
        acceptor = Acceptor(listener, self._max_connections, self._publish)
        self._acceptor = acceptor
        async with trio.open_nursery() as nursery:
            with self._accepting:
                try:
                    await self._accept(acceptor, nursery)
                finally:
                    trio.lowlevel.notify_closing(listener)
                    listener.close()
                    acceptor.close()

    def _publish(self, topic: str, data: dict[str, Any]) -> None:
        self.system.events.publish(topic, self.path, data)

    async def _accept(self, acceptor: Acceptor, nursery: trio.Nursery) -> None:
        """Accept clients for as long as the listener is open (see `Acceptor` for the limits)."""
        while True:
            sock = await acceptor.accept()
            try:
                uid = _peer_uid(sock)
            except OSError:
                uid = -1
            if uid != os.getuid():
                self._refused += 1
                self.system.events.publish("server.refused", self.path, {"uid": uid})
                sock.close()
                acceptor.closed()
                continue
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            nursery.start_soon(self._contain, self._serve_stream, stream, f"uid {uid}", acceptor)

    async def _serve_stream(self, stream: trio.SocketStream, peer: str, acceptor: Acceptor) -> None:
        """One accepted socket: served, then closed (and its place freed), whatever ended it."""
        try:
            async with stream:
                await self._serve_connection(stream, stream, peer)
        finally:
            acceptor.closed()

    async def _serve_cluster(self) -> None:
        """Serve fronts on the node's TCP port: each connection proves it holds the cluster's secret first."""
        port = self._cluster
        acceptor = Acceptor(port.sock, self._max_connections, self._publish)
        async with trio.open_nursery() as nursery:
            with self._accepting_fronts:
                try:
                    while True:
                        sock = await acceptor.accept()
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        peer = "tcp"
                        with contextlib.suppress(OSError):
                            peer = "tcp {}:{}".format(*sock.getpeername()[:2])
                        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                        nursery.start_soon(self._contain, self._serve_front, stream, peer, acceptor)
                finally:
                    # The socket stays open: a restarted server serves it again (the daemon closes it at its stop).
                    acceptor.close()

    async def _serve_front(self, tcp: trio.SocketStream, peer: str, acceptor: Acceptor) -> None:
        """One front's connection: TLS if configured, the handshake, then JSON-RPC as on the socket."""
        from weald.runtime.daemon._cluster import HANDSHAKE_TIMEOUT, HandshakeError, PrefixedStream, server_handshake

        port = self._cluster
        try:
            stream: trio.abc.Stream = tcp
            if port.tls is not None:
                stream = trio.SSLStream(tcp, port.tls, server_side=True)
            async with stream:
                buffer = bytearray()
                node = self.system.store.node
                try:
                    with trio.fail_after(HANDSHAKE_TIMEOUT):
                        await server_handshake(
                            stream, buffer, port.secret, node.node_id if node else "", node.epoch if node else 0
                        )
                except (HandshakeError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    self._refused += 1
                    reason = str(exc) or "the handshake took too long"
                    self.system.events.publish("server.refused", self.path, {"peer": peer, "reason": reason})
                    return
                await self._serve_connection(PrefixedStream(stream, buffer), stream, peer)
        finally:
            acceptor.closed()

    async def _contain(self, serve: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Serve one connection; whatever happens to it stays with it.

        trio reports a task's failure as an ExceptionGroup; only cancellation
        may leave (the server is stopping), anything else is reported here so
        that one client can never take the listener and the others down.
        """
        try:
            await serve(*args)
        except BaseException as exc:
            cancelled, rest = (
                exc.split(trio.Cancelled)
                if isinstance(exc, BaseExceptionGroup)
                else ((exc, None) if isinstance(exc, trio.Cancelled) else (None, exc))
            )
            if rest is not None and not _only_disconnects(rest):
                self.system.events.publish("server.error", self.path, {"error": repr(rest)})
            if cancelled is not None:
                raise cancelled from None

    async def _serve_stdio(self) -> None:
        reader = trio.lowlevel.FdStream(os.dup(0))
        writer = trio.lowlevel.FdStream(os.dup(1))
        async with reader, writer:
            await self._contain(self._serve_connection, reader, writer, "stdio")
        self._daemon.request_stop()  # stdin closed: the client is gone

    async def _serve_connection(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream, peer: str) -> None:
        conn = Connection(self, send, peer)
        self._connections[conn.id] = conn
        self.system.events.publish("server.connected", self.path, {"connection": conn.id, "peer": peer})
        try:
            async with trio.open_nursery() as nursery:
                conn.nursery = nursery
                nursery.start_soon(conn.writer)
                idle = trio.Event()
                in_flight = 0

                async def handle(request: Any, early: dict[int, dict[str, Any]], claim: _Claim) -> None:
                    nonlocal in_flight
                    try:
                        await self._answer(conn, request, early)
                    finally:
                        conn.in_flight_ids.difference_update(claim.ids)
                        in_flight -= 1
                        self._request_done()
                        conn.limiter.release_on_behalf_of(claim)
                        if in_flight == 0:
                            idle.set()

                async with contextlib.aclosing(read_lines(receive, self._max_message_bytes, self._budget)) as lines:
                    async for line in lines:
                        if isinstance(line, TooLarge):
                            # The reply carries the request's id when the line's start gave it.
                            message = _too_large(self._max_message_bytes)
                            await conn.reply(_error(line.request_id, INVALID_REQUEST, message))
                            continue
                        if isinstance(line, OverBudget):
                            await self._refuse_over_budget(conn, line)
                            break
                        assert isinstance(line, bytes)
                        request = await self._decode(conn, line)
                        if request is _UNREADABLE:
                            continue
                        # Ids are claimed here, in the order requests came: a second request
                        # with the id of one still in flight is refused, the first goes on.
                        early, claim = _claim_ids(conn, request)
                        # At most _MAX_CONCURRENT_REQUESTS in flight: reading waits for room (backpressure).
                        # The borrower is the claim: a new object for each message, equal bytes or not.
                        await conn.limiter.acquire_on_behalf_of(claim)
                        in_flight += 1
                        self._in_flight += 1
                        idle = trio.Event() if idle.is_set() else idle
                        nursery.start_soon(handle, request, early, claim)
                # End of input (or input refused): answer what is in flight, then close.
                # A client that is really gone breaks the writer, which cancels the rest.
                # Its own agents go first: a turn of one (a prompt in flight) ends with it.
                self._reap_nowait(conn)
                # Its editor can answer nothing more: tool calls waiting on it fail now (their turn is in flight).
                self._daemon.editors.connection_closed(conn)
                if in_flight:
                    await idle.wait()
                conn.close()
        finally:
            conn.close()
            self._connections.pop(conn.id, None)
            # Tool calls waiting on this connection's editor fail now, not at their deadline.
            self._daemon.editors.connection_closed(conn)
            self.system.events.publish("server.disconnected", self.path, {"connection": conn.id})
            self._reap_nowait(conn)

    def _reap_nowait(self, conn: Connection) -> None:
        """Stop the agents ``conn`` started ephemeral: its client went without stopping them (killed, say)."""
        if conn.ephemeral:
            agent_ids, conn.ephemeral = sorted(conn.ephemeral), set()
            self.run_io(self._reap, agent_ids, reply=_ignore, name="reap ephemeral agents")

    async def _reap(self, agent_ids: list[str]) -> None:
        for agent_id in agent_ids:
            if await self._sessions.stop(agent_id):
                self.system.events.publish(
                    "daemon.reaped", "/sessions", {"agent_id": agent_id, "reason": "its client disconnected"}
                )

    async def _refuse_over_budget(self, conn: Connection, over: OverBudget) -> None:
        """This connection's partial line broke the daemon's input budget: tell it; nothing more is read."""
        limit = self._budget.limit
        self.system.events.publish(
            "server.input_refused",
            self.path,
            {"connection": conn.id, "held": over.held, "max_buffered_bytes": limit, "buffered": self._budget.held},
        )
        data = {"limit": "limits.max_buffered_bytes", "value": limit}
        await conn.reply(_error(None, LIMIT_REACHED, over_budget_message(over.held, limit), data))

    def _request_done(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._answered.unpark_all()

    # -- requests ---------------------------------------------------------------------------------

    async def _decode(self, conn: Connection, raw: bytes) -> Any:
        """The message of one line, or `_UNREADABLE` once its parse error is sent."""
        self._requests += 1
        conn.requests += 1
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            problem = f"the message is not valid JSON ({exc})"
        except UnicodeDecodeError as exc:
            problem = f"the message is not valid UTF-8 ({exc.reason} at byte {exc.start} of a string)"
        except RecursionError:
            problem = "the JSON is nested too deeply"
        await conn.reply(_error(None, PARSE_ERROR, f"parse error: {problem}"))
        return _UNREADABLE

    async def _answer(self, conn: Connection, request: Any, early: dict[int, dict[str, Any]]) -> None:
        """Run one request (or a batch) and send its reply; ``early`` holds replies decided when it was read."""
        if isinstance(request, list):
            if not request:
                await conn.reply(_error(None, INVALID_REQUEST, "invalid request: an empty batch"))
                return
            replies = []
            for index, item in enumerate(request):
                reply = early[index] if index in early else await self._one_contained(conn, item)
                if reply is not None:
                    replies.append(reply)
            if replies:
                await conn.send_line(_encoder.encode(replies) + b"\n")
            return
        response = early[0] if early else await self._one_contained(conn, request)
        if response is not None:
            await conn.reply(response)

    async def _one_contained(self, conn: Connection, request: Any) -> dict[str, Any] | None:
        """`_one`, with any failure of it answered as an internal error: the connection carries on."""
        try:
            return await self._one(conn, request)
        except Exception as exc:  # a bug in one request never costs the others on the connection
            self.system.events.publish("server.error", self.path, {"error": repr(exc)})
            if not isinstance(request, dict) or "id" not in request:
                return None
            request_id = request["id"] if isinstance(request["id"], str | int) else None
            return _error(request_id, INTERNAL_ERROR, f"internal error: {exc!r}")

    async def _one(self, conn: Connection, request: Any) -> dict[str, Any] | None:
        if not isinstance(request, dict):
            return _error(None, INVALID_REQUEST, "invalid request: expected a JSON object")
        request_id = request.get("id")
        notification = "id" not in request
        if request.get("jsonrpc") != "2.0":
            return _error(request_id, INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
        if isinstance(request_id, bool) or (request_id is not None and not isinstance(request_id, str | int)):
            return _error(None, INVALID_REQUEST, 'invalid request: "id" must be a string, a number or null')
        method = request.get("method")
        if not isinstance(method, str):
            return _error(request_id, INVALID_REQUEST, 'invalid request: "method" must be a string')
        outcome = await self._call(conn, method, request.get("params", {}))
        if notification:
            return None
        return {"jsonrpc": "2.0", "id": request_id, **outcome}

    async def _call(self, conn: Connection, method: str, raw_params: Any) -> dict[str, Any]:
        """Run one method: ``{"result": ...}`` (JSON-ready) or ``{"error": {code, message, data?}}``."""
        entry = self._methods.get(method)
        if entry is None:
            known = ", ".join(sorted(self._methods))
            return _failure(METHOD_NOT_FOUND, f"method not found: {method!r}. Methods: {known}")
        params_type, handler = entry
        if raw_params is None:
            raw_params = {}
        if not isinstance(raw_params, dict):
            return _failure(INVALID_PARAMS, "invalid params: params must be an object of named parameters")
        try:
            params = msgspec_convert(raw_params, params_type)
        except msgspec.ValidationError as exc:
            return _failure(INVALID_PARAMS, f"invalid params for {method}: {_describe(exc)}")
        try:
            result = await handler(conn, params)
        except Exception as exc:
            return self._failed(method, exc)
        return {"result": _plain(result)}

    def _failed(self, method: str, exc: Exception) -> dict[str, Any]:
        """The ``error`` part of the reply to ``method`` that raised ``exc``."""
        if isinstance(exc, RPCError):
            return _failure(exc.code, exc.message, exc.data)
        if isinstance(exc, WealdError | ValueError | KeyError):
            if getattr(exc, "rpc_code", None) == INVALID_PARAMS:  # the daemon's InvalidRequestError
                return _failure(INVALID_PARAMS, f"invalid params for {method}: {exc}", {"field": exc.field})  # type: ignore[union-attr]
            if getattr(exc, "rpc_code", None) == UNTRUSTED_CONFIG:  # the daemon's UntrustedConfigDaemonError
                return _failure(UNTRUSTED_CONFIG, str(exc), exc.data)  # type: ignore[union-attr]
            return _failure(APP_ERROR, str(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            return _failure(APP_ERROR, _out_of_fds(method))
        self.system.events.publish("server.error", self.path, {"method": method, "error": repr(exc)})
        return _failure(INTERNAL_ERROR, f"internal error in {method}: {exc!r}")

    def call_nowait(self, method: str, params: dict[str, Any] | None = None) -> Future[dict[str, Any]]:
        """Run one of the methods for an in-process caller (the HTTP observer); returns a future of its outcome.

        The outcome is what a JSON-RPC reply carries besides its id:
        ``{"result": ...}`` or ``{"error": {"code", "message", "data"?}}``,
        from the same method table, checks and handlers as the socket's
        requests. The method runs in a task of its own, so a slow one never
        holds up this actor's mailbox. Methods that need a connection of
        their own (``events.subscribe``, ``agent.prompt``) are refused: the
        observer reads the bus itself.

        Runs in the server's own context (the loop thread).
        """
        future: Future[dict[str, Any]] = Future()
        if method in _CONNECTION_METHODS:
            future.set(_failure(INVALID_REQUEST, f"{method} needs a client connection of its own (the socket)"))
            return future

        async def run() -> None:
            try:
                outcome = await self._call(self._local, method, params)
            except BaseException:  # the caller learns what went wrong; cancellation still ends the task
                future.set_exception()
                raise
            future.set(outcome)

        self.run_io(run, reply=_ignore, name=f"local {method}")
        return future

    # -- agents --------------------------------------------------------------------------------------

    @property
    def _sessions(self) -> Any:
        sessions = self._daemon.sessions
        if sessions is None:
            raise RPCError(APP_ERROR, "the daemon is still starting")
        return sessions

    async def _agent(self, agent_id: str) -> Any:
        """The running agent of ``agent_id``.

        Raises:
            RPCError: it is not running here: not this node's (NOT_OWNER: a front looks its
                owner up again, or asks again shortly while it is on its way here), or no such
                agent runs (NOT_FOUND).
        """
        ref = self.system.whereis(agent_path(agent_id))
        sessions = self._daemon.sessions
        leaving = sessions is not None and agent_id in sessions.leaving
        if ref is not None and not leaving:
            return ref
        store = self.system.store
        node = store.node
        if node is not None and store.fences:
            # On its way here (claimed and restoring, a claim in flight, handed over and not adopted
            # yet), or away (being handed over, handed over, taken over): never "no such agent" to a front.
            gone = leaving or store.fenced_error(agent_id) is not None
            arriving = not gone and await trio.to_thread.run_sync(store.arriving, agent_id)
            if gone or arriving:
                where = "is on its way to" if arriving else "is leaving" if leaving else "is no longer on"
                raise RPCError(
                    NOT_OWNER,
                    f"agent {agent_id!r} {where} node {node.node_id!r}; its placement names its node",
                    {"node": node.node_id},
                )
        raise RPCError(NOT_FOUND, f"no running agent {agent_id!r}; agent.list shows the running ones")

    def _refuse_when_stopping(self, method: str) -> None:
        if self._stopping:
            raise RPCError(APP_ERROR, f"{method} refused: {SHUTDOWN_REASON}; send it again once it is back")

    async def _agent_start(self, conn: Connection, p: AgentStartParams) -> dict[str, Any]:
        self._refuse_when_stopping("agent.start")
        agent_id = await self._sessions.start(
            p.working_dir,
            model=p.model,
            tools=p.tools,
            system_prompt=p.system_prompt,
            agent_id=p.agent_id,
            record=p.record,
            asleep=self._sessions.start_asleep if p.asleep is None else p.asleep,
            mcp_servers=p.mcp_servers,
            project=p.project,
            ephemeral=p.ephemeral,
            title=p.title,
            trust_config=p.trust_config,
        )
        if p.ephemeral and conn is not self._local:
            conn.ephemeral.add(agent_id)
        return {"agent_id": agent_id}

    async def _agents_start(self, conn: Connection, p: AgentsStartParams) -> dict[str, Any]:
        """Start every entry as ``agent.start`` would, together; each answered in its place.

        ``results[i]`` is ``{"result": {"agent_id": ...}}`` or ``{"error":
        {code, message, data?}}`` for ``agents[i]``, as the reply to that
        ``agent.start`` would carry; one entry's failure leaves the others be.
        """
        self._refuse_when_stopping("agents.start")
        results, valid = _check_batch_starts(p.agents)
        starts: list[dict[str, Any]] = []
        places: list[int] = []
        for index, _, params in valid:
            options = msgspec.structs.asdict(params)
            options["asleep"] = self._sessions.start_asleep if params.asleep is None else params.asleep
            starts.append(options)
            places.append(index)
        outcomes = await self._sessions.start_all(starts)
        for index, outcome in zip(places, outcomes, strict=True):
            if not isinstance(outcome, Exception):
                results[index] = {"result": {"agent_id": outcome}}
                continue
            where = f"agents[{index}]"
            failed = self._failed(f"agents.start ({where})", outcome)
            data = failed["error"].get("data")
            if isinstance(data, dict) and "field" in data:  # the param, within the entry
                data["field"] = f"{where}.{data['field']}"
            results[index] = failed
        return {"results": results}

    async def _agent_prompt(self, conn: Connection, p: AgentPromptParams) -> Any:
        """Run a turn through the daemon's turn gate; answered with its `TurnResult` when it ends."""
        self._refuse_when_stopping("agent.prompt")
        await self._agent(p.agent_id)
        conn.watch(p.agent_id)
        self._replay_open_prompts(conn, p.agent_id)
        try:
            since = self.system.events.published  # a start failure after this is this prompt's
            images = tuple(Image(image.mime_type, image.data) for image in p.images or ())
            if p.traceparent is not None and self._daemon.telemetry is not None:
                self._daemon.telemetry.expect_parent(p.agent_id, p.traceparent)
            if p.idempotency_key is not None:
                future = await self._sessions.prompt_once(p.agent_id, p.text, p.idempotency_key, images)
            else:
                future = self._sessions.prompt_nowait(p.agent_id, p.text, images)
            try:
                if p.timeout is None:
                    return self._explained(await future)
                with trio.move_on_after(p.timeout):
                    return self._explained(await future)
            except ActorDeadError as exc:
                raise await self._not_run(p.agent_id, exc, since) from exc
            waiting = " (or is still waiting for a turn slot, limits.max_concurrent_turns)"
            limited = self._daemon.config.limits.max_concurrent_turns is not None
            raise RPCError(
                APP_ERROR,
                f"the turn did not end within {p.timeout:g} s{waiting if limited else ''}; it goes on "
                "(agent.abort stops it, agent.history shows it)",
            )
        finally:
            conn.unwatch(p.agent_id)

    async def _not_run(self, agent_id: str, exc: ActorDeadError, since: int) -> RPCError:
        """Why a prompt found its agent gone: a session that could not be started (woken) says why."""
        with trio.move_on_after(5):  # its supervisor has published the failure once it answers this
            await self._sessions.wait_settled()
        failed = self.system.events.recent(
            1,
            topic="supervisor.child_start_failed",
            source="/sessions",
            where=lambda event: event.seq > since and event.data.get("id") == agent_id,
        )
        if failed:
            cause = failed[-1].data.get("error", "")
            return RPCError(
                APP_ERROR,
                f"agent {agent_id!r} could not be started to take the prompt: {cause}; fix that and start it "
                "again (agent.stop, then agent.start)",
            )
        return RPCError(APP_ERROR, f"agent {agent_id!r} stopped before it took the prompt ({exc}); agent.list shows it")

    def _explained(self, result: TurnResult) -> TurnResult:
        """A turn the shutdown aborted says so (the agent only knows it was aborted)."""
        if self._stopping and result.aborted and SHUTDOWN_REASON not in (result.error or ""):
            error = f"{SHUTDOWN_REASON}: the turn was aborted; its history is kept and the agent is restored on restart"
            return attrs.evolve(result, error=error)
        return result

    async def _agent_abort(self, conn: Connection, p: AgentParams) -> dict[str, Any]:
        await self._agent(p.agent_id)
        return {"aborted": await self._sessions.abort(p.agent_id)}

    async def _agent_stop(self, conn: Connection, p: AgentParams) -> dict[str, Any]:
        for other in self._connections.values():
            other.ephemeral.discard(p.agent_id)
        return {"stopped": await self._sessions.stop(p.agent_id)}

    async def _agent_send(self, conn: Connection, p: AgentSendParams) -> dict[str, Any]:
        """Queue a prompt through the turn gate and answer at once (the turn's result lands in its history)."""
        self._refuse_when_stopping("agent.send")
        await self._agent(p.agent_id)
        future = self._sessions.prompt_nowait(p.agent_id, p.text)

        async def outcome() -> None:
            try:
                await future
            except Exception as exc:  # never started: nobody waits on it, so the bus says so
                data = {"agent_id": p.agent_id, "error": str(exc) or repr(exc)}
                self.system.events.publish("server.send_failed", self.path, data)

        self.run_io(outcome, reply=_ignore, name=f"sent to {p.agent_id}")
        return {"agent_id": p.agent_id, "queued": True}

    async def _agent_hibernate(self, conn: Connection, p: AgentParams) -> dict[str, Any]:
        """Hibernate an idle session now, as ``limits.hibernate_after`` would; a busy one stays awake."""
        ref = await self._agent(p.agent_id)
        if isinstance(ref, Stub) and ref.successor is None:
            return {"agent_id": p.agent_id, "hibernated": False, "reason": "it is asleep already"}
        with self.system.events.subscribe("supervisor.child_hibernated", source="/sessions", max_buffer=4096) as sub:
            try:
                hibernated: bool = await (await ref.proxy().hibernate_now())
            except ActorDeadError as exc:
                raise RPCError(APP_ERROR, f"agent {p.agent_id!r} stopped before it could hibernate ({exc})") from exc
            if not hibernated:
                reason = (
                    "it is busy (a turn, an open question or permission request, a tool call or a write not yet "
                    "committed); ask again once it is idle"
                )
                return {"agent_id": p.agent_id, "hibernated": False, "reason": reason}
            # Answered as the agent stops: the session's supervisor puts its stub in place right after.
            with trio.move_on_after(30):
                async for event in sub:
                    if event.source == "/sessions" and event.data.get("id") == p.agent_id:
                        break
        return {"agent_id": p.agent_id, "hibernated": isinstance(self.system.whereis(f"/sessions/{p.agent_id}"), Stub)}

    async def _agent_wake(self, conn: Connection, p: AgentParams) -> dict[str, Any]:
        """Start an asleep session's actors now, rather than at its next message."""
        ref = await self._agent(p.agent_id)
        asleep = isinstance(ref, Stub) and ref.successor is None
        since = self.system.events.published
        try:
            await ref.proxy().snapshot(0)  # a message to the stub: the session wakes to answer it
        except ActorDeadError as exc:
            raise await self._not_run(p.agent_id, exc, since) from exc
        return {"agent_id": p.agent_id, "woken": asleep}

    # -- pages of sessions and actors (the observer at 100,000 sessions) -------------------------------

    async def _sessions_page(self, conn: Connection, p: SessionsPageParams) -> dict[str, Any]:
        """One page of the sessions, filtered, searched and sorted over all of them; awake ones first by default.

        Which sessions are awake comes from the ``/sessions`` supervisor
        (`SupervisorBase.awake_children`: what the awake ones cost, not all
        of them). The default page (awake first, no filter) then costs what
        the awake ones and the page's rows cost; a filter, a search or a sort
        by id, project or model goes once over the index (100,000 sessions:
        a dict's walk, no lookup per session).
        """
        index = self._sessions.index
        awake = await self._awake_sessions()
        awake_set = set(awake)
        counts = {"active": len(index), "awake": len(awake), "asleep": len(index) - len(awake)}
        if p.state == "stopped":
            ids, records = await self._stopped_sessions(p)
            total, page = len(ids), ids[p.offset : p.offset + p.limit]
        else:
            records = None
            total, page = self._session_ids(p, awake, awake_set)
        return {
            "total": total,
            "offset": p.offset,
            "limit": p.limit,
            "counts": counts,
            "projects": [{"working_dir": path, "sessions": n} for path, n in index.projects()[:200]],
            "models": [{"model": name, "sessions": n} for name, n in index.models()[:200]],
            "rows": await self._session_rows(page, records),
        }

    async def _awake_sessions(self) -> list[str]:
        """The active sessions awake, the most recently woken (or started) last."""
        supervisor = self.system.whereis("/sessions")
        if supervisor is None or supervisor.__class__ is Stub:
            return []
        try:
            up: list[str] = await supervisor.proxy().awake_children()
        except ActorDeadError:
            return []
        index = self._sessions.index
        return [session_id for session_id in up if session_id in index]  # a stopped one is in none

    def _session_ids(self, p: SessionsPageParams, awake: list[str], awake_set: set[str]) -> tuple[int, list[str]]:
        """How many sessions match ``p``, and the ids of its page, in its order."""
        index = self._sessions.index
        project = index.project_number(p.project) if p.project is not None else None
        model = index.model_number(p.model) if p.model is not None else None
        if (p.project is not None and project is None) or (p.model is not None and model is None):
            return 0, []
        needle = (p.search or "").casefold()
        # A search matches an id, or a project's path: each project is looked at once, not once a session.
        wanted = {index.project_number(path) for path, _ in index.projects() if needle in path.casefold()}
        slots = MODEL_SLOTS  # packed = project * slots + model (`SessionIndex`)

        def matches(session_id: str, packed: int) -> bool:
            return (
                (project is None or packed // slots == project)
                and (model is None or packed % slots == model)
                and (not needle or needle in session_id.casefold() or packed // slots in wanted)
            )

        filtered = project is not None or model is not None or bool(needle)
        sort = p.sort
        descending = p.order == "desc" if p.order is not None else sort in ("state", "started")
        window = slice(p.offset, p.offset + p.limit)
        up = [sid for sid in awake if matches(sid, index.packed(sid) or 0)] if filtered else awake
        if sort == "state" or (sort == "started" and p.state == "awake"):
            up_ordered = up[::-1] if descending else up
            if p.state == "awake":
                return len(up), up_ordered[window]
            asleep = (
                (
                    sid
                    for sid, packed in index.items(reverse=descending)
                    if sid not in awake_set and matches(sid, packed)
                )
                if filtered
                else (sid for sid, _ in index.items(reverse=descending) if sid not in awake_set)
            )
            if filtered:  # the count needs the whole pass
                down = list(asleep)
                total = (len(up) if p.state == "active" else 0) + len(down)
                ids = (up_ordered + down) if p.state == "active" else down
                return total, ids[window]
            total = (len(up) if p.state == "active" else 0) + len(index) - len(awake)
            ordered = itertools.chain(up_ordered, asleep) if p.state == "active" else asleep
            return total, list(itertools.islice(ordered, window.start, window.stop))
        # Sorted over all of them: one pass, then a sort.
        ids = [
            sid
            for sid, packed in index.items()
            if (p.state == "active" or (sid in awake_set) == (p.state == "awake")) and matches(sid, packed)
        ]
        if sort == "started":
            pass  # the index's own order
        elif sort == "id":
            ids.sort()
        else:
            name = index.project_of if sort == "project" else index.model_of
            ids.sort(key=lambda sid: (name(index.packed(sid) or 0), sid))
        if descending:
            ids.reverse()
        return len(ids), ids[window]

    async def _stopped_sessions(self, p: SessionsPageParams) -> tuple[list[str], dict[str, Any]]:
        """The stopped sessions matching ``p``, from the store (they are in no index): ids and records."""
        records = [r for r in await trio.to_thread.run_sync(self._sessions.records) if r.status == "stopped"]
        needle = (p.search or "").casefold()
        picked = [
            r
            for r in records
            if (p.project is None or r.working_dir == p.project)
            and (p.model is None or r.model == p.model)
            and (not needle or needle in r.session_id.casefold() or needle in r.working_dir.casefold())
        ]
        if p.sort == "id":
            picked.sort(key=lambda r: r.session_id)
        elif p.sort in ("project", "model"):
            picked.sort(key=lambda r: (getattr(r, "working_dir" if p.sort == "project" else "model"), r.session_id))
        else:
            picked.sort(key=lambda r: r.created)
        descending = p.order == "desc" if p.order is not None else p.sort in ("state", "started")
        if descending:
            picked.reverse()
        return [r.session_id for r in picked], {r.session_id: r for r in picked}

    async def _session_rows(self, page: list[str], known: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Rows as ``agent.list`` gives them, for a page: awake agents asked, asleep ones read from the store.

        An active session's model and project come from the index; only an
        asleep one's stored record is read (its restarts and usage: asking it
        would wake it), all in one worker-thread hop. What an asleep agent
        wrote was committed before it went to sleep, so nothing is flushed first.
        """
        index = self._sessions.index
        store = self.system.store
        whereis = self.system.whereis
        sessions: dict[str, Any] = {session_id: whereis(f"/sessions/{session_id}") for session_id in page}
        asleep = [session_id for session_id, ref in sessions.items() if ref.__class__ is Stub]

        def read() -> dict[str, AgentRecord]:
            agents: dict[str, AgentRecord] = {}
            for session_id in asleep:
                stored = store.get("agents", history_key(session_id, "", 0), type=AgentRecord)
                if stored is not None:
                    agents[session_id] = stored
            return agents

        stored: dict[str, AgentRecord] = {}
        if asleep:
            with contextlib.suppress(StoreError):  # the page is drawn without what could not be read
                stored = await trio.to_thread.run_sync(read)
        rows: list[dict[str, Any]] = []
        limiter = trio.CapacityLimiter(64)

        async def live(ref: Any, row: dict[str, Any]) -> None:
            async with limiter:
                try:
                    snap = await ref.proxy().snapshot(0)
                except Exception:
                    row["state"] = "unavailable"
                    return
            row.update(
                state=snap.status,
                turn_id=snap.turn_id,
                step=snap.step,
                restarts=snap.restarts,
                usage=_plain(snap.usage),
                context=_plain(snap.context),
            )

        async with trio.open_nursery() as nursery:
            for session_id in page:
                row: dict[str, Any] = {"agent_id": session_id, "path": agent_path(session_id)}
                record = (known or {}).get(session_id)
                packed = index.packed(session_id)
                if record is not None:
                    row.update(
                        status=record.status,
                        model=record.model,
                        working_dir=record.working_dir,
                        created=record.created,
                    )
                elif packed is not None:
                    row.update(status="active", model=index.model_of(packed), working_dir=index.project_of(packed))
                rows.append(row)
                session = sessions[session_id]
                if session is None:
                    row["awake"] = False
                    row["state"] = "stopped" if record is None or record.status == "stopped" else "not running"
                elif session.__class__ is Stub:
                    row["awake"] = False
                    row["state"] = session.state  # asking would wake it
                    agent = stored.get(session_id)
                    if agent is not None:
                        row.update(restarts=agent.restarts_at_load(self.system.run_id), usage=_plain(agent.usage))
                else:
                    row["awake"] = True
                    ref = self.system.whereis(agent_path(session_id))
                    if ref is None:
                        row["state"] = "not running"
                    else:
                        nursery.start_soon(live, ref, row)
        return rows

    async def _actors_list(self, conn: Connection, p: ActorsListParams) -> dict[str, Any]:
        """A page of the awake actors (observer's process table), read without messages, sorted over them all."""
        prefix = p.prefix.rstrip("/") or "/"
        needle = (p.search or "").casefold()
        rows: list[dict[str, Any]] = []
        seen: dict[str, tuple[int, int]] = {}
        # The actors themselves: the stubs of 100,000 asleep sessions are not walked.
        for ref in self.system.actors():
            path = ref.path
            if not _under(path, prefix):
                continue
            stats = ref.statistics()
            if stats is None:
                continue
            if needle and needle not in path.casefold() and needle not in stats.kind.casefold():
                continue
            last, streak = self._mailboxes.get(path, (0, 0))
            streak = streak + 1 if stats.mailbox > last else (streak if stats.mailbox == last and streak else 0)
            seen[path] = (stats.mailbox, streak)
            rows.append(
                {
                    "path": path,
                    "kind": stats.kind,
                    "status": stats.status,
                    "mailbox": stats.mailbox,
                    "handled": stats.handled,
                    "growing": streak >= _GROWING and stats.mailbox > 0,
                }
            )
        if prefix == "/":
            self._mailboxes = seen  # the whole table: forget the actors gone
        else:
            self._mailboxes.update(seen)
        if p.sort == "memory" and len(rows) > _MEMORY_SORT_MAX:
            raise RPCError(
                INVALID_PARAMS,
                f"invalid params for actors.list: sorting by memory estimates every actor listed, and {len(rows):,} "
                f"are; narrow the list to at most {_MEMORY_SORT_MAX:,} with prefix or search",
                {"field": "sort"},
            )
        if p.sort == "restarts":
            await self._add_restarts(rows)
        if p.sort == "memory":
            self._add_memory(rows)
        numeric = p.sort in ("mailbox", "handled", "restarts", "memory")
        descending = p.order == "desc" if p.order is not None else numeric
        key = p.sort
        rows.sort(key=lambda row: (row.get(key) or 0, row["path"]) if numeric else (row[key], row["path"]))
        if descending:
            rows.reverse()
        page = rows[p.offset : p.offset + p.limit]
        if p.sort != "restarts":
            await self._add_restarts(page)
        if p.sort != "memory":
            self._add_memory(page)
        return {"total": len(rows), "offset": p.offset, "limit": p.limit, "rows": page}

    async def _add_restarts(self, rows: list[dict[str, Any]]) -> None:
        """Each row's restarts, as its supervisor counts them (one ``which_children`` a supervisor)."""
        parents: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            row["restarts"] = 0
            parents.setdefault(_parent(row["path"]), []).append(row)
        limiter = trio.CapacityLimiter(64)

        async def ask(path: str, children: list[dict[str, Any]]) -> None:
            ref = self.system.whereis(path)
            if ref is None or ref.__class__ is Stub or not issubclass(ref.actor_class, SupervisorBase):
                return
            ids = [row["path"].rpartition("/")[2] for row in children]  # not all 100,000 of /sessions
            async with limiter:
                try:
                    infos = await ref.proxy().which_children(ids)
                except Exception:
                    return
            counts = {info.path: info.restarts for info in infos}
            for row in children:
                row["restarts"] = counts.get(row["path"], 0)
                row["supervised"] = row["path"] in counts

        async with trio.open_nursery() as nursery:
            for path, children in parents.items():
                nursery.start_soon(ask, path, children)

    def _add_memory(self, rows: list[dict[str, Any]]) -> None:
        """Each row's memory estimate; one made under `_MEMORY_AGE` s ago is reused (a table refreshed each second)."""
        whereis = self.system.whereis
        now = time.monotonic()
        cache = self._memory
        for row in rows:
            path = row["path"]
            ref = whereis(path)
            held = cache.get(path)
            if held is not None and held[0] is ref and now - held[1] < _MEMORY_AGE:
                estimate = held[2]
            else:
                estimate = ref.memory_estimate(_MEMORY_OBJECTS) if ref is not None else None
                cache[path] = (ref, now, estimate)
            row["memory"] = None if estimate is None else estimate.bytes
            if estimate is not None and not estimate.complete:
                row["memory_partial"] = True  # more than it could look at: at least this much
        if len(cache) > 4 * len(rows) + 10_000:  # the actors gone, forgotten now and then
            for path in [p for p, (_, at, _) in cache.items() if now - at >= _MEMORY_AGE]:
                del cache[path]

    async def _actor_restart(self, conn: Connection, p: ActorPathParams) -> dict[str, Any]:
        """Kill an actor so that its supervisor restarts it (Erlang observer's kill); answered once it is back."""
        path = p.path.rstrip("/") or "/"
        if not path.startswith(("/sessions/", "/mcp/")):
            raise RPCError(
                APP_ERROR,
                f"{path} is part of the daemon itself, not restarted from here (a session's actors, under "
                "/sessions/<id>, and MCP connections, under /mcp, are); restart the daemon instead",
            )
        ref = self.system.whereis(path)  # a path of an asleep session: its stub (nothing wakes)
        if ref is None or ref.__class__ is Stub:
            state = "asleep: nothing of it runs" if ref is not None else "not running"
            raise RPCError(NOT_FOUND, f"no running actor at {path} ({state}); actors.list shows the running ones")
        parent = self.system.whereis(_parent(path))
        if parent is None or parent.__class__ is Stub or not issubclass(parent.actor_class, SupervisorBase):
            raise RPCError(APP_ERROR, f"{path} has no supervisor to restart it (its parent is not one)")
        infos = await parent.proxy().which_children([path.rpartition("/")[2]])
        info = next((i for i in infos if i.path == path), None)
        if info is None or info.restart == "temporary":
            raise RPCError(
                APP_ERROR,
                f"{path} is a temporary child (a tool call): its supervisor does not restart it; "
                "abort the turn instead",
            )
        with self.system.events.subscribe("supervisor.child_restarted", source=parent.path, max_buffer=256) as sub:
            ref.kill()
            restarts = None
            with trio.move_on_after(30):
                async for event in sub:
                    if event.data.get("path") == path:
                        restarts = event.data.get("restarts")
                        break
        if restarts is None:
            raise RPCError(
                APP_ERROR,
                f"{path} was killed and not restarted within 30 s; its supervisor may have given up (tree shows it)",
            )
        return {"path": path, "restarted": True, "restarts": restarts}

    async def _agent_list(self, conn: Connection, p: AgentListParams) -> list[dict[str, Any]] | dict[str, Any]:
        """Stored sessions in id order, with their live state: all of them, or a page (``limit``, ``after``).

        A page costs the page: its records are one key range of the store
        (the ``sessions`` namespace is keyed by id), its asleep agents'
        records another (a session never woken has none), and only its awake
        agents are asked (an asleep one would wake). Without ``limit`` or
        ``after`` the whole list comes back as a bare list, as it always did,
        built page by page. ``stopped`` false leaves stopped sessions out;
        ``long`` adds each session's ``spill_bytes`` (a third key range).
        """
        with contextlib.suppress(StoreError):  # what is committed answers when a commit fails (a full disk)
            await self.system.store.flush()
        if p.agent_id is not None:
            rows, _ = await self._agent_list_page(None, 1, p)
            return {"rows": rows, "next_after": None, "limit": 1}
        if p.limit is None and p.after is None:
            out: list[dict[str, Any]] = []
            after: str | None = None
            while True:
                rows, after = await self._agent_list_page(after, _AGENT_LIST_PAGE, p)
                out += rows
                if after is None:
                    return out
        limit = _AGENT_LIST_PAGE if p.limit is None else p.limit
        rows, next_after = await self._agent_list_page(p.after, limit, p)
        return {"rows": rows, "next_after": next_after, "limit": limit}

    async def _agent_list_page(
        self, after: str | None, limit: int, p: AgentListParams
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Up to ``limit`` rows of the sessions whose ids sort after ``after``; the next ``after`` (None: no more)."""
        records, more, agents, spill = await trio.to_thread.run_sync(
            functools.partial(
                self._sessions.listing_page, after, limit, stopped=p.stopped, spill=p.long, only=p.agent_id
            )
        )
        rows: list[dict[str, Any]] = []
        limiter = trio.CapacityLimiter(64)
        system = self.system
        run_id = system.run_id
        config_state = self._sessions.config_state
        memo: dict[Any, dict[str, Any]] = {}  # the rows of one page share their configurations' dicts

        async def live(ref: Any, row: dict[str, Any]) -> None:
            async with limiter:
                try:
                    snap = await ref.proxy().snapshot(0)
                except Exception:
                    row["state"] = "unavailable"
                    return
            row.update(
                state=snap.status,
                turn_id=snap.turn_id,
                step=snap.step,
                restarts=snap.restarts,
                usage=_plain(snap.usage),
                context=_plain(snap.context),
            )

        async with trio.open_nursery() as nursery:
            for record in records:
                session_id = record.session_id
                row: dict[str, Any] = {
                    "agent_id": session_id,
                    "status": record.status,
                    "model": record.model,
                    "working_dir": record.working_dir,
                    "created": record.created,
                    "path": agent_path(session_id),
                }
                if record.record is not None:
                    row["record"] = record.record
                row["config"] = config_state(record, memo)
                if record.title is not None:
                    row["title"] = record.title
                if record.ephemeral:
                    row["ephemeral"] = True
                if p.long:
                    row["spill_bytes"] = spill.get(session_id, 0)
                rows.append(row)
                asleep = system.asleep(f"/sessions/{session_id}")  # no stub made for it
                ref = None if asleep is not None else system.whereis(row["path"])
                if asleep is None and ref.__class__ is Stub and ref.successor is None:
                    asleep = ref.state
                if asleep is not None:
                    row["state"] = asleep  # asking it would wake it: its stored record answers
                    stored = agents.get(session_id)
                    if stored is not None:
                        row.update(restarts=stored.restarts_at_load(run_id), usage=_plain(stored.usage))
                elif ref is None:
                    row["state"] = "stopped" if record.status == "stopped" else "not running"
                else:
                    nursery.start_soon(live, ref, row)
        return rows, (records[-1].session_id if more else None)

    async def _asleep_records(self, session_ids: list[str]) -> dict[str, AgentRecord]:
        """The stored records of hibernated top-level agents, read in one worker-thread hop.

        Asking a hibernated agent would wake it; what it saved as it went to
        sleep (its restarts, its usage) is in its record.
        """
        if not session_ids:
            return {}
        store = self.system.store
        # What is committed answers when a commit fails (a full disk): a listing must not fail with it.
        with contextlib.suppress(StoreError):
            await store.flush()

        def read() -> dict[str, AgentRecord]:
            found = {}
            for session_id in session_ids:
                stored = store.get("agents", history_key(session_id, "", 0), type=AgentRecord)
                if stored is not None:
                    found[session_id] = stored
            return found

        return await trio.to_thread.run_sync(read)

    async def _agent_history(self, conn: Connection, p: AgentHistoryParams) -> dict[str, Any]:
        """A page of the stored history, read from the store (an agent holds only its context in memory).

        The page is the newest ``limit`` messages below ``before``, in
        conversation order, each with its ``seq``; ``next_before`` is the
        ``before`` of the page before it (None: this page reaches the start).
        """
        from weald.runtime.agents.agent import HistoryEntry

        store = self.system.store
        await store.flush()  # what the agent has queued is in the store before it is read
        limit = _HISTORY_MAX if p.limit is None else min(p.limit, _HISTORY_MAX)
        entries: list[tuple[str, HistoryEntry]] = []
        if limit:
            entries = await store.aitems_range(
                "history",
                f"{p.agent_id}/",
                stop=None if p.before is None else f"{p.before:08d}",
                limit=limit + 1,  # one more says whether an earlier page exists
                newest_first=True,
                type=HistoryEntry,
            )
        more = len(entries) > limit
        page = [entry for _, entry in reversed(entries[:limit])]
        if (
            not page
            and self.system.whereis(agent_path(p.agent_id)) is None
            and await store.aget("agents", p.agent_id, type=AgentRecord) is None
        ):
            raise RPCError(NOT_FOUND, f"no agent {p.agent_id!r} and no stored history for it")
        return {
            "agent_id": p.agent_id,
            "messages": [_history_row(entry) for entry in page],
            "next_before": page[0].seq if more and page else None,
        }

    async def _agent_compact(self, conn: Connection, p: AgentParams) -> dict[str, Any]:
        """Compact the agent's context now (between turns) or before its next model call (during one)."""
        self._refuse_when_stopping("agent.compact")
        future = await (await self._agent(p.agent_id)).proxy().compact()
        result = await future
        return {"agent_id": p.agent_id, **_plain(result)}

    async def _debug_state(self, conn: Connection, p: DebugStateParams) -> dict[str, Any]:
        from weald.tools.debug_state import describe_state

        view = RuntimeView(self.system)
        if p.agent_id is not None:
            snapshot = await (await self._agent(p.agent_id)).proxy().snapshot(p.messages)
            state: dict[str, Any] = describe_state(snapshot, view, events=p.events, messages=p.messages)
            record = await self._sessions.stored(p.agent_id)
            # Its spill files' bookkeeping, from the store (every node's rows).
            state["spill"] = await trio.to_thread.run_sync(self._sessions.spill_state, p.agent_id)
            if record is not None:
                state["config"] = {
                    **self._sessions.config_state(record),
                    "generation_in_use": snapshot.config_generation,
                }
            return state
        stats = self.system.statistics()
        report: dict[str, Any] = redact(
            {
                "daemon": await self._daemon_status(conn, NoParams()),
                "system": _plain(stats),
                "events": self.system.events.statistics(),
                "recent_events": _plain(self.system.events.recent(p.events)),
            }
        )
        return report

    # -- the tree ---------------------------------------------------------------------------------------

    async def _tree(self, conn: Connection, p: TreeParams) -> dict[str, Any]:
        base = p.path.rstrip("/") or "/"
        registry = self.system._registry
        self.system.whereis(base)  # a path in a hibernated subtree gets its stub (nothing wakes)
        collapsed = tuple(c.rstrip("/") + "/" for c in p.collapse if c.rstrip("/"))
        paths = []
        if collapsed:
            # The actors themselves, not the registry's stubs (100,000 asleep sessions): a supervisor's asleep
            # children outside what is collapsed are drawn from its which_children below.
            paths = [ref.path for ref in self.system.actors() if _under(ref.path, base)]
            paths = [path for path in paths if not path.startswith(collapsed)]
        if base not in paths:
            paths = [path for path in list(registry) if _under(path, base)]
            if collapsed:
                paths = [path for path in paths if not path.startswith(collapsed)]
        if base not in paths:
            raise RPCError(NOT_FOUND, f"no live actor at {base}")
        nodes: dict[str, dict[str, Any]] = {}
        sleeping_agents: list[str] = []

        def draw_sleeping(stub: Stub, path: str) -> None:
            # Its sleeping subtree is drawn too, from the shape it had (asking would wake it).
            for below, actor_class in stub.below().items():
                if below not in nodes and below not in registry and _under(below, base):
                    nodes[below] = {
                        "path": below,
                        "kind": actor_class.__name__,
                        "status": stub.state,
                        "restarts": 0,
                        "mailbox": 0,
                        "children": [],
                    }
                    if issubclass(actor_class, Agent):
                        sleeping_agents.append(below)
            if issubclass(stub.actor_class, Agent):
                sleeping_agents.append(path)

        for path in paths:
            ref = registry.get(path)
            if ref is None:
                continue
            status: str
            if isinstance(ref, Stub) and ref.successor is None:
                status = ref.state  # dormant or hibernated
                draw_sleeping(ref, path)
            else:
                status = "running" if ref.is_alive() else "stopping"
            nodes[path] = {
                "path": path,
                "kind": ref.actor_class.__name__,
                "status": status,
                "restarts": 0,
                "mailbox": ref.mailbox_size(),
                "children": [],
            }
        limiter = trio.CapacityLimiter(64)

        async def supervised(ref: Any) -> None:
            async with limiter:
                try:
                    infos = await ref.proxy().which_children()
                except Exception:
                    return
            for order, info in enumerate(infos):
                node = nodes.get(info.path)
                if node is None:
                    nodes[info.path] = node = {
                        "path": info.path,
                        "kind": info.kind,
                        "status": info.status,
                        "restarts": 0,
                        "mailbox": 0,
                        "children": [],
                    }
                    # A child asleep that nothing had looked up: its stub was made by the question.
                    if isinstance(info.ref, Stub) and info.ref.successor is None and _under(info.path, base):
                        draw_sleeping(info.ref, info.path)
                node["restarts"] = info.restarts
                node["restart"] = info.restart
                node["order"] = order
                if info.escalations:
                    node["escalations"] = info.escalations  # times it gave up (supervisor.gave_up)

        async def agent_restarts(ref: Any, node: dict[str, Any]) -> None:
            # An agent's restarts are its own count (see docs/protocol.md, "restarts"),
            # the number agent.list and debug_state give: restores from the store included.
            async with limiter:
                try:
                    snapshot = await ref.proxy().snapshot(0)
                except Exception:
                    return
            node["restarts"] = snapshot.restarts

        async def counted(ref: Any, node: dict[str, Any]) -> None:
            # A collapsed supervisor: how many children it has, in constant time, not the children.
            try:
                stats = await ref.proxy().statistics()
            except Exception:
                return
            node["children_hidden"] = stats.children
            node["children_asleep"] = stats.asleep

        folded = {c[:-1] for c in collapsed}
        async with trio.open_nursery() as nursery:
            for path in paths:
                ref = registry.get(path)
                # A stub is not asked: the question would wake what it stands for.
                if ref is not None and ref.__class__ is not Stub and issubclass(ref.actor_class, SupervisorBase):
                    if path in folded:
                        nursery.start_soon(counted, ref, nodes[path])
                    else:
                        nursery.start_soon(supervised, ref)
        async with trio.open_nursery() as nursery:
            for path, agent_node in nodes.items():
                ref = registry.get(path)
                if ref is not None and ref.__class__ is not Stub and issubclass(ref.actor_class, Agent):
                    nursery.start_soon(agent_restarts, ref, agent_node)
        # A hibernated top-level agent is not asked: its stored record has the count.
        asleep = {path.split("/")[2]: nodes[path] for path in sleeping_agents if _is_top_agent(path)}
        for session_id, stored in (await self._asleep_records(list(asleep))).items():
            asleep[session_id]["restarts"] = stored.restarts_at_load(self.system.run_id)
        mcp = registry.get("/mcp")
        if mcp is not None and "/mcp" in nodes and hasattr(mcp.actor_class, "servers"):
            with contextlib.suppress(Exception):  # stopping: the tree is drawn without the detail
                for snapshot in await mcp.proxy().servers():
                    node = nodes.get(snapshot.path)
                    if node is not None:
                        node["mcp"] = self._mcp_view(snapshot)
        faults = self._daemon.faults
        counts = faults.fault_counts_by_path() if faults is not None and hasattr(faults, "fault_counts_by_path") else {}
        for path, count in counts.items():
            if path in nodes:
                nodes[path]["faults"] = count
        # Children in their supervisor's start order, then by path.
        for path in sorted(nodes, key=lambda q: (q.count("/"), nodes[q].get("order", 1 << 30), q)):
            if path == base:
                continue
            parent = nodes.get(_parent(path))
            if parent is not None:
                parent["children"].append(nodes[path])
        root = nodes[base]
        if base == "/" and self._daemon.sandbox is not None:
            root["sandbox"] = self._daemon.sandbox.describe()  # how shell commands run
        if p.depth is not None:
            _prune(root, p.depth)
        return root

    async def _actor_snapshot(self, conn: Connection, p: ActorSnapshotParams) -> dict[str, Any]:
        """One live actor's ``snapshot()`` (its class, and the state it reports), secrets redacted."""
        ref = self.system.whereis(p.path.rstrip("/") or "/")
        if ref is None:
            raise RPCError(NOT_FOUND, f"no live actor at {p.path}; tree lists them")
        snapshot = await ref.proxy().snapshot()
        report: dict[str, Any] = redact(
            {"path": ref.path, "kind": ref.actor_class.__name__, "snapshot": _plain(snapshot)}
        )
        return report

    async def _observer_url(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        """The observer's address, with the token that lets a browser in (only over the owner-only socket)."""
        observer = self.system.whereis("/http")
        if observer is None:
            raise RPCError(
                NOT_FOUND,
                "this daemon serves no observer: start it with weald serve --http 127.0.0.1:8765 "
                '(or set http = "127.0.0.1:8765" under [server] in weald.toml)',
            )
        url: str = await observer.proxy().url()
        return {"url": url}

    # -- tasks ------------------------------------------------------------------------------------------

    async def _tasks_list(self, conn: Connection, p: TasksListParams) -> dict[str, Any]:
        from weald.tools.tasks import list_tasks, scope_for_project, scope_for_session

        if p.scope == "session":
            if p.agent_id is None:
                raise RPCError(INVALID_PARAMS, "invalid params for tasks.list: scope 'session' needs agent_id")
            scope = scope_for_session(p.agent_id)
        else:
            working_dir = p.working_dir
            if working_dir is None and p.agent_id is not None:
                record = await self.system.store.aget("sessions", p.agent_id)
                if record is None:
                    raise RPCError(NOT_FOUND, f"no agent {p.agent_id!r}")
                working_dir = record["working_dir"]
            if working_dir is None:
                raise RPCError(INVALID_PARAMS, "invalid params for tasks.list: give working_dir or agent_id")
            scope = scope_for_project(Path(working_dir))
        try:
            tasks = await trio.to_thread.run_sync(lambda: list_tasks(self.system.store, scope, view=p.view))
        except StoreError as exc:
            raise RPCError(APP_ERROR, f"tasks.list failed: {exc}") from exc
        except Exception as exc:  # the view or scope given was wrong
            raise RPCError(INVALID_PARAMS, f"invalid params for tasks.list: {exc}") from exc
        return {"scope": scope, "view": p.view, "tasks": _plain(tasks)}

    # -- questions and permissions -----------------------------------------------------------------------

    async def _watch_prompts(self) -> None:
        """Route permission requests and questions to the clients listening to their agent."""
        with self.system.events.subscribe(["permission.*", "question.*"], max_buffer=65536) as sub:
            async for event in sub:
                self._route(event)

    def _route(self, event: Event) -> None:
        data = event.data
        if event.topic == "permission.requested":
            agent_id = _session_of(event.source)
            payload = {
                "request_id": data["request_id"],
                "agent_id": agent_id,
                "agent_path": data.get("agent_path"),
                "call_id": data.get("call_id"),
                "tool": data.get("tool"),
                "subject": data.get("subject"),
                "arguments": data.get("arguments"),
                "timeout": data.get("timeout"),
                "reason": data.get("reason", ""),
            }
            self._permissions[data["request_id"]] = (event.source, agent_id, payload)
            self._broadcast(agent_id, "permission.request", payload)
        elif event.topic in ("permission.answered", "permission.timed_out"):
            self._permissions.pop(data.get("request_id", ""), None)
        elif event.topic == "question.asked":
            agent_id = _session_of(event.source)
            payload = {
                "question_id": data["question_id"],
                "agent_id": agent_id,
                "question": data.get("question"),
                "choices": data.get("choices", []),
                "asked_by": data.get("asked_by"),
                # An MCP server's question (elicitation) carries the form it asks for.
                "schema": data.get("schema"),
                "origin": data.get("origin"),
            }
            self._questions[data["question_id"]] = (event.source, agent_id, payload)
            self._broadcast(agent_id, "ask_user.question", payload)
        elif event.topic == "question.answered":
            self._questions.pop(data.get("question_id", ""), None)

    def _broadcast(self, agent_id: str, method: str, payload: dict[str, Any]) -> None:
        for conn in list(self._connections.values()):
            if conn.interested_in(agent_id):
                conn.notify(method, payload)

    def _replay_open_prompts(self, conn: Connection, agent_id: str) -> None:
        for _, owner, payload in list(self._permissions.values()):
            if owner == agent_id:
                conn.notify("permission.request", payload)
        for _, owner, payload in list(self._questions.values()):
            if owner == agent_id:
                conn.notify("ask_user.question", payload)

    async def _permission_list(self, conn: Connection, p: OpenPromptsParams) -> list[dict[str, Any]]:
        """The open permission requests (of one agent), as ``permission.request`` sent them."""
        return [payload for _, owner, payload in self._permissions.values() if p.agent_id in (None, owner)]

    async def _ask_user_list(self, conn: Connection, p: OpenPromptsParams) -> list[dict[str, Any]]:
        """The open questions (of one agent), as ``ask_user.question`` sent them."""
        return [payload for _, owner, payload in self._questions.values() if p.agent_id in (None, owner)]

    async def _permission_respond(self, conn: Connection, p: PermissionRespondParams) -> dict[str, Any]:
        entry = self._permissions.get(p.request_id)
        if entry is None:
            raise RPCError(NOT_FOUND, f"no open permission request {p.request_id!r} (answered, timed out or unknown)")
        runner = self.system.whereis(entry[0])
        if runner is None:
            raise RPCError(NOT_FOUND, f"the tool runner for request {p.request_id!r} is gone")
        ok = await runner.proxy().respond_permission(p.request_id, p.decision, p.message)
        if not ok:
            raise RPCError(NOT_FOUND, f"permission request {p.request_id!r} was already answered or timed out")
        return {"ok": True}

    async def _ask_user_respond(self, conn: Connection, p: AskUserRespondParams) -> dict[str, Any]:
        entry = self._questions.get(p.question_id)
        if entry is None:
            raise RPCError(NOT_FOUND, f"no open question {p.question_id!r} (answered, withdrawn or unknown)")
        if (p.answer is None) == (p.decline is None):
            raise RPCError(INVALID_PARAMS, "invalid params for ask_user.respond: give answer or decline (one of them)")
        agent = self.system.whereis(entry[0])
        if agent is None or not await agent.proxy().answer(p.question_id, p.answer or "", declined=p.decline):
            raise RPCError(NOT_FOUND, f"question {p.question_id!r} is no longer open")
        return {"ok": True}

    # -- editors (weald acp) ------------------------------------------------------------------------------

    async def _client_attach(self, conn: Connection, p: ClientAttachParams) -> dict[str, Any]:
        """The editor behind ``conn`` drives the session: its buffers and terminals serve the session's tools.

        Whether they do is the session's project's choice (``[acp] files``,
        ``[acp] terminal``) and needs the editor to offer them (both fs
        methods for files); the answer says what applies now.
        """
        await self._agent(p.agent_id)
        files = p.read_text_file and p.write_text_file
        self._daemon.editors.attach(conn, p.agent_id, files=files, terminal=p.terminal)
        acp = self._sessions.config_of(p.agent_id).acp
        return {
            "files": "editor" if files and acp.files == "editor" else "disk",
            "terminal": "editor" if p.terminal and acp.terminal == "editor" else "sandbox",
        }

    async def _client_respond(self, conn: Connection, p: ClientRespondParams) -> dict[str, Any]:
        error = None if p.error is None else redact(p.error.message[:2000]) or f"error {p.error.code}"
        if not self._daemon.editors.answer(conn, p.request_id, p.result, error):
            msg = f"no request {p.request_id!r} waits for this connection's editor (answered, timed out or unknown)"
            raise RPCError(NOT_FOUND, msg)
        return {"ok": True}

    # -- events ------------------------------------------------------------------------------------------

    async def _events_subscribe(self, conn: Connection, p: EventsSubscribeParams) -> dict[str, Any]:
        source = f"/sessions/{p.agent_id}" if p.agent_id else None
        if p.agent_id is not None:
            await self._agent(p.agent_id)
        sub = self.system.events.subscribe(p.topics, source=source, max_buffer=4096)
        sub_id = f"sub-{next(self._subscription_ids)}"
        conn.subscriptions[sub_id] = sub
        conn.watch(p.agent_id or "*")
        if p.agent_id is not None:
            self._replay_open_prompts(conn, p.agent_id)

        async def forward() -> None:
            async for event in sub:
                conn.notify("event", {"subscription": sub_id, "event": _plain(event)})

        assert conn.nursery is not None
        conn.nursery.start_soon(forward)
        return {"subscription": sub_id}

    async def _events_query(self, conn: Connection, p: EventsQueryParams) -> dict[str, Any]:
        """The newest events the daemon still holds (``[server] event_history``) matching a topic and a source."""
        before = p.before
        events = self.system.events.recent(
            p.limit + 1,
            topic=p.topic or None,
            source=p.source or None,
            where=None if before is None else (lambda event: event.seq < before),
            exclude=p.exclude,
        )
        more = len(events) > p.limit
        page = events[1:] if more else events
        stats = self.system.events.statistics()
        return {
            "events": _plain(page),
            "next_before": page[0].seq if more and page else None,
            "held": stats["ring"],
            "published": stats["published"],
        }

    async def _metrics_series(self, conn: Connection, p: MetricsSeriesParams) -> dict[str, Any]:
        """The metrics sampler's series from ``since`` on (every sample it still holds with 0)."""
        sampler = self.system.whereis("/metrics")
        if sampler is None:
            raise RPCError(NOT_FOUND, "this daemon samples no metrics (its /metrics actor is not running)")
        series: dict[str, Any] = await sampler.proxy().series(p.since)
        return series

    async def _events_unsubscribe(self, conn: Connection, p: EventsUnsubscribeParams) -> dict[str, Any]:
        sub = conn.subscriptions.pop(p.subscription, None)
        if sub is None:
            raise RPCError(NOT_FOUND, f"no subscription {p.subscription!r} on this connection")
        sub.close()
        return {"ok": True}

    # -- faults --------------------------------------------------------------------------------------------

    def _faults(self) -> Any:
        faults = self._daemon.faults
        if faults is None:
            raise RPCError(
                FAULTS_DISABLED,
                "fault injection is not enabled: start the daemon with --faults FILE (or faults.enabled = true)",
            )
        return faults

    async def _fault_inject(self, conn: Connection, p: FaultInjectParams) -> dict[str, Any]:
        from weald.runtime.faults import FaultSpecError

        try:
            return {"id": self._faults().inject(p.fault)}
        except FaultSpecError as exc:
            problems = [attrs.asdict(problem) for problem in exc.problems]
            raise RPCError(INVALID_PARAMS, f"invalid params for fault.inject: {exc}", {"problems": problems}) from exc

    async def _fault_clear(self, conn: Connection, p: FaultClearParams) -> dict[str, Any]:
        from weald.runtime.faults import UnknownFaultError

        try:
            return {"cleared": self._faults().clear(p.id)}
        except UnknownFaultError as exc:
            raise RPCError(NOT_FOUND, str(exc)) from exc

    async def _fault_list(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        faults = self._faults()
        return {
            "faults": [status.to_dict() for status in faults.list()],
            "statistics": faults.statistics().to_dict(),
        }

    # -- MCP -------------------------------------------------------------------------------------------------

    async def _mcp(self, server: str, request: Callable[[Any], Any]) -> Any:
        """Run one request on a server's connection; its answer, or an RPC error saying why not.

        Not configured: NOT_FOUND. Configured but not running now (starting,
        restarting): APP_ERROR saying when it will be back. The server's own
        refusal, a timeout or a lost connection: APP_ERROR with the reason.
        """
        from weald.runtime.mcp import MCPError

        ref = self.system.whereis(f"/mcp/{server}")
        if ref is None:
            supervisor = self.system.whereis("/mcp")
            configured = supervisor is not None and any(s.server == server for s in await supervisor.proxy().servers())
            if not configured:
                raise RPCError(NOT_FOUND, f"no MCP server {server!r} is configured; mcp.servers lists them")
            assert supervisor is not None
            raise RPCError(APP_ERROR, await supervisor.proxy().unavailable(server))
        try:
            return await _maybe_future(await request(ref.proxy()))
        except MCPError as exc:
            raise RPCError(APP_ERROR, str(exc)) from exc

    async def _mcp_servers(self, conn: Connection, p: NoParams) -> list[dict[str, Any]]:
        mcp = self.system.whereis("/mcp")
        if mcp is None:
            return []
        # The mcp supervisor answers at once: no connection's handshake holds it.
        return [self._mcp_view(snapshot) for snapshot in await mcp.proxy().servers()]

    def _mcp_view(self, snapshot: Any) -> dict[str, Any]:
        """One MCP server as ``mcp.servers`` and ``tree`` show it, with its last log messages."""
        logs = self.system.events.recent(3, topic="mcp.log", where=lambda e: e.data.get("server") == snapshot.server)
        return {**_mcp_view(snapshot), "recent_logs": [_plain(event.data) for event in logs]}

    async def _mcp_resources_list(self, conn: Connection, p: McpServerParams) -> Any:
        return await self._mcp(p.server, lambda mcp: mcp.list_resources())

    async def _mcp_resources_read(self, conn: Connection, p: McpReadParams) -> Any:
        return await self._mcp(p.server, lambda mcp: mcp.read_resource(p.uri))

    async def _mcp_resources_subscribe(self, conn: Connection, p: McpReadParams) -> dict[str, Any]:
        await self._mcp(p.server, lambda mcp: mcp.subscribe(p.uri))
        return {"subscribed": True}

    async def _mcp_resources_unsubscribe(self, conn: Connection, p: McpReadParams) -> dict[str, Any]:
        await self._mcp(p.server, lambda mcp: mcp.unsubscribe(p.uri))
        return {"subscribed": False}

    async def _mcp_prompts_list(self, conn: Connection, p: McpServerParams) -> Any:
        return await self._mcp(p.server, lambda mcp: mcp.list_prompts())

    async def _mcp_prompts_get(self, conn: Connection, p: McpPromptParams) -> Any:
        return await self._mcp(p.server, lambda mcp: mcp.get_prompt(p.name, p.arguments))

    # -- the daemon ---------------------------------------------------------------------------------------

    async def _daemon_status(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        sessions = self.system.whereis("/sessions")
        counts = await sessions.proxy().count_children() if sessions is not None else {}
        return {
            "pid": os.getpid(),
            "version": VERSION,
            "socket": str(self._socket_path) if self._socket_path else None,
            "uptime": round(time.time() - self._daemon.started_at, 3),
            "agents": counts.get("active", 0) + counts.get("hibernated", 0),
            "hibernated": counts.get("hibernated", 0),
            "connections": len(self._connections),
            "faults_enabled": self._daemon.faults is not None,
            "store": _store_location(self.system),
            # As last measured (at most a minute ago): no I/O here, on the loop.
            "store_bytes": self._daemon.history.store_bytes if self._daemon.history is not None else None,
            # This node's spill files, from the store's rows, measured with store_bytes (not a walk of the disk).
            "spill_bytes": self._daemon.history.spill_bytes if self._daemon.history is not None else None,
            "store_kind": _store_kind(self.system),
            "node": _node_status(self.system),
            "store_write_failure": _write_failure(self.system),
            # The newest commits' durations (kept by the store's committer; no I/O).
            "store_commits": _plain(self.system.store.commit_latency.summary()),
            "history": self._daemon.history.statistics() if self._daemon.history is not None else None,
            "turns": _plain(self._sessions.gate.statistics()) if self._daemon.sessions is not None else None,
            "max_message_bytes": self._max_message_bytes,
            "front": self._front_status(),
            "sandbox": self._daemon.sandbox.to_dict() if self._daemon.sandbox is not None else None,
            "previous_run": previous.to_dict() if (previous := self._daemon.previous_run) is not None else None,
            "telemetry": _plain(self._daemon.telemetry.statistics()) if self._daemon.telemetry is not None else None,
            "editors": _plain(self._daemon.editors.statistics()),
        }

    def _front_status(self) -> dict[str, Any]:
        """The front door's limits and what they turned away (``daemon.status`` ``front``)."""
        acceptor = self._acceptor.statistics() if self._acceptor is not None else None
        return {
            "max_connections": self._max_connections,
            "max_buffered_bytes": self._budget.limit,
            "buffered_bytes": self._budget.held,
            "buffered_bytes_peak": self._budget.peak,
            "refused": {
                "max_connections": acceptor.refused_max_connections if acceptor else 0,
                "max_buffered_bytes": self._budget.refused,
                "out_of_fds": acceptor.refused_out_of_fds if acceptor else 0,
            },
            "fd_exhaustions": acceptor.fd_exhaustions if acceptor else 0,
            "out_of_fds": acceptor.out_of_fds if acceptor else False,
        }

    async def _history_gc(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        """Apply every project's ``[history] retention`` now (``weald gc``); answers what was removed."""
        self._refuse_when_stopping("history.gc")
        keeper = self._daemon.history
        if keeper is None:
            raise RPCError(APP_ERROR, "the daemon is still starting")
        report: GcReport = await keeper.collect()
        return report.to_dict()

    async def _daemon_stop(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        self._daemon.request_stop()
        return {"stopping": True}

    async def _config_reload(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        """Read every configuration file again and apply what changed (`Daemon.reload`)."""
        self._refuse_when_stopping("config.reload")
        report: dict[str, Any] = await self._daemon.reload()
        return report

    async def _config_trust(self, conn: Connection, p: ConfigTrustParams) -> dict[str, Any]:
        """Trust a nested project configuration file as it is now (``weald trust``)."""
        self._refuse_when_stopping("config.trust")
        record: dict[str, Any] = await self._sessions.trust_file(p.path, p.sha256)
        # A configuration refused for want of this trust applies now (at its sessions' next turns).
        await self._daemon.after_refresh(await self._daemon.projects.refresh(report=False))
        return record

    async def _config_untrust(self, conn: Connection, p: ConfigUntrustParams) -> dict[str, Any]:
        """Forget a file's trust (``weald trust --revoke``)."""
        self._refuse_when_stopping("config.untrust")
        record: dict[str, Any] = await self._sessions.untrust_file(p.path)
        return record

    async def _config_trusted(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        """The trusted nested project files (``weald trust --list``)."""
        return {"trusted": self._sessions.trusted_files()}

    # -- the cluster (a node's part) -------------------------------------------------------------------

    def _cluster_node(self, method: str) -> Any:
        store = self.system.store
        if not store.fences or store.node is None:
            raise RPCError(APP_ERROR, f"{method}: this daemon is no node of a cluster (its store is not shared)")
        return store.node

    async def _cluster_adopt(self, conn: Connection, p: ClusterAdoptParams) -> dict[str, Any]:
        """Claim sessions for this node (orphans, or handed to it) and add them asleep; answers which were."""
        self._refuse_when_stopping("cluster.adopt")
        self._cluster_node("cluster.adopt")
        adopted = await self._sessions.adopt(p.agent_ids)
        return {"adopted": sorted(adopted), "refused": sorted(set(p.agent_ids) - set(adopted))}

    async def _cluster_handover(self, conn: Connection, p: ClusterHandoverParams) -> dict[str, Any]:
        """Hand sessions to node ``to`` (a drain): each once idle, put to sleep here and its placement handed over."""
        self._refuse_when_stopping("cluster.handover")
        node = self._cluster_node("cluster.handover")
        if p.to == node.node_id:
            raise RPCError(
                INVALID_PARAMS, "invalid params for cluster.handover: to: that is this node", {"field": "to"}
            )
        report: dict[str, Any] = await self._sessions.hand_over(p.agent_ids, p.to, timeout=p.timeout)
        return report

    async def _cluster_load(self, conn: Connection, p: NoParams) -> dict[str, Any]:
        """This node's load, as its lease renewals report it to fronts (awake and asleep sessions, CPU)."""
        load: dict[str, Any] = dict(self._daemon.load_info())
        return load


@attrs.frozen
class ClusterPort:
    """A node's TCP port for fronts: the bound socket, the cluster's secret, TLS (or None)."""

    sock: socket.socket
    secret: bytes
    tls: Any = None
    address: str = ""


@attrs.frozen
class _Failed:
    what: str
    error: BaseException


def _crash_on_error(result: Any) -> _Failed | None:
    error = getattr(result, "error", None)
    if error is None:
        return None
    return _Failed("listener", error)


def _only_disconnects(exc: BaseException) -> bool:
    """True if every exception in ``exc`` is a client going away."""
    gone = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, gone)


def _out_of_fds(method: str) -> str:
    return (
        f"{method} failed: the daemon is out of file descriptors (too many connections, processes or files "
        "open); try again shortly"
    )


def _write_failure(system: Any) -> str | None:
    """Why the store cannot commit queued writes right now (a full disk), or None."""
    try:
        failure = system.store.write_failure
    except StoreError:  # the store is restarting
        return None
    return str(failure) if failure is not None else None


def _store_location(system: Any) -> str:
    """Where the store is: its file, or its database URL with the password masked."""
    url = getattr(system, "store_url", None)
    return mask_url(url) if url else str(system.store_path)


def _store_kind(system: Any) -> str:
    return "postgresql" if getattr(system, "store_url", None) else "sqlite"


def _node_status(system: Any) -> dict[str, Any] | None:
    """This daemon's node in the store: its id, epoch, lease and the sessions it holds (``daemon.status``)."""
    try:
        stats = system.store.statistics()
    except StoreError:  # the store is restarting
        return None
    node: dict[str, Any] | None = stats.get("node")
    return node


def _too_large(limit: int) -> str:
    mib = limit / (1024 * 1024)
    size = f"{mib:g} MB" if mib >= 1 else f"{limit / 1024:g} KB"
    return f"message too large: over {limit} bytes ({size}, limits.max_message_bytes); send smaller messages"


_UNREADABLE = object()  # `Server._decode` sent a parse error for the line


class _Claim:
    """The ids one message holds in flight; also the message's borrower of the connection's limiter."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[str | int]) -> None:
        self.ids = ids


def _claim_ids(conn: Connection, request: Any) -> tuple[dict[int, dict[str, Any]], _Claim]:
    """Mark the ids of a request (or of each item of a batch) in flight on ``conn``.

    Returns the replies decided now (by index in the batch, 0 for a single
    request): -32600 for an id already in flight. That reply's ``id`` is
    null, so that it cannot be taken for the reply of the request in flight;
    its message and ``data.id`` name the id. Also returns the `_Claim` of
    the ids claimed, to be given back when the reply is sent. Requests without an id, or
    with null or an invalid one, claim nothing.
    """
    items = request if isinstance(request, list) else [request]
    early: dict[int, dict[str, Any]] = {}
    claimed: list[str | int] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        request_id = item.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, str | int):
            continue
        if request_id in conn.in_flight_ids:
            message = (
                f"invalid request: id {request_id!r} is already in flight on this connection; "
                "give each request its own id (the request in flight goes on)"
            )
            early[index] = _error(None, INVALID_REQUEST, message, {"id": request_id})
            continue
        conn.in_flight_ids.add(request_id)
        claimed.append(request_id)
    return early, _Claim(claimed)


def _failure(code: int, message: str, data: Any = None) -> dict[str, Any]:
    """The ``error`` part of a reply, without its id."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"error": error}


def _check_batch_starts(
    agents: list[Any],
) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any], AgentStartParams]]]:
    """An ``agents.start`` batch checked: a result slot for each entry, and the entries that are valid.

    An entry that is not an object of ``agent.start`` params has its slot
    filled with the error naming it (``agents[i]``); the others are
    returned with their index, as given and as checked.

    Raises:
        RPCError: the batch is empty or larger than `MAX_BATCH_STARTS`.
    """
    count = len(agents)
    if not 1 <= count <= MAX_BATCH_STARTS:
        msg = (
            f"agents: give 1 to {MAX_BATCH_STARTS:,} starts per agents.start request, got {count:,}; "
            "split them into several requests"
        )
        raise RPCError(INVALID_PARAMS, f"invalid params for agents.start: {msg}", {"field": "agents"})
    results: list[dict[str, Any]] = [{} for _ in range(count)]
    valid: list[tuple[int, dict[str, Any], AgentStartParams]] = []
    for index, raw in enumerate(agents):
        where = f"agents[{index}]"
        if not isinstance(raw, dict):
            message = f"invalid params for agents.start ({where}): expected an object of agent.start params"
            results[index] = _failure(INVALID_PARAMS, message, {"field": where})
            continue
        try:
            params = msgspec_convert(raw, AgentStartParams)
        except msgspec.ValidationError as exc:
            message = f"invalid params for agents.start ({where}): {_describe(exc)}"
            results[index] = _failure(INVALID_PARAMS, message, {"field": where})
            continue
        valid.append((index, raw, params))
    return results, valid


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, **_failure(code, message, data)}


def _describe(exc: msgspec.ValidationError) -> str:
    """Msgspec's validation message, in the words of the API (field first)."""
    text = str(exc)
    where = ""
    if " - at `$." in text:
        text, _, where = text.partition(" - at `$.")
        where = where.rstrip("`")
    text = text.replace("Expected", "expected").replace("`", "")
    if text.startswith("Object missing required field "):
        return "missing required field " + text.removeprefix("Object missing required field ")
    if text.startswith("Object contains unknown field "):
        return "unknown field " + text.removeprefix("Object contains unknown field ")
    return f"{where}: {text}" if where else text


_GROWING = 2
"""Lists in a row that saw an actor's mailbox grow before ``actors.list`` marks it ``growing``."""
_MEMORY_SORT_MAX = 5_000  # actors.list sorts by memory at most this many actors (each one estimated)
_MEMORY_OBJECTS = 1_000  # objects one memory estimate visits at most (100,000 sessions: /sessions holds more)
_MEMORY_AGE = 5.0  # seconds an actor's memory estimate is reused by actors.list

_HISTORY_MAX = 10_000
"""The most messages one agent.history reply holds; ``next_before`` pages further back."""


def _history_row(entry: Any) -> dict[str, Any]:
    """One stored history entry as agent.history shows it: the message, its seq and time, a summary, why left out."""
    row: dict[str, Any] = {"seq": entry.seq, "time": entry.time, "turn_id": entry.turn_id, **_plain(entry.message)}
    if entry.compaction is not None:
        row["compaction"] = _plain(entry.compaction)
    if entry.left_out is not None:
        row["left_out"] = entry.left_out
    if entry.usage is not None:
        row["usage"] = _plain(entry.usage)
    return row


def _under(path: str, base: str) -> bool:
    return base in ("/", path) or path.startswith(base + "/")


def _parent(path: str) -> str:
    parent = path.rsplit("/", 1)[0]
    return parent or "/"


def _prune(node: dict[str, Any], depth: int) -> None:
    if depth <= 0:
        node["children_hidden"] = len(node["children"])
        node["children"] = []
        return
    for child in node["children"]:
        _prune(child, depth - 1)


def _session_of(path: str) -> str:
    parts = path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "sessions" else ""


def _mcp_view(snapshot: Any) -> dict[str, Any]:
    """One MCP server as ``mcp.servers`` and ``tree`` show it (a `MCPConnectionSnapshot`, secrets cut)."""
    retry_at = snapshot.retry_at
    return {
        "server": snapshot.server,
        "status": snapshot.status,
        "transport": snapshot.transport,
        "tools": len(snapshot.tools),
        "restarts": snapshot.restarts,
        "attempt": snapshot.attempt,
        "failed_starts": snapshot.failed_starts,
        "last_error": redact_secret_values(snapshot.last_error) if snapshot.last_error else snapshot.last_error,
        "retry_at": retry_at,
        "retry_in": max(round(retry_at - time.time(), 1), 0.0) if retry_at is not None else None,
    }


async def _maybe_future(value: Any) -> Any:
    wait = getattr(value, "wait", None)
    if wait is not None and callable(wait):
        return await wait()
    return value
