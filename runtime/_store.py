"""The persistent key-value store: namespaces of msgspec JSON values, on sqlite or PostgreSQL.

The store plays the part DETS plays in OTP (and, on a shared database, the
part Mnesia plays): the task tracker, sessions, histories and memory live
here and survive a crash of the daemon.

- Where the data lives is the backend's business (``_store_backend``): a
  sqlite file (`SqliteBackend`, the default: one table per namespace, WAL)
  or a ``postgresql://`` database (`PostgresBackend`) several daemons may
  share. This module is the same for both.
- Values are encoded with msgspec as JSON, never pickle; this module
  encodes and decodes (optionally into a typed Struct or attrs class). A
  tampered value is a `StoreCodecError`, never code execution.
- Every synchronous write is committed before the call returns.
- Failures are `StoreError`s naming the store and the cause: a corrupt
  file (`StoreCorruptError`, never replaced), a full disk, here or on the
  database server (`StoreFullError`), a lost connection
  (`StoreConnectionError`), a conflicting transaction (`StoreConflictError`),
  a read-only standby (`StoreReadOnlyError`), a schema of another version
  (`StoreSchemaError`).

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
for its key, as if it were in the store (`get`, `items`, `items_range`,
`keys`, `scan`, `count`, ``in``). Those unsettled values are looked at
before the database is read, so a commit that lands in between is seen in
one or the other, never missed: a reader (``recall``, ``agent.history``, an
agent's restore) never needs to flush first. A flush with nothing enqueued since the last
successful commit is resolved at once, without a round trip. A synchronous
write (`put`, `delete`, `write_batch`...) of a key with a queued write
first waits until that is committed, so a queued older value can never land
over it; while it cannot be committed, the synchronous write fails with its
cause. Writes to other keys do not wait.

A group is one transaction across all its namespaces, written by the
committer through its own connection (on sqlite, 80-150 us for an agent
turn's 15 writes in 3 namespaces, hand-offs included, against 170-430 us
through sqlitedict's connections: benchmarks/bench_store.py). A group is
therefore also atomic: after a crash either all of it is in the store or
none of it.

A group that fails (the disk is full, the connection is lost, the file is
locked too long) is neither dropped nor allowed to stop later writes: every
flush waiting on it fails with the cause, and the group is kept and
committed together with the next one, which is tried at once when more work
comes and every `RETRY_INTERVAL` seconds meanwhile. So writes succeed again,
with nothing lost, as soon as the cause is gone; and a flush succeeds only
once every write enqueued before it is in the store, whichever group carried
it. While more than ``max_retained_bytes`` of writes wait this way,
`enqueue_nowait` refuses new ones with the cause.

Nodes and the fence (a database several daemons share): a daemon joins the
store as a node (`join`; its epoch: the previous start's + 1) and claims the
sessions it runs (`claim`); each claim raises the session's epoch in the database's
``placement`` row. A write enqueued for a session (``session=``) is
committed only if, in the same transaction, the session's placement still
names this node and the epoch it claimed (checked ``FOR SHARE``, so a
takeover waits for the commit, or the commit sees the takeover). A group
whose sessions were taken over is committed without their writes, which are
dropped for good: that session's flushes fail with `StoreFencedError`, later
writes for it are dropped, and ``on_fenced`` is told, so the daemon stops
the session here. The node's lease is renewed every third of it by a thread
of the store; a node that cannot renew it before it runs out stops
committing for every session it holds, as if each had been taken over
(Orleans: a silo declared dead terminates itself). On sqlite, whose file has
one owner at a time, no fence is checked.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import attrs
import msgspec
import trio
from weald.runtime._codec import msgspec_decoder
from weald.runtime._errors import (
    StoreClosedError,
    StoreCodecError,
    StoreError,
    StoreFencedError,
    StoreFullError,
)
from weald.runtime._future import LOOP_THREADS, Future
from weald.runtime._latency import LatencyWindow
from weald.runtime._store_backend import (
    BackendTransaction,
    FencedSessions,
    NodeLease,
    StoreBackend,
    TextHit,
    check_namespace,
    is_url,
    query_terms,
)

__all__ = [
    "DEFAULT_LEASE",
    "HANDOVER_DELAY",
    "HANDOVER_MAX_WRITES",
    "RETRY_INTERVAL",
    "Store",
    "StoreTransaction",
]

logger = logging.getLogger("weald.runtime")

T = TypeVar("T")

RETRY_INTERVAL = 0.5
"""Seconds between attempts to commit queued writes that failed, while nothing else comes."""

HANDOVER_DELAY = 0.005
"""Seconds a write enqueued on a weald loop thread may wait, gathered with others, before the committer takes it."""

HANDOVER_MAX_WRITES = 1024
"""Gathered writes past which the committer is woken at once, whatever the delay."""

DEFAULT_LEASE = 5.0
"""Seconds a node's lease lasts unless configured (``[store] lease``); renewed every third of it."""

_SETTLE_TIMEOUT = 120.0
"""Seconds a synchronous write waits for the queued writes before it (the committer tries each group 3 times)."""

_MISSING: Any = object()

FencedCallback = Callable[[tuple[str, ...], StoreFencedError], None]
"""Told which sessions this node lost, and why: from the committer's or the lease's thread; must not block."""


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


