"""The persistent key-value store: sqlitedict tables, msgspec JSON values.

The store plays the part DETS plays in OTP: the task tracker, sessions,
histories and memory live here and survive a crash of the daemon.

- One database file; one table per namespace (``tasks``, ``sessions``...).
- Values are encoded with msgspec as JSON, never pickle: sqlitedict's own
  pickle codec is replaced by the identity, and this module encodes and
  decodes (optionally into a typed Struct or attrs class). A tampered value
  is a `StoreCodecError`, never code execution.
- Every write is committed before the call returns. The file runs in WAL
  mode; ``durability="process"`` (the default) survives a crash of the
  process (kill -9), ``durability="power"`` also fsyncs every commit.
- An unreadable, corrupt or foreign file is reported with its name
  (`StoreCorruptError`) and never replaced.
- A write that fails because the disk is full is a `StoreFullError` naming
  the directory (``no space left on the device holding <dir>``); the file
  stays intact (each write is one transaction, rolled back whole) and writes
  succeed again as soon as space returns.

Methods block the calling thread; trio code uses the ``a``-prefixed variants,
which run the same operation in a worker thread.

Write-behind: `enqueue_nowait` hands a value to the store's committer thread
and returns at once; the committer commits everything queued in groups, so
thousands of agents writing their histories share commits. `flush` returns a
future resolved once everything enqueued before it is committed: acknowledge
work only after that. The queue belongs to the store, not to the writer, so
an actor that is killed loses nothing it enqueued; `close` drains the queue
before closing.

Enqueued writes are gathered in the store (namespace -> key -> encoded
value: a newer value of a key replaces the older one) and the committer
takes all of them at once when it is woken. Waking it is a thread switch,
and an agent turn makes about 18 writes, so it is not woken per write: on a
weald loop thread the first write of a burst arms a timer, and the writes
are handed over by the next `flush` or `handover_delay` seconds later,
whichever comes first (at once past `HANDOVER_MAX_WRITES` gathered writes);
another thread wakes the committer once per burst. A loop that ends hands
over what it gathered.

Reads see their own writes: a value enqueued and not committed yet (gathered,
being committed, or kept after a failed commit) is what every read returns
for its key, as if it were in the file (`get`, `items`, `items_range`,
`keys`, `scan`, `count`, ``in``). Those unsettled values are looked at
before the file is read, so a commit that lands in between is seen in one or
the other, never missed: a reader (``recall``, ``agent.history``, an agent's
restore) never needs to flush first. A flush with nothing enqueued since the last
successful commit is resolved at once, without a round trip. A synchronous
write (`put`, `delete`, `write_batch`...) of a key with a queued write
first waits until that is committed, so a queued older value can never land
over it; while it cannot be committed, the synchronous write fails with its
cause. Writes to other keys do not wait.

A group is one transaction across all its namespaces, written by the
committer through its own SQLite connection to the same sqlitedict tables
(same file, same schema; sqlitedict opens and creates them, and serves
every read and synchronous write). sqlitedict runs each table's connection
in a thread of its own, so committing a group through it cost a transaction
per namespace and a thread hand-off per write: 170-430 us for an agent
turn's 15 writes in 3 namespaces, against 80-150 us here, hand-offs to the
committer and back included (benchmarks/bench_store.py). A group is
therefore also atomic: after a crash either all of it is in the file or
none of it.

A group that fails (the disk is full, the file is locked too long) is
neither dropped nor allowed to stop later writes: every flush waiting on it
fails with the cause, and the group is kept and committed together with the
next one, which is tried at once when more work comes and every
`RETRY_INTERVAL` seconds meanwhile. So writes succeed again, with nothing
lost, as soon as the cause is gone; and a flush succeeds only once every
write enqueued before it is in the file, whichever group carried it. While
more than ``max_retained_bytes`` of writes wait this way, `enqueue_nowait`
refuses new ones with the cause.

Synchronous writes (`put`, `write_batch`...) also run on a connection of
the store's own, never through sqlitedict: sqlitedict's worker thread ends
for good when a COMMIT fails (leaving its caller waiting forever), and its
reads are the only thing it is trusted with here, besides creating tables.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import math
import os
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, overload

import msgspec
import trio
from sqlitedict import SqliteDict
from weald.runtime._codec import msgspec_decoder
from weald.runtime._errors import (
    StoreClosedError,
    StoreCodecError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
)
from weald.runtime._future import LOOP_THREADS, Future

__all__ = ["HANDOVER_DELAY", "HANDOVER_MAX_WRITES", "RETRY_INTERVAL", "Store"]

logger = logging.getLogger("weald.runtime")

T = TypeVar("T")

RETRY_INTERVAL = 0.5
"""Seconds between attempts to commit queued writes that failed, while nothing else comes."""

HANDOVER_DELAY = 0.005
"""Seconds a write enqueued on a weald loop thread may wait, gathered with others, before the committer takes it."""

HANDOVER_MAX_WRITES = 1024
"""Gathered writes past which the committer is woken at once, whatever the delay."""

_SETTLE_TIMEOUT = 120.0
"""Seconds a synchronous write waits for the queued writes before it (the committer tries each group 3 times)."""

_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_SQLITE_CANTOPEN = 14

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_MISSING: Any = object()
_CREATE: Any = object()


def _identity(value: Any) -> Any:
    return value


class _HandOver:
    """A weald loop's hand-over timer for one store: armed by the first write gathered after a hand-over.

    The timer is the deadline of a cancel scope its task sleeps in: arming
    it sets the deadline (no task switch), and the task runs only when it
    expires. ``deadline`` is what the task's next scope starts with, for an
    arming before the task has entered one.
    """

    __slots__ = ("armed", "deadline", "scope")

    def __init__(self, deadline: float) -> None:
        self.armed = True
        self.deadline = deadline
        self.scope: trio.CancelScope | None = None


class Store:
    """A namespaced, persistent key-value store; thread-safe.

    Args:
        path: the database file; its directory is created if missing.
        durability: ``"process"`` survives a process crash; ``"power"``
            also survives power loss, at the cost of an fsync per write.
        max_retained_bytes: how much of queued writes that failed to commit
            may wait for another attempt before new ones are refused.
        handover_delay: how long writes enqueued on a weald loop thread may
            be gathered before the committer takes them unflushed (see the
            module docstring).

    Raises:
        StoreCorruptError: the file exists but is not a readable database.
        StoreError: the file cannot be created or opened.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        durability: Literal["process", "power"] = "process",
        max_retained_bytes: int = 64 * 1024 * 1024,
        handover_delay: float = HANDOVER_DELAY,
    ) -> None:
        self.path = Path(path).expanduser()
        self.durability = durability
        self.max_retained_bytes = max_retained_bytes
        self.handover_delay = handover_delay
        self._lock = threading.RLock()
        self._tables: dict[str, SqliteDict] = {}
        self._closed = False
        self.writes = 0
        self.reads = 0
        self.commits = 0
        self.failed_commits = 0
        self.rounds = 0  # times the committer woke up and took the gathered writes
        # The committer's wake-ups: ("wake",), ("flush", future), ("stop",).
        # The writes themselves are gathered in _pending, which it takes whole.
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Under _pending_lock: the gathered writes (namespace -> key -> encoded
        # value) and their count; whether an item on the queue will make the
        # committer take them (_woken); whether the committer holds writes it
        # took and has not committed yet, retained ones included (_unsettled).
        # Invariant: every write enqueued is in _pending, or taken and then
        # committed or retained; so with _pending empty and _unsettled False,
        # everything enqueued so far is in the file.
        self._pending_lock = threading.Lock()
        self._pending: dict[str, dict[str, bytes]] = {}
        self._pending_count = 0
        self._woken = False
        self._unsettled = False
        # Per weald loop thread that writes: its hand-over timer (touched on that thread only).
        self._handovers: dict[int, _HandOver] = {}
        self._committer: threading.Thread | None = None
        self._committer_lock = threading.Lock()
        # Queued writes whose commit failed, kept for the next attempt
        # (namespace -> key -> value), and why it failed; while the committer
        # commits a group, _retained is that group. Invariant: the error is
        # set exactly while writes are retained after a round. Only the
        # committer thread changes them, _retained under _pending_lock.
        self._retained: dict[str, dict[str, bytes]] = {}
        self._retained_bytes = 0
        self._retained_count = 0  # for statistics(), which must not iterate what the committer changes
        self._retained_error: StoreError | None = None
        self._writer: sqlite3.Connection | None = None  # the committer's connection
        self._sync_writer: sqlite3.Connection | None = None  # synchronous writes', under _lock
        self._closing = False
        self._stopped = False  # the committer has ended (closed): nothing more will be committed
        self._read_conn: sqlite3.Connection | None = None  # reads', under _lock
        self._check_file()

    def __repr__(self) -> str:
        return f"<Store {self.path} namespaces={sorted(self._tables)}>"

    # -- opening -----------------------------------------------------------------

    def _check_file(self) -> None:
        path = self.path
        if path.is_dir():
            msg = f"store path {path} is a directory, not a database file"
            raise StoreError(msg)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocker = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
            if blocker is not None and not blocker.is_dir():
                msg = f"cannot create the store's directory {path.parent}: {blocker} is not a directory"
            else:
                msg = f"cannot create the store's directory {path.parent}: {exc.strerror}"
            raise StoreError(msg) from exc
        if path.exists():
            try:
                with path.open("rb"):
                    pass
            except OSError as exc:
                msg = f"store file {path} cannot be read: {exc.strerror}"
                raise StoreError(msg) from exc
        try:
            conn = sqlite3.connect(str(path))
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                rows = conn.execute("PRAGMA quick_check").fetchall()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            msg = (
                f"store file {path} is not a readable weald store ({exc}); "
                "it was left untouched - move it aside or restore it from a backup"
            )
            raise StoreCorruptError(msg) from exc
        if rows != [("ok",)]:
            detail = "; ".join(str(r[0]) for r in rows[:3])
            msg = f"store file {path} failed its integrity check ({detail}); it was left untouched"
            raise StoreCorruptError(msg)

    def _table(self, namespace: str) -> SqliteDict:
        table = self._tables.get(namespace)
        if table is not None:
            return table
        if self._closed:
            msg = f"store {self.path} is closed"
            raise StoreClosedError(msg)
        if not _NAMESPACE.match(namespace):
            msg = f"bad namespace {namespace!r}: use lowercase letters, digits and _, starting with a letter"
            raise StoreError(msg)
        # Created here, where a failed COMMIT is an error, not in sqlitedict's
        # thread (see the module docstring); sqlitedict's own CREATE TABLE IF
        # NOT EXISTS then writes nothing. The schema is sqlitedict's.
        sql = f'CREATE TABLE IF NOT EXISTS "{namespace}" (key TEXT PRIMARY KEY, value BLOB)'
        self._write_sync(lambda conn: conn.execute(sql), f"the new namespace {namespace!r}")
        try:
            table = SqliteDict(
                str(self.path),
                tablename=namespace,
                autocommit=False,
                journal_mode="WAL",
                encode=_identity,
                decode=_identity,
                outer_stack=False,
            )
            # sqlitedict turns fsync off; WAL with NORMAL is safe against a
            # process crash, FULL against power loss too.
            sync = "FULL" if self.durability == "power" else "NORMAL"
            table.conn.execute(f"PRAGMA synchronous={sync}")
            table.conn.commit(blocking=True)
        except Exception as exc:
            msg = f"cannot open namespace {namespace!r} in store file {self.path}: {exc}"
            raise StoreError(msg) from exc
        self._tables[namespace] = table
        return table

    def _exists(self, namespace: str) -> bool:
        """Whether the file has the namespace's table (a read; under ``_lock``)."""
        if not _NAMESPACE.match(namespace):
            msg = f"bad namespace {namespace!r}: use lowercase letters, digits and _, starting with a letter"
            raise StoreError(msg)
        try:
            if self._sync_writer is None:
                self._sync_writer = self._connect_writer(check_same_thread=False)
            row = self._sync_writer.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (namespace,)
            ).fetchone()
        except sqlite3.Error as exc:
            msg = f"store {self.path}: cannot read its namespaces: {exc}"
            raise StoreError(msg) from exc
        return row is not None

    # -- codec -----------------------------------------------------------------------

    @staticmethod
    def _encode(namespace: str, key: str, value: Any) -> bytes:
        try:
            return msgspec.json.encode(value)
        except (TypeError, msgspec.EncodeError, OverflowError) as exc:
            msg = f"cannot store {namespace}/{key}: {exc}"
            raise StoreCodecError(msg) from exc

    def _decode(self, namespace: str, key: str, raw: Any, type_: Any) -> Any:
        if isinstance(raw, str):
            raw = raw.encode()
        if not isinstance(raw, bytes | memoryview):
            msg = f"value of {namespace}/{key} in {self.path} is not weald data (a {type(raw).__name__})"
            raise StoreCodecError(msg)
        try:
            if type_ is None:
                return msgspec.json.decode(raw)
            return msgspec_decoder(type_).decode(raw)
        except msgspec.DecodeError as exc:
            msg = f"value of {namespace}/{key} in {self.path} cannot be decoded: {exc}"
            raise StoreCodecError(msg) from exc

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            msg = f"store keys are non-empty strings, got {key!r}"
            raise StoreError(msg)

    def _run(self, namespace: str, op: Callable[[SqliteDict], T], missing: Any = _CREATE) -> T:
        """Run ``op`` on the namespace's table; a read passes what a missing namespace reads as in ``missing``.

        A namespace missing from the file is created, except for a read:
        reading writes nothing (so reads work on a full disk).
        """
        with self._lock:
            if self._closed:
                msg = f"store {self.path} is closed"
                raise StoreClosedError(msg)
            if missing is not _CREATE and namespace not in self._tables and not self._exists(namespace):
                return cast("T", missing)
            table = self._table(namespace)
            try:
                return op(table)
            except StoreError:
                raise
            except Exception as exc:
                msg = f"store {self.path}, namespace {namespace!r}: {exc}"
                raise StoreError(msg) from exc

    # -- reading ---------------------------------------------------------------------

    @overload
    def get(self, namespace: str, key: str, default: Any = None) -> Any: ...
    @overload
    def get(self, namespace: str, key: str, default: Any = None, *, type: type[T]) -> T | Any: ...

    def get(self, namespace: str, key: str, default: Any = None, *, type: Any = None) -> Any:
        """Return the value under ``key``, decoded (into ``type`` if given), or ``default``."""
        self._check_key(key)

        def op(table: SqliteDict) -> Any:
            sql = f'SELECT value FROM "{table.tablename}" WHERE key = ?'  # noqa: S608
            row = self._reader().execute(sql, (key,)).fetchone()
            return _MISSING if row is None else row[0]

        raw = self._unsettled_value(namespace, key)
        if raw is None:
            raw = self._run(namespace, op, _MISSING)
        self.reads += 1
        if raw is _MISSING:
            return default
        return self._decode(namespace, key, raw, type)

    def __contains__(self, item: tuple[str, str]) -> bool:
        namespace, key = item
        return self._unsettled_value(namespace, key) is not None or self._run(namespace, lambda t: key in t, False)

    def keys(self, namespace: str, prefix: str = "") -> list[str]:
        """Return the keys of a namespace (those starting with ``prefix``), in insertion order."""
        rows = self._select(namespace, "key", prefix)
        return [row[0] for row in rows]

    def items(self, namespace: str, prefix: str = "", *, type: Any = None) -> list[tuple[str, Any]]:
        """Return ``(key, value)`` pairs of a namespace, optionally by key prefix, in insertion order."""
        rows = self._select(namespace, "key, value", prefix)
        self.reads += len(rows)
        return [(key, self._decode(namespace, key, raw, type)) for key, raw in rows]

    def scan(
        self, namespace: str, prefix: str = "", *, type: Any = None
    ) -> tuple[list[tuple[str, Any]], list[tuple[str, StoreCodecError]]]:
        """Like `items`, but a value that cannot be decoded is set aside, not fatal.

        Returns:
            The ``(key, value)`` pairs that decoded, and the ``(key, error)``
            pairs that did not, each in insertion order.
        """
        rows = self._select(namespace, "key, value", prefix)
        self.reads += len(rows)
        good: list[tuple[str, Any]] = []
        bad: list[tuple[str, StoreCodecError]] = []
        for key, raw in rows:
            try:
                good.append((key, self._decode(namespace, key, raw, type)))
            except StoreCodecError as exc:
                bad.append((key, exc))
        return good, bad

    def items_range(
        self,
        namespace: str,
        prefix: str,
        *,
        start: str | None = None,
        stop: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        type: Any = None,
    ) -> list[tuple[str, Any]]:
        """Return ``(key, value)`` pairs whose keys start with ``prefix``, in key order, one page at a time.

        Keys are compared as strings, so a range is meaningful for keys of
        one fixed width (``history/<seq:08d>``). Reading a page costs the page,
        not the namespace: the key is the table's primary key.

        Args:
            namespace: the namespace.
            prefix: only keys starting with it.
            start: only keys >= ``prefix + start``.
            stop: only keys < ``prefix + stop``.
            limit: at most this many pairs.
            newest_first: walk from the highest key down (the pairs come in
                that order); with ``limit``, the last page of the range.
            type: decode values into this type.
        """
        low = prefix + (start or "")
        high = prefix + stop if stop is not None else prefix + "\U0010ffff"
        unsettled = self._unsettled_values(namespace, low, high)  # before the file: see the module docstring
        order = "DESC" if newest_first else "ASC"
        bound = " LIMIT ?" if limit is not None else ""
        args: tuple[Any, ...] = (low, high) if limit is None else (low, high, max(0, limit))

        def op(table: SqliteDict) -> list[tuple[Any, ...]]:
            sql = (
                f'SELECT key, value FROM "{table.tablename}" WHERE key >= ? AND key < ? '  # noqa: S608
                f"ORDER BY key {order}{bound}"
            )
            return list(table.conn.select(sql, args))

        rows = self._run(namespace, op)
        if unsettled:
            # A page of the file and every unsettled key in the range hold the page of both.
            merged = {key: raw for key, raw in rows if key not in unsettled}
            merged.update(unsettled)
            ordered = sorted(merged.items(), reverse=newest_first)
            rows = ordered if limit is None else ordered[: max(0, limit)]
        self.reads += len(rows)
        return [(key, self._decode(namespace, key, raw, type)) for key, raw in rows]

    def count(self, namespace: str) -> int:
        """Return how many keys a namespace holds."""
        unsettled = self._unsettled_values(namespace, "", "\U0010ffff")
        if not unsettled:
            return self._run(namespace, len, 0)
        return len(self._select(namespace, "key", ""))

    def _unsettled_value(self, namespace: str, key: str) -> bytes | None:
        """The encoded value of ``key`` enqueued and not yet committed (the newest), or None."""
        with self._pending_lock:
            gathered = self._pending.get(namespace)
            if gathered is not None and key in gathered:
                return gathered[key]
            held = self._retained.get(namespace)
            return held.get(key) if held is not None else None

    def _unsettled_values(self, namespace: str, low: str, high: str) -> dict[str, bytes]:
        """The values enqueued and not yet committed whose keys are in ``[low, high)``, newest per key.

        In the order they will be committed in (a key's newer value keeps its place).
        """
        with self._pending_lock:
            held, gathered = self._retained.get(namespace), self._pending.get(namespace)
            if not held and not gathered:
                return {}
            found = {k: v for k, v in held.items() if low <= k < high} if held else {}
            if gathered:
                found.update((k, v) for k, v in gathered.items() if low <= k < high)
        return found

    def _select(self, namespace: str, columns: str, prefix: str) -> list[tuple[Any, ...]]:
        # Looked at before the file is read: see the module docstring.
        unsettled = self._unsettled_values(namespace, prefix, prefix + "\U0010ffff")

        def op(table: SqliteDict) -> list[tuple[Any, ...]]:
            name = table.tablename
            reader = self._reader()
            if prefix:
                # Keys in [prefix, prefix + U+10FFFF) start with prefix.
                sql = f'SELECT {columns} FROM "{name}" WHERE key >= ? AND key < ? ORDER BY rowid'  # noqa: S608
                return reader.execute(sql, (prefix, prefix + "\U0010ffff")).fetchall()
            sql = f'SELECT {columns} FROM "{name}" ORDER BY rowid'  # noqa: S608
            return reader.execute(sql).fetchall()

        rows: list[tuple[Any, ...]] = self._run(namespace, op, [])
        if not unsettled:
            return rows
        # A committed REPLACE gives its row a new rowid: a key written again moves to the end.
        kept = [row for row in rows if row[0] not in unsettled]
        if columns == "key":
            return kept + [(key,) for key in unsettled]
        return kept + list(unsettled.items())

    def _reader(self) -> sqlite3.Connection:
        """The read connection to the file (made on first use; closed by `close`). Called under ``_lock``.

        Reads used to go through sqlitedict's worker thread, which hands the
        rows over one by one through a queue: ~25 us a row, 5 ms for an
        agent's 200-message history. This connection reads them in one call;
        in WAL mode it sees every committed write. One for every reading
        thread: reads run under the store's lock anyway, and a connection
        per thread kept a page cache per thread (up to 2 MiB each, 90 MiB of
        RSS with the 47 worker threads a burst of 10,000 starts left).
        """
        conn = self._read_conn
        if conn is None:
            conn = self._read_conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
        return conn

    def namespaces(self) -> list[str]:
        """Return the namespaces present in the file."""
        with self._lock:
            return sorted(n for n in SqliteDict.get_tablenames(str(self.path)) if _NAMESPACE.match(n))

    # -- writing ---------------------------------------------------------------------

    def put(self, namespace: str, key: str, value: Any) -> None:
        """Store ``value`` under ``key``; committed to the file before this returns."""
        self.put_many(namespace, {key: value})

    def put_many(self, namespace: str, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Store several values in one transaction: all of them are committed, or none."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        self._transact(namespace, self._encode_all(namespace, pairs))

    def delete(self, namespace: str, key: str) -> bool:
        """Delete ``key``; returns whether it existed. Committed before this returns."""
        return self.delete_many(namespace, [key]) == 1

    def delete_many(self, namespace: str, keys: Iterable[str]) -> int:
        """Delete several keys in one transaction; returns how many existed."""
        return self._transact(namespace, {}, keys)

    def write_batch(
        self,
        namespace: str,
        puts: Mapping[str, Any] | None = None,
        deletes: Iterable[str] = (),
    ) -> None:
        """Apply puts and deletes in one transaction: all of them, or none."""
        self._transact(namespace, self._encode_all(namespace, list((puts or {}).items())), deletes)

    def _encode_all(self, namespace: str, pairs: list[tuple[str, Any]]) -> dict[str, bytes]:
        encoded = {}
        for key, value in pairs:
            self._check_key(key)
            encoded[key] = self._encode(namespace, key, value)
        return encoded

    def _transact(self, namespace: str, puts: Mapping[str, bytes], deletes: Iterable[str] = ()) -> int:
        """Write encoded values and delete keys in one committed transaction (rolled back on failure).

        Returns:
            How many of the keys to delete existed.

        Raises:
            StoreFullError: the disk is full; nothing was written.
            StoreError: the transaction failed otherwise; nothing was written.
        """
        wanted = list(deletes)
        self._check_open()
        self._settle_queued(namespace, itertools.chain(puts, wanted), f"a write to namespace {namespace!r}")
        # `_table` checked the namespace against _NAMESPACE, so it is safe in SQL.
        replace = f'REPLACE INTO "{namespace}" (key, value) VALUES (?,?)'  # noqa: S608
        delete = f'DELETE FROM "{namespace}" WHERE key = ?'  # noqa: S608

        def op(conn: sqlite3.Connection) -> int:
            conn.executemany(replace, puts.items())
            return sum(conn.execute(delete, (key,)).rowcount for key in wanted)

        with self._lock:
            self._check_open()
            self._table(namespace)
            removed = self._write_sync(op, f"a write to namespace {namespace!r}")
        self.writes += len(puts) + removed
        self.commits += 1
        return removed

    def _check_open(self) -> None:
        if self._closed:
            msg = f"store {self.path} is closed"
            raise StoreClosedError(msg)

    def _write_sync(self, op: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``op`` in one immediate transaction on the synchronous writer; committed or rolled back whole."""
        with self._lock:
            conn = self._sync_writer
            try:
                if conn is None:
                    conn = self._sync_writer = self._connect_writer(check_same_thread=False)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = op(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._write_failure(exc, what) from exc
            return result

    def _connect_writer(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        """A connection for writing, in autocommit mode (transactions are explicit), synced per durability."""
        conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=check_same_thread)
        sync = "FULL" if self.durability == "power" else "NORMAL"
        conn.execute(f"PRAGMA synchronous={sync}")
        return conn

    def _write_failure(self, exc: BaseException, what: str) -> StoreError:
        """The error a failed write is reported as: `StoreFullError` when the disk is full."""
        if isinstance(exc, StoreError):
            return exc
        if _no_space(exc, self.path.parent):
            error: StoreError = StoreFullError(
                f"no space left on the device holding {self.path.parent}: store {self.path} "
                f"could not commit {what}; free space there and try again"
            )
        else:
            error = StoreError(f"store {self.path} could not commit {what}: {exc}")
        error.__cause__ = exc
        return error

    # -- write-behind ------------------------------------------------------------------

    def enqueue_nowait(self, namespace: str, key: str, value: Any) -> None:
        """Queue a write for the committer thread; returns at once.

        The value is encoded here, so a value that cannot be stored fails in
        the caller. Use `flush` to learn when it is committed.

        Raises:
            StoreCodecError: the value cannot be encoded.
            StoreClosedError: the store is closed.
            StoreError: an earlier queued write failed for good.
        """
        self._check_key(key)
        if self._closing:
            msg = f"store {self.path} is closed"
            raise StoreClosedError(msg)
        failure = self._retained_error
        if failure is not None and self._retained_bytes > self.max_retained_bytes:
            msg = (
                f"store {self.path} refuses new writes: {self._retained_bytes:,} bytes of earlier ones "
                f"wait to be committed ({failure})"
            )
            raise type(failure)(msg) from failure
        raw = self._encode(namespace, key, value)
        thread = threading.get_ident()
        with self._pending_lock:
            if self._closing:  # checked again under the lock: close() takes everything gathered before it
                msg = f"store {self.path} is closed"
                raise StoreClosedError(msg)
            values = self._pending.get(namespace)
            if values is None:
                values = self._pending[namespace] = {}
            values[key] = raw
            self._pending_count += 1
            if self._woken:
                return  # the committer is to take them anyway
            on_loop = thread in LOOP_THREADS and self._pending_count < HANDOVER_MAX_WRITES
            if on_loop:
                handover = self._handovers.get(thread)
                if handover is not None and handover.armed:
                    return  # its timer hands them over
            else:
                self._woken = True
        if not on_loop:
            self._wake_committer()
        elif not self._arm(thread, handover):
            self._hand_over()

    def _arm(self, thread: int, handover: _HandOver | None) -> bool:
        """Have this loop hand the gathered writes over in ``handover_delay``; False if it cannot (its run ends)."""
        deadline = trio.current_time() + self.handover_delay
        if handover is None:
            handover = _HandOver(deadline)
            try:
                trio.lowlevel.spawn_system_task(
                    self._hand_over_later, handover, name=f"store hand-over {self.path.name}"
                )
            except RuntimeError:  # the run is ending: no timer any more
                return False
            self._handovers[thread] = handover
            return True
        handover.armed = True
        if handover.scope is not None:
            handover.scope.deadline = deadline
        else:
            handover.deadline = deadline
        return True

    async def _hand_over_later(self, handover: _HandOver) -> None:
        # A system task of a loop that writes: it sleeps until its armed
        # deadline, then wakes the committer if writes are still gathered (a
        # flush may have taken them meanwhile). A run that ends cancels it:
        # it then hands over at once, so nothing gathered is left behind.
        # Between two scopes it runs without a checkpoint, so _arm always
        # finds either the scope or the deadline the next one starts with.
        try:
            while True:
                with trio.CancelScope(deadline=handover.deadline) as scope:
                    handover.scope = scope
                    await trio.sleep_forever()
                handover.scope = None
                handover.deadline = math.inf
                handover.armed = False
                self._hand_over()
        finally:
            handover.armed = False
            thread = threading.get_ident()
            if self._handovers.get(thread) is handover:
                del self._handovers[thread]
            self._hand_over()

    def _hand_over(self) -> None:
        """Wake the committer if writes are gathered and nothing will wake it yet; never raises."""
        with self._pending_lock:
            if self._woken or not self._pending_count:
                return
            self._woken = True
        try:
            self._wake_committer()
        except Exception:  # a system task must not fail its run; the next flush or write tries again
            with self._pending_lock:
                self._woken = False
            logger.exception("store %s: waking the committer failed", self.path)

    def _wake_committer(self) -> None:
        self._queue.put(("wake",))
        self._ensure_committer()

    def flush(self) -> Future[None]:
        """A future resolved once every write enqueued before this call is committed.

        It fails with `StoreError` (`StoreFullError` when the disk is full)
        if those writes could not be committed yet; they are kept and
        committed later (see the module docstring), so a later flush may
        succeed. With nothing enqueued since the last successful commit it
        is resolved at once. Await it from trio, or ``.get()`` it from a thread.
        """
        future: Future[None] = Future()
        with self._pending_lock:
            settled = not self._pending_count and not self._unsettled
            stopped = self._stopped
            if not settled and not stopped:
                self._woken = True
                # Put under the lock: once the committer has stopped, it answers every flush it left on the queue.
                self._queue.put(("flush", future))
                # This loop's timer has nothing left to hand over: the committer takes it all. Left
                # armed, it would fire in a later burst (a later turn) and wake the committer for it.
                handover = self._handovers.get(threading.get_ident())
                if handover is not None and handover.armed:
                    handover.armed = False
                    if handover.scope is not None:
                        handover.scope.deadline = math.inf
                    else:
                        handover.deadline = math.inf
        if settled:
            future.set(None)  # nothing to commit: no round trip
        elif stopped:
            self._answer_unsettled(future)
        else:
            self._ensure_committer()
        return future

    def _answer_unsettled(self, future: Future[None]) -> None:
        """Answer a flush the committer will never take (it has stopped): by what is in the file."""
        with self._pending_lock:
            settled = not self._pending_count and not self._unsettled
        if settled:
            future.set(None)
            return
        error = self._retained_error or StoreClosedError(
            f"store {self.path} is closed; writes queued before this flush were not committed"
        )
        future.set_exception((type(error), error, None))

    def _settle_queued(self, namespace: str, keys: Iterable[str], what: str) -> None:
        """If a write to one of ``keys`` is queued, wait until it is committed: a synchronous write lands after it.

        Raises:
            StoreError: it cannot be committed (yet): writing now would let
                it land over this write later (`StoreFullError` when the
                disk is full).
        """
        with self._pending_lock:
            gathered, held = self._pending.get(namespace), self._retained.get(namespace)
            if not any((gathered and key in gathered) or (held and key in held) for key in keys):
                return
        flushed = self.flush()
        landed = threading.Event()
        # A plain wait, not Future.get: this may run on a loop thread, and the committer needs nothing from it.
        flushed._on_done(lambda _: landed.set())
        if not landed.wait(_SETTLE_TIMEOUT):
            msg = (
                f"store {self.path} could not commit {what}: the writes queued before it were not "
                f"committed within {_SETTLE_TIMEOUT:.0f} s"
            )
            raise StoreError(msg)
        try:
            flushed.get()
        except StoreError as exc:
            msg = f"store {self.path} could not commit {what}: the writes queued before it cannot be committed ({exc})"
            raise type(exc)(msg) from exc

    def _ensure_committer(self) -> None:
        if self._committer is not None:
            return
        with self._committer_lock:
            if self._committer is None:
                thread = threading.Thread(
                    target=self._commit_loop, name=f"weald-store-committer {self.path.name}", daemon=True
                )
                thread.start()
                self._committer = thread

    def _commit_loop(self) -> None:
        try:
            self._commit_rounds()
        finally:
            with self._pending_lock:
                self._stopped = True
            # Flushes put after the last round (after the stop, or if the rounds broke off).
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[0] == "flush":
                    self._answer_unsettled(item[1])
            conn, self._writer = self._writer, None
            if conn is not None:
                conn.close()

    @property
    def write_failure(self) -> StoreError | None:
        """Why queued writes are waiting to be committed again, or None when every queued write landed.

        Non-blocking: agents look at it between steps, to stop a turn whose
        writes cannot be committed rather than pile up more of them.
        """
        return self._retained_error

    def _commit_rounds(self) -> None:
        q = self._queue
        while True:
            try:
                # With writes retained, wake up to try them again on our own.
                items = [q.get(timeout=RETRY_INTERVAL if self._retained else None)]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            flushes: list[Future[None]] = [item[1] for item in items if item[0] == "flush"]
            stop = any(item[0] == "stop" for item in items)
            # Taken after the items: every write enqueued before a flush taken
            # here is in it, or was in an earlier round's group.
            with self._pending_lock:
                taken, self._pending, self._pending_count = self._pending, {}, 0
                self._woken = False
                # Retained writes go first; a newer value of the same key
                # replaces its older one. Merged under the lock: a synchronous
                # write looks for its keys in _pending and _retained.
                group = self._retained
                for namespace, values in taken.items():
                    into = group.get(namespace)
                    if into is None:
                        group[namespace] = values
                    else:
                        into.update(values)
                if group:
                    self._unsettled = True
            self.rounds += 1
            error = self._commit_group(group)
            if error is None:
                with self._pending_lock:
                    self._retained = {}
                    self._unsettled = False
                self._retained_bytes, self._retained_count, self._retained_error = 0, 0, None
            else:
                self._retained_bytes = sum(len(raw) for values in group.values() for raw in values.values())
                self._retained_count = sum(len(values) for values in group.values())
                self._retained_error = error
            for future in flushes:
                if error is None:
                    future.set(None)
                else:
                    future.set_exception((type(error), error, None))
            if stop:
                if error is not None:
                    count = sum(len(values) for values in group.values())
                    logger.error("store %s closed; %d queued writes were not committed: %s", self.path, count, error)
                return

    def _commit_group(self, puts: dict[str, dict[str, bytes]]) -> StoreError | None:
        """Commit one group in one transaction; returns why it failed, or None.

        A full disk fails at once; another error is tried a few times first
        (a lock held too long, a transient I/O error).
        """
        if not puts:
            return None
        for attempt in range(3):
            try:
                self._write_group(puts)
            except Exception as exc:  # the committer reports every failure to the flushes
                error = self._write_failure(exc, "queued writes")
                if isinstance(error, StoreFullError | StoreClosedError) or attempt == 2:
                    self.failed_commits += 1
                    return error
                threading.Event().wait(0.05 * 2**attempt)
            else:
                return None
        return None  # not reached: the last attempt returns

    def _write_group(self, puts: dict[str, dict[str, bytes]]) -> None:
        with self._lock:
            for namespace in puts:
                self._table(namespace)  # creates the table; raises once the store is closed
        conn = self._writer
        if conn is None:
            # The committer's own connection (this thread only).
            conn = self._writer = self._connect_writer()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for namespace, values in puts.items():
                # `_table` checked the namespace against _NAMESPACE above.
                sql = f'REPLACE INTO "{namespace}" (key, value) VALUES (?,?)'  # noqa: S608
                conn.executemany(sql, values.items())
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        self.writes += sum(len(values) for values in puts.values())
        self.commits += 1

    # -- lifecycle -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    def close(self) -> None:
        """Commit what is queued, then close every namespace; later calls raise `StoreClosedError`."""
        with self._pending_lock:
            self._closing = True  # refuse new queued writes; drain the ones already gathered
            gathered = self._pending_count
        if gathered:
            self._ensure_committer()  # a loop's timer may not have woken it yet
        committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            self._queue.put(("stop",))
            committer.join(30)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tables = list(self._tables.values())
            self._tables.clear()
            sync_writer, self._sync_writer = self._sync_writer, None
            reader, self._read_conn = self._read_conn, None
        for table in tables:
            table.close()
        if sync_writer is not None:
            sync_writer.close()
        if reader is not None:
            with contextlib.suppress(sqlite3.Error):
                reader.close()

    def statistics(self) -> dict[str, Any]:
        """Counts for introspection: file, size, namespaces open, reads and writes."""
        try:
            size = self.path.stat().st_size
        except OSError:
            size = 0
        return {
            "path": str(self.path),
            "bytes": size,
            "namespaces": sorted(self._tables),
            "reads": self.reads,
            "writes": self.writes,
            "commits": self.commits,
            "failed_commits": self.failed_commits,
            "queued": self._pending_count,
            "rounds": self.rounds,
            "retained": self._retained_count,
            "write_failure": str(self._retained_error) if self._retained_error is not None else None,
            "closed": self._closed,
        }

    # -- trio ----------------------------------------------------------------------------

    async def aget(self, namespace: str, key: str, default: Any = None, *, type: Any = None) -> Any:
        """`get` for trio code: runs in a worker thread."""
        return await trio.to_thread.run_sync(lambda: self.get(namespace, key, default, type=type))

    async def aput(self, namespace: str, key: str, value: Any) -> None:
        """`put` for trio code: committed before it returns."""
        await trio.to_thread.run_sync(self.put, namespace, key, value)

    async def aput_many(self, namespace: str, items: Mapping[str, Any]) -> None:
        """`put_many` for trio code."""
        await trio.to_thread.run_sync(self.put_many, namespace, items)

    async def adelete(self, namespace: str, key: str) -> bool:
        """`delete` for trio code."""
        return await trio.to_thread.run_sync(self.delete, namespace, key)

    async def aitems(self, namespace: str, prefix: str = "", *, type: Any = None) -> list[tuple[str, Any]]:
        """`items` for trio code."""
        return await trio.to_thread.run_sync(lambda: self.items(namespace, prefix, type=type))

    async def aitems_range(self, namespace: str, prefix: str, **options: Any) -> list[tuple[str, Any]]:
        """`items_range` for trio code (the same keyword options)."""
        return await trio.to_thread.run_sync(lambda: self.items_range(namespace, prefix, **options))

    async def awrite_batch(
        self, namespace: str, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = ()
    ) -> None:
        """`write_batch` for trio code."""
        await trio.to_thread.run_sync(lambda: self.write_batch(namespace, puts, deletes))


def _no_space(exc: BaseException, directory: Path) -> bool:
    """Whether a failed write failed for lack of space on the device holding ``directory``."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    code = getattr(exc, "sqlite_errorcode", None)
    if not isinstance(code, int):
        return False
    if code & 0xFF == _SQLITE_FULL:
        return True
    # SQLite reports some failed writes (a journal it cannot create or
    # extend) as I/O errors: they are for lack of space if there is none.
    if code & 0xFF in (_SQLITE_IOERR, _SQLITE_CANTOPEN):
        try:
            stats = os.statvfs(directory)
        except OSError:
            return False
        return stats.f_bavail == 0 or stats.f_favail == 0
    return False
