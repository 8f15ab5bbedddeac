"""Subprocesses in a process group of their own: start them, capture their output, kill them whole.

Every command a tool runs (``rg`` for grep and glob, ``bash -c`` for shell
and its background jobs) starts a new session, so its process id is also
its process group id and session id. Stopping it means stopping that
whole group: SIGTERM, a grace period, then SIGKILL, and returning only once
nothing of it is left. `open_group_process` does that on the way out of its
block whatever the reason (the command ended, the call timed out, the call
was aborted), shielded from cancellation.

"Nothing is left" is judged on Linux by reading ``/proc``: a process that
has died but was not reaped yet (a zombie, which is what orphaned
grandchildren stay until init reaps them) no longer counts, and a process
that moved to a process group of its own but stayed in the session still
does. Elsewhere ``killpg(pgid, 0)`` is the test.

A process can also leave the session (``setsid``, ``nohup setsid ...&``,
a daemon's double fork). To find those, a caller can *mark* a command:
its environment gets ``WEALD_PROCESS_MARK=<mark>`` (`weald.runtime.new_process_mark`),
which every process it starts inherits, and cleanup also stops every live
process whose ``/proc/<pid>/environ`` carries that mark (the mechanism
weald's fault injection uses to find a call's processes). A process that
rebuilds its environment from nothing (``env -i``) drops the mark and is
not found. Without ``/proc`` the mark is passed on but finds nothing.

A command may run inside bubblewrap (``sandboxed=True``, the shell tool's OS
sandbox): the process started here is then ``bwrap``, and the command runs
in a PID namespace of its own below it, which the kernel empties the moment
``bwrap`` dies. Stopping it sends SIGTERM to the processes inside first and
kills ``bwrap`` (so all of them) only after the grace period.

Every process is forked by `weald.runtime.open_child_process`, so it gets
SIGKILL if the daemon dies (bubblewrap asks for that itself).

`OutputCapture` holds what such a process prints: a bounded tail in memory,
the whole of it spooled to a file once it outgrows the tail, and coalesced
``output`` events for whoever is watching.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import trio
from weald.runtime import (
    MARK_VARIABLE,
    ChildProcess,
    make_private_dirs,
    marked_processes,
    open_child_process,
    scan_proc,
)
from weald.tools._contract import ToolError
from weald.tools._spill import SpillBudget

__all__ = [
    "DEFAULT_KILL_GRACE",
    "KILL_WAIT",
    "RIPGREP_FILTERS",
    "CapturedText",
    "OutputCapture",
    "capture_until_exit",
    "clean_terminal_text",
    "find_executable",
    "find_ripgrep",
    "group_alive",
    "leftover_processes",
    "open_group_process",
    "procfs_readable",
    "pump",
    "sandbox_members",
    "signal_group",
    "terminate_group",
    "terminate_groups_blocking",
]

logger = logging.getLogger("weald.tools")

DEFAULT_KILL_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL."""

KILL_WAIT = 5.0
"""Seconds to wait for a group to vanish after SIGKILL.

A killed process is gone within milliseconds unless it is stuck in the
kernel (uninterruptible sleep); past this it is logged and left."""

# How often group membership is polled while waiting for a group to die
# (grows from the first to the second value).
_POLL_FIRST = 0.005
_POLL_MAX = 0.05


def find_executable(name: str) -> str | None:
    """Find a program next to the running Python first, then on ``PATH``.

    The virtualenv's ``bin`` comes first so that a tool installed as a
    Python dependency (the ``ripgrep`` wheel ships ``rg``) is found even
    when the virtualenv is not activated.

    Returns:
        The program's path, or None when it is nowhere to be found.
    """
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


RIPGREP_FILTERS = ("--no-config", "--no-require-git", "--hidden", "--glob", "!.git")
"""The file selection grep and glob share: .gitignore (and .ignore) rules apply
even outside a git repository; hidden files are included, ``.git`` is not;
a user's ripgrep config file does not change the output format."""


def find_ripgrep() -> str:
    """The ``rg`` program, next to the running Python or on ``PATH``.

    Raises:
        ToolError: ripgrep is not installed.
    """
    rg = find_executable("rg")
    if rg is None:
        raise ToolError(
            "ripgrep (rg) is not installed, and grep and glob need it. Ask the user to install it "
            "(pip install ripgrep==14.1.0, or the system package); meanwhile use shell with find or grep.",
        )
    return rg


