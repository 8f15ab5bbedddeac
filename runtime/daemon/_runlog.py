"""The daemon's log file, its fatal-crash tracebacks, and how its previous run ended.

The daemon is the root of its tree: nothing in the process can restart it,
so a fatal crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL in C code) must at
least leave its story. `DaemonLog.open` turns on ``faulthandler`` for every
thread into ``<state dir>/daemon.log`` (and, when the daemon has a terminal,
onto it too, through a ``tee`` that outlives the crash), and sends weald's
warnings there with a time stamp.

A run leaves a marker, ``<state dir>/daemon.running`` (its pid, start time
and log), which a clean stop removes. A start that finds one knows that the
previous run did not stop: `PreviousRun` says how it ended (the fatal error
faulthandler wrote into the log for that pid, or "killed" when the log has
none, as after SIGKILL or a power cut) and is kept as
``daemon.last-crash`` until a run stops cleanly, so ``weald doctor`` and
``daemon.status`` report it too.

Everything here runs on the thread that starts or stops the daemon, before
the loop and after it; nothing runs on the loop.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import attrs
from weald.runtime import make_private_dirs

__all__ = ["LOG_NAME", "DaemonLog", "PreviousRun", "last_crash"]

LOG_NAME = "daemon.log"
_MARKER = "daemon.running"
_LAST_CRASH = "daemon.last-crash"
_MAX_LOG_BYTES = 8 << 20  # a longer log is moved to daemon.log.1 at start (one generation kept)
_HEADER = "--- weald daemon pid {pid} started {when} ---"
_HEADER_RE = re.compile(r"^--- weald daemon pid (\d+) started ")
_FATAL_RE = re.compile(r"^Fatal Python error: (.+)$")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@attrs.frozen
class PreviousRun:
    """A run of the daemon on this state directory that ended without stopping.

    Attributes:
        pid: its process id.
        started: when it started (UTC, ISO 8601).
        ended_by: the fatal error faulthandler logged (``Segmentation fault``),
            or ``killed`` when its log has none (SIGKILL, the OOM killer, a
            power cut).
        log: the log file holding its last lines and tracebacks.
    """

    pid: int
    started: str
    ended_by: str
    log: str

    def describe(self) -> str:
        """One sentence for a person."""
        if self.ended_by == "killed":
            how = "was killed or lost power (no fatal error in its log)"
        else:
            how = f"crashed with a fatal error ({self.ended_by}); every thread's Python stack is in its log"
        return f"the previous daemon run (pid {self.pid}, started {self.started}) {how}: {self.log}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as ``daemon.status`` and ``weald doctor --json`` show it."""
        return {**attrs.asdict(self), "description": self.describe()}


def last_crash(state_dir: Path) -> PreviousRun | None:
    """The unclean end recorded in ``state_dir`` since its last clean stop, if any (for ``weald doctor``).

    A run that is still going is not a crash: when its marker's pid is alive
    (another daemon serving), only an earlier recorded crash is returned.
    """
    recorded = _read_json(state_dir / _LAST_CRASH)
    if recorded is not None:
        with contextlib.suppress(TypeError, ValueError):
            return PreviousRun(
                pid=int(recorded["pid"]),
                started=str(recorded["started"]),
                ended_by=str(recorded["ended_by"]),
                log=str(recorded["log"]),
            )
    marker = _read_json(state_dir / _MARKER)
    if marker is None or _alive(marker.get("pid")):
        return None
    return _ended(marker, state_dir)


