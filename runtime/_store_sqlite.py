"""The embedded store: one sqlite file, one sqlitedict table per namespace (the default on one machine).

- The file runs in WAL mode; ``durability="process"`` (``synchronous=NORMAL``)
  survives a crash of the process (kill -9), ``durability="power"`` also
  fsyncs every commit (``FULL``).
- An unreadable, corrupt or foreign file is reported with its name
  (`StoreCorruptError`) and never replaced.
- A write that fails because the disk is full is a `StoreFullError` naming
  the directory; the file stays intact (each write is one transaction).
- One owner at a time: the daemon holds a lock on the file
  (``lock_state_dir``), so commits check no placement (`fences` is False).

Connections: sqlitedict creates the tables and serves ``contains``,
``count`` and ``select_range``; `get` and `select` read through one
connection of ours (sqlitedict hands rows over one by one through a queue);
synchronous writes go through another, under the backend's lock; the
committer thread has its own. sqlitedict's worker thread ends for good when
a COMMIT fails (leaving its caller waiting forever), so no write goes
through it.

Memory notes (`TEXT_NAMESPACE`) are indexed in FTS5 tables of the same file
(``_weald_memory_docs`` and ``_weald_memory_fts``), written in the
transaction that writes the note. A file from before the index moved here
is indexed when it is opened, and the old sidecar index file beside it
(``<file>.memory-index``) is removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from sqlitedict import SqliteDict
from weald.runtime._errors import StoreClosedError, StoreCorruptError, StoreError, StoreFullError
from weald.runtime._files import make_private_dirs
from weald.runtime._store_backend import (
    TAG_SEPARATOR,
    TEXT_NAMESPACE,
    BackendTransaction,
    NodeLease,
    StoreBackend,
    TextHit,
    is_namespace,
    text_note,
    text_scope,
)

__all__ = ["SqliteBackend", "fts5_available"]

logger = logging.getLogger("weald.runtime")

T = TypeVar("T")

_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_SQLITE_CANTOPEN = 14

# Bump when the index's tables change: an index of another version is rebuilt from the notes.
_INDEX_VERSION: Final = "1"
_OLD_INDEX_SUFFIX: Final = ".memory-index"
# BM25 weights of the FTS columns key, text, tags: a word in the key says most about a note.
_BM25: Final = "bm25(_weald_memory_fts, 4.0, 1.0, 2.0)"


def _identity(value: Any) -> Any:
    return value


_FTS5: bool | None = None


def fts5_available() -> bool:
    """True if this Python's sqlite3 has the FTS5 extension (checked once)."""
    global _FTS5
    if _FTS5 is None:
        conn = sqlite3.connect(":memory:")
        try:
            conn.execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
            _FTS5 = True
        except sqlite3.OperationalError:
            _FTS5 = False
        finally:
            conn.close()
    return _FTS5


def _revision(key: str, text: str, tags: Iterable[str]) -> str:
    payload = "\x00".join([key, text, *tags]).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


class _Tx(BackendTransaction):
    def __init__(self, backend: SqliteBackend, conn: sqlite3.Connection) -> None:
        self._backend = backend
        self._conn = conn

    def get(self, namespace: str, key: str) -> bytes | None:
        if not self._backend.has_table(namespace):
            return None
        row = self._conn.execute(f'SELECT value FROM "{namespace}" WHERE key = ?', (key,)).fetchone()  # noqa: S608
        return None if row is None else bytes(row[0])

    def items(self, namespace: str, prefix: str) -> list[tuple[str, bytes]]:
        if not self._backend.has_table(namespace):
            return []
        sql = f'SELECT key, value FROM "{namespace}" WHERE key >= ? AND key < ? ORDER BY rowid'  # noqa: S608
        return [(key, bytes(raw)) for key, raw in self._conn.execute(sql, (prefix, prefix + "\U0010ffff"))]

    def write(self, namespace: str, puts: Mapping[str, bytes], deletes: Iterable[str]) -> int:
        self._backend.create_table(namespace, self._conn)
        return self._backend.apply(self._conn, namespace, puts, list(deletes))


