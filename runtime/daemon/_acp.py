"""``weald acp``: an Agent Client Protocol agent on stdio, a thin client of the weald daemon.

An editor (Zed, a JetBrains or Neovim ACP client) starts ``weald acp`` as a
subprocess and speaks ACP to it: JSON-RPC 2.0, one message per line, on
stdin/stdout. Everything that matters lives in the daemon: each ACP session
is a weald session (its ``sessionId`` is the agent id), so an editor restart
or a killed ``weald acp`` loses nothing, and ``session/load`` picks the
session up again.

::

    editor --ACP (stdio)--> weald acp --weald JSON-RPC (Unix socket)--> daemon
           <-session/update--         <-event, permission.request--

What maps onto what:

- ``session/new`` -> ``agent.start`` in the given ``cwd`` (under that
  project's configuration), with the editor's MCP servers as the session's
  own MCP connections; then ``events.subscribe`` to the agent.
- ``session/prompt`` -> ``agent.prompt`` (text, images, resource links and
  embedded resources as text); the agent's events stream back as
  ``session/update``: message chunks, tool calls (``tool_call`` then
  ``tool_call_update``, with kinds, locations and, for edits, diffs), and
  the plan (weald's tasks).
- ``session/cancel`` -> ``agent.abort``: the prompt answers ``cancelled``.
- ``permission.request`` -> ``session/request_permission`` (allow once,
  allow always, deny) -> ``permission.respond``.
- ``session/load`` -> the stored history replayed as ``session/update``s
  (the session is started again when no daemon runs it).

Threads: the main thread reads stdin; each request runs in a thread of its
own (a prompt waits for its turn); one thread pumps the daemon's
notifications into ``session/update``s, in order. Output lines are written
whole under a lock.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Literal

import msgspec
from weald.runtime import Future, msgspec_convert
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

__all__ = ["PROTOCOL_VERSION", "AcpAgent", "protocol_stdout", "serve_stdio"]

logger = logging.getLogger("weald.acp")

PROTOCOL_VERSION = 1
"""The ACP protocol version weald implements (the only major version there is)."""

# JSON-RPC error codes (ACP uses JSON-RPC's, plus -32002 "resource not found").
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The largest message read from the editor (images come inline, base64)."""

