"""The daemon's front door: accepting clients and reading their lines, each within a bound.

Whatever clients do, two resources stay bounded here.

File descriptors. `Acceptor` accepts on the listening socket. Past
``limits.max_connections`` open connections, a new client is accepted only
to be told so (one JSON-RPC error line, code `LIMIT_REACHED`) and closed.
When the process runs out of descriptors all the same (EMFILE, ENFILE: tool
subprocesses, MCP servers and the store use them too), accepting pauses
instead of failing: a descriptor kept in reserve is given up so that each
waiting client can be accepted, told so and closed (the trick libuv plays on
EMFILE), then taken back, and accepting is retried after a pause that grows
to `MAX_PAUSE`. The first failure of such a spell is logged and published as
``server.fds_exhausted``, its end as ``server.fds_recovered``; connections
already open are served throughout.

Memory held for unfinished lines. `read_lines` charges the partial line a
connection holds to one `InputBudget` that every connection shares
(``limits.max_buffered_bytes``). The connection whose bytes would take the
total over the budget is the one refused: it gets `OverBudget` and stops
reading. Complete lines are handed on at once and are not charged.

Everything here runs on the trio loop thread, in the server's I/O tasks.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import socket
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final

import attrs
import msgspec
import trio

__all__ = [
    "ID_SCAN_BYTES",
    "LIMIT_REACHED",
    "MAX_PAUSE",
    "Acceptor",
    "AcceptorStatistics",
    "InputBudget",
    "OverBudget",
    "TooLarge",
    "default_max_connections",
    "leading_id",
    "over_budget_message",
    "read_lines",
]

logger = logging.getLogger("weald.runtime")

LIMIT_REACHED: Final = -32003
"""The error code of a refusal for a limit of the daemon (connections, buffered input, descriptors)."""

MAX_PAUSE: Final = 0.5
"""The longest pause, in seconds, between two tries to accept while out of descriptors."""
_FIRST_PAUSE: Final = 0.01
_REFUSE_AT_ONCE: Final = 256  # waiting clients refused per pause, so one spell never holds the loop long
_DRAIN_ON_REFUSAL: Final = 64 * 1024  # what a refused client already sent is read and dropped, up to this
_CHUNK: Final = 256 * 1024

# accept(2) failing for want of a descriptor or of kernel memory: retried after a pause.
_OUT_OF_FDS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept(2) failing because that one client went away first: the next one is accepted at once.
_GONE_FIRST: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})

_encoder = msgspec.json.Encoder()


def default_max_connections() -> int:
    """``limits.max_connections`` when it is not set: three quarters of the process's descriptor limit.

    The other quarter stays for the store, tool subprocesses, MCP servers and
    the clients refused while the limit is reached.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(1, soft * 3 // 4)


def _fd_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def _refusal(message: str, limit: str, value: int | None) -> bytes:
    error = {"code": LIMIT_REACHED, "message": message, "data": {"limit": limit, "value": value}}
    return _encoder.encode({"jsonrpc": "2.0", "id": None, "error": error}) + b"\n"


def _full_message(limit: int) -> str:
    return (
        f"too many connections: the daemon serves at most {limit} at once (limits.max_connections); "
        "this connection is closed. Close an idle connection or try again later"
    )


def _out_of_fds_message(limit: int | None) -> str:
    cap = f"its limit is {limit} open files" if limit is not None else "no limit is set, the system ran out"
    return (
        f"the daemon is out of file descriptors ({cap}): this connection is closed. Try again shortly; "
        "if it persists, raise the daemon's limit (ulimit -n) or lower limits.max_connections"
    )


def over_budget_message(held: int, limit: int) -> str:
    """The error a connection refused for `InputBudget` gets before it is closed."""
    return (
        f"too much unfinished input: this connection's partial line of {held} bytes would take the input the "
        f"daemon buffers for all connections over {limit} bytes ({_size(limit)}, limits.max_buffered_bytes); "
        "this connection is closed. End each message with a newline as soon as it is written, or send smaller ones"
    )


def _size(n: int) -> str:
    mib = n / (1024 * 1024)
    return f"{mib:g} MB" if mib >= 1 else f"{n / 1024:g} KB"


def _take_reserve() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse(client: socket.socket, line: bytes) -> None:
    """Tell a just-accepted client why it is refused, and close it (never waits)."""
    try:
        client.send(line, socket.MSG_DONTWAIT)
        client.shutdown(socket.SHUT_WR)
        # Reading what it already sent lets its side see a clean end of stream, not a reset.
        client.recv(_DRAIN_ON_REFUSAL, socket.MSG_DONTWAIT)
    except OSError:
        pass  # it is gone, or its buffer is full: it is refused all the same
    finally:
        client.close()


@attrs.frozen
class AcceptorStatistics:
    """What the front door let in and turned away.

    Attributes:
        max_connections: ``limits.max_connections`` in force.
        open: Connections accepted and not yet closed.
        accepted: Connections accepted since the start.
        refused_max_connections: Clients refused because ``open`` was at the limit.
        refused_out_of_fds: Clients refused while the process was out of descriptors.
        fd_exhaustions: Spells of running out of descriptors (each logged once).
        out_of_fds: Whether such a spell is going on now.
    """

    max_connections: int
    open: int
    accepted: int
    refused_max_connections: int
    refused_out_of_fds: int
    fd_exhaustions: int
    out_of_fds: bool


class Acceptor:
    """Accepts clients on a listening socket within ``max_connections``, and through running out of descriptors.

    Args:
        sock: the listening socket, non-blocking. The acceptor does not close it.
        max_connections: open connections allowed at once; `closed` frees a place.
        publish: ``publish(topic, data)``, for the server's events.
    """

    def __init__(
        self, sock: socket.socket, max_connections: int, publish: Callable[[str, dict[str, Any]], None]
    ) -> None:
        self._sock = sock
        self._max = max_connections
        self._publish = publish
        self._reserve = _take_reserve()
        self._pause = _FIRST_PAUSE
        self._out_since: float | None = None  # loop time the current spell without descriptors began
        self._refused_in_spell = 0
        self._full = False  # at the connection limit since the last client let in (published once)
        # Invariant: open == accepted - (calls to `closed`).
        self.open = 0
        self._accepted = 0
        self._refused_full = 0
        self._refused_fds = 0
        self._exhaustions = 0

    async def accept(self) -> socket.socket:
        """The next client within the limits, non-blocking and counted in ``open`` until `closed`.

        Clients beyond the limits are refused in here; errors that leave the
        listening socket unusable (it was closed, say) are raised.
        """
        while True:
            await trio.lowlevel.wait_readable(self._sock)
            try:
                client, _ = self._sock.accept()
            except BlockingIOError:
                continue  # another waiter took it, or it went away
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    await self._wait_out_of_fds(exc)
                    continue
                if exc.errno in _GONE_FIRST:
                    continue
                raise
            self._back_in()
            if self.open >= self._max:
                self._refuse_full(client)
                continue
            self._full = False
            client.setblocking(False)
            self.open += 1
            self._accepted += 1
            return client

    def closed(self) -> None:
        """A connection `accept` returned is closed: its place is free."""
        self.open -= 1

    def close(self) -> None:
        """Give back the reserved descriptor (the listening socket is its owner's to close)."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def statistics(self) -> AcceptorStatistics:
        """Counts since the start."""
        return AcceptorStatistics(
            max_connections=self._max,
            open=self.open,
            accepted=self._accepted,
            refused_max_connections=self._refused_full,
            refused_out_of_fds=self._refused_fds,
            fd_exhaustions=self._exhaustions,
            out_of_fds=self._out_since is not None,
        )

    def _refuse_full(self, client: socket.socket) -> None:
        _refuse(client, _refusal(_full_message(self._max), "limits.max_connections", self._max))
        self._refused_full += 1
        if not self._full:
            self._full = True
            logger.warning("the daemon serves %d connections (limits.max_connections): refusing new ones", self._max)
            self._publish("server.connections_full", {"max_connections": self._max})

    async def _wait_out_of_fds(self, exc: OSError) -> None:
        """Out of descriptors: refuse who waits (through the reserve), then pause before the next try."""
        if self._out_since is None:
            self._out_since = trio.current_time()
            self._exhaustions += 1
            self._refused_in_spell = 0
            name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            logger.warning(
                "out of file descriptors (%s, limit %s) with %d connections open: refusing new clients until "
                "descriptors are free; open connections are still served",
                name,
                _fd_limit(),
                self.open,
            )
            self._publish("server.fds_exhausted", {"error": name, "fd_limit": _fd_limit(), "connections": self.open})
        refused = self._refuse_waiting()
        self._refused_fds += refused
        self._refused_in_spell += refused
        await trio.sleep(self._pause)
        self._pause = min(self._pause * 2, MAX_PAUSE)

    def _refuse_waiting(self) -> int:
        """Accept and refuse the clients waiting now, on the reserved descriptor; how many."""
        if self._reserve is None:
            self._reserve = _take_reserve()  # taken back as soon as one is free
            if self._reserve is None:
                return 0
        os.close(self._reserve)
        self._reserve = None
        line = _refusal(_out_of_fds_message(_fd_limit()), "RLIMIT_NOFILE", _fd_limit())
        refused = 0
        try:
            for _ in range(_REFUSE_AT_ONCE):
                try:
                    client, _ = self._sock.accept()
                except OSError:
                    break  # none waits, or another thread took the descriptor first
                _refuse(client, line)
                refused += 1
        finally:
            self._reserve = _take_reserve()
        return refused

    def _back_in(self) -> None:
        """A client was accepted: a spell without descriptors, if any, is over."""
        if self._out_since is None:
            return
        seconds = trio.current_time() - self._out_since
        logger.warning(
            "file descriptors are free again after %.1f s: accepting clients (%d refused meanwhile)",
            seconds,
            self._refused_in_spell,
        )
        self._publish("server.fds_recovered", {"seconds": round(seconds, 3), "refused": self._refused_in_spell})
        self._out_since = None
        self._pause = _FIRST_PAUSE


class InputBudget:
    """Bytes held in unfinished lines across every connection, against ``limits.max_buffered_bytes``.

    Used from the loop thread only. Invariant: ``held`` is the sum of what
    every `read_lines` has charged and not released, and never exceeds ``limit``.

    Args:
        limit: the budget, in bytes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        self.refused = 0

    def charge_nowait(self, n: int) -> bool:
        """Take ``n`` more bytes if the budget allows; False (and counted as a refusal) if not."""
        if self.held + n > self.limit:
            self.refused += 1
            return False
        self.held += n
        self.peak = max(self.peak, self.held)
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes charged before."""
        self.held -= n


@attrs.frozen
class TooLarge:
    """`read_lines` yields it for a line over the message limit, then skips to that line's end.

    Attributes:
        request_id: The line's top-level ``id``, when its first `ID_SCAN_BYTES`
            bytes hold it (a string or an integer), so that the error reply can
            carry it; None otherwise.
    """

    request_id: str | int | None


ID_SCAN_BYTES: Final = 64 * 1024
"""How much of a line over the limit is searched for its ``id``."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR = re.compile(rb"-?[0-9][0-9.eE+-]*|true|false|null")
_SPACE = re.compile(rb"[ \t\r\n]*")


def leading_id(prefix: bytes) -> str | int | None:
    """The top-level ``"id"`` of a JSON object whose text starts with ``prefix``, or None.

    Reads the object's members in order, skipping each value (nested ones by
    their brackets, strings by their quotes) until the ``id`` member; gives
    up (None) at anything unexpected or where the prefix ends.
    """
    pos = _SPACE.match(prefix, 0).end()  # type: ignore[union-attr]
    if prefix[pos : pos + 1] != b"{":
        return None
    pos += 1
    while True:
        pos = _SPACE.match(prefix, pos).end()  # type: ignore[union-attr]
        key = _STRING.match(prefix, pos)
        if key is None:
            return None
        pos = _SPACE.match(prefix, key.end()).end()  # type: ignore[union-attr]
        if prefix[pos : pos + 1] != b":":
            return None
        pos = _SPACE.match(prefix, pos + 1).end()  # type: ignore[union-attr]
        if key.group() == b'"id"':
            token = _STRING.match(prefix, pos) or _SCALAR.match(prefix, pos)
            if token is None or token.end() >= len(prefix):
                return None  # a number the prefix may have cut short (-1 of -100) is not taken
            try:
                value = msgspec.json.decode(token.group())
            except (msgspec.DecodeError, UnicodeDecodeError):
                return None
            return value if isinstance(value, str | int) and not isinstance(value, bool) else None
        end = _skip_value(prefix, pos)
        if end is None:
            return None
        pos = _SPACE.match(prefix, end).end()  # type: ignore[union-attr]
        if prefix[pos : pos + 1] != b",":
            return None
        pos += 1


def _skip_value(text: bytes, pos: int) -> int | None:
    """Where the JSON value starting at ``pos`` ends, or None if ``text`` ends first (or it is not JSON)."""
    first = text[pos : pos + 1]
    if first == b'"':
        string = _STRING.match(text, pos)
        return string.end() if string is not None else None
    if first not in (b"{", b"["):
        scalar = _SCALAR.match(text, pos)
        return scalar.end() if scalar is not None else None
    depth = 0
    while pos < len(text):
        char = text[pos : pos + 1]
        if char == b'"':
            string = _STRING.match(text, pos)
            if string is None:
                return None
            pos = string.end()
            continue
        if char in (b"{", b"["):
            depth += 1
        elif char in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None


@attrs.frozen
class OverBudget:
    """`read_lines` yields it (and then stops) when this connection's partial line would break the budget.

    Attributes:
        held: The bytes of the partial line that did not fit.
    """

    held: int


async def read_lines(
    stream: trio.abc.ReceiveStream, limit: int, budget: InputBudget
) -> AsyncGenerator[bytes | TooLarge | OverBudget, None]:
    """Yield each newline-terminated line of ``stream``, `TooLarge` for one over ``limit``, or `OverBudget`.

    The partial line held between two reads is charged to ``budget``; all of
    it is given back when the generator ends, however it ends (close it with
    `contextlib.aclosing`). After `OverBudget` nothing more is read.
    """
    buf = bytearray()
    skipping = False
    charged = 0

    def settle() -> bool:
        """Make the charge match the partial line held now; False if the budget cannot take it."""
        nonlocal charged
        held = len(buf)
        if held > charged and not budget.charge_nowait(held - charged):
            return False
        if held < charged:
            budget.release(charged - held)
        charged = held
        return True

    try:
        while True:
            data = await stream.receive_some(_CHUNK)
            if not data:
                if buf and not skipping:
                    line = bytes(buf)
                    buf.clear()
                    settle()
                    yield line
                return
            start = 0
            while True:
                newline = data.find(b"\n", start)
                if newline < 0:
                    if not skipping:
                        buf += data[start:]
                        if len(buf) > limit:
                            too_large = TooLarge(leading_id(bytes(buf[:ID_SCAN_BYTES])))
                            buf.clear()
                            settle()
                            skipping = True
                            yield too_large
                    break
                if skipping:
                    skipping = False
                else:
                    buf += data[start:newline]
                    complete = None if len(buf) > limit else bytes(buf)
                    over = TooLarge(leading_id(bytes(buf[:ID_SCAN_BYTES]))) if complete is None else None
                    buf.clear()
                    settle()
                    if over is not None:
                        yield over
                    elif complete is not None and complete.strip():
                        yield complete
                start = newline + 1
            if not settle():
                # Refused: what it held is given back now, before the refusal is even sent,
                # so that the next connection to grow is not refused for it.
                held = len(buf)
                buf.clear()
                budget.release(charged)
                charged = 0
                yield OverBudget(held)
                return
    finally:
        budget.release(charged)
