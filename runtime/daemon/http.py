"""The observer: a live web view of the running daemon, served over HTTP by the daemon itself.

::

    GET  /?token=T      the page: one HTML document, its script and style inlined (nothing from elsewhere)
    GET  /api/stream    server-sent events: events, live views, which sessions changed, metrics
    POST /api/call      {"method": ..., "params": ...} -> {"result": ...} | {"error": {...}}
    POST /api/watch     {"stream": id, "agent_id": id | null}: the agent whose text that stream carries

`Observer` is an actor beside the JSON-RPC server in the daemon's tree
(``/http``). Its HTTP server is Hypercorn's trio worker running a Starlette
app on the daemon's own trio loop. Every piece of data the page sees comes
from the JSON-RPC server's method table (`Server.call_nowait`), the same
handlers the socket's clients reach: the observer adds no logic of its own
about agents, trees or tasks.

Who may come in: the observer listens on loopback unless ``[server]
http_remote`` allows another address. Every request carries the daemon's
token (``Authorization: Bearer T``, or ``?token=T``), which only a client
of the owner-only socket can learn (``observer.url``, which ``weald
observe`` calls): the socket's owner-only rule, carried over to HTTP. A
request with a ``Host`` other than the address listened on (DNS
rebinding), or with an ``Origin`` other than the page's own, is refused.
The page is served with a Content-Security-Policy that lets it load and
connect to nothing but the observer itself.

Cost: while nobody watches, the observer holds no subscription to the
event bus and runs no timer; it is a listening socket. Each viewer's stream
(at most `MAX_VIEWERS` at once) holds one bus subscription with a bounded
buffer (`VIEWER_BUFFER` events; the oldest are dropped and counted when
the viewer falls behind), sends events in batches at most every
`EVENT_BATCH` seconds (text deltas and tool output only of the agent it
watches, at most `MAX_BATCH` a batch), and refreshes a view only when an
event may have changed it, at most every 250 ms for the tree (slower when
refreshing takes long: never more than a fifth of the loop's time per
view). At 100,000 sessions nothing here is proportional to the sessions:
the tree is the daemon's own part (``/sessions`` collapsed to its counts),
the page asks for the sessions and actors it shows a page at a time
(``sessions.page``, ``actors.list``), and the stream tells it which
sessions changed (at most every `SESSIONS_PACE` s), so it fetches again
only the rows on screen. The metrics come from the ``/metrics`` sampler,
once a second.
"""

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import logging
import re
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any

import attrs
import msgspec
import trio

# Imported with this module (by the daemon, on its own thread when it serves an observer),
# never later on the loop thread: an import reads files.
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from weald.runtime import Actor, ActorDeadError, WealdError
from weald.runtime.faults import KINDS

__all__ = [
    "EVENT_BATCH",
    "MAX_VIEWERS",
    "OBSERVER_METHODS",
    "VIEWER_BUFFER",
    "Observer",
    "ObserverError",
    "ObserverSnapshot",
    "new_token",
    "split_address",
]

logger = logging.getLogger("weald.runtime.http")

MAX_VIEWERS = 8
"""Event streams open at once; one more is answered 503."""
VIEWER_BUFFER = 4096
"""Events a viewer's stream holds before the oldest are dropped (and counted)."""
EVENT_BATCH = 0.05
"""Seconds a stream gathers events before it sends them, as one message."""
_MAX_BODY = 256 * 1024  # a request to /api/call; fault declarations and answers are small

OBSERVER_METHODS = frozenset(
    {
        "actor.restart",
        "actor.snapshot",
        "actors.list",
        "agent.abort",
        "agent.hibernate",
        "agent.history",
        "agent.list",
        "agent.send",
        "agent.stop",
        "agent.wake",
        "ask_user.list",
        "ask_user.respond",
        "daemon.status",
        "debug_state",
        "events.query",
        "fault.clear",
        "fault.inject",
        "fault.list",
        "mcp.servers",
        "metrics.series",
        "permission.list",
        "permission.respond",
        "sessions.page",
        "tasks.list",
        "tree",
    }
)
"""The JSON-RPC methods the page may call through ``/api/call``."""

