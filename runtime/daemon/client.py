"""A small synchronous client of the daemon's JSON-RPC API (used by the CLI, scripts and tests).

::

    with Client.connect(socket_path) as client:
        agent_id = client.call("agent.start", {"working_dir": "/my/project"})["agent_id"]
        turn = client.call("agent.prompt", {"agent_id": agent_id, "text": "hello"})

A reader thread matches replies to requests by id and queues notifications
(``event``, ``permission.request``, ``ask_user.question``) for `notifications`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pykka
from weald.runtime import Future, WealdError

__all__ = ["Client", "DaemonTimeoutError", "DaemonUnavailableError", "RPCCallError"]


class RPCCallError(WealdError):
    """The daemon answered a call with an error."""

    def __init__(self, method: str, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{method}: {message} (error {code})")
        self.method = method
        self.code = code
        self.message = message
        self.data = data


class DaemonUnavailableError(WealdError):
    """No daemon answers on the socket (or the connection broke)."""


class DaemonTimeoutError(DaemonUnavailableError, pykka.Timeout):
    """A call's answer did not come within its timeout (also a `pykka.Timeout`, as the future's own timeout is)."""


class Client:
    """One connection to the daemon; thread-safe calls."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, Future[Any]]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.notifications: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._closed = False  # close() was called
        self._broken = False  # the daemon ended the connection
        # The last message read, when it was an error about the connection itself (its id null):
        # the reason the daemon gives if it closes the connection next (a limit, say).
        self._refusal: str | None = None
        self.embedded = False  # True when the CLI started the daemon in its own process
        self.path: Path | None = None  # the socket connected to (`connect`)
        self._reader = threading.Thread(target=self._read, name="weald-client-reader", daemon=True)
        self._reader.start()

    @classmethod
    def connect(cls, path: str | Path, *, timeout: float = 5.0) -> Client:
        """Connect to the daemon's socket, and check that the daemon is this user's.

        A daemon whose accept queue is full (it is busy, not gone) is retried
        until ``timeout``.

        Raises:
            DaemonUnavailableError: nothing listens there, it stayed too busy,
                or another user serves the socket.
        """
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(str(path))
                break
            except BlockingIOError as exc:  # EAGAIN: the accept queue is full
                sock.close()
                if time.monotonic() + delay > deadline:
                    msg = f"the weald daemon on {path} stayed too busy to accept a connection for {timeout:g} s"
                    raise DaemonUnavailableError(msg) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except OSError as exc:
                sock.close()
                msg = f"no weald daemon answers on {path} ({exc.strerror or exc}); start one with `weald serve`"
                raise DaemonUnavailableError(msg) from exc
        # As the daemon checks its clients, a client checks its daemon: in a
        # directory others may write to, someone else's socket could be there.
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            sock.close()
            msg = f"the socket {path} is served by another user (uid {uid}); refusing to talk to it"
            raise DaemonUnavailableError(msg)
        sock.settimeout(None)
        client = cls(sock)
        client.path = Path(path)
        return client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; pending calls fail with `DaemonUnavailableError`."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(5)

    @property
    def broken(self) -> bool:
        """Whether the daemon ended the connection."""
        return self._broken

    def send_raw(self, data: bytes) -> None:
        """Send bytes as they are (for tests of bad input)."""
        with self._send_lock:
            self._sock.sendall(data)

    def request(self, method: str, params: dict[str, Any] | None = None) -> Future[Any]:
        """Send a request; returns a future of its result (raises `RPCCallError` on an error reply)."""
        request_id = next(self._ids)
        future: Future[Any] = Future()
        with self._lock:
            if self._closed or self._broken:
                msg = "the connection to the daemon is closed" + (f": {self._refusal}" if self._refusal else "")
                raise DaemonUnavailableError(msg)
            self._pending[request_id] = (method, future)
        payload = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        try:
            self.send_raw(msgspec.json.encode(payload) + b"\n")
        except OSError as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            # The daemon may have said why it closed the connection (a limit, say): read to the end first.
            self._reader.join(5)
            msg = f"the connection to the daemon broke: {self._refusal or exc}"
            raise DaemonUnavailableError(msg) from exc
        return future

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Call a method and wait for its result.

        Raises:
            DaemonTimeoutError: no answer within ``timeout`` seconds (naming
                the socket: what answers there may not be a weald daemon).
        """
        try:
            return self.request(method, params).get(timeout=timeout)
        except pykka.Timeout as exc:
            where = f" on {self.path}" if self.path is not None else ""
            msg = f"the daemon{where} did not answer within {timeout:g} s (busy, or not a weald daemon)"
            raise DaemonTimeoutError(msg) from exc

    def start_agents(
        self, starts: list[dict[str, Any]], *, batch: int = 1000, timeout: float | None = None
    ) -> list[str | RPCCallError]:
        """Start many agents through ``agents.start``, ``batch`` per request, all requests sent at once.

        Args:
            starts: each an ``agent.start``'s params.
            batch: starts per request (the daemon takes at most 1,000).
            timeout: seconds to wait for each request's reply.

        Returns:
            For each start, in order: its agent id, or the `RPCCallError` its
            entry was answered with.

        Raises:
            RPCCallError: a whole request was refused (the daemon is stopping, say).
        """
        requests = [
            self.request("agents.start", {"agents": starts[first : first + batch]})
            for first in range(0, len(starts), batch)
        ]
        out: list[str | RPCCallError] = []
        for request in requests:
            for entry in request.get(timeout=timeout)["results"]:
                if "error" in entry:
                    err = entry["error"]
                    code, message = err.get("code", 0), err.get("message", "")
                    out.append(RPCCallError("agents.start", code, message, err.get("data")))
                else:
                    out.append(entry["result"]["agent_id"])
        return out

    def next_notification(self, timeout: float | None = None) -> tuple[str, Any] | None:
        """The next notification (method, params), or None after ``timeout``."""
        try:
            return self.notifications.get(timeout=timeout)
        except queue.Empty:
            return None

    def _read(self) -> None:
        # A line's pieces until its newline comes: only each new piece is searched, and a reply of
        # 100 MB (agent.list of 100,000 sessions) is joined once, not copied and searched at each piece.
        pieces: list[bytes] = []
        error: BaseException | None = None
        try:
            while True:
                data = self._sock.recv(1 << 20)
                if not data:
                    break
                end = data.find(b"\n")
                if end < 0:
                    pieces.append(data)
                    continue
                pieces.append(data[:end])
                *complete, tail = data[end + 1 :].split(b"\n")
                lines = [b"".join(pieces), *complete]
                pieces = [tail] if tail else []
                for line in lines:
                    if line.strip():
                        self._dispatch(msgspec.json.decode(line))
        except (OSError, msgspec.DecodeError) as exc:
            error = exc
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            self._broken = True
        for method, future in pending:
            why = f": {self._refusal}" if self._refusal else f": {error}" if error else ""
            lost = DaemonUnavailableError(f"the daemon closed the connection during {method}{why}")
            future.set_exception((DaemonUnavailableError, lost, None))

    def _dispatch(self, message: Any) -> None:
        error = message.get("error") if isinstance(message, dict) and message.get("id") is None else None
        self._refusal = f"{error.get('message', '')} (error {error.get('code')})" if isinstance(error, dict) else None
        if isinstance(message, list):
            for item in message:
                self._dispatch(item)
            return
        if "method" in message and "id" not in message:
            self.notifications.put((message["method"], message.get("params")))
            return
        with self._lock:
            entry = self._pending.pop(message.get("id"), None)
        if entry is None:
            self.notifications.put(("_unmatched", message))
            return
        method, future = entry
        if "error" in message:
            err = message["error"]
            exc = RPCCallError(method, err.get("code", 0), err.get("message", ""), err.get("data"))
            future.set_exception((RPCCallError, exc, None))
        else:
            future.set(message.get("result"))
