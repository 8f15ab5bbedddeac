"""The editors that drive sessions through ACP: their buffers and terminals, reached from the sessions' tools.

``weald acp`` is a client of the daemon. When the editor behind it offers
``fs/*`` or ``terminal/*`` (its ``clientCapabilities``), it says so for each
session it opens (``client.attach``, on its own connection). A tool call of
that session that should go through the editor (``[acp] files`` /
``[acp] terminal``, `weald.tools._editor`) then asks this module's
`ClientBridge`, and the request travels::

    tool (worker thread or loop task)
      -> ClientBridge.arequest   (on the loop: a notification to the connection)
      -> weald acp              ("client.request" {request_id, agent_id, call_id, method, params, timeout})
      -> the editor             (the ACP request, with the session's id)
      <- weald acp              ("client.respond" {request_id, result | error})
      <- the waiting tool call

Every request has a deadline; one the editor does not answer in time fails
with an error that says so. When the connection closes (the editor, or the
``weald acp`` process, went away), every request waiting on it fails at once
with an error naming what was asked, and its sessions' tools fall back to
the disk and weald's own processes until an editor attaches again. The
last connection to attach a session is the one its requests go to.

Threads: everything here runs on the loop thread, except `ClientBridge.request`
(a worker thread's way in, through `Loop.run`) and `EditorBridges.current`
(a dictionary lookup, from any thread).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import msgspec
import trio
from weald.runtime import Loop
from weald.tools import EDITOR_METHODS, EditorError

__all__ = ["BridgeConnection", "ClientBridge", "EditorBridges", "EditorStatistics"]

_encoder = msgspec.json.Encoder()

_MAX_PENDING = 4096
"""The most requests waiting on editors at once, over all connections (each is a tool call)."""


class BridgeConnection(Protocol):
    """What a bridge needs of the daemon's client connection (`weald.runtime.daemon.server.Connection`)."""

    id: int

    async def send_line(self, data: bytes) -> None:
        """Queue one encoded message for the client (waits while its outbox is full)."""
        ...


@attrs.frozen
class EditorStatistics:
    """The editors attached to sessions, and their requests so far (``daemon.status`` ``editors``).

    Attributes:
        attached: sessions an editor drives now.
        pending: requests waiting for an editor's answer.
        requests: requests sent to editors.
        failed: requests that ended in an error (the editor refused, did not answer, or went away).
        timed_out: of those, the ones it did not answer in time.
    """

    attached: int
    pending: int
    requests: int
    failed: int
    timed_out: int


class _Waiting:
    """One request sent to an editor, until its answer comes (loop thread only)."""

    __slots__ = ("answered", "bridge", "error", "method", "refused", "result")

    def __init__(self, bridge: ClientBridge, method: str) -> None:
        self.bridge = bridge
        self.method = method
        self.answered = trio.Event()
        self.result: Any = None
        self.error: str | None = None
        self.refused = False  # the error is the editor's answer


