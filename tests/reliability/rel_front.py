"""Floods at the front door of a real daemon: more clients than file descriptors, and unfinished lines.

fd flood (`run_fd_flood`): a real ``weald serve`` runs under
``prlimit --nofile=N:N``. One client connects first and has a prompt in
flight; then thousands of clients connect at once (non-blocking, retried
while the daemon's accept queue is full), each sending ``daemon.status``.
Every one of them must get an answer: the status, or one error line naming
the limit that refused it (``limits.max_connections`` or the descriptor
limit) before the daemon closes it. Then:

- ``daemon_runs_under_the_fd_limit``: /proc/<pid>/limits shows the limit;
- ``every_client_answered_or_refused_with_a_reason``: no client hangs or is
  dropped without a word, and every refusal is -32003 naming its limit;
- ``open_connection_served_during_flood``: the first client's requests are
  answered while the flood holds every place;
- ``new_clients_served_within_seconds``: once the flood's clients close, a
  new client is served within `RECOVERY_BOUND` seconds;
- ``reply_in_flight_arrives``: the first client's prompt is answered ok;
- ``exhaustion_logged_once_per_spell``: the daemon's log has one line per
  spell without descriptors (as many as ``daemon.status`` counts), not one
  per refused client;
- ``daemon_keeps_its_socket``: the same process still answers on the
  socket, and a second ``weald serve`` on it is refused;
- ``clean_shutdown``: SIGTERM ends it with exit code 0.

Partial-line flood (`run_line_flood`): many connections each send most of a
huge line (15 MB by default) and never finish it. Then:

- ``every_connection_refused_or_held``: each flooding connection either
  holds its line or got one error line naming ``limits.max_buffered_bytes``;
- ``buffered_within_budget``: the daemon never held more than its budget;
- ``rss_peak_bounded``: the daemon's peak resident memory (``VmHWM``) stays
  within `rss_bound_mb` of its resident memory before the flood;
- ``open_connection_served_during_flood`` and, once the flooding
  connections close, ``budget_released`` (nothing held) and
  ``large_message_served_after`` (an 8 MB request is read and answered);
- ``clean_shutdown``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import selectors
import shutil
import socket
import struct
import termios
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import msgspec
from daemon_harness import DaemonProcess
from rel_chaos import InvariantCheck
from rel_load import raise_fd_limit
from weald.runtime.daemon.client import Client, DaemonUnavailableError
from weald.runtime.testing import wait_until

RECOVERY_BOUND = 10.0
"""Seconds within which a new client must be served once a flood's clients are gone."""

FD_FLOOD_INVARIANTS = (
    "daemon_runs_under_the_fd_limit",
    "every_client_answered_or_refused_with_a_reason",
    "open_connection_served_during_flood",
    "new_clients_served_within_seconds",
    "reply_in_flight_arrives",
    "exhaustion_logged_once_per_spell",
    "daemon_keeps_its_socket",
    "clean_shutdown",
)
LINE_FLOOD_INVARIANTS = (
    "every_connection_refused_or_held",
    "buffered_within_budget",
    "rss_peak_bounded",
    "open_connection_served_during_flood",
    "budget_released",
    "large_message_served_after",
    "clean_shutdown",
)
_EXHAUSTED_LOG = "out of file descriptors ("
_STATUS = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "method": "daemon.status"}) + b"\n"
_MIB = 1024 * 1024