# -- process groups ------------------------------------------------------------


def _proc_members(pgid: int, *, session: bool) -> list[int] | None:
    """Live members of process group ``pgid`` (and of session ``pgid`` if asked), from /proc.

    Returns:
        Their pids, or None when /proc cannot be read (not Linux).
    """

    def member(stat: bytes) -> bool:
        # "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parens.
        fields = stat.rpartition(b")")[2].split()
        if len(fields) < 4 or fields[0] in (b"Z", b"X"):
            return False
        return int(fields[2]) == pgid or (session and int(fields[3]) == pgid)

    return scan_proc("stat", member)


def group_alive(pgid: int, *, session: bool = False) -> bool:
    """Return True while any process of group ``pgid`` (or session, if asked) is alive.

    Zombies do not count on Linux. Reap the group's leader (``process.poll()``)
    before asking, or it counts elsewhere.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        if not session:
            return False
    except PermissionError:
        # A member changed its credentials (setuid); it is still there.
        return True
    members = _proc_members(pgid, session=session)
    if members is None:
        # Without /proc, a successful killpg is all we know.
        return not session
    return bool(members)


def leftover_processes(pgid: int, *, session: bool = False, mark: str | None = None) -> list[int]:
    """Live processes of group ``pgid`` (and its session, if asked) and those carrying ``mark``.

    A process SIGKILLed a moment ago (by a timeout, a fault, the group's
    stop) is not left running, though it may not have been scheduled to die
    yet: it is left out.
    Reap the group's leader before asking, or it counts. Without /proc this
    is empty even when something is left.
    """
    found = set(_proc_members(pgid, session=session) or ())
    if mark is not None:
        found.update(marked_processes(mark) or ())
    return sorted(pid for pid in found if not _dying(pid))


def procfs_readable() -> bool:
    """Return True where processes can be listed from /proc (Linux)."""
    return os.access("/proc/self/stat", os.R_OK)


# /proc/<pid>/stat's flags: the task is exiting (the kernel's PF_EXITING).
_PF_EXITING = 0x4
# SIGKILL's bit in /proc/<pid>/status's pending-signal masks.
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _dying(pid: int) -> bool:
    """Return True if ``pid`` is gone, exiting, or has a SIGKILL pending (it cannot survive it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return True
    if len(fields) < 7 or fields[0] in (b"Z", b"X") or int(fields[6]) & _PF_EXITING:
        return True
    for line in status.splitlines():
        if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & _SIGKILL_BIT:
            return True
    return False


def signal_group(pgid: int, sig: int, *, session: bool = False) -> None:
    """Send ``sig`` to process group ``pgid``; with ``session``, also to session members in other groups."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    if not session:
        return
    for pid in _proc_members(pgid, session=True) or ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _signal_all(pgid: int, sig: int, *, session: bool, mark: str | None) -> None:
    """`signal_group`, and ``sig`` to every process carrying ``mark`` too."""
    signal_group(pgid, sig, session=session)
    if mark is None:
        return
    for pid in marked_processes(mark) or ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sandbox_members(outer: int, mark: str | None = None) -> list[int]:
    """The processes running inside the bubblewrap sandbox whose outer ``bwrap`` process is ``outer``.

    ``bwrap`` forks the sandbox's init (pid 1 of its PID namespace), which
    starts a session of its own (``--new-session``) for the command: the
    members of the init's session, init excluded, are the command and what
    it started; those that moved to yet another session are found by
    ``mark`` (or die with the namespace). ``bwrap`` and its init carry the
    mark too, and are never among them: either one's death ends the
    namespace at once.
    """
    inits = _sandbox_inits(outer)
    members: set[int] = set()
    for init in inits:
        members.update(_proc_members(init, session=True) or ())
    if mark is not None:
        members.update(marked_processes(mark) or ())
    return sorted(members - inits - {outer})


def _sandbox_inits(outer: int) -> set[int]:
    """The live children of ``outer``: the init of its sandbox's PID namespace."""

    def child(stat: bytes) -> bool:
        fields = stat.rpartition(b")")[2].split()
        return len(fields) > 1 and fields[0] not in (b"Z", b"X") and int(fields[1]) == outer

    return set(scan_proc("stat", child) or ())


async def _wait_inits_gone(inits: set[int], timeout: float) -> None:
    """Wait until each init has exited: the kernel empties its namespace first.

    bwrap killed (SIGKILL) is gone before its init, which still has to kill
    and wait out every process of its namespace.
    """
    deadline = trio.current_time() + timeout
    delay = _POLL_FIRST
    while any(_alive(pid) for pid in inits) and trio.current_time() < deadline:
        await trio.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state not in ([b"Z"], [b"X"])


def _leader_and_group_alive(process: ChildProcess, session: bool, mark: str | None) -> bool:
    # Reading returncode reaps the leader once it has exited, so that it
    # stops counting as a member of its own group.
    leader_running = process.returncode is None
    return leader_running or group_alive(process.pid, session=session) or bool(mark and marked_processes(mark))


async def _wait_gone(process: ChildProcess, *, session: bool, mark: str | None, timeout: float) -> bool:
    deadline = trio.current_time() + timeout
    delay = _POLL_FIRST
    while _leader_and_group_alive(process, session, mark):
        remaining = deadline - trio.current_time()
        if remaining <= 0:
            return False
        await trio.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX)
    return True