class ClientBridge:
    """The editor behind one connection, for one session: `weald.tools.EditorBridge`.

    Made by `EditorBridges.attach`; no public constructor use.
    """

    def __init__(
        self, hub: EditorBridges, conn: BridgeConnection, agent_id: str, *, files: bool, terminal: bool
    ) -> None:
        self._hub = hub
        self.conn = conn
        self.agent_id = agent_id
        self._files = files
        self._terminal = terminal
        self.closed: str | None = None  # why it no longer reaches the editor

    def __repr__(self) -> str:
        return f"<ClientBridge {self.agent_id} connection={self.conn.id} files={self._files} terminal={self._terminal}>"

    @property
    def files(self) -> bool:
        """The editor reads and writes files (it offers both fs methods)."""
        return self._files

    @property
    def terminal(self) -> bool:
        """The editor runs commands in its terminals."""
        return self._terminal

    def request(self, method: str, params: Mapping[str, Any], *, timeout: float, call_id: str = "") -> Any:
        """Ask the editor from a worker thread (a thread tool); see `arequest`."""
        return self._hub.loop.run(self._arequest, method, dict(params), timeout, call_id)

    async def arequest(self, method: str, params: Mapping[str, Any], *, timeout: float, call_id: str = "") -> Any:
        """Ask the editor ``method`` with ``params`` and wait, at most ``timeout`` seconds, for its answer.

        Raises:
            EditorError: the editor is gone (or goes while waiting), did not
                answer in time, answered an error, or too many requests wait already.
        """
        return await self._arequest(method, dict(params), timeout, call_id)

    async def _arequest(self, method: str, params: dict[str, Any], timeout: float, call_id: str) -> Any:
        if method not in EDITOR_METHODS:
            msg = f"{method} is not a method weald asks of an editor"
            raise ValueError(msg)
        hub = self._hub
        if self.closed is not None:
            raise EditorError(f"the editor cannot be asked {method}: {self.closed}. Nothing was done; retry the call.")
        if len(hub.waiting) >= _MAX_PENDING:
            hub.failed += 1
            raise EditorError(
                f"{len(hub.waiting)} requests are waiting for editors already; {method} was not sent. "
                "Try again shortly."
            )
        request_id = f"e{next(hub.ids)}"
        waiting = _Waiting(self, method)
        hub.waiting[request_id] = waiting
        hub.requests += 1
        try:
            note = {
                "request_id": request_id,
                "agent_id": self.agent_id,
                "call_id": call_id,
                "method": method,
                "params": params,
                "timeout": timeout,
            }
            with trio.move_on_after(timeout) as deadline:
                await self.conn.send_line(
                    _encoder.encode({"jsonrpc": "2.0", "method": "client.request", "params": note}) + b"\n"
                )
                await waiting.answered.wait()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            waiting.error = waiting.error or f"the editor went away before {method} could be sent"
        finally:
            hub.waiting.pop(request_id, None)
        if deadline.cancelled_caught and not waiting.answered.is_set():
            hub.failed += 1
            hub.timed_out += 1
            raise EditorError(
                f"the editor did not answer {method} within {timeout:g} s, so the call gave up; whether it did "
                "anything is unknown. Check the file (or terminal) again before you go on.",
            )
        if waiting.error is not None:
            hub.failed += 1
            raise EditorError(waiting.error, refused=waiting.refused)
        return waiting.result

    def close(self, reason: str) -> None:
        """It no longer reaches the editor: fail what waits on it, and every later request (loop thread)."""
        if self.closed is None:
            self.closed = reason
        for waiting in list(self._hub.waiting.values()):
            if waiting.bridge is self and not waiting.answered.is_set():
                waiting.error = (
                    f"the editor went away ({reason}) while weald waited for its answer to {waiting.method}, so "
                    "the call failed. Until an editor drives this session again, files are read from the disk and "
                    "commands run in weald's own sandbox: retry the call."
                )
                waiting.answered.set()


class EditorBridges:
    """Which editor drives which session, and the requests waiting on them (one per daemon).

    Args:
        loop: the daemon's loop (where requests are sent and answered).
    """

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self._bridges: dict[str, ClientBridge] = {}  # agent id -> its bridge (written on the loop)
        # Loop thread only.
        self.waiting: dict[str, _Waiting] = {}
        self.ids = itertools.count(1)
        self.requests = 0
        self.failed = 0
        self.timed_out = 0

    def current(self, agent_id: str) -> ClientBridge | None:
        """The bridge to the editor driving ``agent_id`` now, or None (any thread: tools call it)."""
        return self._bridges.get(agent_id)

    def attach(self, conn: BridgeConnection, agent_id: str, *, files: bool, terminal: bool) -> ClientBridge | None:
        """``conn``'s editor drives ``agent_id`` from now on (the last to attach wins); returns its bridge.

        Returns None, and detaches a bridge ``conn`` had for the session, when
        the editor offers neither files nor terminals.
        """
        old = self._bridges.get(agent_id)
        if not files and not terminal:
            if old is not None and old.conn is conn:
                del self._bridges[agent_id]
                old.close("the editor no longer offers its files or terminals")
            return None
        bridge = ClientBridge(self, conn, agent_id, files=files, terminal=terminal)
        self._bridges[agent_id] = bridge
        if old is not None:
            old.close("another editor opened the session")
        return bridge

    def answer(self, conn: BridgeConnection, request_id: str, result: Any, error: str | None) -> bool:
        """The editor's answer to ``request_id``, from the connection it was sent to; False if none waits for it."""
        waiting = self.waiting.get(request_id)
        if waiting is None or waiting.bridge.conn is not conn or waiting.answered.is_set():
            return False
        waiting.result = result
        if error is not None:
            waiting.error = f"the editor answered {waiting.method} with an error: {error}"
            waiting.refused = True
        waiting.answered.set()
        return True

    def connection_closed(self, conn: BridgeConnection) -> None:
        """``conn`` is gone: its bridges detach, and what waits on them fails (loop thread)."""
        for agent_id, bridge in list(self._bridges.items()):
            if bridge.conn is conn:
                del self._bridges[agent_id]
                bridge.close("its connection to the daemon closed")

    def statistics(self) -> EditorStatistics:
        """Counts for ``daemon.status``."""
        return EditorStatistics(
            attached=len(self._bridges),
            pending=len(self.waiting),
            requests=self.requests,
            failed=self.failed,
            timed_out=self.timed_out,
        )