# Topics that come many to a turn and change no view: forwarded only for the agent a viewer watches.
_QUIET = frozenset({"agent.message_delta", "tool.output"})
MAX_BATCH = 500
"""Events one batch carries at most; the older ones of a larger batch are skipped (and counted)."""
SESSIONS_PACE = 0.25
"""Seconds between two ``sessions`` messages (which sessions changed) to one viewer."""
_HELLO_EVENTS = 200


class ObserverError(WealdError):
    """The observer cannot listen where it was asked to; the message says what to change."""


@attrs.frozen
class _View:
    """A live view: a method's result, sent again when an event matching ``dirtied_by`` may have changed it.

    With ``outside``, events from sources below that path (``/sessions/a1/...``)
    do not dirty it: the view leaves that subtree out (the tree's sessions,
    which the page lists a page at a time).
    """

    name: str
    method: str
    dirtied_by: tuple[str, ...]
    interval: float  # the least time between two refreshes
    params: dict[str, Any] = attrs.field(factory=dict)
    needs_faults: bool = False
    outside: str | None = None

    def dirtied(self, topic: str, source: str) -> bool:
        if self.outside is not None and source.startswith(self.outside):
            return False
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.dirtied_by)


_VIEWS = (
    # The daemon's own part of the tree; /sessions as one node (sessions.page lists and counts them): what the
    # sessions do, wake or sleep does not redraw it.
    _View("tree", "tree", ("*",), 0.25, params={"collapse": ["/sessions"]}, outside="/sessions"),
    _View("permissions", "permission.list", ("permission.*",), 0.05),
    _View("questions", "ask_user.list", ("question.*",), 0.05),
    _View("mcp", "mcp.servers", ("mcp.*", "supervisor.*"), 0.5),
    _View("faults", "fault.list", ("fault.*",), 0.25, needs_faults=True),
)

# -- where to listen ------------------------------------------------------------------------------


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port).

    Raises:
        ObserverError: it is not HOST:PORT.
    """
    host, colon, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        msg = f'bad observer address {address!r}: expected "HOST:PORT", like "127.0.0.1:8765"'
        raise ObserverError(msg)
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if host == "localhost" else host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        msg = (
            f"the observer cannot listen on {host}:{port}: {exc.strerror or exc}; "
            "choose another address with --http HOST:PORT (port 0 picks a free one)"
        )
        raise ObserverError(msg) from exc
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


# -- the page ---------------------------------------------------------------------------------------


def _load_page() -> tuple[str, str, str]:
    """The page's HTML, script and style, shipped in the package (read once, in a worker thread)."""
    folder = resources.files("weald.runtime.daemon") / "observer"
    return tuple((folder / name).read_text(encoding="utf-8") for name in ("index.html", "observer.js", "observer.css"))  # type: ignore[return-value]


def _compose(page: tuple[str, str, str], nonce: str) -> str:
    html, script, style = page
    return html.replace("__STYLE__", style).replace("__SCRIPT__", script).replace("__NONCE__", nonce)


def _csp(nonce: str) -> str:
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


_COMMON_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]

_encoder = msgspec.json.Encoder()

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@attrs.frozen
class ObserverSnapshot:
    """The observer's state for introspection.

    Attributes:
        path: its path in the tree (``/http``).
        status: the actor's status.
        address: where it listens (``HOST:PORT``; the token is not shown).
        viewers: event streams open now.
        streams: event streams opened since it started.
        requests: HTTP requests answered.
        refused: requests refused (no or wrong token, other Host or Origin, too many viewers, too large).
    """

    path: str
    status: str
    address: str
    viewers: int
    streams: int
    requests: int
    refused: int