class SqliteBackend(StoreBackend):
    """A store file (see the module docstring).

    Args:
        path: the database file; its directory is created if missing.
        durability: ``"process"`` or ``"power"``.

    Raises:
        StoreCorruptError: the file exists but is not a readable database.
        StoreError: the file cannot be created or opened.
    """

    kind = "sqlite"
    fences = False

    def __init__(self, path: Path, durability: Literal["process", "power"] = "process") -> None:
        self.path = path
        self.location = str(path)
        self.durability = durability
        self._lock = threading.RLock()
        self._tables: dict[str, SqliteDict] = {}
        self._closed = False
        self._writer: sqlite3.Connection | None = None  # the committer's connection
        self._sync_writer: sqlite3.Connection | None = None  # synchronous writes', under _lock
        self._read_conn: sqlite3.Connection | None = None  # reads', under _lock
        self._check_file()
        self._indexed = fts5_available()
        if self._indexed:
            self._prepare_index()

    # -- opening -------------------------------------------------------------------------

    def _check_file(self) -> None:
        path = self.path
        if path.is_dir():
            msg = f"store path {path} is a directory, not a database file"
            raise StoreError(msg)
        try:
            make_private_dirs(path.parent)
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
        else:
            # Owner-only whatever the umask: it holds histories and tokens. SQLite
            # gives its -wal and -shm files the database file's permissions.
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
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

    def _prepare_index(self) -> None:
        """Create the memory index's tables; index the notes of a file whose index is missing or of another version."""

        def prepare(conn: sqlite3.Connection) -> None:
            conn.execute("CREATE TABLE IF NOT EXISTS _weald_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = conn.execute("SELECT value FROM _weald_meta WHERE key = 'memory_index'").fetchone()
            if row is not None and row[0] == _INDEX_VERSION:
                return
            conn.execute("DROP TABLE IF EXISTS _weald_memory_fts")
            conn.execute("DROP TABLE IF EXISTS _weald_memory_docs")
            conn.execute(
                "CREATE TABLE _weald_memory_docs (id INTEGER PRIMARY KEY, store_key TEXT NOT NULL UNIQUE, "
                "scope TEXT NOT NULL, rev TEXT NOT NULL)"
            )
            conn.execute(
                "CREATE VIRTUAL TABLE _weald_memory_fts USING "
                "fts5(key, text, tags, tokenize = 'porter unicode61 remove_diacritics 2')"
            )
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TEXT_NAMESPACE,)
            ).fetchone()
            if exists:
                rows = conn.execute(f'SELECT key, value FROM "{TEXT_NAMESPACE}" ORDER BY rowid').fetchall()  # noqa: S608
                self._index(conn, {key: bytes(raw) for key, raw in rows}, [])
            conn.execute("INSERT OR REPLACE INTO _weald_meta VALUES ('memory_index', ?)", (_INDEX_VERSION,))

        self._write_sync(prepare, "the memory index")
        # The index lived in a file of its own before it moved into the store's.
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                Path(str(self.path) + _OLD_INDEX_SUFFIX + suffix).unlink()

    def has_table(self, namespace: str) -> bool:
        """Whether the file has the namespace's table (a read; no table is created)."""
        if namespace in self._tables:
            return True
        with self._lock:
            return self._exists(namespace)

    def _exists(self, namespace: str) -> bool:
        try:
            row = (
                self._sync_conn()
                .execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (namespace,))
                .fetchone()
            )
        except sqlite3.Error as exc:
            msg = f"store {self.path}: cannot read its namespaces: {exc}"
            raise StoreError(msg) from exc
        return row is not None

    def _table(self, namespace: str) -> SqliteDict:
        """The namespace's sqlitedict table, created if missing (under ``_lock``)."""
        table = self._tables.get(namespace)
        if table is not None:
            return table
        self._check_open()
        # Created here, where a failed COMMIT is an error, not in sqlitedict's
        # thread (see the module docstring); sqlitedict's own CREATE TABLE IF
        # NOT EXISTS then writes nothing. The schema is sqlitedict's.
        self._write_sync(lambda conn: self.create_table(namespace, conn), f"the new namespace {namespace!r}")
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
            table.conn.execute(f"PRAGMA synchronous={self._sync_mode}")
            table.conn.commit(blocking=True)
        except Exception as exc:
            msg = f"cannot open namespace {namespace!r} in store file {self.path}: {exc}"
            raise StoreError(msg) from exc
        self._tables[namespace] = table
        return table

    @staticmethod
    def create_table(namespace: str, conn: sqlite3.Connection) -> None:
        """``CREATE TABLE IF NOT EXISTS`` the namespace's table on ``conn`` (in its transaction, if any)."""
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{namespace}" (key TEXT PRIMARY KEY, value BLOB)')

    @property
    def _sync_mode(self) -> str:
        return "FULL" if self.durability == "power" else "NORMAL"

    def _check_open(self) -> None:
        if self._closed:
            msg = f"store {self.path} is closed"
            raise StoreClosedError(msg)

    def _run(self, namespace: str, op: Callable[[SqliteDict], T], missing: Any) -> T:
        """Run a read on the namespace's table; a namespace missing from the file reads as ``missing``."""
        with self._lock:
            self._check_open()
            if namespace not in self._tables and not self._exists(namespace):
                return missing  # type: ignore[no-any-return]
            table = self._table(namespace)
            try:
                return op(table)
            except StoreError:
                raise
            except Exception as exc:
                msg = f"store {self.path}, namespace {namespace!r}: {exc}"
                raise StoreError(msg) from exc

    # -- reads ------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> bytes | None:
        def op(table: SqliteDict) -> Any:
            sql = f'SELECT value FROM "{table.tablename}" WHERE key = ?'  # noqa: S608
            row = self._reader().execute(sql, (key,)).fetchone()
            return None if row is None else row[0]

        return self._run(namespace, op, None)  # type: ignore[no-any-return]

    def contains(self, namespace: str, key: str) -> bool:
        return self._run(namespace, lambda t: key in t, False)

    def select(self, namespace: str, prefix: str, *, values: bool) -> list[tuple[Any, ...]]:
        columns = "key, value" if values else "key"

        def op(table: SqliteDict) -> list[tuple[Any, ...]]:
            name = table.tablename
            reader = self._reader()
            if prefix:
                # Keys in [prefix, prefix + U+10FFFF) start with prefix.
                sql = f'SELECT {columns} FROM "{name}" WHERE key >= ? AND key < ? ORDER BY rowid'  # noqa: S608
                return reader.execute(sql, (prefix, prefix + "\U0010ffff")).fetchall()
            sql = f'SELECT {columns} FROM "{name}" ORDER BY rowid'  # noqa: S608
            return reader.execute(sql).fetchall()

        return self._run(namespace, op, [])

    def select_range(
        self, namespace: str, low: str, high: str, limit: int | None, *, newest_first: bool
    ) -> list[tuple[str, bytes]]:
        order = "DESC" if newest_first else "ASC"
        bound = " LIMIT ?" if limit is not None else ""
        args: tuple[Any, ...] = (low, high) if limit is None else (low, high, max(0, limit))

        def op(table: SqliteDict) -> list[tuple[str, bytes]]:
            sql = (
                f'SELECT key, value FROM "{table.tablename}" WHERE key >= ? AND key < ? '  # noqa: S608
                f"ORDER BY key {order}{bound}"
            )
            # Through the read connection, in one call (see `_reader`): sqlitedict's own
            # hands rows over one at a time through its worker thread's queue (2 ms of
            # a wake with a 200-message history, read with this).
            return self._reader().execute(sql, args).fetchall()

        # A range read creates a missing namespace, as it always did (its table is then empty).
        with self._lock:
            self._check_open()
            self._table(namespace)
        return self._run(namespace, op, [])

    def count(self, namespace: str) -> int:
        return self._run(namespace, len, 0)

    def dump(self, namespace: str, batch: int) -> Iterator[list[tuple[str, bytes]]]:
        after = 0
        sql = f'SELECT rowid, key, value FROM "{namespace}" WHERE rowid > ? ORDER BY rowid LIMIT ?'  # noqa: S608
        while True:

            def page(_table: SqliteDict, since: int = after) -> list[tuple[Any, ...]]:
                return self._reader().execute(sql, (since, batch)).fetchall()

            rows = self._run(namespace, page, [])
            if not rows:
                return
            after = rows[-1][0]
            yield [(key, bytes(raw)) for _, key, raw in rows]

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(n for n in SqliteDict.get_tablenames(str(self.path)) if is_namespace(n))

    def _reader(self) -> sqlite3.Connection:
        """The read connection to the file (made on first use; closed by `close`). Called under ``_lock``.

        Reads used to go through sqlitedict's worker thread, which hands the
        rows over one by one through a queue: ~25 us a row, 5 ms for an
        agent's 200-message history. This connection reads them in one call;
        in WAL mode it sees every committed write. One for every reading
        thread: reads run under the backend's lock anyway, and a connection
        per thread kept a page cache per thread (up to 2 MiB each, 90 MiB of
        RSS with the 47 worker threads a burst of 10,000 starts left).
        """
        conn = self._read_conn
        if conn is None:
            conn = self._read_conn = sqlite3.connect(str(self.path), timeout=30, check_same_thread=False)
        return conn

    # -- writes -------------------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        with self._lock:
            self._table(namespace)

    def apply(self, conn: sqlite3.Connection, namespace: str, puts: Mapping[str, bytes], deletes: list[str]) -> int:
        """Write and delete in the transaction open on ``conn``; returns how many deletes existed."""
        # The store checked the namespace's name, so it is safe in SQL.
        if puts:
            conn.executemany(f'REPLACE INTO "{namespace}" (key, value) VALUES (?,?)', puts.items())  # noqa: S608
        removed = 0
        if deletes:
            delete = f'DELETE FROM "{namespace}" WHERE key = ?'  # noqa: S608
            removed = sum(conn.execute(delete, (key,)).rowcount for key in deletes)
        if namespace == TEXT_NAMESPACE and self._indexed:
            self._index(conn, puts, deletes)
        return removed

    def transact(self, namespace: str, puts: Mapping[str, bytes], deletes: list[str], what: str) -> int:
        with self._lock:
            self._check_open()
            self._table(namespace)
            return self._write_sync(lambda conn: self.apply(conn, namespace, puts, deletes), what)

    @contextlib.contextmanager
    def transaction(self, lock: str | None, what: str) -> Iterator[BackendTransaction]:  # noqa: ARG002 - see below
        # BEGIN IMMEDIATE takes the file's write lock: every writer of the file
        # waits for it, which serializes whatever ``lock`` names, and more.
        with self._lock:
            self._check_open()
            try:
                conn = self._sync_conn()
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self.failure(exc, what) from exc
            try:
                yield _Tx(self, conn)
                conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise self.failure(exc, what) from exc
                raise

    def _write_sync(self, op: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``op`` in one immediate transaction on the synchronous writer; committed or rolled back whole."""
        with self._lock:
            try:
                conn = self._sync_conn()
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = op(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self.failure(exc, what) from exc
            return result

    def _sync_conn(self) -> sqlite3.Connection:
        conn = self._sync_writer
        if conn is None:
            conn = self._sync_writer = self._connect_writer(check_same_thread=False)
        return conn

    def write_group(
        self,
        group: Mapping[str, Mapping[str, bytes]],
        fence: Mapping[str, int],  # noqa: ARG002 - the file has one owner (see the module docstring)
        node: NodeLease | None,  # noqa: ARG002
    ) -> None:
        with self._lock:
            for namespace in group:
                self._table(namespace)  # creates the table; raises once the store is closed
        conn = self._writer
        if conn is None:
            # The committer's own connection (its thread only).
            conn = self._writer = self._connect_writer()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for namespace, values in group.items():
                self.apply(conn, namespace, values, [])
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def close_committer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            conn.close()

    def _connect_writer(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        """A connection for writing, in autocommit mode (transactions are explicit), synced per durability."""
        conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=check_same_thread)
        conn.execute(f"PRAGMA synchronous={self._sync_mode}")
        return conn

    # -- the memory index ----------------------------------------------------------------------------

    def _index(self, conn: sqlite3.Connection, puts: Mapping[str, bytes], deletes: Iterable[str]) -> None:
        """Bring the index in line with these writes to the notes, in the transaction open on ``conn``."""
        for store_key in deletes:
            self._unindex(conn, store_key)
        for store_key, raw in puts.items():
            note = text_note(raw)
            if note is None:
                logger.warning("store %s: %s/%s is not a note; not indexed", self.path, TEXT_NAMESPACE, store_key)
                self._unindex(conn, store_key)
                continue
            rev = _revision(note.key, note.text, note.tags)
            row = conn.execute("SELECT id, rev FROM _weald_memory_docs WHERE store_key = ?", (store_key,)).fetchone()
            if row is not None and row[1] == rev:
                continue
            if row is None:
                doc_id = conn.execute(
                    "INSERT INTO _weald_memory_docs (store_key, scope, rev) VALUES (?, ?, ?)",
                    (store_key, text_scope(store_key), rev),
                ).lastrowid
            else:
                doc_id = row[0]
                conn.execute("DELETE FROM _weald_memory_fts WHERE rowid = ?", (doc_id,))
                conn.execute("UPDATE _weald_memory_docs SET rev = ? WHERE id = ?", (rev, doc_id))
            conn.execute(
                "INSERT INTO _weald_memory_fts (rowid, key, text, tags) VALUES (?, ?, ?, ?)",
                (doc_id, note.key, note.text, TAG_SEPARATOR.join(note.tags)),
            )

    @staticmethod
    def _unindex(conn: sqlite3.Connection, store_key: str) -> None:
        row = conn.execute("SELECT id FROM _weald_memory_docs WHERE store_key = ?", (store_key,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM _weald_memory_fts WHERE rowid = ?", (row[0],))
            conn.execute("DELETE FROM _weald_memory_docs WHERE id = ?", (row[0],))

    def search(self, scope: str, terms: list[tuple[str, bool]], limit: int) -> list[TextHit]:
        if not self._indexed:
            msg = (
                f"searching notes needs sqlite's FTS5 extension, and this Python's sqlite3 (SQLite "
                f"{sqlite3.sqlite_version}) was built without it; run weald on a Python whose sqlite3 has FTS5 "
                "(the python.org and most distribution builds do), or keep the store in PostgreSQL"
            )
            raise StoreError(msg)
        if not terms:
            return []
        match = " OR ".join('"' + word.replace('"', '""') + '"' + ("*" if prefix else "") for word, prefix in terms)
        # The best `limit` first, then a preview of those only: a snippet costs a pass over its
        # note, and a common word matches every note (50x the search itself on 10,000 notes).
        best = (
            f"SELECT f.rowid, {_BM25} AS rank FROM _weald_memory_fts AS f "  # noqa: S608 - constant SQL
            "JOIN _weald_memory_docs AS d ON d.id = f.rowid "
            "WHERE _weald_memory_fts MATCH ? AND d.scope = ? ORDER BY rank LIMIT ?"
        )
        preview = (
            "SELECT rowid, key, snippet(_weald_memory_fts, 1, '**', '**', '...', 16), tags FROM _weald_memory_fts "
            "WHERE _weald_memory_fts MATCH ? AND rowid IN (SELECT value FROM json_each(?))"
        )
        with self._lock:
            self._check_open()
            try:
                reader = self._reader()
                ranked = reader.execute(best, (match, scope, limit)).fetchall()
                shown = {
                    row[0]: row[1:]
                    for row in reader.execute(preview, (match, "[" + ",".join(str(r[0]) for r in ranked) + "]"))
                }
                rows = [(*shown[rowid][:1], rank, *shown[rowid][1:]) for rowid, rank in ranked if rowid in shown]
            except sqlite3.Error as exc:
                msg = f"store {self.path}: searching the notes failed: {exc}"
                raise StoreError(msg) from exc
        return [
            TextHit(
                key=key,
                score=-rank,
                preview=" ".join(preview.split()),
                tags=tuple(tags.split(TAG_SEPARATOR)) if tags else (),
            )
            for key, rank, preview, tags in rows
        ]

    # -- lifecycle --------------------------------------------------------------------------------------

    def join(self, node_id: str, lease: float, info: Mapping[str, Any]) -> NodeLease:  # noqa: ARG002 - no node rows
        # One owner at a time (the daemon's lock on the file): the epoch counts its starts.
        def bump(conn: sqlite3.Connection) -> int:
            conn.execute("CREATE TABLE IF NOT EXISTS _weald_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            key = f"epoch:{node_id}"
            row = conn.execute("SELECT value FROM _weald_meta WHERE key = ?", (key,)).fetchone()
            epoch = (int(row[0]) if row is not None and row[0].isdigit() else 0) + 1
            conn.execute("INSERT OR REPLACE INTO _weald_meta VALUES (?, ?)", (key, str(epoch)))
            return epoch

        return NodeLease(node_id=node_id, epoch=self._write_sync(bump, f"node {node_id}'s epoch"), lease=lease)

    def claim(self, node: NodeLease, session_ids: Iterable[str] | None) -> dict[str, int]:
        # Every session of the file is this node's: the file has one owner.
        if session_ids is None:
            return {key: node.epoch for (key,) in self.select("sessions", "", values=False)}
        return dict.fromkeys(session_ids, node.epoch)

    def claim_orphans(self, node: NodeLease) -> dict[str, int]:  # noqa: ARG002 - one owner: no orphans
        return {}

    def placed_here(self, node: NodeLease, session: str) -> bool:  # noqa: ARG002 - one owner: nothing moves here
        return False

    def renew(self, node: NodeLease, info: Mapping[str, Any] | None = None) -> bool:  # noqa: ARG002 - one owner
        return True

    def handover(self, node: NodeLease, held: Mapping[str, int], to: str) -> dict[str, int]:  # noqa: ARG002
        msg = f"store {self.path}: a sqlite store has one node; sessions move between nodes on a postgresql:// store"
        raise StoreError(msg)

    def leave(self, node: NodeLease) -> None:
        pass

    def release(self, node: NodeLease, session_ids: Iterable[str]) -> None:
        pass

    def placement_changes(self, node: NodeLease, held: Mapping[str, int]) -> tuple[list[str], list[str]]:  # noqa: ARG002
        return [], []  # one owner: nobody takes them, nobody hands any over

    def failure(self, exc: BaseException, what: str) -> StoreError:
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

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def backup(self, target: Path, progress: Callable[[int, int], None] | None = None) -> None:
        """Copy the whole database to ``target`` with sqlite's online backup API (writers may go on meanwhile).

        Raises:
            StoreError: the copy failed (the target is then removed).
        """
        try:
            # A new copy is owner-only, as the store is (one that cannot be made: sqlite says why below).
            with contextlib.suppress(OSError):
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))

            def step(_status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)

            with (
                contextlib.closing(sqlite3.connect(str(self.path), timeout=30)) as source,
                contextlib.closing(sqlite3.connect(str(target))) as dest,
            ):
                source.backup(dest, pages=256, progress=step)
        except sqlite3.Error as exc:
            with contextlib.suppress(OSError):
                target.unlink()
            raise self.failure(exc, f"a backup to {target}") from exc

    def close(self) -> None:
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

    @property
    def open_namespaces(self) -> list[str]:
        """The namespaces opened so far (for statistics)."""
        return sorted(self._tables)


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
