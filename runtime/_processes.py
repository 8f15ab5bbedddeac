"""Child processes that die with the daemon, and the marks that find what a dead daemon left behind.

Spawning. `open_child_process` starts a program the way ``trio.lowlevel.open_process``
does (pipes as trio streams, an awaitable exit), with one difference that
matters: the fork happens on one long-lived thread of this process (the
*spawner*), and the child asks the kernel for ``SIGKILL`` when its parent
dies (``PR_SET_PDEATHSIG``, set through ``prctl`` in the child before it
runs the program). The kernel sends that signal when the *thread* that
forked the child exits, not the process: trio forks on a worker thread of
its cache, and those exit after ten idle seconds, which would kill every
child with them. The spawner thread lives as long as the process, so the
signal comes exactly when the process dies, kill -9 included.

The child asks for the signal by running ``setpriv --pdeathsig KILL`` (from
util-linux), which then executes the program in its place: CPython can set
it only with a ``preexec_fn``, which makes the fork a full fork of this
(large) process instead of a vfork, about 5 ms per spawn against 2 ms for
the extra exec. Without ``setpriv`` the ``preexec_fn`` is the fallback. The
program is looked up on ``PATH`` first, so that a missing one still fails
at once with ``FileNotFoundError``. A child started with
``die_with_parent=False`` (bubblewrap, which sets the same signal for itself
with ``--die-with-parent``) is forked on the spawner thread too, for the
same reason.

The signal reaches only the child itself: what it started lives on (the
signal is not inherited). Those are found by their *mark*, below, or never
get out at all when the child is bubblewrap with its own PID namespace.

Marks. Every process a tool or an MCP stdio server starts carries
``WEALD_PROCESS_MARK=<state>.<owner>.<call>`` in its environment, which its
own children inherit: ``<state>`` names the daemon's state directory (a
hash of its real path), ``<owner>`` the daemon process (pid and start
time, so a reused pid is not mistaken for it), ``<call>`` the one command.
`marked_processes` finds a call's processes wherever they went (a
``setsid`` or a double fork leaves the process group, not the
environment); `stop_leftover_processes`, run when a daemon starts, finds
every process marked for its state directory by a daemon process that no
longer runs, and stops it. A process that rebuilds its environment from
nothing (``env -i``) drops the mark; only a PID namespace contains those.

Threads: `open_child_process` and `ChildProcess.wait` run in a trio task;
everything else may be called from any thread. Reading ``/proc`` never
blocks on a disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import io
import logging
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

__all__ = [
    "MARK_VARIABLE",
    "ChildProcess",
    "LeftoverProcess",
    "marked_processes",
    "new_process_mark",
    "open_child_process",
    "scan_proc",
    "set_process_owner",
    "stop_leftover_processes",
]

logger = logging.getLogger("weald.runtime")

MARK_VARIABLE = "WEALD_PROCESS_MARK"
"""The environment variable that marks every process a tool call or an MCP server started."""

_PR_SET_PDEATHSIG = 1
_LIBC: Any = None
if sys.platform == "linux":
    with contextlib.suppress(OSError):
        _LIBC = ctypes.CDLL(None, use_errno=True)

_PROC = Path("/proc")


# -- spawning --------------------------------------------------------------------------------------


class _Spawner:
    """The one thread that forks children, so that their parent-death signal means the process's death.

    Requests are callables run in order; each result goes back through the
    ``deliver`` callback its caller gave. The thread is a daemon thread
    started on first use and never stopped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]]]
        self._requests = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any], deliver: Callable[[Any, BaseException | None], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="weald-spawner", daemon=True)
                self._thread.start()
        self._requests.put((fn, deliver))

    def _serve(self) -> None:
        while True:
            fn, deliver = self._requests.get()
            try:
                result, error = fn(), None
            except BaseException as exc:  # reported to the caller, never kills the spawner (its children with it)
                result, error = None, exc
            try:
                deliver(result, error)
            except Exception:  # the caller's loop is gone: nothing waits for this child any more
                logger.exception("a spawned child could not be handed to its caller")
                if isinstance(result, _Spawned):
                    result.abandon()


_SPAWNER = _Spawner()


