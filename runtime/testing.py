"""Helpers for tests of weald systems: wait by condition, never by a bare sleep.

These are public so that projects testing their own agents on weald can use
them too.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio
from weald.runtime._actor import Actor
from weald.runtime._events import Event, EventBus
from weald.runtime._guard import LOOP_GUARD_ENV, LoopViolation, install_loop_guard, take_loop_guard_violations
from weald.runtime.tool_runner import ToolResults

__all__ = [
    "LOOP_GUARD_ENV",
    "LoopViolation",
    "ResultCollector",
    "WaitTimeout",
    "await_until",
    "fill_disk",
    "install_loop_guard",
    "live_members",
    "process_alive",
    "take_loop_guard_violations",
    "wait_for_event",
    "wait_mcp_running",
    "wait_until",
]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not become true in time (an AssertionError, so tests fail clearly)."""


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.001,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Block until ``predicate()`` is truthy and return its value.

    The predicate is polled with a growing interval (capped at 50 ms), so
    a condition that is already true costs one call.

    Raises:
        WaitTimeout: still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            msg = f"timed out after {timeout} s waiting for {text}"
            raise WaitTimeout(msg)
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


async def await_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.001,
    message: str = "condition",
) -> T:
    """`wait_until` for trio code."""
    delay = interval
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await trio.sleep(delay)
            delay = min(delay * 2, 0.05)
    msg = f"timed out after {timeout} s waiting for {message}"
    raise WaitTimeout(msg)


def wait_for_event(
    bus: EventBus,
    topic: str,
    where: Callable[[Event], bool] | None = None,
    *,
    timeout: float = 10.0,
    since: int = 0,
) -> Event:
    """Block until an event matching ``topic`` (and ``where``) with seq > ``since`` is published.

    Events already in the bus's ring count, so there is no race between
    causing an event and starting to wait for it.

    Raises:
        WaitTimeout: no such event within ``timeout`` seconds.
    """
    with bus.subscribe(topic) as sub:
        for event in bus.recent(limit=1000000, topic=topic):
            if event.seq > since and (where is None or where(event)):
                return event
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            event_or_none = sub.get(timeout=max(remaining, 0.0)) if remaining > 0 else None
            if event_or_none is None:
                msg = f"timed out after {timeout} s waiting for a {topic!r} event"
                raise WaitTimeout(msg)
            if event_or_none.seq > since and (where is None or where(event_or_none)):
                return event_or_none


def wait_mcp_running(ref: Any, *, timeout: float = 30.0) -> Any:
    """Block until the MCP connection actor ``ref`` is ``running``; returns its snapshot.

    An `weald.runtime.mcp.MCPConnection` starts connecting when it starts and
    is connected (its tools registered) a moment later; this waits for that.

    Raises:
        WaitTimeout: not running within ``timeout`` seconds (the message
            carries its status and last error).
    """
    last: list[Any] = []

    def running() -> Any:
        snapshot = ref.proxy().snapshot().get(timeout=timeout)
        last[:] = [snapshot]
        return snapshot if snapshot.status == "running" else None

    def why() -> str:
        snapshot = last[0] if last else None
        if snapshot is None:
            return f"{ref} to be running"
        return f"{ref} to be running; it is {snapshot.status}, last error: {snapshot.last_error}"

    return wait_until(running, timeout=timeout, message=why)


class ResultCollector(Actor):
    """Stands in for an agent in tool-runner tests: keeps the `ToolResults` it is sent.

    Give its ref as a `RunCalls` reply-to, then wait on ``result(batch_id)``
    through a proxy, e.g. ``wait_until(lambda: collector.proxy().result(b).get())``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._results: list[ToolResults] = []

    def on_receive(self, message: Any) -> None:
        """Keep a `ToolResults`; ignore anything else."""
        if isinstance(message, ToolResults):
            self._results.append(message)

    def received(self) -> list[ToolResults]:
        """Every `ToolResults` so far, in the order they arrived (a batch sent twice shows twice)."""
        return list(self._results)

    def result(self, batch_id: str) -> ToolResults | None:
        """The first results of batch ``batch_id``; None while it runs."""
        return next((r for r in self._results if r.batch_id == batch_id), None)


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat.rpartition(b")")[2].split()  # the command name may hold spaces and parens


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux, from /proc): a zombie waiting to be reaped is dead."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in (b"Z", b"X")


def live_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid`` or in session ``pgid`` (Linux, from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is not None and fields[0] not in (b"Z", b"X") and pgid in (int(fields[2]), int(fields[3])):
            found.append(int(entry.name))
    return found


def fill_disk(directory: Path) -> Path:
    """Write a file in ``directory`` until its device is full (ENOSPC); returns the file.

    For tests of what happens when the disk fills up: use a small filesystem
    of the test's own (a tmpfs), never a shared one.
    """
    filler = directory / "weald-filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 65536, 4096, 512, 1):
            chunk = b"\0" * size
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler
