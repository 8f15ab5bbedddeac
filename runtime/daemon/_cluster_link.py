"""A front's connection to one node: TCP (TLS if configured), the handshake, then JSON-RPC requests on trio.

A `NodeLink` is one connection. `NodeLink.call` sends a request and waits
for its reply; replies are matched by id, so calls on one link run
concurrently. A message without an id of ours (a notification: an event,
a permission request) goes to the link's ``on_notify``. When the connection
breaks, every call waiting on it fails with `LinkLost`, and the link is
closed for good: the front opens another.

Runs on the front's trio loop; `NodeLink.run` is the link's reader task.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Callable
from typing import Any, Final

import msgspec
import trio
from weald.runtime.daemon._cluster import HandshakeError, client_handshake, split_host_port

__all__ = ["LinkLost", "NodeLink"]

_MAX_LINE: Final = 64 * 1024 * 1024
"""The longest reply a link reads (a node's ``limits.max_message_bytes`` is 16 MB by default)."""


class LinkLost(Exception):
    """The connection to the node broke (or was closed) before the reply came."""


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: dict[str, Any] | None = None


class NodeLink:
    """One authenticated connection to a node (see the module docstring).

    Args:
        node_id: the node it is to.
        address: ``HOST:PORT``.
        secret: the cluster's secret.
        tls: a client TLS context, or None for plain TCP.
        on_notify: called (on the loop) with ``(method, params)`` for each notification.
    """

    def __init__(
        self,
        node_id: str,
        address: str,
        secret: bytes,
        tls: ssl.SSLContext | None = None,
        on_notify: Callable[[str, Any], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self._secret = secret
        self._tls = tls
        self._on_notify = on_notify
        self._stream: trio.abc.Stream | None = None
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._buffer = bytearray()
        self.closed = False
        self.ended = trio.Event()  # set once the link is closed, whoever closed it
        self.epoch = 0
        self.error: str | None = None
        self._cancel = trio.CancelScope()

    async def connect(self, timeout: float) -> None:
        """Open the connection and run the handshake, within ``timeout`` seconds.

        Raises:
            OSError: the node cannot be reached.
            HandshakeError: it refused this front, or is no weald node.
            trio.TooSlowError: it did not complete the handshake in time (a frozen node).
        """
        host, port = split_host_port(self.address)
        with trio.fail_after(timeout):
            tcp = await trio.open_tcp_stream(host, port)
            try:
                tcp.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
                stream: trio.abc.Stream = tcp
                if self._tls is not None:
                    stream = trio.SSLStream(tcp, self._tls, server_hostname=host)
                    await stream.do_handshake()
                hello = await client_handshake(stream, self._buffer, self._secret)
            except BaseException:
                await trio.aclose_forcefully(tcp)
                raise
        if hello.get("node_id") and hello["node_id"] != self.node_id:
            await trio.aclose_forcefully(stream)
            msg = f"{self.address} is node {hello['node_id']!r}, not {self.node_id!r} (an address taken over?)"
            raise HandshakeError(msg)
        self.epoch = int(hello.get("epoch") or 0)
        self._stream = stream

    async def run(self) -> None:
        """Read replies and notifications until the connection ends; then every waiting call fails."""
        stream = self._stream
        assert stream is not None
        buffer = self._buffer
        try:
            with self._cancel:
                while True:
                    end = buffer.find(b"\n")
                    while end >= 0:
                        line = bytes(buffer[:end])
                        del buffer[: end + 1]
                        if line.strip():
                            self._dispatch(line)
                        end = buffer.find(b"\n")
                    if len(buffer) > _MAX_LINE:
                        self.error = "the node sent a message larger than a front reads"
                        break
                    data = await stream.receive_some(65536)
                    if not data:
                        self.error = "the node closed the connection"
                        break
                    buffer += data
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.error = f"the connection broke ({exc or type(exc).__name__})"
        finally:
            self._end()
            await trio.aclose_forcefully(stream)

    def _dispatch(self, line: bytes) -> None:
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return  # a node only sends JSON; nothing to match it to
        if isinstance(message, list):  # a batch's replies (a front sends none; be lenient)
            for item in message:
                self._dispatch(msgspec.json.encode(item))
            return
        if not isinstance(message, dict):
            return
        request_id = message.get("id")
        if "method" not in message and isinstance(request_id, int):
            pending = self._pending.pop(request_id, None)
            if pending is not None:
                pending.reply = message
                pending.done.set()
            return
        method = message.get("method")
        if isinstance(method, str) and self._on_notify is not None:
            self._on_notify(method, message.get("params"))

    def _end(self) -> None:
        self.closed = True
        self.ended.set()
        pending, self._pending = self._pending, {}
        for item in pending.values():
            item.done.set()

    def close(self) -> None:
        """Close the link: its reader ends and calls waiting on it fail with `LinkLost`."""
        self.closed = True
        self.error = self.error or "the front closed the connection"
        self._cancel.cancel()
        self._end()

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        """Send one request and wait for its reply: ``{"result": ...}`` or ``{"error": {...}}``.

        Raises:
            LinkLost: the connection broke before the reply (the request may or may not have run).
        """
        if self.closed or self._stream is None:
            raise LinkLost(self.error or "the link is closed")
        request_id = next(self._ids)
        pending = _Pending()
        self._pending[request_id] = pending
        data = msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + b"\n"
        try:
            async with self._send_lock:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._pending.pop(request_id, None)
            self.close()
            raise LinkLost(f"cannot send to node {self.node_id!r}: {exc or type(exc).__name__}") from exc
        try:
            await pending.done.wait()
        finally:
            self._pending.pop(request_id, None)
        reply = pending.reply
        if reply is None:
            raise LinkLost(f"the connection to node {self.node_id!r} was lost ({self.error or 'closed'})")
        if "error" in reply:
            return {"error": reply["error"]}
        return {"result": reply.get("result")}