class StoreTransaction:
    """A synchronous transaction on the store (`Store.transaction`): reads see its writes; all or nothing.

    Made by the store only. Values are decoded and encoded as the store's.
    """

    __slots__ = ("_store", "_tx")

    def __init__(self, store: Store, tx: BackendTransaction) -> None:
        self._store = store
        self._tx = tx

    def get(self, namespace: str, key: str, default: Any = None, *, type: Any = None) -> Any:
        """The value under ``key`` as this transaction sees it, or ``default``."""
        check_namespace(namespace)
        self._store._check_key(key)
        raw = self._tx.get(namespace, key)
        return default if raw is None else self._store._decode(namespace, key, raw, type)

    def items(self, namespace: str, prefix: str = "", *, type: Any = None) -> list[tuple[str, Any]]:
        """``(key, value)`` pairs whose keys start with ``prefix``, in insertion order."""
        check_namespace(namespace)
        return [(key, self._store._decode(namespace, key, raw, type)) for key, raw in self._tx.items(namespace, prefix)]

    def write_batch(self, namespace: str, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = ()) -> int:
        """Put and delete in this transaction; returns how many of ``deletes`` existed."""
        check_namespace(namespace)
        wanted = list(deletes)
        encoded = self._store._encode_all(namespace, list((puts or {}).items()))
        removed = self._tx.write(namespace, encoded, wanted)
        self._store.writes += len(encoded) + removed
        return removed