async def terminate_group(
    process: ChildProcess,
    *,
    grace: float = DEFAULT_KILL_GRACE,
    session: bool = False,
    mark: str | None = None,
    sandboxed: bool = False,
) -> bool:
    """Stop ``process`` and every process in its group; return once they are all gone.

    SIGTERM (with SIGCONT, so that stopped processes see it), then, after
    ``grace`` seconds, SIGKILL. Run it shielded from cancellation (as
    `open_group_process` does): a cancelled cleanup leaves processes behind.

    Args:
        process: a process started with ``start_new_session=True``.
        grace: seconds the group has to exit after SIGTERM.
        session: also stop processes that left the group but not the session.
        mark: also stop every process whose environment carries this mark
            (see `weald.runtime.marked_processes`), wherever it went.
        sandboxed: ``process`` is ``bwrap`` with a PID namespace below it:
            SIGTERM goes to the processes inside (`sandbox_members`), and
            SIGKILL to ``bwrap``, which takes the whole namespace with it.

    Returns:
        True if anything was still running and had to be signalled.
    """
    pgid = process.pid
    if sandboxed and process.returncode is not None:
        # bwrap exits after its init, and the kernel empties a PID namespace
        # before its init is gone: nothing of the command is left to look for.
        return False
    if not _leader_and_group_alive(process, session, mark):
        await process.wait()
        return False
    inits: set[int] = set()
    if sandboxed:
        # SIGTERM to bwrap itself would end the namespace at once (its init
        # dies with it): the command gets its grace period from inside.
        inits = _sandbox_inits(pgid)
        for pid in sandbox_members(pgid, mark):
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
    else:
        _signal_all(pgid, signal.SIGTERM, session=session, mark=mark)
        _signal_all(pgid, signal.SIGCONT, session=session, mark=mark)
    if not await _wait_gone(process, session=session, mark=mark, timeout=grace):
        _signal_all(pgid, signal.SIGKILL, session=session, mark=mark)
        if not await _wait_gone(process, session=session, mark=mark, timeout=KILL_WAIT):
            logger.warning("process group %d survived SIGKILL for %.0f s", pgid, KILL_WAIT)
    await process.wait()
    await _wait_inits_gone(inits, KILL_WAIT)
    return True


def terminate_groups_blocking(
    pgids: Sequence[int],
    *,
    grace: float = DEFAULT_KILL_GRACE,
    session: bool = False,
) -> None:
    """`terminate_group` for a thread that is not running trio, for several groups at once.

    Blocks until every group is gone: all get SIGTERM together, then SIGKILL
    together once ``grace`` has passed. The leaders are not reaped here (the
    tasks that started them do that), so on systems without /proc this
    waits out the grace period.
    """
    remaining = [p for p in pgids if group_alive(p, session=session)]
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pgid in remaining:
            signal_group(pgid, sig, session=session)
    for timeout, then in ((grace, signal.SIGKILL), (KILL_WAIT, None)):
        deadline = time.monotonic() + timeout
        delay = _POLL_FIRST
        while remaining and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
            remaining = [p for p in remaining if group_alive(p, session=session)]
        if not remaining:
            return
        if then is not None:
            for pgid in remaining:
                signal_group(pgid, then, session=session)
    logger.warning("process groups %s survived SIGKILL for %.0f s", remaining, KILL_WAIT)