_FILE_CAP = 1024 * 1024  # the most of a file read for a diff
_OUTPUT_CAP = 64 * 1024  # the most of a call's streamed output kept to show
_TURN_END_WAIT = 10.0  # seconds the prompt's answer waits for the turn's last events
_PERMISSION_OPTIONS = [
    {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Allow always", "kind": "allow_always"},
    {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
]
_BUFFER_READ_WAIT = 10.0  # seconds a permission request's diff waits for the editor's buffer
# The ACP client methods the daemon may ask of the editor for a session's tools (weald.tools.EDITOR_METHODS).
_CLIENT_METHODS = frozenset(
    {
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    }
)
_TRACEPARENT = re.compile(r"\A[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

# weald's tool names (and, for others, their kind) -> ACP tool kinds.
_KIND_BY_NAME = {
    "read_file": "read",
    "recall": "read",
    "memory_get": "read",
    "glob": "search",
    "grep": "search",
    "memory_search": "search",
    "edit_file": "edit",
    "write_file": "edit",
    "memory_set": "edit",
    "shell": "execute",
    "fetch": "fetch",
    "tasks": "think",
}
_KIND_BY_WEALD_KIND = {"read": "read", "write": "edit", "exec": "execute", "network": "fetch"}


# -- the editor's messages ---------------------------------------------------------------------------------


class _Params(msgspec.Struct, rename="camel", kw_only=True):
    """ACP params: unknown fields (``_meta``, newer fields) are allowed, as the protocol asks."""


class InitializeParams(_Params):
    protocol_version: int
    client_capabilities: dict[str, Any] = {}
    client_info: dict[str, Any] | None = None


class EnvVariable(msgspec.Struct, kw_only=True):
    name: str
    value: str


class HttpHeader(msgspec.Struct, kw_only=True):
    name: str
    value: str


class McpServer(msgspec.Struct, kw_only=True):
    name: str
    type: Literal["stdio", "http", "sse"] = "stdio"
    command: str | None = None
    args: list[str] = []
    env: list[EnvVariable] = []
    url: str | None = None
    headers: list[HttpHeader] = []


class NewSessionParams(_Params):
    cwd: str
    mcp_servers: list[McpServer] = []


class LoadSessionParams(_Params):
    session_id: str
    cwd: str
    mcp_servers: list[McpServer] = []


class ContentBlock(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    data: str | None = None
    mime_type: str | None = msgspec.field(default=None, name="mimeType")
    uri: str | None = None
    name: str | None = None
    title: str | None = None
    resource: dict[str, Any] | None = None


class PromptParams(_Params):
    session_id: str
    prompt: list[ContentBlock]
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class SessionParams(_Params):
    session_id: str


class RequestError(Exception):
    """A JSON-RPC error answer to the editor."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def _describe(exc: msgspec.ValidationError) -> str:
    """Msgspec's message, with its ``$.`` path made plain (``at `$.cwd``` -> ``at cwd``)."""
    return str(exc).replace("`$.", "`").replace("`$`", "the params")


# -- one session as the editor sees it ----------------------------------------------------------------------


class _Call:
    """What the session keeps of one tool call while it runs: enough to show its diff and output."""

    __slots__ = ("acp_id", "kind", "new_text", "old_text", "output", "path", "read_buffer", "terminal_id", "tool")

    def __init__(self, acp_id: str, tool: str, kind: str, path: str | None) -> None:
        self.acp_id = acp_id
        self.tool = tool
        self.kind = kind
        self.path = path
        self.old_text: str | None = None
        self.read_buffer = False  # old_text is the editor's buffer (it read the file through the editor)
        self.new_text: str | None = None  # what it wrote through the editor (the disk does not show it)
        self.terminal_id: str | None = None  # the editor's terminal running its command
        self.output = ""


class _Session:
    """One ACP session: a weald agent, the subscription to it, and the turn in flight."""

    def __init__(self, session_id: str, cwd: str, subscription: str) -> None:
        self.id = session_id
        self.cwd = cwd
        self.subscription = subscription
        self.lock = threading.Lock()
        self.turn_id: str | None = None
        self.calls: dict[str, _Call] = {}  # weald call id -> the call, this turn
        self.streamed = False  # text deltas came for the current model call
        self.turn_ends: dict[str, threading.Event] = {}
        self.cancelled = False
        # What the session's project takes from this editor ("client.attach"'s answer): its buffers, its terminals.
        self.files = "disk"
        self.terminal = "sandbox"


# -- the agent ----------------------------------------------------------------------------------------------------


class AcpAgent:
    """The ACP agent: reads the editor's messages, drives the daemon, streams updates back.

    Args:
        client: a connection to the daemon (it may be an embedded one).
        model: the model of new sessions (``provider:model`` or an alias);
            None: the project's default.
        stdin: where the editor's messages come from (bytes, one per line).
        stdout: where the answers and updates go.
    """

    def __init__(self, client: Client, *, model: str | None = None, stdin: BinaryIO, stdout: BinaryIO) -> None:
        self._daemon = client
        self._model = model
        self._stdin = stdin
        self._stdout = stdout
        self._write_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, Future[Any]] = {}
        self._pending_lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._by_subscription: dict[str, _Session] = {}
        self._sessions_lock = threading.Lock()
        self._client_capabilities: dict[str, Any] = {}
        self._closed = threading.Event()
        self._encoder = msgspec.json.Encoder()
        self._handlers: dict[str, tuple[type[Any], Callable[[Any], Any]]] = {
            "initialize": (InitializeParams, self._initialize),
            "authenticate": (dict, lambda _params: {}),
            "session/new": (NewSessionParams, self._new_session),
            "session/load": (LoadSessionParams, self._load_session),
            "session/prompt": (PromptParams, self._prompt),
        }
        self._notification_handlers: dict[str, tuple[type[Any], Callable[[Any], None]]] = {
            "session/cancel": (SessionParams, self._cancel),
        }

    # -- the loop ------------------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve until the editor closes stdin or the daemon goes away; returns the exit status (1: the daemon)."""
        threading.Thread(target=self._pump, name="weald-acp-pump", daemon=True).start()
        # stdin is read in a thread of its own, so that a daemon gone away ends the agent at once.
        threading.Thread(target=self._read, name="weald-acp-reader", daemon=True).start()
        self._closed.wait()
        with self._pending_lock:
            pending, self._pending = list(self._pending.values()), {}
        for future in pending:
            future.set_exception((ConnectionError, ConnectionError("the editor closed the connection"), None))
        return 1 if self._daemon.broken else 0

    def _read(self) -> None:
        try:
            while not self._closed.is_set():
                line = self._stdin.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    self._skip_rest_of_line()
                    self._error(None, INVALID_REQUEST, f"message larger than {MAX_LINE_BYTES:,} bytes; not read")
                    continue
                if line.strip():
                    self._receive(line)
        finally:
            self._closed.set()

    def _skip_rest_of_line(self) -> None:
        while True:
            chunk = self._stdin.readline(MAX_LINE_BYTES)
            if not chunk or chunk.endswith(b"\n"):
                return

    def _receive(self, line: bytes) -> None:
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError as exc:
            self._error(None, PARSE_ERROR, f"parse error: the line is not valid JSON ({exc})")
            return
        if isinstance(message, list):
            self._error(None, INVALID_REQUEST, "batches are not part of ACP: send one message per line")
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self._error(
                message.get("id") if isinstance(message, dict) else None,
                INVALID_REQUEST,
                'invalid request: expected a JSON-RPC 2.0 object ({"jsonrpc": "2.0", ...})',
            )
            return
        method = message.get("method")
        if method is None:
            self._answered(message)
            return
        if not isinstance(method, str):
            self._error(message.get("id"), INVALID_REQUEST, "invalid request: method must be a string")
            return
        if "id" in message:
            threading.Thread(
                target=self._handle_request, args=(message,), name=f"weald-acp-{method}", daemon=True
            ).start()
        else:
            self._handle_notification(method, message.get("params"))

    def _handle_request(self, message: dict[str, Any]) -> None:
        request_id, method = message["id"], message["method"]
        entry = self._handlers.get(method)
        if entry is None:
            known = ", ".join(sorted(self._handlers))
            self._error(request_id, METHOD_NOT_FOUND, f"method not found: {method} (weald acp serves {known})")
            return
        kind, handler = entry
        try:
            params = msgspec_convert(message.get("params") or {}, kind)
            result = handler(params)
        except msgspec.ValidationError as exc:
            self._error(request_id, INVALID_PARAMS, f"invalid params for {method}: {_describe(exc)}")
            return
        except RequestError as exc:
            self._error(request_id, exc.code, exc.message, exc.data)
            return
        except RPCCallError as exc:
            code = RESOURCE_NOT_FOUND if exc.code == -32001 else INVALID_PARAMS if exc.code == -32602 else exc.code
            self._error(request_id, code, exc.message, exc.data)
            return
        except DaemonUnavailableError as exc:
            self._error(request_id, INTERNAL_ERROR, f"the weald daemon is gone: {exc}")
            return
        except Exception as exc:  # an internal error reaches the editor as one, with its cause
            logger.exception("%s failed", method)
            self._error(request_id, INTERNAL_ERROR, f"internal error in {method}: {exc}")
            return
        self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    def _handle_notification(self, method: str, params: Any) -> None:
        entry = self._notification_handlers.get(method)
        if entry is None:
            return  # unknown notifications are ignored (JSON-RPC: nothing to answer)
        kind, handler = entry
        try:
            handler(msgspec_convert(params or {}, kind))
        except msgspec.ValidationError as exc:
            logger.warning("ignored %s: %s", method, _describe(exc))

    def _answered(self, message: dict[str, Any]) -> None:
        """A reply to one of our requests (``session/request_permission``)."""
        with self._pending_lock:
            future = self._pending.pop(message.get("id"), None)  # type: ignore[arg-type]
        if future is None:
            return
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            exc = RequestError(error.get("code", INTERNAL_ERROR), str(error.get("message", "")))
            future.set_exception((RequestError, exc, None))
        else:
            future.set(message.get("result"))

    # -- output -------------------------------------------------------------------------------------------------

    def _send(self, payload: dict[str, Any]) -> None:
        data = self._encoder.encode(payload) + b"\n"
        with self._write_lock:
            try:
                self._stdout.write(data)
                self._stdout.flush()
            except (OSError, ValueError):  # the editor went away: stdin's end stops the loop
                self._closed.set()

    def _error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self._send({"jsonrpc": "2.0", "id": request_id, "error": error})

    def _update(self, session: _Session, update: dict[str, Any]) -> None:
        self._send(
            {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session.id, "update": update}}
        )

    def _ask_editor(self, method: str, params: dict[str, Any], timeout: float | None = None) -> Any:
        request_id = next(self._ids)
        future: Future[Any] = Future()
        with self._pending_lock:
            self._pending[request_id] = future
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return future.get(timeout=timeout)

    # -- methods ---------------------------------------------------------------------------------------------------

    def _initialize(self, params: InitializeParams) -> dict[str, Any]:
        self._client_capabilities = params.client_capabilities
        from weald.runtime._version import VERSION

        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": True, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": True, "sse": False},
            },
            "agentInfo": {"name": "weald", "title": "weald", "version": VERSION},
            "authMethods": [],
        }

    def _new_session(self, params: NewSessionParams) -> dict[str, Any]:
        cwd = _absolute(params.cwd)
        start: dict[str, Any] = {"working_dir": cwd, "asleep": False}
        if self._model is not None:
            start["model"] = self._model
        if params.mcp_servers:
            start["mcp_servers"] = _mcp_servers(params.mcp_servers)
        agent_id = self._daemon.call("agent.start", start, timeout=120)["agent_id"]
        self._attach(agent_id, cwd)
        return {"sessionId": agent_id}

    def _load_session(self, params: LoadSessionParams) -> dict[str, Any]:
        cwd = _absolute(params.cwd)
        rows = self._daemon.call("agent.list", {"agent_id": params.session_id}, timeout=60)["rows"]
        row = rows[0] if rows else None
        if row is None:
            raise RequestError(RESOURCE_NOT_FOUND, f"no session {params.session_id!r} is stored by this weald daemon")
        if row.get("state") in ("stopped", "not running"):
            # Stored, not running (its daemon was embedded, or it was stopped): it goes on where it was.
            start: dict[str, Any] = {
                "working_dir": row.get("working_dir") or cwd,
                "agent_id": params.session_id,
                "model": row["model"],
                "asleep": False,
            }
            if params.mcp_servers:
                start["mcp_servers"] = _mcp_servers(params.mcp_servers)
            self._daemon.call("agent.start", start, timeout=120)
        session = self._attach(params.session_id, row.get("working_dir") or cwd)
        self._replay(session)
        return {}

    def _attach(self, agent_id: str, cwd: str) -> _Session:
        topics = ["agent.*", "tool.*"]
        subscription = self._daemon.call("events.subscribe", {"agent_id": agent_id, "topics": topics}, timeout=60)
        session = _Session(agent_id, cwd, subscription["subscription"])
        with self._sessions_lock:
            old = self._sessions.get(agent_id)
            self._sessions[agent_id] = session
            self._by_subscription[session.subscription] = session
        if old is not None:
            with contextlib.suppress(RPCCallError, DaemonUnavailableError):
                self._daemon.call("events.unsubscribe", {"subscription": old.subscription}, timeout=30)
            with self._sessions_lock:
                self._by_subscription.pop(old.subscription, None)
        self._offer_editor(session)
        return session

    def _offer_editor(self, session: _Session) -> None:
        """Tell the daemon what the editor offers this session (its files, its terminals), if anything."""
        fs = self._client_capabilities.get("fs")
        fs = fs if isinstance(fs, dict) else {}
        offer = {
            "read_text_file": fs.get("readTextFile") is True,
            "write_text_file": fs.get("writeTextFile") is True,
            "terminal": self._client_capabilities.get("terminal") is True,
        }
        if not any(offer.values()):
            return
        try:
            routes = self._daemon.call("client.attach", {"agent_id": session.id, **offer}, timeout=60)
        except RPCCallError as exc:  # the session goes on without the editor's files and terminals
            logger.warning("session %s: the daemon did not take the editor's files and terminals: %s", session.id, exc)
            return
        session.files, session.terminal = routes["files"], routes["terminal"]

    def _session(self, session_id: str) -> _Session:
        with self._sessions_lock:
            session = self._sessions.get(session_id)
        if session is None:
            msg = f"no session {session_id!r} on this connection; create it (session/new) or load it (session/load)"
            raise RequestError(RESOURCE_NOT_FOUND, msg)
        return session

    def _prompt(self, params: PromptParams) -> dict[str, Any]:
        session = self._session(params.session_id)
        text, images = _prompt_content(params.prompt)
        session.cancelled = False
        request: dict[str, Any] = {"agent_id": session.id, "text": text}
        if images:
            request["images"] = images
        traceparent = (params.meta or {}).get("traceparent")
        if isinstance(traceparent, str) and _TRACEPARENT.match(traceparent):
            request["traceparent"] = traceparent  # the editor's trace goes on in the daemon's (telemetry on)
        result = self._daemon.call("agent.prompt", request)
        # The reply and the turn's last events travel apart: the editor gets every update first.
        ended = self._turn_end(session, result["turn_id"])
        ended.wait(_TURN_END_WAIT)
        with session.lock:
            session.turn_ends.pop(result["turn_id"], None)
            # Calls the turn left unfinished (cancelled, aborted) end with it, before the answer.
            left, session.calls = list(session.calls.values()), {}
        for call in left:
            self._update(session, {"sessionUpdate": "tool_call_update", "toolCallId": call.acp_id, "status": "failed"})
        usage = result.get("usage") or {}
        answer: dict[str, Any] = {
            "stopReason": _stop_reason(result, session.cancelled),
            "_meta": {"weald": {"turnId": result["turn_id"], "steps": result.get("steps"), "usage": usage}},
        }
        if not result.get("ok") and not result.get("aborted") and answer["stopReason"] == "end_turn":
            raise RequestError(INTERNAL_ERROR, f"the turn failed: {result.get('error')}", {"turnId": result["turn_id"]})
        return answer

    def _cancel(self, params: SessionParams) -> None:
        with self._sessions_lock:
            session = self._sessions.get(params.session_id)
        if session is None:
            return
        session.cancelled = True
        # Not on the reading thread: stdin must go on being read (the permission answer may be next).
        threading.Thread(target=self._abort, args=(session,), name="weald-acp-cancel", daemon=True).start()

    def _abort(self, session: _Session) -> None:
        with contextlib.suppress(RPCCallError, DaemonUnavailableError):
            self._daemon.call("agent.abort", {"agent_id": session.id}, timeout=60)

    def _turn_end(self, session: _Session, turn_id: str) -> threading.Event:
        with session.lock:
            return session.turn_ends.setdefault(turn_id, threading.Event())

    # -- session/load: the stored history ------------------------------------------------------------------------------

    def _replay(self, session: _Session) -> None:
        history = self._daemon.call("agent.history", {"agent_id": session.id}, timeout=120)
        for message in history["messages"]:
            role, content = message.get("role"), message.get("content") or ""
            if role == "user" and message.get("compaction") is None:
                self._update(session, {"sessionUpdate": "user_message_chunk", "content": _text(content)})
            elif role == "assistant":
                if content:
                    self._update(session, {"sessionUpdate": "agent_message_chunk", "content": _text(content)})
                for call in message.get("tool_calls") or []:
                    tool = call.get("name", "")
                    arguments = call.get("arguments") if isinstance(call.get("arguments"), dict) else {}
                    self._update(
                        session,
                        {
                            "sessionUpdate": "tool_call",
                            "toolCallId": f"h{message['seq']}.{call.get('id')}",
                            "title": _title(tool, arguments),
                            "kind": _kind(tool, None),
                            "status": "completed",
                            "locations": _locations(session.cwd, arguments),
                            "rawInput": arguments,
                        },
                    )
            elif role == "tool":
                # The call's message came just before: it holds the matching id.
                self._update(
                    session,
                    {
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": self._replayed_call_id(history["messages"], message),
                        "status": "failed" if message.get("is_error") else "completed",
                        "content": [{"type": "content", "content": _text(_clip(content, 4000))}],
                    },
                )

    @staticmethod
    def _replayed_call_id(messages: list[dict[str, Any]], result: dict[str, Any]) -> str:
        for message in reversed(messages):
            if message["seq"] >= result["seq"] or message.get("role") != "assistant":
                continue
            if any(call.get("id") == result.get("tool_call_id") for call in message.get("tool_calls") or []):
                return f"h{message['seq']}.{result.get('tool_call_id')}"
        return f"h{result['seq']}.{result.get('tool_call_id')}"

    # -- the daemon's notifications -> session/update ------------------------------------------------------------

    def _pump(self) -> None:
        """Turn the daemon's notifications into updates, in the order they came (its own thread)."""
        while not self._closed.is_set():
            note = self._daemon.next_notification(timeout=0.5)
            if note is None:
                if self._daemon.broken:
                    logger.error("the weald daemon closed the connection; weald acp stops")
                    self._closed.set()
                    return
                continue
            method, params = note
            try:
                if method == "event":
                    self._on_event(params)
                elif method == "permission.request":
                    threading.Thread(
                        target=self._permission, args=(params,), name="weald-acp-permission", daemon=True
                    ).start()
                elif method == "ask_user.question":
                    threading.Thread(target=self._question, args=(params,), name="weald-acp-ask", daemon=True).start()
                elif method == "client.request":
                    # Its own thread: a terminal's wait_for_exit lasts as long as the command.
                    threading.Thread(
                        target=self._client_request, args=(params,), name="weald-acp-client", daemon=True
                    ).start()
            except Exception:  # one bad event must not stop the updates of every session
                logger.exception("could not turn %s into an ACP update", method)

    def _on_event(self, params: dict[str, Any]) -> None:
        with self._sessions_lock:
            session = self._by_subscription.get(params.get("subscription", ""))
        if session is None:
            return
        event = params["event"]
        topic, data = event["topic"], event.get("data") or {}
        if topic.startswith("agent.") and event.get("source") != f"/sessions/{session.id}/agent":
            return  # a sub-agent's own events: its parent's sub_agent call stands for it
        if topic == "agent.turn_start":
            with session.lock:
                session.turn_id = data.get("turn_id")
                session.calls = {}
        elif topic == "agent.message_start":
            session.streamed = False
        elif topic == "agent.message_delta":
            session.streamed = True
            self._update(session, {"sessionUpdate": "agent_message_chunk", "content": _text(data.get("text", ""))})
        elif topic == "agent.message_end":
            if not session.streamed and data.get("text"):
                self._update(session, {"sessionUpdate": "agent_message_chunk", "content": _text(data["text"])})
        elif topic == "agent.turn_end":
            self._turn_end(session, data.get("turn_id", "")).set()
        elif topic == "tool.started":
            self._call_started(session, data)
        elif topic == "tool.output":
            self._call_output(session, data)
        elif topic in ("tool.finished", "tool.failed"):
            self._call_ended(session, data, ok=topic == "tool.finished")

    def _acp_call_id(self, session: _Session, call_id: str) -> str:
        return f"{session.turn_id or 'turn'}.{call_id}"

    def _call_started(self, session: _Session, data: dict[str, Any]) -> None:
        if data.get("agent") != f"/sessions/{session.id}/agent":
            return
        tool, arguments = data.get("tool", ""), data.get("arguments") or {}
        kind = _kind(tool, None)
        path = _path(session.cwd, arguments)
        call = _Call(self._acp_call_id(session, data["call_id"]), tool, kind, path)
        if kind == "edit" and path is not None:
            call.old_text = _read_text(path)
        with session.lock:
            session.calls[data["call_id"]] = call
        self._update(
            session,
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call.acp_id,
                "title": _title(tool, arguments),
                "kind": kind,
                "status": "in_progress",
                "locations": _locations(session.cwd, arguments),
                "rawInput": arguments,
            },
        )

    def _call_output(self, session: _Session, data: dict[str, Any]) -> None:
        call = session.calls.get(data.get("call_id", ""))
        if call is None or call.terminal_id is not None:
            return  # a command in the editor's terminal: the editor shows its output itself
        call.output = (call.output + data.get("text", ""))[-_OUTPUT_CAP:]
        self._update(
            session,
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call.acp_id,
                "content": [{"type": "content", "content": _text(call.output)}],
            },
        )

    def _call_ended(self, session: _Session, data: dict[str, Any], *, ok: bool) -> None:
        with session.lock:
            call = session.calls.pop(data.get("call_id", ""), None)
        if call is None:
            return
        update: dict[str, Any] = {
            "sessionUpdate": "tool_call_update",
            "toolCallId": call.acp_id,
            "status": "completed" if ok else "failed",
        }
        content: list[dict[str, Any]] = []
        if call.terminal_id is not None:
            content.append({"type": "terminal", "terminalId": call.terminal_id})
        elif call.output:
            content.append({"type": "content", "content": _text(call.output)})
        if ok and call.kind == "edit" and call.path is not None:
            # Written through the editor, the change is in its buffer, not on the disk.
            new_text = call.new_text if call.new_text is not None else _read_text(call.path)
            if new_text is not None and new_text != call.old_text:
                content.append({"type": "diff", "path": call.path, "oldText": call.old_text, "newText": new_text})
        if not ok and data.get("error"):
            content.append({"type": "content", "content": _text(data["error"])})
        if content:
            update["content"] = content
        self._update(session, update)
        if ok and call.tool == "tasks":
            self._send_plan(session)

    def _send_plan(self, session: _Session) -> None:
        try:
            listed = self._daemon.call("tasks.list", {"agent_id": session.id, "view": "all"}, timeout=30)
        except (RPCCallError, DaemonUnavailableError) as exc:
            logger.warning("no plan for session %s: %s", session.id, exc)
            return
        statuses = {"done": "completed", "in_progress": "in_progress"}
        entries = [
            {"content": task["title"], "priority": "medium", "status": statuses.get(task["status"], "pending")}
            for task in listed["tasks"]
            if task["status"] != "cancelled"
        ]
        self._update(session, {"sessionUpdate": "plan", "entries": entries})

    # -- permissions and questions ----------------------------------------------------------------------------------

    def _permission(self, request: dict[str, Any]) -> None:
        with self._sessions_lock:
            session = self._sessions.get(request.get("agent_id", ""))
        if session is None:
            return
        call_id = request.get("call_id") or ""
        call = session.calls.get(call_id)
        tool, arguments = request.get("tool", ""), request.get("arguments") or {}
        tool_call: dict[str, Any] = {
            "toolCallId": call.acp_id if call is not None else self._acp_call_id(session, call_id),
            "title": _title(tool, arguments),
            "kind": _kind(tool, None),
            "status": "pending",
            "locations": _locations(session.cwd, arguments),
            "rawInput": arguments,
        }
        diff = _proposed_diff(session.cwd, call, tool, arguments, self._buffer_reader(session))
        if diff is not None:
            tool_call["content"] = [diff]
        decision, message = "deny", None
        try:
            answer = self._ask_editor(
                "session/request_permission",
                {"sessionId": session.id, "toolCall": tool_call, "options": _PERMISSION_OPTIONS},
                timeout=request.get("timeout"),
            )
            outcome = (answer or {}).get("outcome") or {}
            if outcome.get("outcome") == "selected" and outcome.get("optionId") in ("allow", "allow_always", "deny"):
                decision = outcome["optionId"]
            elif outcome.get("outcome") == "cancelled":
                message = "the user cancelled the turn in the editor"
        except (RequestError, ConnectionError, TimeoutError) as exc:
            message = f"the editor did not answer the permission request ({exc})"
        params: dict[str, Any] = {"request_id": request["request_id"], "decision": decision}
        if decision == "deny" and message is not None:
            params["message"] = message
        with contextlib.suppress(RPCCallError, DaemonUnavailableError):  # answered elsewhere, or timed out
            self._daemon.call("permission.respond", params, timeout=30)

    def _buffer_reader(self, session: _Session) -> Callable[[str], str | None] | None:
        """How to read a file as the session's tools will (the editor's buffer), or None: the disk."""
        if session.files != "editor":
            return None

        def read(path: str) -> str | None:
            try:
                answer = self._ask_editor(
                    "fs/read_text_file", {"sessionId": session.id, "path": path}, timeout=_BUFFER_READ_WAIT
                )
            except (RequestError, ConnectionError, TimeoutError):
                return None
            content = answer.get("content") if isinstance(answer, dict) else None
            return content if isinstance(content, str) else None

        return read

    # -- the editor's files and terminals, for the session's tools ---------------------------------------------------

    def _client_request(self, request: dict[str, Any]) -> None:
        """Ask the editor what a tool call of one of our sessions asks (``client.request``), and answer the daemon."""
        request_id, method = request.get("request_id"), request.get("method")
        given = request.get("params")
        params: dict[str, Any] = given if isinstance(given, dict) else {}
        with self._sessions_lock:
            session = self._sessions.get(request.get("agent_id", ""))
        error: dict[str, Any] | None = None
        result: Any = None
        if session is None:
            error = {"code": RESOURCE_NOT_FOUND, "message": "the session is not open in this editor any more"}
        elif method not in _CLIENT_METHODS or not self._offers(method):
            error = {"code": METHOD_NOT_FOUND, "message": f"the editor does not offer {method}"}
        else:
            timeout = request.get("timeout")
            try:
                result = self._ask_editor(
                    method,
                    {**params, "sessionId": session.id},
                    timeout=float(timeout) if isinstance(timeout, int | float) else None,
                )
            except RequestError as exc:
                error = {"code": exc.code, "message": exc.message}
            except TimeoutError:
                error = {"code": INTERNAL_ERROR, "message": f"the editor did not answer {method} in time"}
            except ConnectionError as exc:
                error = {"code": INTERNAL_ERROR, "message": f"the editor is gone ({exc})"}
            else:
                self._note_client_request(session, request.get("call_id") or "", method, params, result)
        answer: dict[str, Any] = {"request_id": request_id}
        if error is not None:
            answer["error"] = error
        else:
            answer["result"] = result
        with contextlib.suppress(RPCCallError, DaemonUnavailableError):  # timed out in the daemon, or it is gone
            self._daemon.call("client.respond", answer, timeout=30)

    def _offers(self, method: str) -> bool:
        if method.startswith("terminal/"):
            return self._client_capabilities.get("terminal") is True
        fs = self._client_capabilities.get("fs")
        key = "readTextFile" if method == "fs/read_text_file" else "writeTextFile"
        return isinstance(fs, dict) and fs.get(key) is True

    def _note_client_request(
        self, session: _Session, call_id: str, method: str, params: dict[str, Any], result: Any
    ) -> None:
        """What the tool call's updates show of it: the buffer before and after an edit, the terminal."""
        call = session.calls.get(call_id)
        if call is None:
            return
        if method == "fs/read_text_file" and params.get("path") == call.path and not call.read_buffer:
            content = result.get("content") if isinstance(result, dict) else None
            if isinstance(content, str):
                call.old_text, call.read_buffer = content, True
        elif method == "fs/write_text_file" and params.get("path") == call.path:
            if isinstance(params.get("content"), str):
                call.new_text = params["content"]
                if not call.read_buffer:  # a new file: nothing was there before
                    call.old_text, call.read_buffer = None, True
        elif method == "terminal/create" and isinstance(result, dict) and isinstance(result.get("terminalId"), str):
            call.terminal_id = result["terminalId"]
            self._update(
                session,
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call.acp_id,
                    "content": [{"type": "terminal", "terminalId": call.terminal_id}],
                },
            )

    def _question(self, question: dict[str, Any]) -> None:
        """ACP has no question of the agent to its user: say so to the model, which goes on."""
        with self._sessions_lock:
            if question.get("agent_id") not in self._sessions:
                return
        answer = (
            "(no answer: this session runs in an editor through ACP, which cannot put questions to the user; "
            "choose the most sensible option yourself and say which you chose)"
        )
        with contextlib.suppress(RPCCallError, DaemonUnavailableError):
            self._daemon.call("ask_user.respond", {"question_id": question["question_id"], "answer": answer})


