"""Fuzzing the daemon's JSON-RPC server: random bytes and well-formed but wrong requests, over a raw socket.

`FuzzClient` is a raw Unix-socket connection with a reader thread that
splits replies into lines and checks that each is a JSON-RPC response (an
object with ``jsonrpc: "2.0"``, an ``id``, and exactly one of ``result`` and
``error``, or a batch of them). `FuzzClient.exchange` sends one fuzz line,
waits (bounded) for the reply it must get, then sends a probe
(``daemon.status`` with a fresh id) and waits for its answer: the connection
carries on after anything. `expected_codes` is the oracle for a decoded
request: which error codes the JSON-RPC spec and ``docs/protocol.md`` allow
for it, computed from the request alone (params are checked against the
method's params type with msgspec, as the protocol documents).

The method table is read from ``runtime/daemon/server.py`` as the daemon tests do,
and each method's params type is imported from it, so a new method is
fuzzed without touching this file.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import weald.runtime.daemon.server as server_module

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603

REPLY_BOUND = 10.0
"""Seconds within which every request with an id must be answered."""

# Methods never sent with params that could be valid: it would stop the daemon under test.
UNSAFE = frozenset({"daemon.stop"})

_SERVER_SOURCE = Path(server_module.__file__).read_text()


def method_table() -> dict[str, type[msgspec.Struct]]:
    """Every method the server serves, with its params type (read from ``runtime/daemon/server.py``)."""
    pairs = re.findall(r'^\s+"([a-z_.]+)": \((\w+Params), self\._', _SERVER_SOURCE, re.MULTILINE)
    return {method: getattr(server_module, name) for method, name in pairs}


def params_fields(method: str) -> list[msgspec.structs.FieldInfo]:
    """The fields of a method's params."""
    return list(msgspec.structs.fields(method_table()[method]))


def params_valid(method: str, params: Any) -> bool:
    """Whether ``params`` pass the method's params type, as the protocol says the server checks them."""
    try:
        msgspec.convert(params if params is not None else {}, type=method_table()[method])
    except msgspec.ValidationError:
        return False
    return True


def expected_codes(request: Any) -> set[int] | None:
    """The error codes a request may get (the empty set: it may succeed, or fail at -32000/-32001/-32002).

    Returns None when the request must get no reply (a notification of a
    known method). When a request is wrong in several ways, the spec does
    not say which error wins, so each applicable code is allowed.
    """
    if not isinstance(request, dict):
        return {INVALID_REQUEST}
    codes = set()
    if request.get("jsonrpc") != "2.0":
        codes.add(INVALID_REQUEST)
    request_id = request.get("id")
    if "id" in request and (isinstance(request_id, bool) or not isinstance(request_id, str | int | None)):
        codes.add(INVALID_REQUEST)
    method = request.get("method")
    if not isinstance(method, str):
        codes.add(INVALID_REQUEST)
    elif method not in method_table():
        codes.add(METHOD_NOT_FOUND)
    else:
        params = request.get("params")
        if not isinstance(params, dict | None) or not params_valid(method, params):
            codes.add(INVALID_PARAMS)
    if "id" not in request and not codes:
        return None
    return codes


def reply_problem(reply: Any) -> str | None:
    """Why ``reply`` is not a JSON-RPC response (or a batch of them), or None."""
    if isinstance(reply, list):
        if not reply:
            return "an empty batch reply"
        return next((p for p in map(reply_problem, reply) if p), None)
    if not isinstance(reply, dict):
        return f"a reply that is not an object: {reply!r:.200}"
    if reply.get("jsonrpc") != "2.0":
        return f"a reply without jsonrpc 2.0: {reply!r:.200}"
    if "id" not in reply:
        return f"a reply without id: {reply!r:.200}"
    if ("result" in reply) == ("error" in reply):
        return f"a reply with both or neither of result and error: {reply!r:.200}"
    if "error" in reply:
        error = reply["error"]
        if not isinstance(error, dict) or not isinstance(error.get("code"), int) or not error.get("message"):
            return f"an error without a code and a message: {reply!r:.200}"
        if error["code"] == INTERNAL_ERROR:
            return f"an internal error (an unhandled exception in the daemon): {error['message']:.300}"
    return None