class Store:
    """A namespaced, persistent key-value store; thread-safe.

    Args:
        path: the sqlite database file (its directory is created if missing);
            or a ``postgresql://`` URL, the same as ``url``.
        url: a ``postgresql://user:password@host:port/database`` URL: the
            data lives there, not in ``path``. Its password is never shown
            (`location` masks it).
        durability: on sqlite, ``"process"`` survives a process crash;
            ``"power"`` also survives power loss, at the cost of an fsync per
            write. PostgreSQL commits with ``synchronous_commit`` on: a commit
            is on the server's disk before it is acknowledged.
        max_retained_bytes: how much of queued writes that failed to commit
            may wait for another attempt before new ones are refused.
        handover_delay: how long writes enqueued on a weald loop thread may
            be gathered before the committer takes them unflushed (see the
            module docstring).

    Attributes:
        path: the sqlite file; None when the data lives on a database server.
        location: what messages name the store by (the file, or the URL with
            its password masked).
        on_fenced: called with the sessions this node lost (see the module
            docstring), on the committer's or the lease's thread.

    Raises:
        StoreCorruptError: the file exists but is not a readable database.
        StoreConnectionError: the database server cannot be reached or refused the login.
        StoreSchemaError: the database holds weald tables of another version.
        StoreError: the store cannot be created or opened.
    """

    __weald_shared__ = True  # shared by every actor: not in one actor's memory estimate

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        url: str | None = None,
        durability: Literal["process", "power"] = "process",
        max_retained_bytes: int = 64 * 1024 * 1024,
        handover_delay: float = HANDOVER_DELAY,
    ) -> None:
        if url is None and path is not None and is_url(path):
            path, url = None, str(path)
        self.durability = durability
        self.max_retained_bytes = max_retained_bytes
        self.handover_delay = handover_delay
        self._backend: StoreBackend
        if url is not None:
            from weald.runtime._store_postgres import PostgresBackend

            self.path: Path | None = None
            self._backend = PostgresBackend(url)
        else:
            from weald.runtime._store_sqlite import SqliteBackend

            if path is None:
                msg = "a store needs a file (path) or a database URL (url)"
                raise StoreError(msg)
            self.path = Path(path).expanduser()
            self._backend = SqliteBackend(self.path, durability)
        self.location = self._backend.location
        # Names this store's threads and tasks.
        self._name = self.path.name if self.path is not None else "postgresql"
        self._closed = False
        self.writes = 0
        self.reads = 0
        self.commits = 0
        self.commit_seconds = 0.0  # time spent in the commits counted by `commits` (their mean is the latency)
        # The durations of the newest commits timed above (daemon.status, the commit latency metric).
        self.commit_latency = LatencyWindow(1024)
        self.failed_commits = 0
        self.rounds = 0  # times the committer woke up and took the gathered writes
        # The committer's wake-ups: ("wake",), ("flush", future, session), ("stop",).
        # The writes themselves are gathered in _pending, which it takes whole.
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Under _pending_lock: the gathered writes (namespace -> key -> encoded
        # value) and their count; the sessions they were written for
        # (session -> [(namespace, key)], only writes given one); whether an
        # item on the queue will make the committer take them (_woken); whether
        # the committer holds writes it took and has not committed yet,
        # retained ones included (_unsettled).
        # Invariant: every write enqueued is in _pending, or taken and then
        # committed, retained or dropped as fenced; so with _pending empty and
        # _unsettled False, everything enqueued so far is in the store (or fenced).
        self._pending_lock = threading.Lock()
        self._pending: dict[str, dict[str, bytes]] = {}
        self._pending_sessions: dict[str, list[tuple[str, str]]] = {}
        self._pending_count = 0
        self._woken = False
        self._unsettled = False
        # Per weald loop thread that writes: its hand-over timer (touched on that thread only).
        self._handovers: dict[int, _HandOver] = {}
        self._committer: threading.Thread | None = None
        self._committer_lock = threading.Lock()
        # Queued writes whose commit failed, kept for the next attempt
        # (namespace -> key -> value, and their sessions), and why it failed;
        # while the committer commits a group, _retained is that group.
        # Invariant: the error is set exactly while writes are retained after
        # a round. Only the committer thread changes them, _retained under
        # _pending_lock.
        self._retained: dict[str, dict[str, bytes]] = {}
        self._retained_sessions: dict[str, list[tuple[str, str]]] = {}
        self._retained_bytes = 0
        self._retained_count = 0  # for statistics(), which must not iterate what the committer changes
        self._retained_error: StoreError | None = None
        self._closing = False
        self._stopped = False  # the committer has ended (closed): nothing more will be committed
        # Nodes and the fence (see the module docstring). _held: the sessions
        # this node claimed, with the epoch of each claim; _fenced: sessions it
        # lost, and why. Both change under _fence_lock.
        self.on_fenced: FencedCallback | None = None
        self._node: NodeLease | None = None
        self._fence_lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._fenced: dict[str, StoreFencedError] = {}
        self._claims = 0  # claims sent and not yet noted in _held (`arriving`)
        self._arrived: dict[str, float] = {}  # placed here by another node, not held: when seen (`stranded`)
        self.fenced_writes = 0
        # The lease: renewed by its own thread; the committer refuses session
        # writes once time.monotonic() passes _lease_deadline.
        self._lease_deadline = math.inf
        self._lease_thread: threading.Thread | None = None
        self._lease_stop = threading.Event()
        self._lease_lost: StoreFencedError | None = None
        self.on_lease_back: Callable[[], None] | None = None
        # What each renewal writes into the node's row (load figures for fronts): must not block.
        self.lease_info: Callable[[], Mapping[str, Any]] | None = None
        self.last_commit: float | None = None  # wall-clock time of the last group committed
        self.lease_renewals = 0
        self.lease_failures = 0

    def __repr__(self) -> str:
        return f"<Store {self.location}>"

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``: where the data lives."""
        return self._backend.kind

    @property
    def fences(self) -> bool:
        """Whether commits check the placement of the sessions they touch (a database several nodes share)."""
        return self._backend.fences

    @property
    def backend(self) -> StoreBackend:
        """The database under the store (for tools that move or back up its data)."""
        return self._backend

    def _check_open(self) -> None:
        if self._closed:
            msg = f"store {self.location} is closed"
            raise StoreClosedError(msg)

    # -- reading ---------------------------------------------------------------------

    @overload
    def get(self, namespace: str, key: str, default: Any = None) -> Any: ...
    @overload
    def get(self, namespace: str, key: str, default: Any = None, *, type: type[T]) -> T | Any: ...

    def get(self, namespace: str, key: str, default: Any = None, *, type: Any = None) -> Any:
        """Return the value under ``key``, decoded (into ``type`` if given), or ``default``."""
        self._check_key(key)
        self._check_open()
        check_namespace(namespace)
        raw = self._unsettled_value(namespace, key)
        if raw is None:
            raw = self._backend.get(namespace, key)
        self.reads += 1
        if raw is None:
            return default
        return self._decode(namespace, key, raw, type)

    def __contains__(self, item: tuple[str, str]) -> bool:
        namespace, key = item
        self._check_open()
        check_namespace(namespace)
        return self._unsettled_value(namespace, key) is not None or self._backend.contains(namespace, key)

    def keys(self, namespace: str, prefix: str = "") -> list[str]:
        """Return the keys of a namespace (those starting with ``prefix``), in insertion order."""
        rows = self._select(namespace, "key", prefix)
        return [row[0] for row in rows]

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
            msg = f"value of {namespace}/{key} in {self.location} is not weald data (a {type(raw).__name__})"
            raise StoreCodecError(msg)
        try:
            if type_ is None:
                return msgspec.json.decode(raw)
            return msgspec_decoder(type_).decode(raw)
        except msgspec.DecodeError as exc:
            msg = f"value of {namespace}/{key} in {self.location} cannot be decoded: {exc}"
            raise StoreCodecError(msg) from exc

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            msg = f"store keys are non-empty strings, got {key!r}"
            raise StoreError(msg)

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
        return self._decode_apart(namespace, rows, type)

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

        Keys are compared as strings (by code point, on every backend), so a
        range is meaningful for keys of one fixed width (``history/<seq:08d>``).
        Reading a page costs the page, not the namespace: the key is the
        table's primary key.

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
        rows = self._range_rows(namespace, prefix, start, stop, limit, newest_first=newest_first)
        if type is not None and len(rows) > 1:
            values = self._decode_page([raw for _, raw in rows], type)
            if values is not None:
                return [(key, value) for (key, _), value in zip(rows, values, strict=True)]
        return [(key, self._decode(namespace, key, raw, type)) for key, raw in rows]

    def scan_range(
        self, namespace: str, prefix: str = "", *, start: str | None = None, limit: int | None = None, type: Any = None
    ) -> tuple[list[tuple[str, Any]], list[tuple[str, StoreCodecError]]]:
        """`scan` one page at a time: keys from ``prefix + start`` on, in key order, at most ``limit`` (`items_range`).

        For a pass over a namespace of a million values (a daemon's sessions
        at its start): only a page of raw values is held at once, and a
        value that cannot be decoded is set aside, not fatal. The next page
        starts after the last key of this one (the greater of the last good
        and the last bad key).
        """
        rows = self._range_rows(namespace, prefix, start, None, limit, newest_first=False)
        return self._decode_apart(namespace, rows, type)

    def _decode_apart(
        self, namespace: str, rows: list[tuple[str, Any]], type: Any
    ) -> tuple[list[tuple[str, Any]], list[tuple[str, StoreCodecError]]]:
        """``rows`` decoded: the ``(key, value)`` pairs that decoded, and the ``(key, error)`` pairs that did not."""
        good: list[tuple[str, Any]] = []
        bad: list[tuple[str, StoreCodecError]] = []
        for key, raw in rows:
            try:
                good.append((key, self._decode(namespace, key, raw, type)))
            except StoreCodecError as exc:
                bad.append((key, exc))
        return good, bad

    def _range_rows(
        self, namespace: str, prefix: str, start: str | None, stop: str | None, limit: int | None, *, newest_first: bool
    ) -> list[tuple[str, Any]]:
        """The raw rows of `items_range` (unsettled writes merged in), counted as reads."""
        low = prefix + (start or "")
        high = prefix + stop if stop is not None else prefix + "\U0010ffff"
        self._check_open()
        check_namespace(namespace)
        unsettled = self._unsettled_values(namespace, low, high)  # before the database: see the module docstring
        rows = self._backend.select_range(namespace, low, high, limit, newest_first=newest_first)
        if unsettled:
            # A page of the database and every unsettled key in the range hold the page of both.
            merged = {key: raw for key, raw in rows if key not in unsettled}
            merged.update(unsettled)
            ordered = sorted(merged.items(), reverse=newest_first)
            rows = ordered if limit is None else ordered[: max(0, limit)]
        self.reads += len(rows)
        return rows

    @staticmethod
    def _decode_page(raws: list[Any], type_: Any) -> list[Any] | None:
        """A page of values decoded as one JSON array, or None to decode them one by one.

        A wake reads an agent's history this way: a decode per value cost more
        than the decoding (200 messages: 0.29 -> 0.12 ms). Anything unusual (a
        value that is not text, one that does not decode, a count that does not
        match) is left to the one-by-one path, which names the value at fault.
        """
        parts: list[bytes] = []
        for raw in raws:
            if raw.__class__ is bytes:
                parts.append(raw)
            elif isinstance(raw, str):
                parts.append(raw.encode())
            elif isinstance(raw, memoryview):
                parts.append(raw.tobytes())
            else:
                return None
        try:
            values: list[Any] = msgspec_decoder(list[type_]).decode(b"[" + b",".join(parts) + b"]")
        except msgspec.DecodeError:
            return None
        return values if len(values) == len(raws) else None

    def count(self, namespace: str) -> int:
        """Return how many keys a namespace holds."""
        self._check_open()
        check_namespace(namespace)
        unsettled = self._unsettled_values(namespace, "", "\U0010ffff")
        if not unsettled:
            return self._backend.count(namespace)
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
        self._check_open()
        check_namespace(namespace)
        # Looked at before the database is read: see the module docstring.
        unsettled = self._unsettled_values(namespace, prefix, prefix + "\U0010ffff")
        rows = self._backend.select(namespace, prefix, values=columns != "key")
        if not unsettled:
            return rows
        # A committed write moves its key to the end of the insertion order.
        kept = [row for row in rows if row[0] not in unsettled]
        if columns == "key":
            return kept + [(key,) for key in unsettled]
        return kept + list(unsettled.items())

    def namespaces(self) -> list[str]:
        """Return the namespaces present in the store."""
        self._check_open()
        return self._backend.namespaces()

    def search(self, scope: str, text: str, limit: int = 10) -> list[TextHit]:
        """The notes of ``scope`` (in the `TEXT_NAMESPACE` namespace) most relevant to ``text``, best first.

        ``text`` is free text: its words are searched for (any of them; notes
        matching more, and rarer, words rank first), ``word*`` as a prefix,
        and nothing of it is read as query syntax. The index is written in
        the transaction that writes each note, so a committed note is found
        at once, by any daemon sharing the store.

        Raises:
            StoreError: the index cannot be used (sqlite without FTS5) or the search failed.
        """
        self._check_open()
        terms = query_terms(text)
        if not terms:
            return []
        return self._backend.search(scope, terms, limit)

    # -- writing ---------------------------------------------------------------------

    def put(self, namespace: str, key: str, value: Any) -> None:
        """Store ``value`` under ``key``; committed before this returns."""
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
        what = f"a write to namespace {namespace!r}"
        self._settle_queued(namespace, itertools.chain(puts, wanted), what)
        self._check_open()
        check_namespace(namespace)
        started = time.perf_counter()
        removed = self._backend.transact(namespace, puts, wanted, what)
        took = time.perf_counter() - started
        self.commit_seconds += took
        self.commit_latency.record(took)
        self.writes += len(puts) + removed
        self.commits += 1
        return removed

    @contextlib.contextmanager
    def transaction(self, lock: str | None = None, *, settle: Iterable[str] = ()) -> Iterator[StoreTransaction]:
        """A synchronous transaction: what it reads stays as read until it commits its writes, or nothing.

        With ``lock``, the transaction holds a transaction-level lock of that
        name until it ends (PostgreSQL: ``pg_advisory_xact_lock``; sqlite:
        the file's write lock): two transactions with the same lock never
        overlap, in this process or in another daemon on the same database.
        That makes read-check-write sequences (the task tracker's batches)
        safe across daemons.

        Args:
            lock: the lock's name (any string), or None.
            settle: namespaces whose queued writes are committed first, so
                the transaction reads them.

        Raises:
            StoreError: the transaction failed (mapped as for other writes);
                nothing of it was written.
        """
        self._check_open()
        what = f"a transaction{f' holding lock {lock!r}' if lock else ''}"
        for namespace in settle:
            self._settle_queued(namespace, None, what)
        with self._backend.transaction(lock, what) as tx:
            yield StoreTransaction(self, tx)
        self.commits += 1

    # -- write-behind ------------------------------------------------------------------

    def enqueue_nowait(self, namespace: str, key: str, value: Any, *, session: str | None = None) -> None:
        """Queue a write for the committer thread; returns at once.

        The value is encoded here, so a value that cannot be stored fails in
        the caller. Use `flush` to learn when it is committed.

        Args:
            namespace: the namespace.
            key: the key.
            value: the value.
            session: the session the write belongs to: on a database several
                nodes share, it is committed only while this node owns the
                session (see the module docstring). A write for a session
                this node lost is dropped here.

        Raises:
            StoreCodecError: the value cannot be encoded.
            StoreClosedError: the store is closed.
            StoreError: an earlier queued write failed for good.
        """
        self._check_key(key)
        if self._closing:
            msg = f"store {self.location} is closed"
            raise StoreClosedError(msg)
        if session is not None and session in self._fenced:
            self.fenced_writes += 1  # this node lost the session: its flushes say so
            return
        failure = self._retained_error
        if failure is not None and self._retained_bytes > self.max_retained_bytes:
            msg = (
                f"store {self.location} refuses new writes: {self._retained_bytes:,} bytes of earlier ones "
                f"wait to be committed ({failure})"
            )
            raise type(failure)(msg) from failure
        raw = self._encode(namespace, key, value)
        thread = threading.get_ident()
        with self._pending_lock:
            if self._closing:  # checked again under the lock: close() takes everything gathered before it
                msg = f"store {self.location} is closed"
                raise StoreClosedError(msg)
            values = self._pending.get(namespace)
            if values is None:
                values = self._pending[namespace] = {}
            values[key] = raw
            if session is not None and self._node is not None:
                written = self._pending_sessions.get(session)
                if written is None:
                    written = self._pending_sessions[session] = []
                written.append((namespace, key))
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
                trio.lowlevel.spawn_system_task(self._hand_over_later, handover, name=f"store hand-over {self._name}")
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
            logger.exception("store %s: waking the committer failed", self.location)

    def _wake_committer(self) -> None:
        self._queue.put(("wake",))
        self._ensure_committer()

    def flush(self, session: str | None = None) -> Future[None]:
        """A future resolved once every write enqueued before this call is committed.

        It fails with `StoreError` (`StoreFullError` when the disk is full,
        `StoreConnectionError` when the database cannot be reached) if those
        writes could not be committed yet; they are kept and committed later
        (see the module docstring), so a later flush may succeed. With
        ``session``, it fails with `StoreFencedError` once this node has lost
        that session (its writes were dropped); without, writes of lost
        sessions do not count. With nothing enqueued since the last
        successful commit it is resolved at once. Await it from trio, or
        ``.get()`` it from a thread.
        """
        future: Future[None] = Future()
        with self._pending_lock:
            settled = not self._pending_count and not self._unsettled
            stopped = self._stopped
            if not settled and not stopped:
                self._woken = True
                # Put under the lock: once the committer has stopped, it answers every flush it left on the queue.
                self._queue.put(("flush", future, session))
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
            fenced = self._fenced.get(session) if session is not None else None
            if fenced is None:
                future.set(None)  # nothing to commit: no round trip
            else:
                future.set_exception((type(fenced), fenced, None))
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
            f"store {self.location} is closed; writes queued before this flush were not committed"
        )
        future.set_exception((type(error), error, None))

    def _settle_queued(self, namespace: str, keys: Iterable[str] | None, what: str) -> None:
        """If a write to one of ``keys`` (None: any key) is queued, wait until it is committed.

        So a synchronous write lands after it (and a transaction reads it).

        Raises:
            StoreError: it cannot be committed (yet): writing now would let
                it land over this write later (`StoreFullError` when the
                disk is full).
        """
        with self._pending_lock:
            gathered, held = self._pending.get(namespace), self._retained.get(namespace)
            if keys is None:
                if not gathered and not held:
                    return
            elif not any((gathered and key in gathered) or (held and key in held) for key in keys):
                return
        flushed = self.flush()
        landed = threading.Event()
        # A plain wait, not Future.get: this may run on a loop thread, and the committer needs nothing from it.
        flushed._on_done(lambda _: landed.set())
        if not landed.wait(_SETTLE_TIMEOUT):
            msg = (
                f"store {self.location} could not commit {what}: the writes queued before it were not "
                f"committed within {_SETTLE_TIMEOUT:.0f} s"
            )
            raise StoreError(msg)
        try:
            flushed.get()
        except StoreError as exc:
            msg = (
                f"store {self.location} could not commit {what}: the writes queued before it cannot be "
                f"committed ({exc})"
            )
            raise type(exc)(msg) from exc

    def _ensure_committer(self) -> None:
        if self._committer is not None:
            return
        with self._committer_lock:
            if self._committer is None:
                thread = threading.Thread(
                    target=self._commit_loop, name=f"weald-store-committer {self._name}", daemon=True
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
            self._backend.close_committer()

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
            flushes: list[tuple[Future[None], str | None]] = [
                (item[1], item[2]) for item in items if item[0] == "flush"
            ]
            stop = any(item[0] == "stop" for item in items)
            # Taken after the items: every write enqueued before a flush taken
            # here is in it, or was in an earlier round's group.
            with self._pending_lock:
                taken, self._pending, self._pending_count = self._pending, {}, 0
                taken_sessions, self._pending_sessions = self._pending_sessions, {}
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
                sessions = self._retained_sessions
                for session, written in taken_sessions.items():
                    sessions.setdefault(session, []).extend(written)
                if group:
                    self._unsettled = True
            self.rounds += 1
            error = self._commit_group(group, sessions)
            if error is None:
                with self._pending_lock:
                    self._retained = {}
                    self._retained_sessions = {}
                    self._unsettled = False
                self._retained_bytes, self._retained_count, self._retained_error = 0, 0, None
            else:
                self._retained_bytes = sum(len(raw) for values in group.values() for raw in values.values())
                self._retained_count = sum(len(values) for values in group.values())
                self._retained_error = error
            for future, flushed_for in flushes:
                failed: StoreError | None = error
                if failed is None and flushed_for is not None:
                    failed = self._fenced.get(flushed_for)
                if failed is None:
                    future.set(None)
                else:
                    future.set_exception((type(failed), failed, None))
            if stop:
                if error is not None:
                    count = sum(len(values) for values in group.values())
                    logger.error(
                        "store %s closed; %d queued writes were not committed: %s", self.location, count, error
                    )
                return

    def _commit_group(
        self, group: dict[str, dict[str, bytes]], sessions: dict[str, list[tuple[str, str]]]
    ) -> StoreError | None:
        """Commit one group in one transaction; returns why it failed, or None.

        A full disk fails at once; another error is tried a few times first
        (a lock held too long, a transient I/O error, a lost connection).
        """
        if not group:
            return None
        for attempt in range(3):
            try:
                self._write_group(group, sessions)
            except Exception as exc:  # the committer reports every failure to the flushes
                error = self._backend.failure(exc, "queued writes")
                if isinstance(error, StoreFullError | StoreClosedError) or attempt == 2:
                    self.failed_commits += 1
                    return error
                threading.Event().wait(0.05 * 2**attempt)
            else:
                return None
        return None  # not reached: the last attempt returns

    def _write_group(self, group: dict[str, dict[str, bytes]], sessions: dict[str, list[tuple[str, str]]]) -> None:
        if self._closed:
            msg = f"store {self.location} is closed"
            raise StoreClosedError(msg)
        for namespace in group:
            check_namespace(namespace)
        while True:
            fence = self._fence(group, sessions)
            if not group:
                return  # every write was a lost session's
            started = time.perf_counter()
            try:
                self._backend.write_group(group, fence, self._node)
            except FencedSessions as exc:
                # Nothing was written: the sessions taken over go, the rest is tried again at once.
                self._lose(exc.sessions, "another node claimed it (its placement's owner or epoch changed)")
                continue
            took = time.perf_counter() - started
            self.commit_seconds += took
            self.commit_latency.record(took)
            break
        self.writes += sum(len(values) for values in group.values())
        self.commits += 1
        self.last_commit = time.time()

    # -- the fence ---------------------------------------------------------------------------

    def _fence(self, group: dict[str, dict[str, bytes]], sessions: dict[str, list[tuple[str, str]]]) -> dict[str, int]:
        """The epochs the group's sessions must still have; writes of sessions this node does not hold are dropped.

        Runs on the committer thread. A node whose lease ran out holds none.
        """
        if not sessions or self._node is None or not self._backend.fences:
            return {}
        if time.monotonic() > self._lease_deadline and self._lease_lost is None:
            self._lose_node("its lease ran out before it could be renewed")
        fence: dict[str, int] = {}
        dropped: list[str] = []
        unknown: list[str] = []
        with self._fence_lock:
            for session in sessions:
                epoch = self._held.get(session)
                if epoch is not None:
                    fence[session] = epoch
                else:
                    dropped.append(session)
                    if session not in self._fenced:
                        unknown.append(session)
        if unknown:
            self._lose(unknown, "this node never claimed it")
        if dropped:
            with self._pending_lock:  # a synchronous write looks for its keys in the group
                for session in dropped:
                    for namespace, key in sessions.pop(session):
                        values = group.get(namespace)
                        if values is not None and values.pop(key, None) is not None:
                            self.fenced_writes += 1
                            if not values:
                                del group[namespace]
        return fence

    def _lose(self, sessions: Iterable[str], reason: str) -> None:
        """Mark ``sessions`` lost to this node (their writes are dropped from now on), and tell ``on_fenced``."""
        node = self._node
        lost: list[str] = []
        with self._fence_lock:
            for session in sessions:
                epoch = self._held.pop(session, None)
                if session in self._fenced:
                    continue
                held = f", epoch {epoch}" if epoch is not None else ""
                where = f"node {node.node_id!r}" if node is not None else "this process"
                self._fenced[session] = StoreFencedError(
                    f"store {self.location}: session {session!r} is no longer {where}'s{held}: {reason}; "
                    "nothing more of it is written here",
                    (session,),
                )
                lost.append(session)
        if not lost:
            return
        callback = self.on_fenced
        if callback is not None:
            try:
                callback(tuple(lost), self._fenced[lost[0]])
            except Exception:  # a callback's failure must not stop the committer or the lease
                logger.exception("store %s: the fenced-session callback failed", self.location)

    def _lose_node(self, reason: str) -> None:
        """This node lost its lease: every session it holds is lost with it."""
        node = self._node
        name = node.node_id if node is not None else "?"
        self._lease_lost = StoreFencedError(f"store {self.location}: node {name!r} lost its lease: {reason}")
        logger.error(
            "store %s: node %s lost its lease (%s); it stops writing its sessions", self.location, name, reason
        )
        with self._fence_lock:
            held = list(self._held)
        self._lose(held, f"the node lost its lease ({reason})")

    # -- nodes --------------------------------------------------------------------------------

    @property
    def node(self) -> NodeLease | None:
        """This process's node identity (None until `join`)."""
        return self._node

    def join(
        self,
        node_id: str,
        *,
        lease: float = DEFAULT_LEASE,
        info: Mapping[str, Any] | None = None,
        commit_log: bool = False,
    ) -> NodeLease:
        """Join the store as node ``node_id``: this start's epoch is the previous one + 1.

        On a database several nodes share, a thread of the store renews the
        node's lease every third of ``lease`` from now on (see the module
        docstring). With ``commit_log``, on such a database, each fenced
        commit is also logged (``[store] commit_log``). Blocking.

        Raises:
            StoreError: the database could not register the node, or
                ``commit_log`` was asked of a store that does not fence.
        """
        self._check_open()
        if commit_log and not self._backend.fences:
            msg = "[store] commit_log logs the commits of nodes sharing a PostgreSQL store: set [store] url too"
            raise StoreError(msg)
        started = time.monotonic()
        node = self._backend.join(node_id, lease, info or {})
        if commit_log:
            self._backend.open_commit_log()
            node = attrs.evolve(node, commit_log=True)
        self._node = node
        if self._backend.fences:
            self._lease_deadline = started + lease
            self._lease_stop.clear()
            thread = threading.Thread(
                target=self._keep_lease, args=(node,), name=f"weald-store-lease {node_id}", daemon=True
            )
            thread.start()
            self._lease_thread = thread
        return node

    def _require_node(self) -> NodeLease:
        node = self._node
        if node is None:
            msg = f"store {self.location}: no node has joined it (Store.join)"
            raise StoreError(msg)
        return node

    def claim(self, session_ids: Iterable[str] | None = None, *, new_only: bool = False) -> dict[str, int]:
        """Claim sessions for this node; returns those claimed, each with its new epoch. Blocking.

        ``new_only``: return only those this node did not hold already (the
        others run here, or are being restored here, since their last claim).

        ``None`` (a start): the sessions this node owned and every orphan
        whose owner's lease has run out. A list: exactly those, each unless
        another live node owns it. From now on this node's writes for them
        are committed, and their previous owner's are refused.

        Raises:
            StoreError: the database failed (nothing was claimed).
        """
        node = self._require_node()
        with self._claiming():
            claimed = self._backend.claim(node, None if session_ids is None else list(session_ids))
            new = self.hold(claimed)
        return new if new_only else claimed

    @contextlib.contextmanager
    def _claiming(self) -> Iterator[None]:
        # From before the claim's statement is sent until its sessions are in _held: a session the
        # database already names this node's owner of, but _held does not yet hold, is `arriving`.
        with self._fence_lock:
            self._claims += 1
        try:
            yield
        finally:
            with self._fence_lock:
                self._claims -= 1

    def claim_orphans(self) -> dict[str, int]:
        """Claim other nodes' sessions whose owners' leases have run out (a dead or frozen node's). Blocking.

        Returns:
            Those claimed that this node did not hold already, each with its new epoch.
        """
        node = self._require_node()
        if self._lease_lost is not None:
            return {}  # a node without its lease claims nothing
        with self._claiming():
            return self.hold(self._backend.claim_orphans(node))

    def hold(self, claimed: Mapping[str, int]) -> dict[str, int]:
        """Note sessions this node claimed (session -> epoch): their writes are committed again.

        Returns:
            Those it did not hold before.
        """
        new = {}
        with self._fence_lock:
            for session, epoch in claimed.items():
                if session not in self._held:
                    new[session] = epoch
                self._held[session] = epoch
                self._fenced.pop(session, None)
                self._arrived.pop(session, None)
        return new

    def release(self, session_ids: Iterable[str]) -> None:
        """Give up sessions (stopped for good): they have no owner any more. Blocking."""
        ids = list(session_ids)
        node = self._node
        if node is not None and ids:
            self._backend.release(node, ids)
        with self._fence_lock:
            for session in ids:
                self._held.pop(session, None)

    def hand_over(self, session_ids: Iterable[str], to: str) -> list[str]:
        """Hand sessions this node holds to node ``to`` (their epochs + 1); returns those handed. Blocking.

        Their writes must be committed first (`flush`): from now on they are
        refused here, as if taken over, without telling ``on_fenced`` (the
        caller stopped them). A session this node no longer holds is not handed.

        Raises:
            StoreError: the database failed (nothing was handed).
        """
        node = self._require_node()
        with self._fence_lock:
            held = {session: self._held[session] for session in session_ids if session in self._held}
        if not held:
            return []
        handed = self._backend.handover(node, held, to)
        with self._fence_lock:
            for session in handed:
                self._held.pop(session, None)
                self._fenced[session] = StoreFencedError(
                    f"store {self.location}: session {session!r} was handed over to node {to!r}; "
                    "nothing more of it is written here",
                    (session,),
                )
        return list(handed)

    def holds(self, session: str) -> bool:
        """Whether this node may write ``session`` (it claimed it and has not lost it)."""
        return session not in self._fenced and (self._node is None or not self._backend.fences or session in self._held)

    def arriving(self, session: str) -> bool:
        """Whether ``session`` is on its way to this node, which does not run it yet. Blocking.

        It is when this node holds it (claimed, being restored), when one of
        this node's claims is in flight (the database may name this node
        already), or when the database places it here (another node handed
        it over; `claim` takes it). A front asks such a node again shortly
        instead of reporting the session missing.
        """
        node = self._node
        if node is None or not self._backend.fences:
            return False
        with self._fence_lock:
            if session in self._held or self._claims:
                return True
        return self._backend.placed_here(node, session)

    def stranded(self, grace: float) -> list[str]:
        """Sessions another node handed to this one that nobody has had it adopt ``grace`` seconds after.

        A front hands a session over and has its new node adopt it at once;
        one whose front went away in between is placed here and run nowhere.
        The lease's thread notices such placements; the node adopts these.
        """
        now = time.monotonic()
        with self._fence_lock:
            return [s for s, seen in self._arrived.items() if now - seen >= grace]

    def forget_arrived(self, sessions: Iterable[str]) -> None:
        """Stop offering ``sessions`` as `stranded` (their adoption was refused: another node runs them)."""
        with self._fence_lock:
            for session in sessions:
                self._arrived.pop(session, None)

    def fenced_error(self, session: str) -> StoreFencedError | None:
        """Why this node lost ``session``, or None."""
        return self._fenced.get(session)

    def _keep_lease(self, node: NodeLease) -> None:
        """The lease's thread: renew every third of the lease; lose the node's sessions when it cannot."""
        interval = node.lease / 3
        while not self._lease_stop.wait(interval):
            sent = time.monotonic()
            info: Mapping[str, Any] | None = None
            if self.lease_info is not None:
                try:
                    info = self.lease_info()
                except Exception:  # the figures are extra; the lease is what matters
                    logger.exception("store %s: the lease's figures could not be read", self.location)
            try:
                renewed = self._backend.renew(node, info)
            except StoreError as exc:
                self.lease_failures += 1
                if time.monotonic() > self._lease_deadline and self._lease_lost is None:
                    self._lose_node(f"the database could not be reached to renew it ({exc})")
                continue
            if not renewed:
                self._lease_deadline = -math.inf
                if self._lease_lost is None:
                    self._lose_node(f"a newer start of node {node.node_id!r} took its place")
                return
            self.lease_renewals += 1
            self._lease_deadline = sent + node.lease
            if self._lease_lost is not None:
                self._lease_lost = None
                logger.warning("store %s: node %s has its lease back", self.location, node.node_id)
                callback = self.on_lease_back
                if callback is not None:
                    try:
                        callback()
                    except Exception:
                        logger.exception("store %s: the lease-back callback failed", self.location)
            with self._fence_lock:
                held = dict(self._held)
            try:
                lost, arrived = self._backend.placement_changes(node, held)
            except StoreError:
                continue
            if arrived:
                now = time.monotonic()
                with self._fence_lock:  # one claimed since `held` was copied is not on its way any more
                    for session in arrived:
                        if session not in self._held:
                            self._arrived.setdefault(session, now)
            if lost:
                self._lose(lost, "another node claimed it (its placement's owner or epoch changed)")

    # -- lifecycle -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    def close(self) -> None:
        """Commit what is queued, then close every connection; later calls raise `StoreClosedError`.

        A node that joined ends its lease (its sessions may be claimed by
        another node at once) once the queue is committed.
        """
        with self._pending_lock:
            self._closing = True  # refuse new queued writes; drain the ones already gathered
            gathered = self._pending_count
        if gathered:
            self._ensure_committer()  # a loop's timer may not have woken it yet
        committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            self._queue.put(("stop",))
            committer.join(30)
        self._lease_stop.set()
        lease = self._lease_thread
        if lease is not None and lease is not threading.current_thread():
            lease.join(30)
        if self._closed:
            return
        node = self._node
        if node is not None and self._lease_lost is None and self._backend.fences:
            try:
                self._backend.leave(node)
            except StoreError as exc:
                logger.warning("store %s: node %s could not end its lease: %s", self.location, node.node_id, exc)
        self._closed = True
        self._backend.close()

    def statistics(self) -> dict[str, Any]:
        """Counts for introspection: where, size, namespaces open, reads and writes, the node and its sessions."""
        node = self._node
        stats: dict[str, Any] = {
            "kind": self._backend.kind,
            "path": self.location,
            "bytes": self._backend.size() if not self._closed else 0,
            "namespaces": getattr(self._backend, "open_namespaces", []),
            "reads": self.reads,
            "writes": self.writes,
            "commits": self.commits,
            "commit_seconds": self.commit_seconds,
            "commit_latency": attrs.asdict(self.commit_latency.summary()),
            "failed_commits": self.failed_commits,
            "queued": self._pending_count,
            "rounds": self.rounds,
            "retained": self._retained_count,
            "write_failure": str(self._retained_error) if self._retained_error is not None else None,
            "closed": self._closed,
            "node": None
            if node is None
            else {
                "node_id": node.node_id,
                "epoch": node.epoch,
                "lease": node.lease,
                "lease_left": None
                if math.isinf(self._lease_deadline)
                else round(max(0.0, self._lease_deadline - time.monotonic()), 3),
                "lease_lost": str(self._lease_lost) if self._lease_lost is not None else None,
                "sessions": len(self._held),
                "fenced_sessions": len(self._fenced),
                "fenced_writes": self.fenced_writes,
            },
        }
        stats.update(self._backend.describe())
        return stats

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