# -- helpers ----------------------------------------------------------------------------------------------------------


def _absolute(cwd: str) -> str:
    if not os.path.isabs(cwd):
        raise RequestError(
            INVALID_PARAMS, f"invalid params: cwd must be an absolute path, got {cwd!r}", {"field": "cwd"}
        )
    return cwd


def _mcp_servers(servers: list[McpServer]) -> list[dict[str, Any]]:
    """The editor's MCP servers as ``agent.start``'s ``mcp_servers``."""
    out: list[dict[str, Any]] = []
    for server in servers:
        if server.type == "sse":
            msg = f"MCP server {server.name!r}: the legacy SSE transport is not offered (mcpCapabilities.sse is false)"
            raise RequestError(INVALID_PARAMS, msg, {"field": "mcpServers"})
        if server.type == "http":
            out.append({"name": server.name, "url": server.url, "headers": {h.name: h.value for h in server.headers}})
        else:
            env = {variable.name: variable.value for variable in server.env}
            out.append({"name": server.name, "command": server.command, "args": list(server.args), "env": env})
    return out


def _prompt_content(blocks: list[ContentBlock]) -> tuple[str, list[dict[str, str]]]:
    """The prompt as weald's text and images; resource links and embedded resources become text."""
    parts: list[str] = []
    images: list[dict[str, str]] = []
    for index, block in enumerate(blocks):
        if block.type == "text":
            parts.append(block.text or "")
        elif block.type == "image":
            mime = block.mime_type or ""
            if mime not in _IMAGE_TYPES or not block.data:
                msg = f"prompt[{index}]: an image needs data and a mimeType among {', '.join(_IMAGE_TYPES)}"
                raise RequestError(INVALID_PARAMS, msg, {"field": f"prompt[{index}]"})
            try:
                base64.b64decode(block.data, validate=True)
            except (binascii.Error, ValueError) as exc:
                msg = f"prompt[{index}]: the image's data is not base64"
                raise RequestError(INVALID_PARAMS, msg, {"field": f"prompt[{index}]"}) from exc
            images.append({"mime_type": mime, "data": block.data})
        elif block.type == "resource_link":
            label = block.title or block.name or block.uri
            parts.append(f"[{label}]({block.uri})")
        elif block.type == "resource":
            resource = block.resource or {}
            uri = resource.get("uri", "")
            if isinstance(resource.get("text"), str):
                parts.append(f'<context uri="{uri}">\n{resource["text"]}\n</context>')
            else:
                parts.append(f"[{uri}] (binary, {resource.get('mimeType') or 'unknown type'}; not shown)")
        else:
            msg = f"prompt[{index}]: content of type {block.type!r} is not accepted (promptCapabilities)"
            raise RequestError(INVALID_PARAMS, msg, {"field": f"prompt[{index}]"})
    text = "\n\n".join(part for part in parts if part)
    if not text and images:
        text = "(image)"
    return text, images