@contextlib.asynccontextmanager
async def open_group_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    stdin: int = subprocess.DEVNULL,
    grace: float = DEFAULT_KILL_GRACE,
    session: bool = False,
    pass_fds: Sequence[int] = (),
    mark: str | None = None,
    sandboxed: bool = False,
) -> AsyncIterator[ChildProcess]:
    """Start ``argv`` in a new session with piped stdout and stderr; stop all of it on exit.

    Leaving the block, for any reason, runs `terminate_group` shielded and
    closes the pipes: when the block is left, nothing the command started
    is running. The process gets SIGKILL if this process dies
    (`weald.runtime.open_child_process`).

    Args:
        argv: the program and its arguments.
        cwd: where it runs.
        env: its environment (None: this process's).
        stdin: ``subprocess.DEVNULL`` or ``subprocess.PIPE``.
        grace: seconds between SIGTERM and SIGKILL.
        session: also stop processes that moved to another group of the session.
        pass_fds: descriptors the program inherits at the same numbers (a
            pinned directory it runs in, as ``cwd=/proc/self/fd/<n>``).
        mark: put ``MARK_VARIABLE=mark`` into the environment, and on exit
            also stop every process carrying it (those that left the session).
        sandboxed: ``argv`` starts ``bwrap --die-with-parent`` with a PID
            namespace (see `terminate_group`).

    Raises:
        OSError: the program could not be started.
    """
    environ = dict(env) if env is not None else None
    if mark is not None:
        environ = {**(os.environ if environ is None else environ), MARK_VARIABLE: mark}
    process = await open_child_process(
        list(argv),
        cwd=str(cwd),
        env=environ,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
        die_with_parent=not sandboxed,
    )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            await terminate_group(process, grace=grace, session=session, mark=mark, sandboxed=sandboxed)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()


# -- output ----------------------------------------------------------------------

_READ_SIZE = 64 * 1024

# Spool writes are batched: one worker-thread hop per this many bytes.
_SPOOL_FLUSH = 1024 * 1024

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


@attrs.frozen
class CapturedText:
    """A stretch of captured output decoded for a model.

    Attributes:
        text: the output, ANSI escapes removed and carriage-return
            overwrites resolved as a terminal shows them.
        omitted: bytes before ``text`` that it does not include (dropped
            from memory, or cut to whole lines).
    """

    text: str
    omitted: int


def clean_terminal_text(text: str) -> str:
    """Remove ANSI escapes and resolve carriage-return overwrites (progress bars) line by line."""
    text = _ANSI.sub("", text)
    if "\r" not in text:
        return text
    return "\n".join(line.rstrip("\r").rpartition("\r")[2] for line in text.split("\n"))


