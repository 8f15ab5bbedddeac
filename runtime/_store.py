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

Methods block the calling thread; trio code uses the ``a``-prefixed variants,
which run the same operation in a worker thread.

Write-behind: `enqueue_nowait` hands a value to the store's committer thread
and returns at once; the committer commits everything queued in groups, so
thousands of agents writing their histories share commits. `flush` returns a
future resolved once everything enqueued before it is committed: acknowledge
work only after that. The queue belongs to the store, not to the writer, so
an actor that is killed loses nothing it enqueued; `close` drains the queue
before closing.

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
"""

from __future__ import annotations

import contextlib
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import msgspec
import trio
from sqlitedict import SqliteDict
from weald.runtime._errors import StoreClosedError, StoreCodecError, StoreCorruptError, StoreError
from weald.runtime._future import Future

__all__ = ["Store"]

T = TypeVar("T")

_NAMESPACE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_MISSING: Any = object()


def _identity(value: Any) -> Any:
    return value


class Store:
    """A namespaced, persistent key-value store; thread-safe.

    Args:
        path: the database file; its directory is created if missing.
        durability: ``"process"`` survives a process crash; ``"power"``
            also survives power loss, at the cost of an fsync per write.

    Raises:
        StoreCorruptError: the file exists but is not a readable database.
        StoreError: the file cannot be created or opened.
    """

    def __init__(self, path: str | Path, *, durability: Literal["process", "power"] = "process") -> None:
        self.path = Path(path).expanduser()
        self.durability = durability
        self._lock = threading.RLock()
        self._tables: dict[str, SqliteDict] = {}
        self._closed = False
        self.writes = 0
        self.reads = 0
        self.commits = 0
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._committer: threading.Thread | None = None
        self._committer_lock = threading.Lock()
        self._write_error: BaseException | None = None
        self._writer: sqlite3.Connection | None = None  # the committer's connection
        self._closing = False
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
            return msgspec.json.decode(raw, type=type_)
        except msgspec.DecodeError as exc:
            msg = f"value of {namespace}/{key} in {self.path} cannot be decoded: {exc}"
            raise StoreCodecError(msg) from exc

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            msg = f"store keys are non-empty strings, got {key!r}"
            raise StoreError(msg)

    def _run(self, namespace: str, op: Callable[[SqliteDict], T]) -> T:
        with self._lock:
            if self._closed:
                msg = f"store {self.path} is closed"
                raise StoreClosedError(msg)
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
        raw = self._run(namespace, lambda t: t.get(key, _MISSING))
        self.reads += 1
        if raw is _MISSING:
            return default
        return self._decode(namespace, key, raw, type)

    def __contains__(self, item: tuple[str, str]) -> bool:
        namespace, key = item
        return self._run(namespace, lambda t: key in t)

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

    def count(self, namespace: str) -> int:
        """Return how many keys a namespace holds."""
        return self._run(namespace, len)

    def _select(self, namespace: str, columns: str, prefix: str) -> list[tuple[Any, ...]]:
        def op(table: SqliteDict) -> list[tuple[Any, ...]]:
            name = table.tablename
            if prefix:
                # Keys in [prefix, prefix + U+10FFFF) start with prefix.
                sql = f'SELECT {columns} FROM "{name}" WHERE key >= ? AND key < ? ORDER BY rowid'  # noqa: S608
                return list(table.conn.select(sql, (prefix, prefix + "\U0010ffff")))
            sql = f'SELECT {columns} FROM "{name}" ORDER BY rowid'  # noqa: S608
            return list(table.conn.select(sql))

        return self._run(namespace, op)

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
        """
        wanted = list(deletes)

        def op(table: SqliteDict) -> int:
            removed = 0
            try:
                for key, raw in puts.items():
                    table[key] = raw
                for key in wanted:
                    if key in table:
                        del table[key]
                        removed += 1
                table.commit(blocking=True)
            except Exception:
                _rollback(table)
                raise
            return removed

        removed = self._run(namespace, op)
        self.writes += len(puts) + removed
        self.commits += 1
        return removed

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
        if self._write_error is not None:
            msg = f"store {self.path} could not commit queued writes: {self._write_error}"
            raise StoreError(msg) from self._write_error
        raw = self._encode(namespace, key, value)
        self._queue.put(("put", namespace, key, raw))
        self._ensure_committer()

    def flush(self) -> Future[None]:
        """A future resolved once every write enqueued before this call is committed.

        It fails with `StoreError` if those writes could not be committed.
        Await it from trio, or ``.get()`` it from a thread.
        """
        future: Future[None] = Future()
        if self._closing and self._committer is None:
            future.set(None)
            return future
        self._queue.put(("flush", future))
        self._ensure_committer()
        return future

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
            conn, self._writer = self._writer, None
            if conn is not None:
                conn.close()

    def _commit_rounds(self) -> None:
        q = self._queue
        while True:
            items = [q.get()]
            while len(items) < 1024:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            stop = False
            puts: dict[str, dict[str, bytes]] = {}
            flushes: list[Future[None]] = []
            for item in items:
                if item[0] == "put":
                    puts.setdefault(item[1], {})[item[2]] = item[3]
                elif item[0] == "flush":
                    flushes.append(item[1])
                else:
                    stop = True
            error = self._commit_group(puts)
            for future in flushes:
                if error is None:
                    future.set(None)
                else:
                    exc = StoreError(f"store {self.path} could not commit queued writes: {error}")
                    exc.__cause__ = error
                    future.set_exception((StoreError, exc, None))
            if stop:
                return

    def _commit_group(self, puts: dict[str, dict[str, bytes]]) -> BaseException | None:
        """Commit one group in one transaction; retried a few times, then the store refuses writes."""
        if not puts:
            return None
        for attempt in range(5):
            try:
                self._write_group(puts)
            except StoreClosedError as exc:
                self._write_error = exc
                return exc
            except Exception as exc:
                if attempt == 4:
                    self._write_error = exc
                    return exc
                threading.Event().wait(0.05 * 2**attempt)
            else:
                return None
        return None  # not reached: the last attempt returns

    def _write_group(self, puts: dict[str, dict[str, bytes]]) -> None:
        with self._lock:
            for namespace in puts:
                self._table(namespace)  # sqlitedict creates the table; raises once the store is closed
        conn = self._writer
        if conn is None:
            # The committer's own connection (this thread only); the file is in
            # WAL mode already, set by sqlitedict when it opened a table.
            conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
            sync = "FULL" if self.durability == "power" else "NORMAL"
            conn.execute(f"PRAGMA synchronous={sync}")
            self._writer = conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for namespace, values in puts.items():
                # The statement sqlitedict's __setitem__ runs, for every value at
                # once; `_table` checked the namespace against _NAMESPACE above.
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
        self._closing = True  # refuse new queued writes; drain the ones already queued
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
        for table in tables:
            table.close()

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
            "queued": self._queue.qsize(),
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

    async def awrite_batch(
        self, namespace: str, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = ()
    ) -> None:
        """`write_batch` for trio code."""
        await trio.to_thread.run_sync(lambda: self.write_batch(namespace, puts, deletes))


def _rollback(table: SqliteDict) -> None:
    try:
        table.conn.execute("ROLLBACK")
        table.conn.commit(blocking=True)
    except Exception:  # noqa: S110 - nothing was pending to roll back
        pass
