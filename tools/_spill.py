"""Spill files: tool output too long for the model, saved for it to read, within bounds.

When a tool's output is cut to fit the model's limits, the whole of it is
saved to a file (a *spill file*) that the model can read or search. Each
session spills into a directory of its own, and a `SpillBudget` bounds what
it writes there:

- per call, ``max_call_bytes``: the file holds the output's first bytes up
  to that limit, and the model is told where it was cut;
- per session, ``max_session_bytes`` in all, across every node that ran
  the session (the count is kept in the store, so a restarted daemon goes on
  where it was);
- on the device, ``min_free_bytes``: nothing is spilled that would leave
  less free space than this, so that a flood of output can never take the
  space the store needs to commit (point ``spill.dir`` at another
  filesystem to keep them apart entirely).

The files stay on the node's own disk; their bookkeeping lives in the
store with everything else (namespace ``spill``, `SPILL_NAMESPACE`): one
`SpillRow` per session and node, holding the directory, the bytes and files
it holds and when that last changed. A budget given a `SpillLedger` starts
from the session's rows (every node's: the per-session limit holds across a
cluster) and writes its node's row at each change, queued into the store's
group commit and fenced by the session's placement; only a session with no
row of this node yet (a store from before the rows) has its directory walked
once, and that row is written then. Without a ledger (a tool used on its
own) the budget counts its directory on first use.

A session's directory is removed when the session is stopped for good
(`remove_spill_dir`, and its rows with `forget_spill`); the daemon, when it
starts, removes the directories and rows of sessions that are gone (from
the rows), and directories no row names once they are older than the
retention period (`sweep_spill_dirs`).

Threads: every method here touches the file system or the store and
blocks; call them from worker threads, never from the trio loop.
`SpillBudget` is thread-safe.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import attrs
import msgspec
from weald.runtime import Store, StoreError

__all__ = [
    "DEFAULT_MAX_CALL_BYTES",
    "DEFAULT_MAX_SESSION_BYTES",
    "DEFAULT_MIN_FREE_BYTES",
    "DEFAULT_RETENTION",
    "SPILL_NAMESPACE",
    "SpillBudget",
    "SpillLedger",
    "SpillLimits",
    "SpillRow",
    "forget_spill",
    "format_bytes",
    "remove_spill_dir",
    "session_spill",
    "spill_key",
    "sweep_spill_dirs",
]

logger = logging.getLogger("weald.tools")

SPILL_NAMESPACE = "spill"
"""The store's namespace of spill bookkeeping: one `SpillRow` per session and node, under `spill_key`."""

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


class SpillRow(msgspec.Struct, kw_only=True, frozen=True):
    """One node's spill directory of one session, as the store keeps it (`SPILL_NAMESPACE`, key `spill_key`).

    Attributes:
        session: the session's id.
        node: the node whose disk holds the directory.
        directory: the directory.
        bytes: what its spill files hold.
        files: how many spill files it holds.
        changed: when this last changed (seconds since the epoch).
    """

    session: str
    node: str
    directory: str
    bytes: int = 0
    files: int = 0
    changed: float = 0.0


def spill_key(session_id: str, node_id: str) -> str:
    """The key of a session's row for one node (session ids hold no ``/``: a session's rows share its prefix)."""
    return f"{session_id}/{node_id}"


def session_spill(store: Store, session_id: str) -> list[SpillRow]:
    """Every node's row of a session (blocking; rows that cannot be decoded are left out)."""
    good, _ = store.scan(SPILL_NAMESPACE, f"{session_id}/", type=SpillRow)
    return [row for _, row in good]


def forget_spill(store: Store, session_ids: Iterable[str]) -> int:
    """Delete the rows of ``session_ids`` (every node's), committed; returns how many there were (blocking)."""
    keys = [key for session in session_ids for key in store.keys(SPILL_NAMESPACE, f"{session}/")]
    return store.delete_many(SPILL_NAMESPACE, keys) if keys else 0