class Observer(Actor):
    """Serves the observer page and its live data over HTTP, on the daemon's trio loop.

    Args:
        daemon: the `weald.runtime.daemon.tree.Daemon` it shows.
        address: ``HOST:PORT``; port 0 picks a free port (kept across restarts of this actor).
        token: what every request must carry.
        remote: allow a non-loopback address.

    Raises:
        ObserverError: (from ``on_start``) the address is not loopback and
            ``remote`` is off, or it cannot be listened on.
    """

    def __init__(self, daemon: Any, address: str, token: str, *, remote: bool = False) -> None:
        super().__init__()
        self._daemon = daemon
        self._host, self._port = split_address(address)
        self._token = token
        self._remote = remote
        self._page: tuple[str, str, str] | None = None
        self._hosts: frozenset[str] = frozenset()
        self._viewers = 0
        self._streams = 0
        self._requests = 0
        self._refused = 0
        self._open: dict[str, _Stream] = {}  # the open streams by their id (`/api/watch` names one)

    # -- lifecycle ---------------------------------------------------------------------------

    def on_start(self) -> Any:
        """Read the page, bind the address and start serving; a bind that fails is a failed start."""
        return self._start()

    async def _start(self) -> None:
        if not self._remote and not _is_loopback(self._host):
            msg = (
                f"the observer listens on loopback only, not {self._host}: use 127.0.0.1 or ::1, or set "
                "http_remote = true under [server] (anyone who reaches the port with the token sees everything)"
            )
            raise ObserverError(msg)
        self._page = await trio.to_thread.run_sync(_load_page)
        # A restart listens where the first start did, even if port 0 was asked for.
        port = getattr(self._daemon, "observer_port", None) or self._port
        sock = _bind(self._host, port)
        self._port = sock.getsockname()[1]
        self._daemon.observer_port = self._port
        self._hosts = self._allowed_hosts()
        self.run_io(self._serve, sock, reply=_crash_on_error, name="http")

    def on_receive(self, message: Any) -> None:
        """The HTTP server failed: crash, to be restarted."""
        if isinstance(message, _Failed):
            msg = f"the observer's HTTP server failed: {message.error!r}"
            raise WealdError(msg) from message.error

    def _allowed_hosts(self) -> frozenset[str]:
        port = self._port
        hosts = {f"{_url_host(self._host)}:{port}"}
        if _is_loopback(self._host):
            hosts |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
        return frozenset(hosts)

    async def _serve(self, sock: socket.socket) -> None:
        config = HypercornConfig()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn takes the socket over
        config.accesslog = None
        config.errorlog = logger
        config.include_server_header = False
        config.graceful_timeout = 1.0
        await serve(self._app(), config, mode="asgi")  # type: ignore[arg-type]

    # -- public, through the proxy ---------------------------------------------------------------

    def url(self) -> str:
        """The page's address, with the token (for ``observer.url``: the owner-only socket only)."""
        return f"http://{_url_host(self._host)}:{self._port}/?token={self._token}"

    def snapshot(self) -> ObserverSnapshot:
        """Where it listens, its viewers and what it answered and refused."""
        return ObserverSnapshot(
            path=self.path,
            status=self._status,
            address=f"{_url_host(self._host)}:{self._port}",
            viewers=self._viewers,
            streams=self._streams,
            requests=self._requests,
            refused=self._refused,
        )

    # -- the app -----------------------------------------------------------------------------

    def _app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        app = Starlette(
            routes=[
                Route("/", self._page_endpoint, methods=["GET"]),
                Route("/api/call", self._call_endpoint, methods=["POST"]),
                Route("/api/watch", self._watch_endpoint, methods=["POST"]),
                Route("/api/stream", _AsgiEndpoint(self._stream_endpoint), methods=["GET"]),
            ]
        )

        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
                return
            if scope["type"] != "http":
                return  # no websockets here
            self._requests += 1
            problem = self._refusal(scope)
            if problem is not None:
                self._refused += 1
                status, text = problem
                await _plain_response(send, status, text)
                return
            await app(scope, receive, send)

        return guarded

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """Why a request is refused (status, text), or None to let it in."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not self._remote and host not in self._hosts:
            return 403, f"refused: Host {host!r} is not this observer's address"
        origin = headers.get("origin")
        if origin is not None and origin != f"http://{host}":
            return 403, f"refused: requests from {origin!r} are not allowed (only the observer's own page)"
        token = ""
        authorization = headers.get("authorization", "")
        if authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        else:
            match = re.search(r"(?:^|&)token=([^&]*)", scope.get("query_string", b"").decode("latin-1"))
            token = match.group(1) if match else ""
        if not hmac.compare_digest(token.encode(), self._token.encode()):
            return 401, (
                "refused: this address needs the observer's token; open it with `weald observe` "
                "(its URL carries the token)"
            )
        return None

    async def _page_endpoint(self, request: Any) -> Any:  # noqa: ARG002 - Starlette's endpoint signature
        assert self._page is not None
        nonce = secrets.token_urlsafe(16)
        response = HTMLResponse(_compose(self._page, nonce))
        response.headers["content-security-policy"] = _csp(nonce)
        for name, value in _COMMON_HEADERS:
            response.headers[name.decode()] = value.decode()
        return response

    async def _call_endpoint(self, request: Any) -> Any:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_BODY:
                self._refused += 1
                return Response(f"a request body is at most {_MAX_BODY} bytes", 413, media_type="text/plain")
        try:
            call = msgspec.json.decode(bytes(body))
        except (msgspec.DecodeError, UnicodeDecodeError):
            call = None
        if not isinstance(call, dict) or not isinstance(call.get("method"), str):
            return _json_response({"error": {"code": -32600, "message": 'expected {"method": ..., "params": {...}}'}})
        method = call["method"]
        if method not in OBSERVER_METHODS:
            allowed = ", ".join(sorted(OBSERVER_METHODS))
            return _json_response(
                {"error": {"code": -32601, "message": f"the observer does not call {method!r}; it calls {allowed}"}}
            )
        return _json_response(await self._call(method, call.get("params") or {}))

    async def _watch_endpoint(self, request: Any) -> Any:
        """``{"stream": id, "agent_id": id or null}``: the agent whose text deltas that stream carries."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > 4096:
                self._refused += 1
                return Response("a watch request is at most 4096 bytes", 413, media_type="text/plain")
        try:
            watch = msgspec.json.decode(bytes(body))
        except (msgspec.DecodeError, UnicodeDecodeError):
            watch = None
        agent_id = watch.get("agent_id") if isinstance(watch, dict) else None
        if (
            not isinstance(watch, dict)
            or not isinstance(watch.get("stream"), str)
            or not (agent_id is None or isinstance(agent_id, str))
        ):
            return _json_response({"error": {"code": -32600, "message": 'expected {"stream": ..., "agent_id": ...}'}})
        stream = self._open.get(watch["stream"])
        if stream is None:
            return _json_response({"error": {"code": -32001, "message": f"no open stream {watch['stream']!r}"}})
        stream.watching = agent_id
        return _json_response({"result": {"stream": watch["stream"], "agent_id": agent_id}})

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One JSON-RPC method, through the server's own method table."""
        restarting = {"error": {"code": -32000, "message": "the daemon's JSON-RPC server is restarting; try again"}}
        server = self.system.whereis("/server")
        if server is None:
            return restarting
        try:
            outcome: dict[str, Any] = await (await server.proxy().call_nowait(method, params))
        except ActorDeadError:
            return restarting
        return outcome

    # -- the stream ----------------------------------------------------------------------------

    async def _stream_endpoint(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: ARG002 - ASGI
        if self._viewers >= MAX_VIEWERS:
            self._refused += 1
            await _plain_response(send, 503, f"the observer serves at most {MAX_VIEWERS} viewers at once")
            return
        self._viewers += 1
        self._streams += 1
        stream = _Stream(self, send)
        self._open[stream.id] = stream
        self.system.events.publish("observer.viewer_opened", self.path, {"viewers": self._viewers})
        try:
            headers = [(b"content-type", b"text/event-stream; charset=utf-8"), *_COMMON_HEADERS]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async with trio.open_nursery() as nursery:

                async def until_disconnected() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_disconnected)
                await stream.run()
                nursery.cancel_scope.cancel()
        finally:
            self._viewers -= 1
            self._open.pop(stream.id, None)
            self.system.events.publish("observer.viewer_closed", self.path, {"viewers": self._viewers})


class _Stream:
    """One viewer's server-sent events.

    ``hello`` first (the daemon, the last events, the metrics so far), then:
    ``events`` batches (at most every `EVENT_BATCH` s; text deltas and tool
    output only of the agent it watches), ``view`` when an event may have
    changed a view and it did change, ``sessions`` (which sessions changed,
    at most every `SESSIONS_PACE` s: the page refetches the rows it shows)
    and ``metrics`` (the new samples, once a sample).
    """

    def __init__(self, observer: Observer, send: Send) -> None:
        self.id = secrets.token_urlsafe(12)
        self.watching: str | None = None  # the agent whose text deltas and tool output are forwarded
        self._observer = observer
        self._send = send
        faults = observer._daemon.faults is not None
        self._views = [view for view in _VIEWS if faults or not view.needs_faults]
        self._dirty: set[str] = {view.name for view in self._views}
        self._last: dict[str, float] = {}
        self._pace: dict[str, float] = {view.name: view.interval for view in self._views}
        self._sent: dict[str, bytes] = {}
        self._pending: deque[Any] = deque()
        self._dropped = 0  # events this viewer missed since the last batch
        self._bus_dropped = 0  # the subscription's own count, as last read
        self._arrived = trio.Event()
        self._changed: set[str] = set()  # sessions changed since the last `sessions` message
        self._membership = False  # a session started, stopped, woke or went to sleep
        self._changed_sent = -1e9
        self._metrics_next = 0  # the next sample to send
        self._metrics_due = 0.0

    async def run(self) -> None:
        observer = self._observer
        system = observer.system
        with system.events.subscribe("*", max_buffer=VIEWER_BUFFER) as sub:
            status = await observer._call("daemon.status", {})
            events = system.events.recent(_HELLO_EVENTS, exclude=_QUIET)
            metrics = await observer._call("metrics.series", {})
            series = metrics.get("result")
            if series is not None:
                self._metrics_next = series["next"]
            await self._message(
                "hello",
                {
                    "stream": self.id,
                    "daemon": status.get("result"),
                    "events": events,
                    "faults_enabled": observer._daemon.faults is not None,
                    "fault_kinds": _fault_kinds(),
                    "views": [view.name for view in self._views],
                    "metrics": series,
                },
            )
            self._metrics_due = trio.current_time() + 1.0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, sub)
                await self._loop()

    async def _read(self, sub: Any) -> None:
        async for event in sub:
            if len(self._pending) >= VIEWER_BUFFER:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append(event)
            self._dropped += sub.dropped - self._bus_dropped
            self._bus_dropped = sub.dropped
            self._arrived.set()

    def _due(self) -> float:
        due = [self._last.get(v.name, -1e9) + self._pace[v.name] for v in self._views if v.name in self._dirty]
        due.append(self._metrics_due)
        if self._changed or self._membership:
            due.append(self._changed_sent + SESSIONS_PACE)
        return min(due)

    async def _loop(self) -> None:
        while True:
            now = trio.current_time()
            for view in self._views:
                if view.name in self._dirty and now >= self._last.get(view.name, -1e9) + self._pace[view.name]:
                    await self._refresh(view)
            if now >= self._metrics_due:
                await self._metrics()
            if (self._changed or self._membership) and now >= self._changed_sent + SESSIONS_PACE:
                await self._sessions()
            with trio.move_on_at(self._due()):
                await self._arrived.wait()
            if not self._pending:
                continue
            await trio.sleep(EVENT_BATCH)  # gather what comes with it: one message, not one per event
            self._arrived = trio.Event()
            events, self._pending = list(self._pending), deque()
            await self._forward(events)

    async def _forward(self, events: list[Any]) -> None:
        watched = f"/sessions/{self.watching}/" if self.watching else None
        forwarded = []
        for event in events:
            topic, source = event.topic, event.source
            quiet = topic in _QUIET
            if source.startswith("/sessions/"):
                self._changed.add(source.split("/", 3)[2])
            elif source == "/sessions":  # a session started, stopped, woke or went to sleep
                self._membership = True
            if quiet:
                if watched is not None and source.startswith(watched):
                    forwarded.append(event)
                continue
            forwarded.append(event)
            for view in self._views:
                if view.name not in self._dirty and view.dirtied(topic, source):
                    self._dirty.add(view.name)
        skipped = max(len(forwarded) - MAX_BATCH, 0)
        dropped, self._dropped = self._dropped, 0
        if forwarded or dropped:
            await self._message("events", {"events": forwarded[skipped:], "dropped": dropped, "skipped": skipped})

    async def _refresh(self, view: _View) -> None:
        started = trio.current_time()
        self._dirty.discard(view.name)
        outcome = await self._observer._call(view.method, view.params)
        ended = trio.current_time()
        self._last[view.name] = ended
        # A view that takes long to build is refreshed less often: at most a fifth of the time.
        self._pace[view.name] = max(view.interval, 4 * (ended - started))
        data = _encoder.encode(outcome)
        if self._sent.get(view.name) == data:
            return
        self._sent[view.name] = data
        name = _encoder.encode(view.name)
        await self._send_raw(b'event: view\ndata: {"name":' + name + b',"outcome":' + data + b"}\n\n")

    async def _metrics(self) -> None:
        self._metrics_due = trio.current_time() + 1.0
        outcome = await self._observer._call("metrics.series", {"since": self._metrics_next})
        series = outcome.get("result")
        if series is None or not series["t"]:
            return
        self._metrics_next = series["next"]
        del series["series"]  # what each series means went with the hello
        await self._message("metrics", series)

    async def _sessions(self) -> None:
        self._changed_sent = trio.current_time()
        changed, self._changed = self._changed, set()
        membership, self._membership = self._membership, False
        # Too many to name: the page refetches what it shows.
        named = sorted(changed) if len(changed) <= 1000 else None
        await self._message("sessions", {"changed": named, "membership": membership})

    async def _message(self, name: str, data: Any) -> None:
        await self._send_raw(b"event: " + name.encode() + b"\ndata: " + _encoder.encode(data) + b"\n\n")

    async def _send_raw(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})


def _fault_kinds() -> dict[str, list[str]]:
    """Each fault target's kinds, for the page's fault form (`weald.runtime.faults.KINDS`)."""
    return {target: list(kinds) for target, kinds in KINDS.items()}


class _AsgiEndpoint:
    """A plain ASGI callable as a Starlette route's endpoint (Starlette calls instances as ASGI apps)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    """ASGI's lifespan, answered here: the app has nothing to start or stop.

    Starlette's own would format a traceback (reading source files, on the
    loop thread) when the observer is cancelled at shutdown.
    """
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _plain_response(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *_COMMON_HEADERS]})
    await send({"type": "http.response.body", "body": body})


def _json_response(value: Any) -> Any:
    response = Response(_encoder.encode(value), media_type="application/json")
    for name, header in _COMMON_HEADERS:
        response.headers[name.decode()] = header.decode()
    return response


@attrs.frozen
class _Failed:
    error: BaseException


def _crash_on_error(result: Any) -> _Failed | None:
    error = getattr(result, "error", None)
    if error is None:
        return None
    return _Failed(error)


def new_token() -> str:
    """A fresh observer token: 32 random bytes, URL-safe."""
    return secrets.token_urlsafe(32)