class OutputCapture:
    """What a process prints: a bounded tail, a spool file, and coalesced output events.

    ``stdout`` and ``stderr`` are kept in one buffer in arrival order, as a
    terminal shows them. Memory stays bounded: the last ``tail_bytes``
    bytes are kept; once the output outgrows them, all of it (from the
    first byte) is written to a spool file in ``spool_dir``, in batches, on
    a worker thread.

    The spool file is bounded by ``spill`` (a `SpillBudget`; default
    bounds when None): once it may grow no further, it ends there and
    `spool_cut` says where and why; the tail in memory goes on.

    Events: ``emit("output", {"stream": ..., "text": ...})``, at most one per
    stream every ``emit_interval`` seconds while `run_emitter` runs, each
    with at most ``emit_max`` characters: the newest ones. When a burst was
    cut, the event also has ``"dropped"``: how many characters it left out
    (they are in the spool file).

    Threads: `feed`, `run_emitter` and `aclose` run in the trio task(s)
    reading the process; the reading methods (`tail`, `read_new`, `total`...)
    may be called from any thread.
    """

    def __init__(
        self,
        *,
        tail_bytes: int,
        spool_dir: Path | None,
        spool_prefix: str = "output-",
        emit: Callable[[str, Mapping[str, Any]], None] | None = None,
        emit_interval: float = 0.05,
        emit_max: int = 4096,
        spill: SpillBudget | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._tail = bytearray()
        self._tail_limit = tail_bytes
        self._total = 0
        self._read_pos = 0
        # Spool: starts the moment the tail first drops bytes.
        self._spool_dir = spool_dir
        self._spool_prefix = spool_prefix
        self._spooling = False
        self._spool_path: Path | None = None
        self._spool_file: IO[bytes] | None = None
        self._spool_error: str | None = None
        self._spill = spill if spill is not None or spool_dir is None else SpillBudget(spool_dir)
        self._spooled = 0  # bytes in the spool file
        self._spool_cut: str | None = None
        self._pending = bytearray()
        self._flush_lock = trio.Lock()
        self._arrived = trio.Event()
        # Events.
        self._emit = emit
        self._emit_interval = emit_interval
        self._emit_max = emit_max
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self._emit_pending: dict[str, str] = {}
        self._emit_dropped: dict[str, int] = {}
        self._emit_wakeup = trio.Event()
        self._last_emit = -math.inf

    def __repr__(self) -> str:
        return f"<OutputCapture total={self._total} spool={self._spool_path}>"

    # -- writing (trio task) -----------------------------------------------------

    async def feed(self, stream: str, data: bytes | bytearray) -> None:
        """Take a chunk the process wrote to ``stream`` (``"stdout"`` or ``"stderr"``)."""
        if not data:
            return
        with self._lock:
            self._total += len(data)
            if self._spooling:
                if self._spool_error is None and self._spool_cut is None:
                    self._pending += data
            elif self._total > self._tail_limit and self._spool_dir is not None:
                # Nothing was dropped yet, so the tail still holds everything.
                self._spooling = True
                self._pending += self._tail
                self._pending += data
            self._tail += data
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                del self._tail[:excess]
        self._arrived.set()
        self._arrived = trio.Event()
        if self._emit is not None:
            self._queue_event(stream, data)
        if len(self._pending) >= _SPOOL_FLUSH:
            await self._flush_spool()

    async def _flush_spool(self) -> None:
        # Under the lock, batches reach the file in the order they were taken.
        async with self._flush_lock:
            data, self._pending = self._pending, bytearray()
            if data and self._spool_error is None:
                await trio.to_thread.run_sync(self._write_spool_sync, bytes(data))

    def _write_spool_sync(self, data: bytes) -> None:
        assert self._spill is not None
        granted, why = self._spill.grant(len(data), self._spooled)
        if why is not None:
            # The file ends here; the command goes on and its result says so.
            self._spool_cut = why
        if not granted:
            return
        try:
            if self._spool_file is None:
                assert self._spool_dir is not None
                make_private_dirs(self._spool_dir)
                fd, name = tempfile.mkstemp(prefix=self._spool_prefix, suffix=".log", dir=self._spool_dir)
                self._spool_file = os.fdopen(fd, "wb")
                self._spool_path = Path(name)
            self._spool_file.write(data[:granted])
            self._spooled += granted
        except OSError as exc:
            # The command goes on; its result says the full output was lost.
            self._spill.give_back(granted, file=self._spool_file is None)
            self._spool_error = f"{type(exc).__name__}: {exc}"

    def _queue_event(self, stream: str, data: bytes | bytearray) -> None:
        text = self._emit_pending.get(stream, "") + self._decoders[stream].decode(data)
        if len(text) > self._emit_max:
            self._emit_dropped[stream] = self._emit_dropped.get(stream, 0) + len(text) - self._emit_max
            text = text[-self._emit_max :]
        self._emit_pending[stream] = text
        self._emit_wakeup.set()

    def _send_events(self) -> None:
        if self._emit is None:
            return
        pending, self._emit_pending = self._emit_pending, {}
        dropped, self._emit_dropped = self._emit_dropped, {}
        for stream, text in pending.items():
            if not text:
                continue
            data: dict[str, Any] = {"stream": stream, "text": text}
            if dropped.get(stream):
                data["dropped"] = dropped[stream]
            self._emit("output", data)
        self._last_emit = trio.current_time()

    async def run_emitter(self) -> None:
        """Send queued events, at most one per stream per interval; runs until cancelled."""
        while True:
            await self._emit_wakeup.wait()
            self._emit_wakeup = trio.Event()
            await trio.sleep_until(self._last_emit + self._emit_interval)
            self._send_events()

    async def wait_output(self, after: int) -> None:
        """Wait until more than ``after`` bytes have been captured in total."""
        while self._total <= after:
            await self._arrived.wait()

    async def aclose(self) -> None:
        """Send the last events and finish the spool file; call once, after the last `feed`."""
        if self._emit is not None:
            for stream, decoder in self._decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    self._emit_pending[stream] = self._emit_pending.get(stream, "") + tail
            self._send_events()
        await self._flush_spool()
        if self._spool_file is not None:
            await trio.to_thread.run_sync(self._spool_file.close)

    # -- reading (any thread) ----------------------------------------------------

    @property
    def total(self) -> int:
        """Bytes captured so far."""
        return self._total

    @property
    def spool_path(self) -> Path | None:
        """The file holding the whole output, once it outgrew the tail (else None)."""
        return self._spool_path

    @property
    def spool_error(self) -> str | None:
        """Why the spool file could not be written, if it could not."""
        return self._spool_error

    @property
    def spool_cut(self) -> str | None:
        """Where and why the spool file ends before the output does (None: it holds all of it, or there is none).

        A sentence for the model: ``"it holds the first 8,388,608 bytes only, as one call saves at most 8 MiB
        (spill.max_call_bytes)"``, or, when nothing could be saved, ``"it was not saved, as ..."``.
        """
        if self._spool_cut is None:
            return None
        if not self._spooled:
            return f"it was not saved, as {self._spool_cut}"
        return f"it holds the first {self._spooled:,} bytes only, as {self._spool_cut}"

    @property
    def unread(self) -> int:
        """Bytes captured since the last `read_new`."""
        return self._total - self._read_pos

    def tail(self, *, max_lines: int | None = None) -> CapturedText:
        """The end of the output: at most the tail buffer, cut to whole lines, at most ``max_lines`` lines."""
        with self._lock:
            data = bytes(self._tail)
            start = self._total - len(data)
        return _decode(data, start, max_lines=max_lines)

    def read_new(self, *, max_lines: int | None = None) -> CapturedText:
        """Output captured since the previous call (as much of it as is still in memory).

        ``omitted`` counts new bytes that were no longer in memory (they are
        in the spool file).
        """
        with self._lock:
            start = self._total - len(self._tail)
            skipped = max(0, start - self._read_pos)
            data = bytes(self._tail[max(0, self._read_pos - start) :])
            self._read_pos = self._total
        return _decode(data, skipped, max_lines=max_lines)


def _decode(data: bytes, omitted: int, *, max_lines: int | None) -> CapturedText:
    if omitted:
        # The buffer starts mid-line (maybe mid-character): start at the next line.
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            omitted += newline + 1
            data = data[newline + 1 :]
    text = clean_terminal_text(data.decode("utf-8", errors="replace"))
    if max_lines is not None:
        lines = text.split("\n")
        if len(lines) > max_lines:
            cut = "\n".join(lines[:-max_lines]) + "\n"
            omitted += len(cut.encode("utf-8", errors="replace"))
            text = "\n".join(lines[-max_lines:])
    return CapturedText(text=text, omitted=omitted)


async def pump(stream: trio.abc.ReceiveStream, name: str, capture: OutputCapture) -> None:
    """Copy ``stream`` into ``capture`` until end of file."""
    while True:
        data = await stream.receive_some(_READ_SIZE)
        if not data:
            return
        await capture.feed(name, data)


async def capture_until_exit(process: ChildProcess, capture: OutputCapture, *, drain: float = 0.25) -> bool:
    """Copy the process's stdout and stderr into ``capture`` until it exits.

    Output keeps being read until both pipes close, but at most ``drain``
    seconds past the process's exit: a process it left running in the
    background may hold the pipes open for ever. Events are sent meanwhile
    (`OutputCapture.run_emitter`).

    Returns:
        True if the pipes were still open ``drain`` seconds after the exit,
        that is, something the command started is still running.
    """
    stdout, stderr = process.stdout, process.stderr
    assert stdout is not None
    assert stderr is not None
    pipes_closed = trio.Event()

    async def pump_both() -> None:
        async with trio.open_nursery() as pumps:
            pumps.start_soon(pump, stdout, "stdout", capture)
            pumps.start_soon(pump, stderr, "stderr", capture)
        pipes_closed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(capture.run_emitter)
        nursery.start_soon(pump_both)
        await process.wait()
        with trio.move_on_after(drain):
            await pipes_closed.wait()
        nursery.cancel_scope.cancel()
    return not pipes_closed.is_set()
