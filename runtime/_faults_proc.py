"""Finding and killing the process groups that faults aim at, from ``/proc``.

weald starts every subprocess (shell commands, ripgrep, MCP stdio servers)
with ``start_new_session=True``, so its pid is also its process group id and
its session id, and its parent is this process. A ``kill_subprocess`` fault
finds the one its tool call started among this process's session-leader
children: exactly, by an environment variable the call passes down (the
shell tool puts ``[tools.shell] env`` into its command's
environment), or, for tools that do not pass it, as a child that appeared
after the call began.

Everything here is non-blocking: procfs reads come from kernel memory, never
from a disk. Without ``/proc`` (not Linux) nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

__all__ = ["MARK_VARIABLE", "find_group", "group_alive", "kill_group", "marked_processes", "session_leaders"]

#: The environment variable that marks the processes of one faulted tool call.
MARK_VARIABLE = "WEALD_FAULT_MARK"

_MARK_PREFIX = MARK_VARIABLE.encode() + b"="


def _stat(pid: str) -> tuple[bytes, int, int, int] | None:
    """``(state, ppid, pgrp, session)`` of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
    fields = stat.rpartition(b")")[2].split()
    if len(fields) < 4:
        return None
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _pids() -> Iterator[str]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    yield from (name for name in names if name.isdigit())


def session_leaders() -> set[int]:
    """Live children of this process that lead a session of their own (zombies excluded)."""
    me = os.getpid()
    found = set()
    for name in _pids():
        stat = _stat(name)
        if stat is None:
            continue
        state, ppid, _, session = stat
        if ppid == me and session == int(name) and state not in (b"Z", b"X"):
            found.add(int(name))
    return found


def _environ(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return None


def _mark_of(pid: int) -> bytes | None:
    """The value of the mark variable in ``pid``'s environment, b"" if it has none, None if unreadable."""
    environ = _environ(pid)
    if environ is None:
        return None
    for entry in environ:
        if entry.startswith(_MARK_PREFIX):
            return entry[len(_MARK_PREFIX) :]
    return b""


def find_group(mark: str, before: set[int], *, unmarked: bool) -> int | None:
    """The process group a faulted call started, if it has started one yet.

    Args:
        mark: the call's mark; a session-leader child carrying it is the one.
        before: session-leader children that existed before the call began.
        unmarked: also accept a new child carrying no mark at all (for tools
            that do not pass the mark on to their subprocess).

    Returns:
        The group's id (its leader's pid), or None.
    """
    wanted = mark.encode()
    fallback = None
    for pid in sorted(session_leaders() - before):
        value = _mark_of(pid)
        if value == wanted:
            return pid
        if unmarked and value == b"" and fallback is None:
            fallback = pid
    return fallback


def marked_processes(mark: str) -> list[int]:
    """Every live process (any parent) whose environment carries ``mark``: what a kill left behind."""
    wanted = mark.encode()
    found = []
    for name in _pids():
        stat = _stat(name)
        if stat is None or stat[0] in (b"Z", b"X"):
            continue
        if _mark_of(int(name)) == wanted:
            found.append(int(name))
    return found


def group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in group or session ``pgid``."""
    for name in _pids():
        stat = _stat(name)
        if stat is not None and stat[0] not in (b"Z", b"X") and pgid in (stat[2], stat[3]):
            return True
    return False


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` and whatever of its session moved to other groups."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    for name in _pids():
        stat = _stat(name)
        if stat is not None and stat[3] == pgid and stat[2] != pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(name), signal.SIGKILL)