class DaemonLog:
    """The open log of one daemon run; create with `open`, end with `close` (clean) or not at all (crash)."""

    def __init__(
        self, state_dir: Path, file: IO[str], tee: subprocess.Popen[bytes] | None, previous: PreviousRun | None
    ):
        self.state_dir = state_dir
        self.path = state_dir / LOG_NAME
        self.previous = previous
        self._file = file
        self._tee = tee
        self._handler = logging.StreamHandler(file)
        self._handler.setLevel(logging.WARNING)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("weald").addHandler(self._handler)

    @classmethod
    def open(cls, state_dir: Path, *, terminal: bool) -> DaemonLog:
        """Open ``<state_dir>/daemon.log``, turn on faulthandler into it, and mark this run as started.

        Call it with the store's lock held (so no other daemon rotates or
        marks the same directory), before sessions are restored.

        Args:
            state_dir: the daemon's state directory (made 0700 if new).
            terminal: also write fatal tracebacks to this process's stderr.

        Raises:
            OSError: the log or the marker cannot be written.
        """
        make_private_dirs(state_dir)
        previous = _take_marker(state_dir)
        path = state_dir / LOG_NAME
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > _MAX_LOG_BYTES:
                path.replace(path.with_name(LOG_NAME + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        file = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace")
        file.write(_HEADER.format(pid=os.getpid(), when=_now()) + "\n")
        if previous is not None:
            file.write(f"WARNING {previous.describe()}\n")
        tee = _terminal_tee(path) if terminal else None
        # faulthandler keeps only the descriptor: the file object stays open for the run.
        faulthandler.enable(file=tee.stdin if tee is not None and tee.stdin is not None else file, all_threads=True)
        marker = {"pid": os.getpid(), "started": _now(), "log": str(path)}
        _write_json(state_dir / _MARKER, marker)
        return cls(state_dir, file, tee, previous)

    def close(self) -> None:
        """A clean stop: remove the marker and any recorded crash, stop writing the log."""
        for name in (_MARKER, _LAST_CRASH):
            with contextlib.suppress(FileNotFoundError):
                (self.state_dir / name).unlink()
        logging.getLogger("weald").removeHandler(self._handler)
        # Back to stderr: a crash while the process winds down still prints its stacks.
        faulthandler.enable(file=sys.stderr, all_threads=True)
        self._file.write(f"--- weald daemon pid {os.getpid()} stopped {_now()} ---\n")
        self._file.close()
        if self._tee is not None:
            if self._tee.stdin is not None:
                self._tee.stdin.close()
            self._tee.wait(5)


def _take_marker(state_dir: Path) -> PreviousRun | None:
    """How the run before this one ended, if it did not stop cleanly; recorded as the last crash."""
    marker = _read_json(state_dir / _MARKER)
    if marker is None:
        return None
    previous = _ended(marker, state_dir)
    if previous is not None:
        _write_json(state_dir / _LAST_CRASH, attrs.asdict(previous))
    return previous


def _ended(marker: dict[str, Any], state_dir: Path) -> PreviousRun | None:
    try:
        pid = int(marker["pid"])
    except (KeyError, TypeError, ValueError):
        return None
    log = Path(str(marker.get("log") or state_dir / LOG_NAME))
    return PreviousRun(pid=pid, started=str(marker.get("started", "?")), ended_by=_fatal_error(log, pid), log=str(log))


def _fatal_error(log: Path, pid: int) -> str:
    """The fatal error faulthandler logged in ``pid``'s part of ``log`` (or its rotated copy); else ``killed``."""
    for candidate in (log, log.with_name(log.name + ".1")):
        try:
            with open(candidate, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue
        found = None
        inside = False
        for line in lines:
            header = _HEADER_RE.match(line)
            if header is not None:
                inside = int(header.group(1)) == pid
                continue
            fatal = _FATAL_RE.match(line.rstrip("\n")) if inside else None
            if fatal is not None:
                found = fatal.group(1).strip()
        if found is not None:
            return found
    return "killed"


def _terminal_tee(path: Path) -> subprocess.Popen[bytes] | None:
    """A ``tee -a LOG`` onto this process's stderr: it outlives a crash of this process and writes both."""
    tee = shutil.which("tee")
    if tee is None:
        return None
    try:
        return subprocess.Popen(  # noqa: S603 - coreutils' tee, by its resolved path
            [tee, "-a", str(path)],
            stdin=subprocess.PIPE,
            stdout=sys.stderr.fileno(),
            start_new_session=True,  # a Ctrl-C for the daemon does not end the tee before the daemon's last words
        )
    except OSError:
        return None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(value, f)
