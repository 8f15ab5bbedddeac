"""Spill files: tool output too long for the model, saved for it to read, within bounds.

When a tool's output is cut to fit the model's limits, the whole of it is
saved to a file (a *spill file*) that the model can read or search. Each
session spills into a directory of its own, and a `SpillBudget` bounds what
it writes there:

- per call, ``max_call_bytes``: the file holds the output's first bytes up
  to that limit, and the model is told where it was cut;
- per session, ``max_session_bytes`` in all (files already in the
  directory count, so a restarted daemon goes on where it was);
- on the device, ``min_free_bytes``: nothing is spilled that would leave
  less free space than this, so that a flood of output can never take the
  space the store needs to commit (point ``spill.dir`` at another
  filesystem to keep them apart entirely).

A session's directory is removed when the session is stopped for good
(`remove_spill_dir`); directories no stored session owns are removed when
the daemon starts, once they are older than the retention period
(`sweep_spill_dirs`).

Threads: every method here touches the file system and blocks; call them
from worker threads, never from the trio loop. `SpillBudget` is thread-safe.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Collection
from pathlib import Path

import attrs

__all__ = [
    "DEFAULT_MAX_CALL_BYTES",
    "DEFAULT_MAX_SESSION_BYTES",
    "DEFAULT_MIN_FREE_BYTES",
    "DEFAULT_RETENTION",
    "SpillBudget",
    "SpillLimits",
    "format_bytes",
    "remove_spill_dir",
    "sweep_spill_dirs",
]

DEFAULT_MAX_CALL_BYTES = 8 * 1024 * 1024
"""The most one call's saved output may hold (``spill.max_call_bytes``)."""

DEFAULT_MAX_SESSION_BYTES = 256 * 1024 * 1024
"""The most one session's saved outputs may hold in all (``spill.max_session_bytes``)."""

DEFAULT_MIN_FREE_BYTES = 256 * 1024 * 1024
"""Free space spilling never goes below, on the spill directory's device (``spill.min_free_bytes``)."""

DEFAULT_RETENTION = 24 * 3600.0
"""Seconds before the daemon removes a spill directory no stored session owns (``spill.retention``)."""


def format_bytes(size: int) -> str:
    """``8 MiB``, ``512 KiB``, ``700 bytes``: a size for a message."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{size} bytes"


@attrs.frozen
class SpillLimits:
    """The bounds on spilled output (``[spill]`` in ``weald.toml``).

    Attributes:
        max_call_bytes: the most one call's saved output holds.
        max_session_bytes: the most one session's saved outputs hold in all.
        min_free_bytes: free space on the spill directory's device that
            spilling leaves untouched.
    """

    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES
    max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES


class SpillBudget:
    """One session's spill directory, and how much more may be saved there.

    A writer asks `grant` before each write and writes at most what it is
    granted; once a call is granted less than it asked for, its file ends
    there, and `grant` says why (for the model).

    Args:
        directory: the session's spill directory (created on first use).
        limits: the bounds.
    """

    def __init__(self, directory: Path, limits: SpillLimits | None = None) -> None:
        self.directory = Path(directory)
        self.limits = limits if limits is not None else SpillLimits()
        self._lock = threading.Lock()
        self._used: int | None = None  # counted from the directory on first use

    def __repr__(self) -> str:
        return f"<SpillBudget {self.directory} used={self._used}>"

    @property
    def used(self) -> int:
        """Bytes this session's spill files hold (as far as the budget knows)."""
        with self._lock:
            return self._count_locked()

    def _count_locked(self) -> int:
        if self._used is None:
            self._used = _tree_size(self.directory)
        return self._used

    def grant(self, wanted: int, saved: int) -> tuple[int, str | None]:
        """How many of ``wanted`` more bytes a call that has saved ``saved`` bytes may write now.

        The bytes granted count as used at once (return what was not
        written with `give_back`).

        Returns:
            The bytes granted, and, when that is less than ``wanted``, why:
            a sentence naming the limit and the setting that sets it.
        """
        limits = self.limits
        with self._lock:
            used = self._count_locked()
            rooms = [
                (
                    limits.max_call_bytes - saved,
                    f"one call saves at most {format_bytes(limits.max_call_bytes)} (spill.max_call_bytes)",
                ),
                (
                    limits.max_session_bytes - used,
                    f"this session's saved outputs reached {format_bytes(limits.max_session_bytes)} "
                    "(spill.max_session_bytes)",
                ),
            ]
            free = _free_space(self.directory)
            if free is not None:
                rooms.append(
                    (
                        free - limits.min_free_bytes,
                        f"only {format_bytes(free)} is free on the device holding {self.directory}, and "
                        f"{format_bytes(limits.min_free_bytes)} is kept free for the store (spill.min_free_bytes)",
                    )
                )
            room, why = min(rooms, key=lambda r: r[0])
            granted = max(0, min(wanted, room))
            self._used = used + granted
        return granted, (why if granted < wanted else None)

    def give_back(self, size: int) -> None:
        """Return granted bytes that were not written (a write failed)."""
        with self._lock:
            self._used = max(0, self._count_locked() - size)


def remove_spill_dir(directory: Path) -> None:
    """Remove a session's spill directory and everything in it (it may be missing)."""
    shutil.rmtree(directory, ignore_errors=True)


def sweep_spill_dirs(root: Path, keep: Collection[str], retention: float, *, now: float | None = None) -> list[Path]:
    """Remove the spill directories under ``root`` that no live session owns and nothing touched lately.

    Args:
        root: the directory holding one spill directory per session.
        keep: names (session ids) whose directories stay, whatever their age.
        retention: seconds since anything in a directory last changed
            before it is removed.
        now: the current time (for tests); `time.time` if None.

    Returns:
        The directories removed.
    """
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if entry.name in keep or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if now - _newest_change(path) >= retention:
            remove_spill_dir(path)
            removed.append(path)
    return removed


def _tree_size(directory: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _newest_change(directory: Path) -> float:
    newest = 0.0
    for dirpath, _, filenames in os.walk(directory):
        for path in (dirpath, *(os.path.join(dirpath, n) for n in filenames)):
            try:
                newest = max(newest, os.lstat(path).st_mtime)
            except OSError:
                continue
    return newest


def _free_space(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the device holding ``directory`` (its nearest existing parent)."""
    for path in (directory, *directory.parents):
        try:
            stats = os.statvfs(path)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize
    return None