def _stop_reason(result: dict[str, Any], cancelled: bool) -> str:
    if result.get("aborted") or cancelled:
        return "cancelled"
    if result.get("ok"):
        return "end_turn"
    if "agent.max_steps" in (result.get("error") or ""):
        return "max_turn_requests"
    return "end_turn"


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit:,} more characters]"


def _kind(tool: str, weald_kind: str | None) -> str:
    return _KIND_BY_NAME.get(tool) or _KIND_BY_WEALD_KIND.get(weald_kind or "", "other")


def _title(tool: str, arguments: dict[str, Any]) -> str:
    for key in ("path", "command", "pattern", "url", "title", "task", "query", "key"):
        value = arguments.get(key)
        if isinstance(value, str) and value:
            return f"{tool} {_clip(value, 120)}"
    return tool


def _path(cwd: str, arguments: dict[str, Any]) -> str | None:
    value = arguments.get("path")
    if not isinstance(value, str) or not value:
        return None
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))


def _locations(cwd: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    path = _path(cwd, arguments)
    if path is None:
        return []
    location: dict[str, Any] = {"path": path}
    line = arguments.get("offset") or arguments.get("start")
    if isinstance(line, int) and line > 0:
        location["line"] = line
    return [location]


def _read_text(path: str) -> str | None:
    """A file's text for a diff: None when it is missing, not a regular file, too large or not UTF-8."""
    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path) or os.fstat(f.fileno()).st_size > _FILE_CAP:
                return None
            return f.read(_FILE_CAP).decode()
    except (OSError, UnicodeDecodeError):
        return None


