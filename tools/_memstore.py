"""Memory notes in the store, found by the store's own full-text index.

The notes live in the store's ``memory`` namespace under ``<scope>/<key>``,
one `MemoryNote` each: committed before a tool answers. A scope is a
project (`scope_for_project`, the same hash the task tracker uses) or
`GLOBAL_SCOPE`.

The store indexes every note of that namespace in the transaction that
writes it (sqlite: FTS5 tables in the store's own file, ranked by BM25;
PostgreSQL: a weighted ``tsvector`` under a GIN index, ranked by
``ts_rank``), so a note is searchable the moment its write is committed,
from any daemon sharing the store, and the index can never lag behind the
notes. Search terms are never handed to the index as syntax (see
`weald.runtime.Store.search`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

import msgspec
from weald.runtime import Store, StoreClosedError, StoreError, TextHit, query_terms
from weald.tools._contract import ToolError

__all__ = [
    "GLOBAL_SCOPE",
    "NAMESPACE",
    "MemoryIndexError",
    "MemoryNote",
    "SearchHit",
    "delete_note",
    "fts_query",
    "get_note",
    "list_keys",
    "search_notes",
    "set_note",
]

NAMESPACE: Final = "memory"
"""The store namespace that holds every scope's notes (the one the store indexes for search)."""

GLOBAL_SCOPE: Final = "global"
"""The scope of notes shared by every project."""

SearchHit = TextHit
"""One note found by `search_notes`: key, score (higher is better, within one search), preview, tags."""


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


class MemoryIndexError(ToolError):
    """The notes cannot be searched (sqlite without FTS5, or the search failed)."""


def fts_query(text: str) -> str:
    """``text`` as the FTS5 query the sqlite store runs: each word quoted, words joined by OR, ``word*`` a prefix.

    Returns:
        The query, or an empty string when ``text`` holds no words.
    """
    return " OR ".join(
        '"' + word.replace('"', '""') + '"' + ("*" if prefix else "") for word, prefix in query_terms(text)
    )


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
    """Write a note, and its index entry, in one transaction (committed before this returns).

    The note it replaces is read in the same transaction, under a lock on
    the key, so concurrent writers (in this daemon or another) each keep the
    first ``created`` time.

    Returns:
        The note written, and the note it replaced (None if the key is new).
    """
    store_key = _store_key(scope, key)
    with store.transaction(f"memory:{store_key}") as tx:
        found: Any = tx.get(NAMESPACE, store_key, None, type=MemoryNote)
        old = found if isinstance(found, MemoryNote) else None
        now = time.time()
        note = MemoryNote(key=key, text=text, tags=tuple(tags), created=old.created if old else now, updated=now)
        tx.write_batch(NAMESPACE, {store_key: note})
    return note, old


def delete_note(store: Store, scope: str, key: str) -> bool:
    """Delete a note (its index entry goes with it); returns whether it existed."""
    return store.delete(NAMESPACE, _store_key(scope, key))


def search_notes(store: Store, scope: str, query: str, limit: int = 10) -> list[SearchHit]:
    """The notes of ``scope`` most relevant to ``query``, best first.

    Args:
        store: the runtime's store.
        scope: a project scope or `GLOBAL_SCOPE`.
        query: free text; never parsed as query syntax.
        limit: the most hits to return.

    Raises:
        MemoryIndexError: the notes cannot be searched (sqlite without FTS5, a failed search).
        StoreClosedError: the store was closed.
    """
    if store.closed:
        msg = f"store {store.location} is closed"
        raise StoreClosedError(msg)
    try:
        return store.search(scope, query, limit)
    except StoreClosedError:
        raise
    except StoreError as exc:
        raise MemoryIndexError(f"{exc}. memory_set and memory_get still work.") from exc
