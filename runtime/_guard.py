"""The loop guard: catches blocking file and socket calls made on a trio loop thread.

Every weald loop thread is shared by every loop-hosted actor, so one
blocking call there (reading a FIFO nobody writes, a socket connect, a
directory walk on a slow disk) stalls the whole daemon. The guard is a
`sys.addaudithook` hook: Python raises an audit event for each such call
(``open``, ``os.listdir``, ``os.scandir``, ``sqlite3.connect``, a blocking
``socket.connect``...), and the hook records the ones made on a loop thread,
with the line that made them. It costs one set lookup per audited event
while it is installed, and nothing when it is not.

What it does not see: calls Python does not audit (``os.stat``, ``read`` on
an already open file, ``time.sleep``); single metadata calls (chmod, unlink,
rename, mkdir), as quick as a stat; opening with ``O_PATH`` or
``O_DIRECTORY``, a path lookup; imports, which read their modules once,
from the installation; and reads of ``/proc``, ``/sys`` and ``/dev/null``,
which the kernel answers without waiting on a device.

`install_loop_guard` turns it on (the test suite does, and a daemon started
with ``WEALD_LOOP_GUARD=1`` in its environment, which then also writes each
new call site to stderr); `take_loop_guard_violations` returns what it
caught so far.
"""

from __future__ import annotations

import ipaddress
import linecache
import os
import sys
import threading
import traceback
from typing import Any

import attrs
from weald.runtime._future import LOOP_THREADS

__all__ = ["LOOP_GUARD_ENV", "LoopViolation", "install_loop_guard", "take_loop_guard_violations"]

LOOP_GUARD_ENV = "WEALD_LOOP_GUARD"
"""Set to ``1`` in a daemon's environment to install the guard when its loop starts."""

# Audit events of calls that read or write contents, list directories or
# wait on the network: what may take long. A single metadata call (stat,
# chmod, unlink, rename, mkdir) is as quick as the stat calls Python does
# not audit at all, and is not counted.
_WATCHED = frozenset(
    {
        "open",
        "os.listdir",
        "os.scandir",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.copytree",
        "shutil.move",
        "glob.glob",
        "sqlite3.connect",
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
    }
)
_QUIET = ("/proc", "/sys", "/dev/null")
# Opening with one of these flags reads nothing and waits on no device (a path lookup, as stat does).
_LOOKUP_ONLY = getattr(os, "O_PATH", 0) | os.O_DIRECTORY
_MAX_KEPT = 200
_STDLIB = os.path.dirname(os.__file__)
_LINECACHE = linecache.__file__
# weald's source root (runtime/, tools/, supervisors/ and tests/ sit in it):
# the report names the line there that asked for the call.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_lock = threading.Lock()
_inside = threading.local()  # set while the hook runs: what it does itself is not reported
_installed = False
_echo = False
_violations: list[LoopViolation] = []
_sites: set[tuple[str, str]] = set()


@attrs.frozen
class LoopViolation:
    """A blocking call made on a loop thread.

    Attributes:
        event: the audit event (``open``, ``socket.connect``...).
        target: what it was called on (a path, an address), as text.
        site: where: ``file:line in function``, the first frame outside the standard library.
        stack: the last frames, for the report.
    """

    event: str
    target: str
    site: str
    stack: str

    def __str__(self) -> str:
        return f"{self.event}({self.target}) at {self.site}"


def install_loop_guard(*, echo: bool = False) -> None:
    """Start watching loop threads for blocking calls (once per process; it cannot be removed).

    Args:
        echo: also write each new call site to stderr (for a daemon process).
    """
    global _installed, _echo
    with _lock:
        _echo = _echo or echo
        if _installed:
            return
        _installed = True
    sys.addaudithook(_hook)


def take_loop_guard_violations() -> list[LoopViolation]:
    """The blocking calls caught since the last call (at most a few hundred), oldest first."""
    with _lock:
        caught = list(_violations)
        _violations.clear()
        _sites.clear()
    return caught


def _hook(event: str, args: tuple[Any, ...]) -> None:
    # The fast path: every audited event of the process comes through here.
    if event not in _WATCHED or threading.get_ident() not in LOOP_THREADS or getattr(_inside, "on", False):
        return
    _inside.on = True
    try:
        _report(event, args)
    finally:
        _inside.on = False


def _report(event: str, args: tuple[Any, ...]) -> None:
    target = _target(event, args)
    if target is None:
        return
    # No source lines: reading them would open files, here, on the loop thread.
    frames = traceback.StackSummary.extract(traceback.walk_stack(sys._getframe(2)), limit=16, lookup_lines=False)
    frames.reverse()  # oldest first
    if any(f.filename.startswith("<frozen importlib") for f in frames):
        return  # an import reading its module
    if any(f.filename == _LINECACHE for f in frames):
        return  # a traceback's source lines, for an error being logged (which is the news, not its cost)
    site = next(
        (f for f in reversed(frames) if f.filename.startswith(_ROOT)),
        next((f for f in reversed(frames) if not f.filename.startswith((_STDLIB, "<"))), frames[-1]),
    )
    where = f"{site.filename}:{site.lineno} in {site.name}"
    stack = "".join(f"    {f.filename}:{f.lineno} in {f.name}\n" for f in frames[-8:])
    violation = LoopViolation(event, target, where, stack)
    with _lock:
        if (event, where) in _sites or len(_violations) >= _MAX_KEPT:
            return
        _sites.add((event, where))
        _violations.append(violation)
        echo = _echo
    if echo:
        sys.stderr.write(f"weald: blocking call on the trio loop thread: {violation}\n")


def _target(event: str, args: tuple[Any, ...]) -> str | None:
    """What the call was made on, or None when it cannot block."""
    if event == "socket.connect":
        sock = args[0]
        if not sock.getblocking():
            return None  # trio's sockets: the connect returns at once
        return repr(args[1])
    first = args[0] if args else ""
    if event == "socket.getaddrinfo":
        try:
            ipaddress.ip_address(first.decode() if isinstance(first, bytes) else first)
        except ValueError:
            return repr(first)
        return None  # an address already: nothing to look up (trio's fast path)
    if event == "open":
        if isinstance(first, int):
            return None  # os.fdopen of a descriptor already open
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if flags & _LOOKUP_ONLY:
            return None
    if isinstance(first, str | bytes | os.PathLike):
        path = os.fsdecode(first)
        if any(path == quiet or path.startswith(quiet + "/") for quiet in _QUIET):
            return None
        return repr(path)
    return repr(first)
