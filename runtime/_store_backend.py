"""What a `Store` needs from a database: the `StoreBackend` contract, and what both backends share.

The `Store` (``_store.py``) keeps everything that does not depend on the
database: the write-behind queue and its committer thread, retained groups,
the hand-over timers, the codec, the read-your-writes rule. A backend does
the SQL, on connections of its own:

- `SqliteBackend` (``_store_sqlite.py``): one file, one table per
  namespace (sqlitedict's schema), the default on one machine;
- `PostgresBackend` (``_store_postgres.py``): a ``postgresql://`` database
  several daemons may share, with the ``nodes`` and ``placement`` tables and
  the fence every commit checks.

Threads: `StoreBackend.write_group` runs on the store's committer thread
only (its connection is that thread's); every other method may be called
from any thread, and the backend serializes what must be.

Text search: the values of the `TEXT_NAMESPACE` namespace (memory notes,
``{"key", "text", "tags"}``) are indexed by the backend in the same
transaction that writes them (FTS5 in sqlite, ``tsvector`` + GIN in
Postgres), so a note is found by search as soon as its write is committed,
from any daemon sharing the database. `query_terms` turns free text into
terms; no backend ever hands user text to its query syntax.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import attrs
import msgspec
from weald.runtime._codec import msgspec_decoder
from weald.runtime._errors import StoreError

__all__ = [
    "MAX_QUERY_TERMS",
    "TAG_SEPARATOR",
    "TEXT_NAMESPACE",
    "BackendTransaction",
    "FencedSessions",
    "NodeLease",
    "StoreBackend",
    "TextHit",
    "TextNote",
    "check_namespace",
    "is_namespace",
    "is_url",
    "mask_url",
    "query_terms",
    "text_note",
    "text_scope",
    "url_password",
]

TEXT_NAMESPACE: Final = "memory"
"""The namespace whose values the store indexes for full-text search (see `StoreBackend.search`)."""

MAX_QUERY_TERMS: Final = 32
"""The most terms a search uses; the rest of the text is ignored."""

_TERM = re.compile(r"\w+(\*)?")
_NAMESPACE = re.compile(r"\A[a-z][a-z0-9_]{0,62}\Z")  # \Z: "$" would let a final newline in


def check_namespace(namespace: str) -> None:
    """Refuse a namespace name that is not lowercase letters, digits and ``_``, starting with a letter.

    Raises:
        StoreError: it is not.
    """
    if not _NAMESPACE.match(namespace):
        msg = f"bad namespace {namespace!r}: use lowercase letters, digits and _, starting with a letter"
        raise StoreError(msg)


def is_namespace(name: str) -> bool:
    """Whether ``name`` is a namespace's (tables of the backend's own start with ``_`` or ``weald_``)."""
    return bool(_NAMESPACE.match(name)) and not name.startswith("weald_")


# -- URLs -----------------------------------------------------------------------------------------


def is_url(target: str | Path) -> bool:
    """Whether a store target is a database URL (``postgresql://``, ``postgres://``) rather than a file."""
    return isinstance(target, str) and target.split(":", 1)[0].lower() in ("postgresql", "postgres")


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (in the user part and in a ``password=`` parameter).

    What every message, status and log line shows of a database URL: it
    names the server, the user and the database, never the password.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{hosts}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(name.lower() == "password" for name, _ in pairs):
            query = "&".join(
                f"{name}=***" if name.lower() == "password" else f"{name}={urllib.parse.quote(value)}"
                for name, value in pairs
            )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_password(url: str) -> str | None:
    """The password a database URL carries (user part or ``password=``), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # not a URL urllib reads (libpq may still quote it whole in an error)
        found = re.search(r"//[^:/@]*:([^@]*)@", url)
        return urllib.parse.unquote(found.group(1)) if found and found.group(1) else None
    if parts.password:
        return urllib.parse.unquote(parts.password)
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() == "password" and value:
            return value
    return None


# -- text search ---------------------------------------------------------------------------------


def query_terms(text: str) -> list[tuple[str, bool]]:
    """The words of free text, each once (case-folded), as ``(word, prefix)``: ``deploy*`` is a prefix search.

    Punctuation separates words and operator words (``AND``, ``NOT``,
    ``NEAR``...) are plain terms: a backend quotes each term in its own
    query syntax, and nothing of the text is ever read as syntax.
    """
    terms: list[tuple[str, bool]] = []
    seen: set[tuple[str, bool]] = set()
    for match in _TERM.finditer(unicodedata.normalize("NFC", text)):
        word = match.group(0).rstrip("*")
        term = (word, bool(match.group(1)))
        folded = (word.casefold(), term[1])
        if folded not in seen:
            seen.add(folded)
            terms.append(term)
        if len(terms) == MAX_QUERY_TERMS:
            break
    return terms


class TextNote(msgspec.Struct, frozen=True):
    """The fields of a `TEXT_NAMESPACE` value that are indexed (others are ignored)."""

    key: str = ""
    text: str = ""
    tags: tuple[str, ...] = ()


TAG_SEPARATOR: Final = ", "


def text_note(raw: bytes) -> TextNote | None:
    """The indexed fields of an encoded value, or None when it is not a note (it is then not indexed)."""
    try:
        note: TextNote = msgspec_decoder(TextNote).decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return note


def text_scope(store_key: str) -> str:
    """The scope of a note's store key ``<scope>/<key>``: what a search is limited to."""
    return store_key.partition("/")[0]


@attrs.frozen
class TextHit:
    """One value found by `StoreBackend.search`.

    Attributes:
        key: the note's key within its scope (the store key without ``<scope>/``).
        score: relevance, higher is better (comparable within one search only).
        preview: a short passage of the text around the matches, matches in ``**``.
        tags: the note's tags.
    """

    key: str
    score: float
    preview: str
    tags: tuple[str, ...] = ()


# -- nodes ------------------------------------------------------------------------------------------


@attrs.frozen
class NodeLease:
    """This process's identity in the store: its node id and this start's epoch.

    Attributes:
        node_id: the node's name (``--node-id``).
        epoch: how many times a node of this name has started on this store,
            this start included: a write of an older epoch is refused.
        lease: seconds the node's lease lasts; it is renewed every third of it.
        commit_log: each fenced commit is also logged (node, epoch, sessions
            and their epochs), where the backend keeps such a log.
    """

    node_id: str
    epoch: int
    lease: float
    commit_log: bool = False


# -- the contract ----------------------------------------------------------------------------------


class BackendTransaction(ABC):
    """A synchronous transaction opened by `StoreBackend.transaction`: reads see its own writes.

    Reads and writes go through the transaction's connection; it commits
    when its ``with`` block ends without an exception, and rolls back whole
    otherwise. Values are encoded bytes (the `Store` wraps this with its codec).
    """

    @abstractmethod
    def get(self, namespace: str, key: str) -> bytes | None:
        """The encoded value under ``key``, or None."""

    @abstractmethod
    def items(self, namespace: str, prefix: str) -> list[tuple[str, bytes]]:
        """``(key, encoded value)`` pairs with keys starting with ``prefix``, in insertion order."""

    @abstractmethod
    def write(self, namespace: str, puts: Mapping[str, bytes], deletes: Iterable[str]) -> int:
        """Write and delete in this transaction; returns how many of ``deletes`` existed."""


class StoreBackend(ABC):
    """The database under a `Store`; see the module docstring for the threads it is called from.

    Values are the store's encoded bytes; keys are non-empty strings;
    namespaces have been checked by the store (`check_namespace`).

    Attributes:
        kind: ``"sqlite"`` or ``"postgresql"``.
        location: what messages name the store by: its file, or its URL with
            the password masked.
        fences: whether commits check the placement of the sessions they
            touch (a database several nodes share); sqlite's file has one
            owner at a time (the daemon's lock), so it does not.
    """

    kind: str = ""
    location: str = ""
    fences: bool = False

    # -- reads -------------------------------------------------------------------------

    @abstractmethod
    def get(self, namespace: str, key: str) -> bytes | None:
        """The encoded value under ``key``; None if absent (or the namespace is)."""

    @abstractmethod
    def contains(self, namespace: str, key: str) -> bool:
        """Whether ``key`` is present."""

    @abstractmethod
    def select(self, namespace: str, prefix: str, *, values: bool) -> list[tuple[Any, ...]]:
        """``(key,)`` or ``(key, value)`` rows with keys starting with ``prefix`` (all: ``""``), in insertion order."""

    @abstractmethod
    def select_range(
        self, namespace: str, low: str, high: str, limit: int | None, *, newest_first: bool
    ) -> list[tuple[str, bytes]]:
        """``(key, value)`` rows with ``low <= key < high`` in code-point order (descending if ``newest_first``)."""

    @abstractmethod
    def dump(self, namespace: str, batch: int) -> Iterator[list[tuple[str, bytes]]]:
        """Every ``(key, value)`` of the namespace in insertion order, ``batch`` rows at a time (for copies)."""

    @abstractmethod
    def count(self, namespace: str) -> int:
        """How many keys the namespace holds (0 if it does not exist)."""

    @abstractmethod
    def namespaces(self) -> list[str]:
        """The namespaces present, sorted."""

    # -- writes ------------------------------------------------------------------------

    @abstractmethod
    def ensure_namespace(self, namespace: str) -> None:
        """Create the namespace if it is missing (committed before this returns)."""

    @abstractmethod
    def transact(self, namespace: str, puts: Mapping[str, bytes], deletes: list[str], what: str) -> int:
        """Write and delete in one committed transaction; returns how many of ``deletes`` existed.

        Raises:
            StoreError: it failed (mapped by `failure`); nothing was written.
        """

    @abstractmethod
    def transaction(self, lock: str | None, what: str) -> AbstractContextManager[BackendTransaction]:
        """A synchronous transaction holding the transaction-level lock named ``lock`` (if any) until it ends.

        Two transactions with the same ``lock`` never overlap, in this process
        or in any other using the same database.
        """

    @abstractmethod
    def write_group(
        self, group: Mapping[str, Mapping[str, bytes]], fence: Mapping[str, int], node: NodeLease | None
    ) -> None:
        """Commit one group in one transaction, on the committer thread's own connection.

        Args:
            group: namespace -> key -> encoded value.
            fence: the sessions the group touches -> the epoch this node holds
                each at (0: a session new to this node). Ignored unless `fences`.
            node: this node (None: not joined; no fence is checked).

        Raises:
            FencedSessions: sessions of ``fence`` this node does not own (their
                owner or epoch changed); nothing was written.
            Exception: the commit failed otherwise (the store maps it with
                `failure`); nothing was written.
        """

    @abstractmethod
    def close_committer(self) -> None:
        """Close the committer thread's connection (called on that thread as it ends)."""

    # -- text search -------------------------------------------------------------------

    @abstractmethod
    def search(self, scope: str, terms: list[tuple[str, bool]], limit: int) -> list[TextHit]:
        """The `TEXT_NAMESPACE` values of ``scope`` matching any of ``terms``, best first.

        Raises:
            StoreError: the index cannot be used (sqlite without FTS5, a failed query).
        """

    # -- nodes and placement -------------------------------------------------------------

    @abstractmethod
    def join(self, node_id: str, lease: float, info: Mapping[str, Any]) -> NodeLease:
        """Register this start of node ``node_id``: its epoch is the previous one + 1.

        ``info`` (host, pid, ...) is kept in the node's row for those who list nodes.
        """

    def open_commit_log(self) -> None:
        """Make ready the log of fenced commits (`NodeLease.commit_log`); a backend that fences keeps one."""
        msg = f"{type(self).__name__} keeps no commit log"
        raise NotImplementedError(msg)

    @abstractmethod
    def renew(self, node: NodeLease, info: Mapping[str, Any] | None = None) -> bool:
        """Extend this node's lease, merging ``info`` into its row; False if a newer start took the name.

        Raises:
            StoreError: the database could not be reached (the lease is not renewed).
        """

    @abstractmethod
    def handover(self, node: NodeLease, held: Mapping[str, int], to: str) -> dict[str, int]:
        """Hand sessions this node holds (session -> epoch) to node ``to``, each epoch + 1; returns those handed.

        A session whose placement no longer names this node at that epoch is
        not handed (it was lost meanwhile).

        Raises:
            StoreError: the database failed, or the backend has one node only.
        """

    @abstractmethod
    def leave(self, node: NodeLease) -> None:
        """End this node's lease now (a clean stop): its orphaned sessions may be claimed at once."""

    @abstractmethod
    def claim(self, node: NodeLease, session_ids: Iterable[str] | None) -> dict[str, int]:
        """Claim sessions for this node; returns those claimed, each with its new epoch.

        ``None`` claims the sessions this node owned before plus every orphan
        whose owner's lease has expired (a start); a list claims exactly
        those (new sessions, or sessions handed to this node), each only if
        it is not owned by another live node. Each claimed session's epoch
        goes up by one, so the previous owner's writes are refused from now on.
        """

    @abstractmethod
    def claim_orphans(self, node: NodeLease) -> dict[str, int]:
        """Claim the sessions of other nodes whose leases have run out (not this node's own); as `claim`."""

    @abstractmethod
    def placed_here(self, node: NodeLease, session: str) -> bool:
        """Whether the database places ``session`` on this node (handed to it, perhaps not adopted yet)."""

    @abstractmethod
    def release(self, node: NodeLease, session_ids: Iterable[str]) -> None:
        """Give up sessions this node owns (stopped for good): they have no owner any more."""

    @abstractmethod
    def placement_changes(self, node: NodeLease, held: Mapping[str, int]) -> tuple[list[str], list[str]]:
        """What changed in the database's placement since the last look, for this node.

        Returns:
            The sessions of ``held`` (session -> epoch) this node no longer
            owns, and those now placed on this node that it does not hold
            (handed to it; `Store.stranded`).
        """

    # -- lifecycle -------------------------------------------------------------------------

    @abstractmethod
    def failure(self, exc: BaseException, what: str) -> StoreError:
        """The `StoreError` a failed operation is reported as, naming the store and the cause."""

    @abstractmethod
    def size(self) -> int:
        """Bytes the store's data takes (file size, or the database's tables)."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection but the committer's (it is closed by its thread)."""

    def describe(self) -> Iterator[tuple[str, Any]]:
        """Extra ``statistics()`` entries."""
        return iter(())


class FencedSessions(Exception):
    """Raised by `StoreBackend.write_group` when sessions of the fence are not this node's; nothing was written.

    Attributes:
        sessions: those sessions.
    """

    def __init__(self, sessions: Iterable[str]) -> None:
        self.sessions = tuple(sessions)
        super().__init__(", ".join(self.sessions))