def _proc_status(pid: int, key: str) -> float:
    """A ``kB`` figure of /proc/<pid>/status (VmRSS, VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {key} for pid {pid}")


def _open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open files limit for pid {pid}")


def _check(checks: list[InvariantCheck], name: str, held: bool, detail: str = "") -> None:
    checks.append(InvariantCheck(name, held, "" if held else detail))


@attrs.define
class FdFloodReport:
    """What the fd flood did: clients by outcome, recovery time, and the invariants."""

    clients: int
    nofile: int
    max_connections: int | None
    connected: int = 0
    served: int = 0
    refused: dict[str, int] = attrs.field(factory=dict)  # by the limit named in the refusal
    closed_without_a_word: int = 0
    unanswered: int = 0
    other_replies: list[str] = attrs.field(factory=list)
    fd_exhaustions: int = 0
    warnings_logged: int = 0
    flood_seconds: float = 0.0
    recovery_seconds: float = 0.0
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]


class _Flood:
    """Thousands of non-blocking clients, each connecting, sending ``daemon.status`` and reading one line."""

    def __init__(self, path: Path, clients: int) -> None:
        self.path = str(path)
        self.waiting = list(range(clients))  # not connected yet
        self.socks: dict[int, socket.socket] = {}
        self.lines: dict[int, bytes | None] = {}  # None: closed without a line
        self.bufs: dict[int, bytearray] = {}
        self.connect_errors: list[str] = []

    def run(self, deadline: float) -> None:
        with selectors.DefaultSelector() as selector:
            while (self.waiting or len(self.lines) < len(self.socks)) and time.monotonic() < deadline:
                self._connect_some(selector)
                for key, _ in selector.select(timeout=0.02):
                    self._read(selector, key.data)

    def _connect_some(self, selector: selectors.BaseSelector) -> None:
        still: list[int] = []
        for n in self.waiting:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(self.path)
            except BlockingIOError:  # the accept queue is full: the daemon is busy, try again
                sock.close()
                still.append(n)
                continue
            except OSError as exc:
                sock.close()
                self.connect_errors.append(f"client {n}: {exc}")
                if exc.errno != errno.ECONNREFUSED:
                    still.append(n)
                continue
            with contextlib.suppress(OSError):  # refused already: its line (if any) is read below
                sock.send(_STATUS)
            self.socks[n] = sock
            self.bufs[n] = bytearray()
            selector.register(sock, selectors.EVENT_READ, n)
        self.waiting = still

    def _read(self, selector: selectors.BaseSelector, n: int) -> None:
        sock = self.socks[n]
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.bufs[n] += data
            if b"\n" not in self.bufs[n]:
                return
            self.lines[n] = bytes(self.bufs[n].split(b"\n", 1)[0])
        else:
            self.lines[n] = None
        selector.unregister(sock)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()


def run_fd_flood(
    root: Path, *, clients: int = 2000, nofile: int = 1024, max_connections: int | None = None
) -> FdFloodReport:
    """A daemon under ``prlimit --nofile=<nofile>`` flooded by ``clients`` connections at once (see the module)."""
    report = FdFloodReport(clients, nofile, max_connections)
    if shutil.which("prlimit") is None:
        raise AssertionError("the fd flood needs prlimit (util-linux): apt-get install util-linux")
    if raise_fd_limit(clients + 512) < clients + 64:
        raise AssertionError(f"the fd flood needs {clients + 64} descriptors in this process; raise ulimit -n")
    extra = f"[limits]\nmax_connections = {max_connections}\n" if max_connections else ""
    daemon = DaemonProcess(root, extra_config=extra)
    slow = daemon.script("slow", [{"text": "answered through the flood", "delay": 2.0}])
    flood = _Flood(daemon.socket, clients)
    checks = report.checks
    try:
        daemon.start(wrapper=("prlimit", f"--nofile={nofile}:{nofile}", "--"))
        assert daemon.proc is not None
        pid = daemon.proc.pid
        limit = _open_files_limit(pid)
        _check(checks, "daemon_runs_under_the_fd_limit", limit == nofile, f"the daemon's limit is {limit}")
        with daemon.client() as keeper:
            keeper.call("agent.start", {"working_dir": str(daemon.project), "model": slow, "agent_id": "slow"})
            prompt = keeper.request("agent.prompt", {"agent_id": "slow", "text": "answer through the flood"})
            started = time.monotonic()
            flood.run(deadline=started + 60)
            report.flood_seconds = time.monotonic() - started
            _tally(report, flood)
            during: dict[str, Any] | None = None
            with contextlib.suppress(DaemonUnavailableError, TimeoutError, OSError):
                during = keeper.call("daemon.status", timeout=30)
            _check(
                checks,
                "open_connection_served_during_flood",
                during is not None and during["pid"] == pid,
                "the connection opened before the flood got no answer",
            )
            flood.close()
            closed = time.monotonic()
            try:
                wait_until(lambda: _served(daemon.socket), timeout=60, message="a new client to be served")
            except AssertionError:
                report.recovery_seconds = float("inf")
            else:
                report.recovery_seconds = time.monotonic() - closed
            _check(
                checks,
                "new_clients_served_within_seconds",
                report.recovery_seconds <= RECOVERY_BOUND,
                f"a new client was served {report.recovery_seconds:.1f} s after the flood ended",
            )
            try:
                turn = prompt.get(timeout=60)
            except Exception as exc:
                turn = {"ok": False, "error": repr(exc)}
            _check(checks, "reply_in_flight_arrives", bool(turn.get("ok")), f"the prompt in flight: {turn!r:.300}")
            status = keeper.call("daemon.status", timeout=30)
        report.fd_exhaustions = status["front"]["fd_exhaustions"]
        report.warnings_logged = daemon.log.read_text(errors="replace").count(_EXHAUSTED_LOG)
        _check(
            checks,
            "exhaustion_logged_once_per_spell",
            report.warnings_logged == report.fd_exhaustions,
            f"{report.warnings_logged} log lines for {report.fd_exhaustions} spells",
        )
        second = daemon.cli("serve", "--socket", str(daemon.socket), timeout=60)
        _check(
            checks,
            "daemon_keeps_its_socket",
            second.returncode != 0 and daemon.proc.poll() is None and _served(daemon.socket, pid),
            f"a second daemon exited {second.returncode} ({second.stderr.strip()[-300:]}); "
            f"the first is {'alive' if daemon.proc.poll() is None else 'gone'}",
        )
        code = daemon.terminate()
        _check(checks, "clean_shutdown", code == 0, f"exit code {code}")
    finally:
        flood.close()
        daemon.close()
    return report


def _tally(report: FdFloodReport, flood: _Flood) -> None:
    report.connected = len(flood.socks)
    report.unanswered = len(flood.socks) - len(flood.lines) + len(flood.waiting)
    for line in flood.lines.values():
        if line is None:
            report.closed_without_a_word += 1
            continue
        message = msgspec.json.decode(line)
        if "result" in message:
            report.served += 1
        elif message.get("error", {}).get("code") == -32003:
            named = message["error"].get("data", {}).get("limit", "?")
            report.refused[named] = report.refused.get(named, 0) + 1
        else:
            report.other_replies.append(f"{message!r:.200}")
    problems = [
        f"{report.unanswered} clients unanswered or never connected",
        f"{report.closed_without_a_word} closed without a word",
        f"other replies: {report.other_replies[:3]}",
        f"refusals naming unknown limits: { {k: v for k, v in report.refused.items() if k not in _LIMITS} }",
        f"connect errors: {flood.connect_errors[:3]}",
    ]
    held = (
        not report.unanswered
        and not report.closed_without_a_word
        and not report.other_replies
        and set(report.refused) <= _LIMITS
        and report.served + sum(report.refused.values()) == report.clients
    )
    _check(report.checks, "every_client_answered_or_refused_with_a_reason", held, "; ".join(problems))


_LIMITS = {"limits.max_connections", "RLIMIT_NOFILE"}


def _served(path: Path, pid: int | None = None) -> bool:
    try:
        with Client.connect(path, timeout=5) as client:
            status = client.call("daemon.status", timeout=10)
    except (DaemonUnavailableError, OSError, TimeoutError):
        return False
    return pid is None or status["pid"] == pid


# -- the partial-line flood ------------------------------------------------------------------------------


@attrs.define
class LineFloodReport:
    """What the partial-line flood did: connections refused and held, memory, and the invariants."""

    connections: int
    line_mb: float
    budget_mb: float = 0.0
    refused: int = 0
    held: int = 0
    rss_before: float = 0.0
    rss_peak: float = 0.0
    rss_after: float = 0.0
    buffered_peak_mb: float = 0.0
    seconds: float = 0.0
    checks: list[InvariantCheck] = attrs.field(factory=list)

    @property
    def failures(self) -> list[InvariantCheck]:
        """The invariants that did not hold."""
        return [c for c in self.checks if not c.held]


def rss_bound_mb(budget_bytes: int, connections: int) -> float:
    """The growth of the daemon's peak RSS allowed under a partial-line flood, in MB.

    The lines held add up to the budget; a growing buffer may have up to an
    eighth more allocated than it holds, and moving it when it grows copies
    it once (so half the budget again covers both); each connection has one
    read of at most 256 KB in hand; and 48 MB is left for everything else
    the daemon does meanwhile (its allocator's arenas, the replies, Python's
    own caches).
    """
    return budget_bytes * 1.5 / _MIB + connections * 0.25 + 48


def run_line_flood(
    root: Path, *, connections: int = 60, line_mb: float = 15.0, budget_mb: float | None = None
) -> LineFloodReport:
    """``connections`` clients each send ``line_mb`` MB of one line and never end it (see the module)."""
    report = LineFloodReport(connections, line_mb)
    extra = f"[limits]\nmax_buffered_bytes = {int(budget_mb * _MIB)}\n" if budget_mb else ""
    daemon = DaemonProcess(root, extra_config=extra)
    release = threading.Event()
    outcomes: list[str] = []
    socks: list[socket.socket] = []
    threads: list[threading.Thread] = []
    checks = report.checks
    try:
        daemon.start()
        assert daemon.proc is not None
        pid = daemon.proc.pid
        with daemon.client() as keeper:
            for _ in range(20):  # warm-up: what serving allocates once is in the baseline
                front = keeper.call("daemon.status", timeout=30)["front"]
            budget = front["max_buffered_bytes"]
            report.budget_mb = budget / _MIB
            report.rss_before = _proc_status(pid, "VmRSS")
            started = time.monotonic()
            for _ in range(connections):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(str(daemon.socket))
                socks.append(sock)
                thread = threading.Thread(target=_send_unfinished, args=(sock, line_mb, outcomes, release))
                thread.start()
                threads.append(thread)
            wait_until(lambda: len(outcomes) == connections, timeout=120, message="every flooding client to send")
            report.seconds = time.monotonic() - started
            report.rss_peak = _proc_status(pid, "VmHWM")
            during = keeper.call("daemon.status", timeout=30)
            _check(checks, "open_connection_served_during_flood", during["pid"] == pid, f"status {during!r:.200}")
            report.refused = outcomes.count("refused")
            report.held = outcomes.count("held")
            strays = [o for o in outcomes if o not in ("refused", "held")]
            _check(
                checks,
                "every_connection_refused_or_held",
                not strays and report.refused + report.held == connections,
                f"{report.refused} refused, {report.held} held, others: {strays[:3]}",
            )
            front = during["front"]
            report.buffered_peak_mb = front["buffered_bytes_peak"] / _MIB
            _check(
                checks,
                "buffered_within_budget",
                front["buffered_bytes_peak"] <= budget and front["buffered_bytes"] <= budget,
                f"held {front['buffered_bytes']}, at most {front['buffered_bytes_peak']}, budget {budget}",
            )
            bound = rss_bound_mb(budget, connections)
            _check(
                checks,
                "rss_peak_bounded",
                report.rss_peak - report.rss_before <= bound,
                f"peak RSS {report.rss_peak:.0f} MB, {report.rss_peak - report.rss_before:.0f} MB over the "
                f"{report.rss_before:.0f} MB before; allowed {bound:.0f} MB",
            )
            release.set()
            for thread in threads:
                thread.join(60)
            for sock in socks:
                sock.close()
            try:
                wait_until(
                    lambda: keeper.call("daemon.status", timeout=30)["front"]["buffered_bytes"] == 0,
                    timeout=30,
                    message="the budget to be released",
                )
            except AssertionError as exc:
                _check(checks, "budget_released", False, str(exc))
            else:
                _check(checks, "budget_released", True)
            report.rss_after = _proc_status(pid, "VmRSS")
            _check(checks, "large_message_served_after", _large_message_served(daemon.socket, pid))
        code = daemon.terminate()
        _check(checks, "clean_shutdown", code == 0, f"exit code {code}")
    finally:
        release.set()
        for sock in socks:
            sock.close()
        daemon.close()
    return report


def _send_unfinished(sock: socket.socket, line_mb: float, outcomes: list[str], release: threading.Event) -> None:
    """Send the start of a request and ``line_mb`` MB of one string, no newline; then see what the daemon says."""
    chunk = b"x" * _MIB
    sock.settimeout(60)
    try:
        sock.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "daemon.status", "params": {}, "padding": "')
        for _ in range(int(line_mb)):
            sock.sendall(chunk)
    except OSError:
        pass  # the daemon stopped reading and closed: its reason is read below
    try:
        first = _first_reply(sock)
    except OSError as exc:
        outcomes.append(f"reset without a word ({exc})")
        return
    if first is None:
        outcomes.append("held")  # the daemon read all of it, holds the line and waits for its end
        release.wait(120)
        return
    if not first:
        outcomes.append("closed without a word")
        return
    sock.settimeout(5)
    data = first
    with contextlib.suppress(OSError):
        while b"\n" not in data and (more := sock.recv(65536)):
            data += more
    message = msgspec.json.decode(data.split(b"\n", 1)[0])
    error = message.get("error", {})
    named = error.get("code") == -32003 and error.get("data", {}).get("limit") == "limits.max_buffered_bytes"
    outcomes.append("refused" if named else f"other reply {message!r:.200}")


def _first_reply(sock: socket.socket) -> bytes | None:
    """What the daemon sends first; None if it read everything sent and said nothing for a second after."""
    sock.settimeout(0.2)
    read_all_at: float | None = None
    while read_all_at is None or time.monotonic() - read_all_at < 1.0:
        try:
            return sock.recv(65536)
        except TimeoutError:
            pass
        if read_all_at is None and _unread(sock) == 0:
            read_all_at = time.monotonic()
    return None


def _unread(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not read yet (SIOCOUTQ)."""
    raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
    return int(struct.unpack("i", raw)[0])


def _large_message_served(path: Path, pid: int) -> bool:
    """An 8 MB request (under the message limit and the budget) is read and answered."""
    padding = "y" * (8 * _MIB)
    line = msgspec.json.encode({"jsonrpc": "2.0", "id": 9, "method": "daemon.status", "padding": padding})
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(path))
        sock.sendall(line + b"\n")
        with sock.makefile("rb") as reader:
            reply = msgspec.json.decode(reader.readline())
    # The server ignores members it does not know in a request object; padding is one of them.
    return bool(reply.get("id") == 9 and reply.get("result", {}).get("pid") == pid)