class SpillLedger:
    """A session's spill bookkeeping in the store, as one node's `SpillBudget` keeps it.

    Args:
        store: the store (a callable: the daemon's store actor may open a
            new one after a restart).
        session_id: the session.
        node_id: the node whose disk holds the budget's directory.
        record: how this node's row is written (``SpillRow`` -> None, must
            not block); None: queued at once with ``Store.enqueue_nowait``,
            fenced by the session's placement. A runner on a weald loop
            passes one that enqueues on the loop, so the row is gathered
            into the turn's group commit rather than committed apart.
    """

    __slots__ = ("_record", "_store", "node_id", "session_id")

    def __init__(
        self,
        store: Callable[[], Store],
        session_id: str,
        node_id: str,
        *,
        record: Callable[[SpillRow], None] | None = None,
    ) -> None:
        self._store = store
        self.session_id = session_id
        self.node_id = node_id
        self._record = record

    def __repr__(self) -> str:
        return f"<SpillLedger {spill_key(self.session_id, self.node_id)}>"

    def load(self) -> tuple[SpillRow | None, int]:
        """This node's row of the session (None if it has none), and the bytes of the other nodes' rows (blocking).

        Raises:
            StoreError: the store cannot be read.
        """
        own: SpillRow | None = None
        others = 0
        for row in session_spill(self._store(), self.session_id):
            if row.node == self.node_id:
                own = row
            else:
                others += row.bytes
        return own, others

    def record(self, row: SpillRow) -> None:
        """Write this node's row (queued, fenced by the session's placement); a refusal is logged, not raised."""
        try:
            if self._record is not None:
                self._record(row)
            else:
                self.enqueue(row)
        except StoreError as exc:
            logger.warning("the spill bookkeeping of session %s could not be written: %s", self.session_id, exc)

    def enqueue(self, row: SpillRow) -> None:
        """Queue this node's row into the store's group commit, fenced by the session (non-blocking).

        Raises:
            StoreError: the store refuses queued writes (closed, or earlier
                writes wait to be committed).
        """
        self._store().enqueue_nowait(
            SPILL_NAMESPACE, spill_key(self.session_id, self.node_id), row, session=self.session_id
        )


class SpillBudget:
    """One session's spill directory, and how much more may be saved there.

    A writer asks `grant` before each write and writes at most what it is
    granted; once a call is granted less than it asked for, its file ends
    there, and `grant` says why (for the model). A call's first grant
    (``saved == 0``) starts a file.

    Args:
        directory: the session's spill directory (created on first use).
        limits: the bounds.
        ledger: where the session's count lives in the store (see the
            module docstring); None: counted from the directory on first use.
    """

    def __init__(
        self, directory: Path, limits: SpillLimits | None = None, *, ledger: SpillLedger | None = None
    ) -> None:
        self.directory = Path(directory)
        self.limits = limits if limits is not None else SpillLimits()
        self.ledger = ledger
        self._lock = threading.Lock()
        # Counted on first use: this node's bytes and files, and the other nodes' bytes (from the ledger's rows).
        self._used: int | None = None
        self._files = 0
        self._others = 0

    def __repr__(self) -> str:
        return f"<SpillBudget {self.directory} used={self._used}>"

    @property
    def used(self) -> int:
        """Bytes this session's spill files hold, on every node (as far as the budget knows)."""
        with self._lock:
            return self._count_locked() + self._others

    @property
    def files(self) -> int:
        """Spill files this node's directory holds (as far as the budget knows)."""
        with self._lock:
            self._count_locked()
            return self._files

    def _count_locked(self) -> int:
        """This node's bytes: from its row in the store, else (no row yet, or no ledger) from the directory."""
        if self._used is not None:
            return self._used
        ledger = self.ledger
        own: SpillRow | None = None
        if ledger is not None:
            try:
                own, self._others = ledger.load()
            except StoreError as exc:
                logger.warning("spill bookkeeping %s could not be read (%s): counting the directory", ledger, exc)
                ledger = None
        if own is not None:
            self._used, self._files = own.bytes, own.files
        else:
            self._used, self._files = _tree_count(self.directory)
            if ledger is not None:
                self._record_locked()  # the row a store from before the rows lacked
        return self._used

    def _record_locked(self) -> None:
        ledger = self.ledger
        if ledger is None or self._used is None:
            return
        ledger.record(
            SpillRow(
                session=ledger.session_id,
                node=ledger.node_id,
                directory=str(self.directory),
                bytes=self._used,
                files=self._files,
                changed=time.time(),
            )
        )

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
            mine = self._count_locked()
            used = mine + self._others
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
            if granted:
                self._used = mine + granted
                if saved == 0:
                    self._files += 1
                self._record_locked()
        return granted, (why if granted < wanted else None)

    def give_back(self, size: int, *, file: bool = False) -> None:
        """Return granted bytes that were not written (a write failed); ``file``: the file was not made either."""
        with self._lock:
            self._used = max(0, self._count_locked() - size)
            if file:
                self._files = max(0, self._files - 1)
            self._record_locked()


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


def _tree_count(directory: Path) -> tuple[int, int]:
    """The bytes and the files under ``directory`` (walked: only where the store has no row)."""
    total = files = 0
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            files += 1
    return total, files


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