class FuzzClient:
    """A raw connection to the daemon; every reply line is decoded and checked by a reader thread."""

    _probe_ids = itertools.count(1)

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.replies: queue.Queue[Any] = queue.Queue()
        self.problems: list[str] = []
        self.sent = 0
        self.raw = 0
        self.due = 0
        self.answered = 0
        self.codes: Counter[int] = Counter()
        self.notifications = 0
        self._pending: list[Any] = []
        self._reader = threading.Thread(target=self._read, name="fuzz-reader", daemon=True)
        self._reader.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._reader.join(10)

    def __enter__(self) -> FuzzClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                break
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    reply = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    self.problems.append(f"a reply line that is not JSON: {line[:200]!r}")
                    continue
                if isinstance(reply, dict) and "method" in reply and "id" not in reply:
                    # A server notification (an event of a subscription a fuzz request made): not a reply.
                    self.notifications += 1
                    if reply.get("jsonrpc") != "2.0" or not isinstance(reply["method"], str):
                        self.problems.append(f"a malformed notification: {reply!r:.200}")
                    continue
                problem = reply_problem(reply)
                if problem:
                    self.problems.append(problem)
                self.replies.put(reply)
        self.replies.put(EOFError("the daemon closed the connection"))

    def _next(self, match: Any, what: str) -> Any:
        """The first reply (pending or arriving) for which ``match`` holds; others stay pending."""
        for i, reply in enumerate(self._pending):
            if match(reply):
                return self._pending.pop(i)
        deadline = time.monotonic() + REPLY_BOUND
        while True:
            remaining = deadline - time.monotonic()
            try:
                reply = self.replies.get(timeout=max(remaining, 0))
            except queue.Empty:
                raise AssertionError(f"no reply within {REPLY_BOUND} s to {what}") from None
            if isinstance(reply, EOFError):
                raise AssertionError(f"the daemon closed the connection while {what} waited for its reply")
            if match(reply):
                return reply
            self._pending.append(reply)

    def next_error(self, code: int, what: str) -> dict[str, Any]:
        """Wait (bounded) for an error reply with ``code``: the answer to a line of garbage."""
        return self._next(lambda r: isinstance(r, dict) and r.get("error", {}).get("code") == code, what)  # type: ignore[no-any-return]

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def probe(self) -> dict[str, Any]:
        """Send ``daemon.status`` and wait for its result: the connection still carries on."""
        probe_id = f"probe-{next(self._probe_ids)}"
        self.send(msgspec.json.encode({"jsonrpc": "2.0", "id": probe_id, "method": "daemon.status"}) + b"\n")
        reply = self._next(lambda r: isinstance(r, dict) and r.get("id") == probe_id, f"probe {probe_id}")
        assert "result" in reply, f"the probe failed: {reply}"
        return reply["result"]  # type: ignore[no-any-return]

    def exchange(self, data: bytes, request: Any = ..., what: str = "") -> Any:
        """Send one line; wait for the reply it must get (checked against `expected_codes`); then probe.

        Args:
            data: the bytes of the line (a newline is added).
            request: the decoded request, when ``data`` is one; ``...`` for raw bytes.
            what: how to name it in failures.

        Returns:
            The reply, or None when none was due (or the bytes were not one request).
        """
        self.sent += 1
        self.send(data + b"\n")
        reply = None
        what = what or repr(data[:200])
        if request is ...:
            self.raw += 1  # garbage: whether a reply is due depends on what it happens to be
        elif isinstance(request, list) and request:
            if any(isinstance(r, dict) and "id" in r for r in request):
                self.due += 1
                reply = self._next(lambda r: isinstance(r, list), f"the batch {what}")
        else:
            codes = expected_codes(request)
            if codes is not None:
                self.due += 1
                reply = self._reply_to(request, what)
                self._check_code(reply, codes, what)
        if reply is not None:
            self.answered += 1
        self.probe()
        self._pending.clear()  # replies to garbage lines (errors, checked by the reader) or to notifications
        return reply

    def _reply_to(self, request: Mapping[str, Any], what: str) -> Any:
        request_id = request.get("id")
        valid_id = not isinstance(request_id, bool) and isinstance(request_id, str | int)
        if valid_id and request.get("jsonrpc") == "2.0" and request_id is not None:
            return self._next(lambda r: isinstance(r, dict) and r.get("id") == request_id, what)
        # A null or invalid id (or one the server could not trust) is answered with id null, or echoed.
        return self._next(lambda r: isinstance(r, dict) and r.get("id") in (None, request_id), what)

    def _check_code(self, reply: Any, codes: set[int], what: str) -> None:
        error = reply.get("error") if isinstance(reply, dict) else None
        if error is not None:
            self.codes[error["code"]] += 1
        if codes and (error is None or error["code"] not in codes):
            self.problems.append(f"{what}: expected an error in {sorted(codes)}, got {reply!r:.300}")
        # Handlers may still refuse well-typed params (-32602: "give working_dir or agent_id"), never the shape.
        if not codes and error is not None and error["code"] in (PARSE_ERROR, INVALID_REQUEST):
            self.problems.append(f"{what}: a well-formed request was refused as malformed: {reply!r:.300}")