def _proposed_diff(
    cwd: str,
    call: _Call | None,
    tool: str,
    arguments: dict[str, Any],
    read_buffer: Callable[[str], str | None] | None = None,
) -> dict[str, Any] | None:
    """The edit a permission request asks about, as an ACP diff, when it can be told before it runs.

    The call's ``tool.started`` may not have been seen yet (the request and
    the event travel apart): the file is then read now. With ``read_buffer``
    (the session's files are the editor's buffers), the file is what the editor holds.
    """
    path = call.path if call is not None else _path(cwd, arguments)
    if path is None or tool not in ("write_file", "edit_file"):
        return None
    read = read_buffer if read_buffer is not None else _read_text
    old_text = call.old_text if call is not None and read_buffer is None else read(path)
    new_text: str | None = None
    if tool == "write_file" and isinstance(arguments.get("content"), str):
        new_text = arguments["content"]
    elif old_text is not None:
        old, new = arguments.get("old_string"), arguments.get("new_string")
        if isinstance(old, str) and isinstance(new, str) and old and old_text.count(old) == 1:
            new_text = old_text.replace(old, new, 1)
    if new_text is None:
        return None
    return {"type": "diff", "path": path, "oldText": old_text, "newText": new_text}


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    """Log to stderr only (stdout carries the protocol)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("weald acp: %(message)s"))
    logging.getLogger("weald").addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger("weald").removeHandler(handler)


def protocol_stdout() -> BinaryIO:
    """Take fd 1 for the protocol: returns it, and points fd 1 (stray prints, an embedded daemon's) at stderr."""
    sys.stdout.flush()
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return protocol_out


def serve_stdio(client: Client, stdout: BinaryIO, *, model: str | None = None) -> int:
    """Serve ACP on stdin and ``stdout`` (from `protocol_stdout`) until the editor closes it (``weald acp``)."""
    with _quiet_logging():
        return AcpAgent(client, model=model, stdin=sys.stdin.buffer, stdout=stdout).serve()
