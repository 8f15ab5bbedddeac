"""Memory notes in the store, and their full-text index (sqlite FTS5, ranked by BM25).

The notes themselves live in the store's ``memory`` namespace under
``<scope>/<key>``, one `MemoryNote` each: the store is the truth, committed
before a tool answers. A scope is a project (`scope_for_project`, the same
hash the task tracker uses) or `GLOBAL_SCOPE`.

The store (sqlitedict) cannot search text, so the notes are also indexed in
an FTS5 table of our own, in a sidecar file next to the store's
(``<store file>.memory-index``, WAL). A sidecar rather than a table in the
store's own file: the index is derived data, it may be deleted at any time
and is rebuilt, and it stays out of the store's transactions, integrity
check and namespace list. Each indexed note carries a revision (a hash of its
key, text and tags); the first use of the index in a process reconciles it
with the store (adding, replacing and dropping notes until every revision
matches), so an index that is missing, from an older schema, corrupt, or
behind because the process died between the store write and the index
write, is brought up to date before anything is searched. Within a process,
note writes and index writes happen under one lock per index, so the two
never disagree in order; a failed index write marks the index stale and the
next search reconciles it again.

Search terms are never handed to FTS5 as syntax: `fts_query` turns any text
into quoted terms joined by OR (BM25 ranks notes matching more, and rarer,
terms first), with a trailing ``*`` kept as a prefix search.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import sqlite3
import threading
import time
import unicodedata
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import msgspec
from weald.runtime import Store, StoreClosedError, msgspec_convert
from weald.tools._contract import ToolError

__all__ = [
    "GLOBAL_SCOPE",
    "INDEX_SUFFIX",
    "NAMESPACE",
    "MemoryIndex",
    "MemoryIndexError",
    "MemoryNote",
    "SearchHit",
    "delete_note",
    "fts5_available",
    "fts_query",
    "get_note",
    "index_for",
    "index_path",
    "list_keys",
    "search_notes",
    "set_note",
]

log = logging.getLogger("weald.tools")

NAMESPACE: Final = "memory"
"""The store namespace that holds every scope's notes."""

GLOBAL_SCOPE: Final = "global"
"""The scope of notes shared by every project."""

INDEX_SUFFIX: Final = ".memory-index"
"""Appended to the store's file name to name the index's file."""

MAX_QUERY_TERMS: Final = 32

# Bump when the index's tables change: an index from another version is rebuilt.
_SCHEMA_VERSION: Final = "1"
# BM25 weights of the FTS columns key, text, tags: a word in the key says most about a note.
_BM25: Final = "bm25(notes, 4.0, 1.0, 2.0)"
_TERM = re.compile(r"\w+(\*)?")
_TAG_SEPARATOR: Final = ", "


class MemoryNote(msgspec.Struct, frozen=True, kw_only=True):
    """One note, as stored.

    Attributes:
        key: its name in its scope.
        text: the note.
        tags: short labels, searched along with the text.
        created: when the key was first written (Unix seconds).
        updated: when the note last changed (Unix seconds).
    """

    key: str
    text: str
    tags: tuple[str, ...] = ()
    created: float = 0.0
    updated: float = 0.0


@attrs.frozen
class SearchHit:
    """One note found by `search_notes`.

    Attributes:
        key: the note's key.
        score: relevance (BM25, higher is better; comparable within one search only).
        preview: a short passage of the text around the matches, matches in ``**``.
        tags: the note's tags.
    """

    key: str
    score: float
    preview: str
    tags: tuple[str, ...] = ()


class MemoryIndexError(ToolError):
    """The full-text index cannot be used (no FTS5 in this sqlite, or the file is unusable)."""


# -- queries ---------------------------------------------------------------------------------


def fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 query: each word quoted, words joined by OR.

    FTS5 syntax in the input (``"``, ``AND``, ``OR``, ``NOT``, ``NEAR``,
    ``(``, ``:``, ``^``...) is treated as text: punctuation separates words
    and operator words become plain terms. A word directly followed by ``*``
    stays a prefix search (``deploy*``).

    Returns:
        The query, or an empty string when ``text`` holds no words.
    """
    terms: list[str] = []
    seen: set[str] = set()
    for match in _TERM.finditer(unicodedata.normalize("NFC", text)):
        word = match.group(0).rstrip("*")
        quoted = '"' + word.replace('"', '""') + '"' + ("*" if match.group(1) else "")
        if quoted.casefold() not in seen:
            seen.add(quoted.casefold())
            terms.append(quoted)
        if len(terms) == MAX_QUERY_TERMS:
            break
    return " OR ".join(terms)


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


# -- the index ---------------------------------------------------------------------------------


def _revision(note: MemoryNote) -> str:
    payload = msgspec.json.encode([note.key, note.text, list(note.tags)])
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def index_path(store: Store) -> Path:
    """Where the index of ``store``'s notes lives: next to the store's file."""
    return store.path.with_name(store.path.name + INDEX_SUFFIX)


def _remove_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            Path(str(path) + suffix).unlink()


class MemoryIndex:
    """The FTS5 index of one store's notes, in its own sqlite file; thread-safe.

    Created by `index_for`, one per `Store`. Methods block; they run in the
    tool's worker thread.

    Args:
        path: the index file (created if missing; rebuilt if unreadable or
            of another schema version).

    Raises:
        MemoryIndexError: FTS5 is missing, or the file cannot be created.
    """

    def __init__(self, path: Path) -> None:
        if not fts5_available():
            raise MemoryIndexError(
                f"memory_search needs sqlite's FTS5 extension, and this Python's sqlite3 "
                f"(SQLite {sqlite3.sqlite_version}) was built without it. memory_set and memory_get still work; "
                "run weald on a Python whose sqlite3 has FTS5 (the python.org and most distribution builds do).",
            )
        self.path = path
        self.lock = threading.RLock()
        self.stale = True
        self.rebuilds = 0
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            # Derived data: an unreadable index is replaced, never trusted.
            log.warning("memory index %s is unusable (%s); rebuilding it from the store", path, exc)
            _remove_files(path)
            try:
                self._conn = self._open()
            except sqlite3.Error as again:
                msg = f"cannot create the memory index {path}: {again}"
                raise MemoryIndexError(msg) from again

    def __repr__(self) -> str:
        return f"<MemoryIndex {self.path} stale={self.stale}>"

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=10.0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is not None and row[0] != _SCHEMA_VERSION:
                conn.execute("DROP TABLE IF EXISTS notes")
                conn.execute("DROP TABLE IF EXISTS docs")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, store_key TEXT NOT NULL UNIQUE, "
                "scope TEXT NOT NULL, rev TEXT NOT NULL)",
            )
            conn.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS notes USING "
                "fts5(key, text, tags, tokenize = 'porter unicode61 remove_diacritics 2')",
            )
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (_SCHEMA_VERSION,))
            # Reading every table proves the file is whole before it is trusted.
            conn.execute("SELECT count(*) FROM docs").fetchone()
            conn.execute("SELECT count(*) FROM notes").fetchone()
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the index file (idempotent)."""
        with self.lock:
            self._conn.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @staticmethod
    def _put(conn: sqlite3.Connection, store_key: str, note: MemoryNote) -> None:
        scope = store_key.partition("/")[0]
        rev = _revision(note)
        row = conn.execute("SELECT id FROM docs WHERE store_key = ?", (store_key,)).fetchone()
        if row is None:
            doc_id = conn.execute(
                "INSERT INTO docs (store_key, scope, rev) VALUES (?, ?, ?)",
                (store_key, scope, rev),
            ).lastrowid
        else:
            doc_id = row[0]
            conn.execute("DELETE FROM notes WHERE rowid = ?", (doc_id,))
            conn.execute("UPDATE docs SET scope = ?, rev = ? WHERE id = ?", (scope, rev, doc_id))
        conn.execute(
            "INSERT INTO notes (rowid, key, text, tags) VALUES (?, ?, ?, ?)",
            (doc_id, note.key, note.text, _TAG_SEPARATOR.join(note.tags)),
        )

    @staticmethod
    def _drop(conn: sqlite3.Connection, store_key: str) -> None:
        row = conn.execute("SELECT id FROM docs WHERE store_key = ?", (store_key,)).fetchone()
        if row is not None:
            conn.execute("DELETE FROM notes WHERE rowid = ?", (row[0],))
            conn.execute("DELETE FROM docs WHERE id = ?", (row[0],))

    def put(self, store_key: str, note: MemoryNote) -> None:
        """Index (or re-index) one note; a failure marks the index stale instead of raising."""
        with self.lock:
            try:
                with self._transaction() as conn:
                    self._put(conn, store_key, note)
            except sqlite3.Error as exc:
                self.stale = True
                log.warning("memory index %s: cannot index %s (%s); it will be rebuilt", self.path, store_key, exc)

    def drop(self, store_key: str) -> None:
        """Remove one note from the index; a failure marks the index stale instead of raising."""
        with self.lock:
            try:
                with self._transaction() as conn:
                    self._drop(conn, store_key)
            except sqlite3.Error as exc:
                self.stale = True
                log.warning("memory index %s: cannot drop %s (%s); it will be rebuilt", self.path, store_key, exc)

    def sync(self, store: Store) -> int:
        """Reconcile the index with every note in ``store``; returns how many entries changed.

        Raises:
            MemoryIndexError: the index file cannot be written.
        """
        with self.lock:
            wanted: dict[str, tuple[MemoryNote, str]] = {}
            for store_key, value in store.items(NAMESPACE):
                try:
                    note = msgspec_convert(value, MemoryNote)
                except msgspec.ValidationError as exc:
                    log.warning("memory note %s in %s is not a note (%s); not indexed", store_key, store.path, exc)
                    continue
                wanted[store_key] = (note, _revision(note))
            try:
                have = dict(self._conn.execute("SELECT store_key, rev FROM docs").fetchall())
                changed = 0
                with self._transaction() as conn:
                    for store_key in have.keys() - wanted.keys():
                        self._drop(conn, store_key)
                        changed += 1
                    for store_key, (note, rev) in wanted.items():
                        if have.get(store_key) != rev:
                            self._put(conn, store_key, note)
                            changed += 1
            except sqlite3.Error as exc:
                msg = f"cannot update the memory index {self.path}: {exc}"
                raise MemoryIndexError(msg) from exc
            self.stale = False
            self.rebuilds += 1
            return changed

    def search(self, store: Store, scope: str, query: str, limit: int) -> list[SearchHit]:
        """The notes of ``scope`` matching ``query`` (see `fts_query`), best first.

        Reconciles the index with ``store`` first if it is stale.

        Raises:
            MemoryIndexError: the index cannot be read or brought up to date.
        """
        match = fts_query(query)
        if not match:
            return []
        with self.lock:
            if self.stale:
                self.sync(store)
            try:
                rows = self._conn.execute(
                    f"SELECT notes.key, {_BM25} AS rank, snippet(notes, 1, '**', '**', '...', 16), notes.tags "  # noqa: S608 - constant SQL
                    "FROM notes JOIN docs ON docs.id = notes.rowid "
                    "WHERE notes MATCH ? AND docs.scope = ? ORDER BY rank LIMIT ?",
                    (match, scope, limit),
                ).fetchall()
            except sqlite3.Error as exc:
                self.stale = True
                msg = f"the memory index {self.path} failed ({exc}); it is rebuilt on the next search, try again"
                raise MemoryIndexError(msg) from exc
        return [
            SearchHit(
                key=key,
                score=-rank,
                preview=" ".join(preview.split()),
                tags=tuple(tags.split(_TAG_SEPARATOR)) if tags else (),
            )
            for key, rank, preview, tags in rows
        ]


_INDEXES: weakref.WeakKeyDictionary[Store, MemoryIndex] = weakref.WeakKeyDictionary()
_INDEXES_GUARD = threading.Lock()
# Serializes note writes when there is no index (no FTS5), as the index's lock does otherwise.
_NO_INDEX_LOCK = threading.RLock()


def index_for(store: Store) -> MemoryIndex:
    """The index of ``store``'s notes, opened once per store (closed when the store is collected).

    Raises:
        MemoryIndexError: FTS5 is missing or the index file cannot be created.
    """
    with _INDEXES_GUARD:
        index = _INDEXES.get(store)
        if index is None:
            index = MemoryIndex(index_path(store))
            weakref.finalize(store, index.close)
            _INDEXES[store] = index
        return index


def _index_or_none(store: Store) -> MemoryIndex | None:
    try:
        return index_for(store)
    except MemoryIndexError as exc:
        log.warning("memory notes of %s are not indexed: %s", store.path, exc)
        return None


# -- notes -------------------------------------------------------------------------------------


def _store_key(scope: str, key: str) -> str:
    return f"{scope}/{key}"


def get_note(store: Store, scope: str, key: str) -> MemoryNote | None:
    """The note under ``key`` in ``scope``, or None."""
    value: Any = store.get(NAMESPACE, _store_key(scope, key), None, type=MemoryNote)
    return value if isinstance(value, MemoryNote) else None


def list_keys(store: Store, scope: str) -> list[str]:
    """Every note key in ``scope``, oldest first."""
    prefix = _store_key(scope, "")
    return [k[len(prefix) :] for k in store.keys(NAMESPACE, prefix=prefix)]


def set_note(
    store: Store,
    scope: str,
    key: str,
    text: str,
    tags: Iterable[str] = (),
) -> tuple[MemoryNote, MemoryNote | None]:
    """Write a note (committed to the store before this returns) and index it.

    Returns:
        The note written, and the note it replaced (None if the key is new).
    """
    store_key = _store_key(scope, key)
    index = _index_or_none(store)
    with index.lock if index is not None else _NO_INDEX_LOCK:
        old = get_note(store, scope, key)
        now = time.time()
        note = MemoryNote(key=key, text=text, tags=tuple(tags), created=old.created if old else now, updated=now)
        store.put(NAMESPACE, store_key, note)
        if index is not None:
            index.put(store_key, note)
    return note, old


def delete_note(store: Store, scope: str, key: str) -> bool:
    """Delete a note and drop it from the index; returns whether it existed."""
    store_key = _store_key(scope, key)
    index = _index_or_none(store)
    with index.lock if index is not None else _NO_INDEX_LOCK:
        existed = store.delete(NAMESPACE, store_key)
        if index is not None:
            index.drop(store_key)
    return existed


def search_notes(store: Store, scope: str, query: str, limit: int = 10) -> list[SearchHit]:
    """The notes of ``scope`` most relevant to ``query``, best first (FTS5, BM25).

    Args:
        store: the runtime's store.
        scope: a project scope or `GLOBAL_SCOPE`.
        query: free text; never parsed as FTS5 syntax (see `fts_query`).
        limit: the most hits to return.

    Raises:
        MemoryIndexError: FTS5 is missing or the index cannot be used.
        StoreClosedError: the store was closed (the index outlives it until it is collected).
    """
    if store.closed:
        msg = f"store {store.path} is closed"
        raise StoreClosedError(msg)
    return index_for(store).search(store, scope, query, limit)