def _die_with_parent(parent: int) -> None:
    """Runs in the child between fork and exec: SIGKILL this process when the forking thread dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        # The parent died before the signal was asked for: it will never come.
        os.kill(os.getpid(), signal.SIGKILL)


@functools.cache
def _setpriv() -> str | None:
    """``setpriv`` when it can set a parent-death signal (util-linux 2.33+), else None; runs it once."""
    program = shutil.which("setpriv")
    true = shutil.which("true")
    if program is None or true is None:
        return None
    try:
        done = subprocess.run(  # noqa: S603 - a fixed probe
            [program, "--pdeathsig", "KILL", "--", true], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return program if done.returncode == 0 else None


def _resolve(program: str, cwd: str | os.PathLike[str] | None, env: Mapping[str, str] | None) -> str:
    """The program ``execvp`` would run, checked as Popen checks it (which a wrapper would not).

    Raises:
        FileNotFoundError: there is no such program.
        PermissionError: it is not executable.
    """
    if os.sep in program:
        path = os.path.join(os.fspath(cwd), program) if cwd is not None else program
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return program  # the child runs in cwd already
    search = (os.environ if env is None else env).get("PATH", os.defpath)
    found = shutil.which(program, path=search)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return found


class _Spawned:
    """A Popen and its pidfd, as the spawner thread hands them over."""

    __slots__ = ("pidfd", "popen")

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pidfd: io.FileIO | None = None
        with contextlib.suppress(OSError, AttributeError):  # no pidfd_open: waiting polls instead
            self.pidfd = io.FileIO(os.pidfd_open(popen.pid), "r")

    def abandon(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.popen.kill()
        self.popen.wait()
        if self.pidfd is not None:
            self.pidfd.close()


_CREATE = object()


class ChildProcess:
    """A running child process and its pipes; created by `open_child_process` only.

    The interface of ``trio.Process`` that weald uses: ``pid``,
    ``returncode`` (reading it reaps the child once it has exited),
    ``wait()``, and ``stdin``, ``stdout``, ``stderr`` as trio streams (or
    None when not piped). One task at a time may ``wait``.
    """

    def __init__(
        self,
        spawned: _Spawned,
        stdin: trio.lowlevel.FdStream | None,
        stdout: trio.lowlevel.FdStream | None,
        stderr: trio.lowlevel.FdStream | None,
        *,
        _create: object = None,
    ) -> None:
        if _create is not _CREATE:
            msg = "ChildProcess has no public constructor; use open_child_process"
            raise TypeError(msg)
        self._popen = spawned.popen
        self._pidfd = spawned.pidfd
        self.pid: int = spawned.popen.pid
        self.args = spawned.popen.args
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._wait_lock = trio.Lock()

    def __repr__(self) -> str:
        code = self.returncode
        return f"<ChildProcess {self.pid} {'running' if code is None else f'exited {code}'}>"

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal), else None."""
        code = self._popen.poll()
        if code is not None:
            self._close_pidfd()
        return code

    def poll(self) -> int | None:
        """The same as `returncode`."""
        return self.returncode

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(RuntimeError):  # outside trio: nothing can be waiting on it
                trio.lowlevel.notify_closing(self._pidfd.fileno())
            self._pidfd.close()
            self._pidfd = None

    async def wait(self) -> int:
        """Wait until the child exits; return its status (see `returncode`)."""
        async with self._wait_lock:
            if self.returncode is None:
                if self._pidfd is not None:
                    with contextlib.suppress(trio.ClosedResourceError):
                        await trio.lowlevel.wait_readable(self._pidfd.fileno())
                else:  # no pidfd (not Linux, or an old kernel): a worker thread waits
                    await trio.to_thread.run_sync(self._popen.wait, abandon_on_cancel=True)
                self._popen.wait()
                self._close_pidfd()
        code = self._popen.returncode
        assert code is not None
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the child (not to its group)."""
        self._popen.send_signal(sig)


async def open_child_process(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int = subprocess.DEVNULL,
    stdout: int = subprocess.PIPE,
    stderr: int = subprocess.PIPE,
    start_new_session: bool = True,
    pass_fds: Sequence[int] = (),
    die_with_parent: bool = True,
) -> ChildProcess:
    """Start ``argv`` from the spawner thread; it gets SIGKILL if this process dies.

    Args:
        argv: the program and its arguments.
        cwd: where it runs (None: here).
        env: its whole environment (None: this process's).
        stdin: ``subprocess.PIPE`` (then ``process.stdin`` is a trio stream),
            ``subprocess.DEVNULL``, or a descriptor.
        stdout: the same, for its output (``process.stdout``).
        stderr: the same, for its errors (``process.stderr``).
        start_new_session: run it in a session (and process group) of its own.
        pass_fds: descriptors it inherits at the same numbers.
        die_with_parent: ask for ``PR_SET_PDEATHSIG`` in the child. False for
            a program that asks for it itself (``bwrap --die-with-parent``):
            the fork is then a vfork, which is faster.

    Raises:
        OSError: the program could not be started.
    """
    parent = os.getpid()
    streams: dict[str, trio.lowlevel.FdStream | None] = {"stdin": None, "stdout": None, "stderr": None}
    child_fds = {"stdin": stdin, "stdout": stdout, "stderr": stderr}
    with ExitStack() as always, ExitStack() as on_failure:
        for name in ("stdin", "stdout", "stderr"):
            if child_fds[name] != subprocess.PIPE:
                continue
            read_end, write_end = os.pipe()
            ours, theirs = (write_end, read_end) if name == "stdin" else (read_end, write_end)
            stream = trio.lowlevel.FdStream(ours)
            on_failure.callback(stream.close)
            always.callback(os.close, theirs)
            streams[name] = stream
            child_fds[name] = theirs

        def popen() -> subprocess.Popen[bytes]:
            command, preexec = list(argv), None
            if die_with_parent:
                setpriv = _setpriv()
                if setpriv is not None:
                    command = [setpriv, "--pdeathsig", "KILL", "--", _resolve(command[0], cwd, env), *command[1:]]
                else:
                    preexec = functools.partial(_die_with_parent, parent)
            return subprocess.Popen(  # noqa: S603 - the caller's command, as trio.lowlevel.open_process runs it
                command,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=child_fds["stdin"],
                stdout=child_fds["stdout"],
                stderr=child_fds["stderr"],
                start_new_session=start_new_session,
                pass_fds=tuple(pass_fds),
                # Safe with threads as written: it makes one system call
                # through a library loaded before the fork, takes no lock.
                preexec_fn=preexec,  # noqa: PLW1509
            )

        # Shielded: a child forked while we were being cancelled must still
        # be handed over (its caller's cleanup stops it), never lost.
        with trio.CancelScope(shield=True):
            spawned = await _run_on_spawner(lambda: _Spawned(popen()))
        on_failure.pop_all()
    return ChildProcess(spawned, streams["stdin"], streams["stdout"], streams["stderr"], _create=_CREATE)


async def _run_on_spawner(fn: Callable[[], _Spawned]) -> _Spawned:
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[Any] = []

    def deliver(result: Any, error: BaseException | None) -> None:
        box.append((result, error))
        token.run_sync_soon(done.set)

    _SPAWNER.submit(fn, deliver)
    await done.wait()
    result, error = box[0]
    if error is not None:
        raise error
    spawned: _Spawned = result
    return spawned


# -- /proc -----------------------------------------------------------------------------------------


def scan_proc(entry: str, accept: Callable[[bytes], bool]) -> list[int] | None:
    """Pids whose ``/proc/<pid>/<entry>`` content ``accept`` takes; None when /proc cannot be read.

    procfs reads come from kernel memory, never from a disk: they do not
    block. A process that is gone, or that this user may not read, is skipped.
    """
    try:
        names = os.listdir(_PROC)
    except OSError:
        return None
    found = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/{entry}", "rb") as f:
                content = f.read()
        except OSError:
            continue
        if accept(content):
            found.append(int(name))
    return found


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after ``(comm)``: state first; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rpartition(b")")[2].split()


def _start_time(pid: int | str) -> str | None:
    """When ``pid`` started (clock ticks since boot, field 22 of its stat), or None when it is not running."""
    fields = _stat(pid)
    if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode()


# -- marks -----------------------------------------------------------------------------------------


def _state_key(state_dir: str | os.PathLike[str]) -> str:
    real = os.path.realpath(os.fspath(state_dir))
    return hashlib.sha256(os.fsencode(real)).hexdigest()[:16]


_owner_lock = threading.Lock()
_owner_state = "-"  # no daemon: marks name no state directory, and no sweep ever matches them


def set_process_owner(state_dir: str | os.PathLike[str]) -> None:
    """Mark this process's children as those of the daemon on ``state_dir`` from now on.

    A daemon calls it when it starts. One daemon per process is the normal
    case; when a program hosts several one after another (tests), marks
    name the latest, which matters only to the sweep after a crash.
    """
    global _owner_state
    with _owner_lock:
        _owner_state = _state_key(state_dir)


@functools.cache
def _owner_process() -> str:
    return f"{os.getpid()}-{_start_time('self') or 0}"


def new_process_mark() -> str:
    """A fresh mark for one command's processes: this daemon's state directory and process, and a random part."""
    with _owner_lock:
        state = _owner_state
    # Recomputed after a fork: the cache holds the pid it was computed in.
    owner = _owner_process()
    if not owner.startswith(f"{os.getpid()}-"):
        _owner_process.cache_clear()
        owner = _owner_process()
    return f"{state}.{owner}.{secrets.token_hex(8)}"


def marked_processes(mark: str) -> list[int] | None:
    """Live processes (any parent, any session) whose environment carries ``MARK_VARIABLE=mark``.

    One read of ``/proc/<pid>/environ`` per process: about 0.2 ms for 70
    processes. Zombies have an empty environment, so they do not count.
    Processes of other users cannot be read, so they do not either.

    Returns:
        Their pids, or None when /proc cannot be read (not Linux).
    """
    entry = b"\0" + MARK_VARIABLE.encode() + b"=" + mark.encode() + b"\0"
    return scan_proc("environ", lambda environ: entry in b"\0" + environ)


@attrs.frozen
class LeftoverProcess:
    """A process a dead daemon started on the same state directory, found at the next start.

    Attributes:
        pid: its process id.
        command: its command line (at most 200 characters).
        owner_pid: the pid of the daemon process that started it (no longer running).
        stopped: True once it is gone (SIGTERM, then SIGKILL after the grace period).
    """

    pid: int
    command: str
    owner_pid: int
    stopped: bool


def _leftovers(state_dir: str | os.PathLike[str]) -> dict[int, tuple[str, int]]:
    """Live processes marked for ``state_dir`` by a daemon process that is gone: pid -> (command, owner pid)."""
    prefix = f"{MARK_VARIABLE}={_state_key(state_dir)}.".encode()
    found: dict[int, tuple[str, int]] = {}
    # A daemon started from a dead daemon's shell carries its mark, and so do
    # the processes it runs under: none of them is a leftover to stop.
    spared = _ancestors()
    for pid in scan_proc("environ", lambda environ: b"\0" + prefix in b"\0" + environ) or ():
        if pid in spared:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                entries = f.read().split(b"\0")
        except OSError:
            continue
        value = next((e[len(prefix) :] for e in entries if e.startswith(prefix)), b"")
        owner, _, _call = value.decode("ascii", "replace").partition(".")
        owner_pid_text, _, owner_start = owner.partition("-")
        if not owner_pid_text.isdigit():
            continue
        owner_pid = int(owner_pid_text)
        if _start_time(owner_pid) == owner_start:
            continue  # its daemon runs (this one, or another process on the same state directory)
        if _start_time(pid) is None:
            continue  # a zombie
        found[pid] = (_command_line(pid), owner_pid)
    return found


def _ancestors() -> set[int]:
    """This process and its ancestors."""
    chain = set()
    pid = os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        fields = _stat(pid)
        if fields is None or len(fields) < 2:
            break
        pid = int(fields[1])
    return chain


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]


def stop_leftover_processes(
    state_dir: str | os.PathLike[str], *, grace: float = 2.0, kill_wait: float = 5.0
) -> list[LeftoverProcess]:
    """Stop every process a dead daemon on ``state_dir`` left running; blocks until they are gone.

    A daemon that was killed (kill -9, a crash, the machine's OOM killer)
    could not stop what its tools and MCP servers had started. Run at
    start, before anything new is spawned: the processes marked for this
    state directory by a daemon process that no longer runs get SIGTERM
    (and SIGCONT), and SIGKILL after ``grace`` seconds.

    Returns:
        What was found, each saying whether it is gone (it is not when it
        stayed alive ``kill_wait`` seconds after SIGKILL: stuck in the kernel).
    """
    found = _leftovers(state_dir)
    if not found:
        return []
    remaining = set(found)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        for pid in sorted(remaining):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                if sig == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + wait
        while remaining and time.monotonic() < deadline:
            time.sleep(0.01)
            remaining = {pid for pid in remaining if _start_time(pid) is not None}
        if not remaining:
            break
    return [
        LeftoverProcess(pid=pid, command=command, owner_pid=owner, stopped=pid not in remaining)
        for pid, (command, owner) in sorted(found.items())
    ]
