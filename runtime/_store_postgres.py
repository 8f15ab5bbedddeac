"""The shared store: a PostgreSQL database (``postgresql://...``), through psycopg 3's sync API.

Tables (all named ``weald_*``, so the database may hold others):

- ``weald_kv (ns, key, value, seq)``: every namespace's values; ``key`` is
  compared by code point (``COLLATE "C"``) as in sqlite, ``seq`` orders a
  namespace by last write (sqlite's rowid order).
- ``weald_namespaces``: the namespaces written so far.
- ``weald_nodes (node_id, epoch, lease_until, started, info)``: one row per
  node; each start takes ``epoch = previous + 1`` and renews ``lease_until``.
- ``weald_placement (agent_id, owner, epoch, lease, version)``: one row per
  session a node runs: its owner node, the epoch of the last claim, until
  when that claim is leased, and a sequence number of the last change, set
  by a trigger on every insert and update, whoever makes it (so a node reads
  only what changed since it last looked, a change made by hand included).
- ``weald_memory_index``: the notes of ``memory`` with a weighted
  ``tsvector`` (key A, tags B, text C) under a GIN index, written in the
  note's transaction.
- ``weald_commit_log (seq, node_id, node_epoch, agent_ids, epochs, at)``:
  only with ``[store] commit_log`` (made when a node joins with it): a row
  per fenced commit, written after the fence in the commit's transaction.
- ``weald_meta``: the schema version. A database with another version is
  refused at open (`StoreSchemaError`), never altered.

The fence is ``weald_fence(node, sessions, epochs)``, a function run first
in each group's transaction: it locks the sessions' placement rows ``FOR
SHARE`` and raises (SQLSTATE ``WF001``, the sessions in its detail) unless
every one names this node and the epoch given. A group is one statement
(``INSERT ... SELECT FROM unnest``, every namespace at once) joined to the
fence's one row; a group holding a memory note, or written with the commit
log, is an explicit transaction pipelined behind it. Either way a fenced
commit costs one round trip, as an unfenced one does. A takeover (``UPDATE
... SET owner, epoch = epoch + 1``) waits for commits holding the share
lock, or makes them fail.

A node frozen in the middle of a transaction (SIGSTOP, a VM paused, a
partition after ``BEGIN`` and the fence went out but before ``COMMIT``)
would hold its share locks, and with them every takeover of its sessions,
for as long as it stays frozen. Each connection sets
``idle_in_transaction_session_timeout`` (`IDLE_IN_TRANSACTION`, 2 s): the
server ends a transaction whose client has gone quiet that long, releasing
its locks, and the node finds its connection broken when it wakes.

Connections: the committer thread has its own (pipelined group commits);
the lease thread has its own, so a busy store never delays a renewal; other
calls take one from a small pool. All run in autocommit mode with explicit
transactions; ``synchronous_commit`` is the server's (on by default: a commit
is on the server's disk before it is acknowledged). A connection that
breaks is replaced on next use, with backoff (0.1 s doubling to 5 s) while
the server stays unreachable.

psycopg's async API does not run under trio (it needs an asyncio loop), so
every call here is sync, on a worker thread or the store's own threads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec
from weald.runtime._codec import msgspec_decoder
from weald.runtime._errors import (
    StoreClosedError,
    StoreConflictError,
    StoreConnectionError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreSchemaError,
)
from weald.runtime._secrets import redact_text, register_secret
from weald.runtime._store_backend import (
    TAG_SEPARATOR,
    TEXT_NAMESPACE,
    BackendTransaction,
    FencedSessions,
    NodeLease,
    StoreBackend,
    TextHit,
    mask_url,
    text_note,
    text_scope,
    url_password,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["SCHEMA_VERSION", "PostgresBackend"]

logger = logging.getLogger("weald.runtime")

SCHEMA_VERSION: Final = 1
"""The version of the ``weald_*`` tables this code reads and writes."""

_FENCE_STATE: Final = "WF001"
_POOL_SIZE: Final = 4
_CONNECT_TIMEOUT: Final = 10
IDLE_IN_TRANSACTION: Final = 2.0
"""Seconds a transaction may wait on its client (idle in transaction) before the server ends it (see above)."""
_BACKOFF_FIRST: Final = 0.1
_BACKOFF_MAX: Final = 5.0
_TS_CONFIG: Final = "english"

_SCHEMA: Final = """
CREATE TABLE weald_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE SEQUENCE weald_kv_seq;
CREATE TABLE weald_kv (
    ns text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value bytea NOT NULL,
    seq bigint NOT NULL DEFAULT nextval('weald_kv_seq'),
    PRIMARY KEY (ns, key)
);
CREATE INDEX weald_kv_order ON weald_kv (ns, seq);
CREATE TABLE weald_namespaces (ns text PRIMARY KEY);
CREATE TABLE weald_nodes (
    node_id text PRIMARY KEY,
    epoch bigint NOT NULL,
    lease_until timestamptz NOT NULL,
    started timestamptz NOT NULL DEFAULT now(),
    info jsonb NOT NULL DEFAULT '{}'
);
CREATE SEQUENCE weald_placement_seq;
CREATE TABLE weald_placement (
    agent_id text PRIMARY KEY,
    owner text,
    epoch bigint NOT NULL,
    lease timestamptz NOT NULL,
    version bigint NOT NULL
);
CREATE INDEX weald_placement_owner ON weald_placement (owner);
CREATE INDEX weald_placement_version ON weald_placement (version);
CREATE FUNCTION weald_placement_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := nextval('weald_placement_seq');
    RETURN NEW;
END $$;
CREATE TRIGGER weald_placement_touch BEFORE INSERT OR UPDATE ON weald_placement
    FOR EACH ROW EXECUTE FUNCTION weald_placement_touch();
CREATE TABLE weald_memory_index (
    store_key text COLLATE "C" PRIMARY KEY,
    scope text COLLATE "C" NOT NULL,
    key text NOT NULL,
    tags text NOT NULL,
    body text NOT NULL,
    doc tsvector NOT NULL
);
CREATE INDEX weald_memory_doc ON weald_memory_index USING GIN (doc);
CREATE FUNCTION weald_fence(p_node text, p_ids text[], p_epochs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad text[];
BEGIN
    PERFORM 1 FROM weald_placement WHERE agent_id = ANY(p_ids) FOR SHARE;
    SELECT array_agg(f.id) INTO bad
    FROM unnest(p_ids, p_epochs) AS f(id, epoch)
    LEFT JOIN weald_placement p ON p.agent_id = f.id
    WHERE p.owner IS DISTINCT FROM p_node OR p.epoch IS DISTINCT FROM f.epoch;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'weald fence: sessions not owned by node %', p_node
            USING ERRCODE = '@FENCE@', DETAIL = array_to_json(bad)::text;
    END IF;
END $$;
INSERT INTO weald_meta VALUES ('schema', '@VERSION@');
""".replace("@FENCE@", _FENCE_STATE).replace("@VERSION@", str(SCHEMA_VERSION))

# A placement another node may take: no owner, this node's, or leased to a node whose lease ran out.
_CLAIMABLE: Final = """(p.owner IS NULL OR p.owner = %(me)s OR (p.lease < now() AND NOT EXISTS (
    SELECT 1 FROM weald_nodes n WHERE n.node_id = p.owner AND n.lease_until > now())))"""

# Parameters go in binary (%b): a value is sent as its bytes, not hex-escaped (15 rows: 650 -> 490 us).
_UPSERT: Final = (
    "INSERT INTO weald_kv (ns, key, value) SELECT %b, unnest(%b::text[]), unnest(%b::bytea[]) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, seq = EXCLUDED.seq"
)
# A whole group in one statement, so in one implicit transaction (the connection is autocommit): no
# BEGIN, no COMMIT, one parse and execute for every namespace at once. The fenced form joins the
# writes to the fence's one row, so the fence runs (and may abort the statement) before a row is made.
_UPSERT_GROUP: Final = (
    "INSERT INTO weald_kv (ns, key, value) SELECT u.ns, u.key, u.value "
    "FROM unnest(%b::text[], %b::text[], %b::bytea[]) AS u(ns, key, value) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, seq = EXCLUDED.seq"
)
_UPSERT_GROUP_FENCED: Final = (
    "WITH fence AS (SELECT weald_fence(%b, %b::text[], %b::bigint[])) "
    "INSERT INTO weald_kv (ns, key, value) SELECT u.ns, u.key, u.value "
    "FROM fence, unnest(%b::text[], %b::text[], %b::bytea[]) AS u(ns, key, value) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, seq = EXCLUDED.seq"
)
_INDEX_NOTE: Final = (
    "INSERT INTO weald_memory_index (store_key, scope, key, tags, body, doc) "
    "SELECT k, s, n, t, b, setweight(to_tsvector(%(cfg)s::regconfig, n), 'A') || "
    "setweight(to_tsvector(%(cfg)s::regconfig, t), 'B') || setweight(to_tsvector(%(cfg)s::regconfig, b), 'C') "
    "FROM unnest(%(k)s::text[], %(s)s::text[], %(n)s::text[], %(t)s::text[], %(b)s::text[]) AS u(k, s, n, t, b) "
    "ON CONFLICT (store_key) DO UPDATE SET scope = EXCLUDED.scope, key = EXCLUDED.key, tags = EXCLUDED.tags, "
    "body = EXCLUDED.body, doc = EXCLUDED.doc"
)


# [store] commit_log: a row per fenced commit, in its transaction, after the fence (so in the order
# the placement rows' locks allow: a takeover waits for the commits that share-locked them).
_COMMIT_LOG_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS weald_commit_log (seq bigserial PRIMARY KEY, node_id text NOT NULL, "
    "node_epoch bigint NOT NULL, agent_ids text[] NOT NULL, epochs bigint[] NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
_LOG_COMMIT: Final = (
    "INSERT INTO weald_commit_log (node_id, node_epoch, agent_ids, epochs) VALUES (%s, %s, %s::text[], %s::bigint[])"
)


def _raise_if_fenced(exc: BaseException) -> None:
    """Raise `FencedSessions` (naming them) if ``exc`` is the fence's refusal."""
    if getattr(exc, "sqlstate", None) == _FENCE_STATE:
        detail = getattr(exc, "diag").message_detail or "[]"  # noqa: B009 - psycopg's Error, typed as any error here
        raise FencedSessions(msgspec_decoder(list[str]).decode(detail.encode())) from exc


def _first_line(exc: BaseException) -> str:
    """The first line of an error's message, any known secret cut out (libpq may quote the URL)."""
    text = str(exc).strip()
    return redact_text(text.splitlines()[0] if text else type(exc).__name__)


class _PipelineAborted(logging.Filter):
    """Drops psycopg's "error ignored terminating <Pipeline>" warning: the store raises that error itself, named."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("error ignored terminating")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        msg = (
            "a postgresql:// store needs psycopg 3, which is not installed: "
            "pip install 'weald[postgresql]' (or 'psycopg[binary]')"
        )
        raise StoreError(msg) from exc
    quiet = logging.getLogger("psycopg")
    if not any(isinstance(f, _PipelineAborted) for f in quiet.filters):
        quiet.addFilter(_PipelineAborted())
    return psycopg


class _Slot:
    """One connection that is replaced when it breaks, with backoff while the server is unreachable."""

    __slots__ = ("_backend", "backoff", "conn", "not_before")

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self.conn: psycopg.Connection[Any] | None = None
        self.backoff = 0.0
        self.not_before = 0.0

    def get(self) -> psycopg.Connection[Any]:
        conn = self.conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self.close()
        wait = self.not_before - time.monotonic()
        if wait > 0:
            msg = (
                f"store {self._backend.location}: the database is unreachable; the next attempt to "
                f"connect is in {wait:.1f} s"
            )
            raise StoreConnectionError(msg)
        try:
            conn = self._backend.connect()
        except StoreError:
            self.backoff = min(_BACKOFF_MAX, self.backoff * 2 or _BACKOFF_FIRST)
            self.not_before = time.monotonic() + self.backoff
            raise
        self.backoff = 0.0
        self.conn = conn
        return conn

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class _Tx(BackendTransaction):
    def __init__(self, backend: PostgresBackend, conn: psycopg.Connection[Any]) -> None:
        self._backend = backend
        self._conn = conn

    def get(self, namespace: str, key: str) -> bytes | None:
        row = self._conn.execute("SELECT value FROM weald_kv WHERE ns = %s AND key = %s", (namespace, key)).fetchone()
        return None if row is None else bytes(row[0])

    def items(self, namespace: str, prefix: str) -> list[tuple[str, bytes]]:
        rows = self._conn.execute(
            "SELECT key, value FROM weald_kv WHERE ns = %s AND key >= %s AND key < %s ORDER BY seq",
            (namespace, prefix, prefix + "\U0010ffff"),
        ).fetchall()
        return [(key, bytes(raw)) for key, raw in rows]

    def write(self, namespace: str, puts: Mapping[str, bytes], deletes: Iterable[str]) -> int:
        return self._backend.apply(self._conn, namespace, puts, list(deletes))


class PostgresBackend(StoreBackend):
    """A ``postgresql://`` database (see the module docstring).

    Args:
        url: the database's URL; its password is registered as a secret
            (never printed) and masked in `location`.

    Raises:
        StoreConnectionError: the server cannot be reached, refused the
            login, or the database does not exist.
        StoreSchemaError: the database holds weald tables of another version.
        StoreError: psycopg is missing, or the schema could not be created.
    """

    kind = "postgresql"
    fences = True

    def __init__(self, url: str) -> None:
        self._psycopg = _psycopg()
        self.url = url
        password = url_password(url)
        if password:
            register_secret(password)
        self.location = mask_url(url)
        self._closed = False
        self._pool_lock = threading.Condition()
        self._idle: list[_Slot] = []
        self._slots = 0
        self._committer = _Slot(self)
        self._lease = _Slot(self)
        self._lease_lock = threading.Lock()
        self._namespaces: set[str] = set()
        self._seen_version = 0
        try:
            self._check_schema()
        except BaseException:
            self.close()
            raise

    # -- connections --------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new connection (autocommit; transactions are explicit).

        Raises:
            StoreConnectionError: the server cannot be reached or refused the login.
        """
        if self._closed:
            msg = f"store {self.location} is closed"
            raise StoreClosedError(msg)
        try:
            conn: psycopg.Connection[Any] = self._psycopg.connect(
                self.url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT, application_name="weald"
            )
        except self._psycopg.ProgrammingError as exc:  # the URL itself
            msg = f"store {self.location}: not a usable postgresql:// URL ({_first_line(exc)})"
            raise StoreError(msg) from exc
        except self._psycopg.Error as exc:
            msg = f"store {self.location}: cannot connect to the database ({_first_line(exc)})"
            raise StoreConnectionError(msg) from exc
        try:
            # A setting of this session, not of the URL's ``options``, which stay the user's.
            timeout = f"{int(IDLE_IN_TRANSACTION * 1000)}ms"
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)", (timeout,))
        except self._psycopg.Error as exc:
            conn.close()
            msg = f"store {self.location}: cannot set up the connection ({_first_line(exc)})"
            raise StoreConnectionError(msg) from exc
        return conn

    @contextlib.contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one call (at most `_POOL_SIZE` at once; more callers wait)."""
        with self._pool_lock:
            while True:
                if self._closed:
                    msg = f"store {self.location} is closed"
                    raise StoreClosedError(msg)
                if self._idle:
                    slot = self._idle.pop()
                    break
                if self._slots < _POOL_SIZE:
                    self._slots += 1
                    slot = _Slot(self)
                    break
                self._pool_lock.wait()
        try:
            yield slot.get()
        finally:
            with self._pool_lock:
                if self._closed:
                    slot.close()
                else:
                    self._idle.append(slot)
                self._pool_lock.notify()

    def _read(self, what: str, sql: str, args: Any) -> list[tuple[Any, ...]]:
        try:
            with self._conn() as conn:
                return conn.execute(sql, args).fetchall()
        except self._psycopg.Error as exc:
            raise self.failure(exc, what, reading=True) from exc

    def _check_schema(self) -> None:
        try:
            with self._conn() as conn, conn.transaction():
                # One creator at a time: two daemons starting on an empty database.
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('weald schema', 0))")
                exists = conn.execute("SELECT to_regclass('weald_meta') IS NOT NULL").fetchone()
                if not (exists and exists[0]):
                    conn.execute(_SCHEMA)
                    return
                row = conn.execute("SELECT value FROM weald_meta WHERE key = 'schema'").fetchone()
        except self._psycopg.Error as exc:
            raise self.failure(exc, "its schema", reading=True) from exc
        found = row[0] if row is not None else "unknown"
        if found != str(SCHEMA_VERSION):
            msg = (
                f"store {self.location} holds weald tables of schema version {found}, and this weald uses "
                f"version {SCHEMA_VERSION}; it was left untouched: use the weald that wrote it, or move its data "
                "with weald store migrate into another database"
            )
            raise StoreSchemaError(msg)

    # -- reads ------------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> bytes | None:
        rows = self._read(
            f"{namespace}/{key}", "SELECT value FROM weald_kv WHERE ns = %s AND key = %s", (namespace, key)
        )
        return bytes(rows[0][0]) if rows else None

    def contains(self, namespace: str, key: str) -> bool:
        rows = self._read(f"{namespace}/{key}", "SELECT 1 FROM weald_kv WHERE ns = %s AND key = %s", (namespace, key))
        return bool(rows)

    def select(self, namespace: str, prefix: str, *, values: bool) -> list[tuple[Any, ...]]:
        columns = "key, value" if values else "key"
        if prefix:
            sql = f"SELECT {columns} FROM weald_kv WHERE ns = %s AND key >= %s AND key < %s ORDER BY seq"  # noqa: S608
            rows = self._read(f"namespace {namespace!r}", sql, (namespace, prefix, prefix + "\U0010ffff"))
        else:
            sql = f"SELECT {columns} FROM weald_kv WHERE ns = %s ORDER BY seq"  # noqa: S608
            rows = self._read(f"namespace {namespace!r}", sql, (namespace,))
        if values:
            return [(key, bytes(raw)) for key, raw in rows]
        return rows

    def select_range(
        self, namespace: str, low: str, high: str, limit: int | None, *, newest_first: bool
    ) -> list[tuple[str, bytes]]:
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT key, value FROM weald_kv WHERE ns = %s AND key >= %s AND key < %s ORDER BY key {order}"  # noqa: S608
        args: tuple[Any, ...] = (namespace, low, high)
        if limit is not None:
            sql += " LIMIT %s"
            args = (*args, max(0, limit))
        return [(key, bytes(raw)) for key, raw in self._read(f"namespace {namespace!r}", sql, args)]

    def dump(self, namespace: str, batch: int) -> Iterator[list[tuple[str, bytes]]]:
        after = -1
        while True:
            rows = self._read(
                f"namespace {namespace!r}",
                "SELECT seq, key, value FROM weald_kv WHERE ns = %s AND seq > %s ORDER BY seq LIMIT %s",
                (namespace, after, batch),
            )
            if not rows:
                return
            after = rows[-1][0]
            yield [(key, bytes(raw)) for _, key, raw in rows]

    def count(self, namespace: str) -> int:
        rows = self._read(f"namespace {namespace!r}", "SELECT count(*) FROM weald_kv WHERE ns = %s", (namespace,))
        return int(rows[0][0])

    def namespaces(self) -> list[str]:
        return [row[0] for row in self._read("its namespaces", "SELECT ns FROM weald_namespaces ORDER BY ns", ())]

    # -- writes -------------------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO weald_namespaces VALUES (%s) ON CONFLICT DO NOTHING", (namespace,))
        except self._psycopg.Error as exc:
            raise self.failure(exc, f"the new namespace {namespace!r}") from exc
        self._namespaces.add(namespace)

    def apply(
        self, conn: psycopg.Connection[Any], namespace: str, puts: Mapping[str, bytes], deletes: list[str]
    ) -> int:
        """Write and delete in the transaction open on ``conn`` (pipelined or not); returns how many deletes existed."""
        if namespace not in self._namespaces:
            conn.execute("INSERT INTO weald_namespaces VALUES (%s) ON CONFLICT DO NOTHING", (namespace,))
        if puts:
            conn.execute(_UPSERT, (namespace, list(puts), list(puts.values())))
        removed = 0
        if deletes:
            cur = conn.execute("DELETE FROM weald_kv WHERE ns = %s AND key = ANY(%s)", (namespace, deletes))
            removed = cur.rowcount if cur.rowcount > 0 else 0
        if namespace == TEXT_NAMESPACE:
            self._index(conn, puts, deletes)
        return removed

    def _index(self, conn: psycopg.Connection[Any], puts: Mapping[str, bytes], deletes: list[str]) -> None:
        gone = list(deletes)
        keys: list[str] = []
        scopes: list[str] = []
        names: list[str] = []
        tags: list[str] = []
        bodies: list[str] = []
        for store_key, raw in puts.items():
            note = text_note(raw)
            if note is None:
                logger.warning("store %s: %s/%s is not a note; not indexed", self.location, TEXT_NAMESPACE, store_key)
                gone.append(store_key)
                continue
            keys.append(store_key)
            scopes.append(text_scope(store_key))
            names.append(note.key)
            tags.append(TAG_SEPARATOR.join(note.tags))
            bodies.append(note.text)
        if gone:
            conn.execute("DELETE FROM weald_memory_index WHERE store_key = ANY(%s)", (gone,))
        if keys:
            conn.execute(_INDEX_NOTE, {"cfg": _TS_CONFIG, "k": keys, "s": scopes, "n": names, "t": tags, "b": bodies})

    def transact(self, namespace: str, puts: Mapping[str, bytes], deletes: list[str], what: str) -> int:
        try:
            with self._conn() as conn, conn.transaction():
                removed = self.apply(conn, namespace, puts, deletes)
        except self._psycopg.Error as exc:
            raise self.failure(exc, what) from exc
        self._namespaces.add(namespace)
        return removed

    @contextlib.contextmanager
    def transaction(self, lock: str | None, what: str) -> Iterator[BackendTransaction]:
        try:
            with self._conn() as conn, conn.transaction():
                if lock is not None:
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
                yield _Tx(self, conn)
        except self._psycopg.Error as exc:
            raise self.failure(exc, what) from exc

    def write_group(
        self, group: Mapping[str, Mapping[str, bytes]], fence: Mapping[str, int], node: NodeLease | None
    ) -> None:
        conn = self._committer.get()
        if self._namespaces.issuperset(group) and TEXT_NAMESPACE not in group and not (node and node.commit_log):
            self._write_one_statement(conn, group, fence, node)
            return
        try:
            # One explicit transaction pipelined whole: BEGIN, the fence, the writes, COMMIT, then one
            # sync. An error skips what follows it up to the sync, and leaves the transaction aborted.
            with conn.pipeline() as pipeline:
                conn.execute("BEGIN")
                if fence and node is not None:
                    conn.execute(
                        "SELECT weald_fence(%s, %s::text[], %s::bigint[])",
                        (node.node_id, list(fence), list(fence.values())),
                    )
                    if node.commit_log:
                        conn.execute(_LOG_COMMIT, (node.node_id, node.epoch, list(fence), list(fence.values())))
                for namespace, values in group.items():
                    self.apply(conn, namespace, values, [])
                conn.execute("COMMIT")
                pipeline.sync()
        except self._psycopg.Error as exc:
            if not conn.broken and not conn.closed:
                with contextlib.suppress(self._psycopg.Error):
                    conn.execute("ROLLBACK")
            _raise_if_fenced(exc)
            raise
        self._namespaces.update(group)

    def _write_one_statement(
        self,
        conn: psycopg.Connection[Any],
        group: Mapping[str, Mapping[str, bytes]],
        fence: Mapping[str, int],
        node: NodeLease | None,
    ) -> None:
        """The common group (known namespaces, no note to index, no commit log) as one statement."""
        namespaces: list[str] = []
        keys: list[str] = []
        values: list[bytes] = []
        for namespace, puts in group.items():
            namespaces.extend(itertools.repeat(namespace, len(puts)))
            keys.extend(puts)
            values.extend(puts.values())
        try:
            if fence and node is not None:
                args = (node.node_id, list(fence), list(fence.values()), namespaces, keys, values)
                conn.execute(_UPSERT_GROUP_FENCED, args)
            else:
                conn.execute(_UPSERT_GROUP, (namespaces, keys, values))
        except self._psycopg.Error as exc:
            _raise_if_fenced(exc)
            raise

    def close_committer(self) -> None:
        self._committer.close()

    # -- text search ----------------------------------------------------------------------------

    def search(self, scope: str, terms: list[tuple[str, bool]], limit: int) -> list[TextHit]:
        if not terms:
            return []
        # Each term a quoted lexeme: nothing of the text is read as tsquery syntax.
        query = " | ".join(
            "'" + word.replace("'", "''").replace("\\", "\\\\") + "'" + (":*" if prefix else "")
            for word, prefix in terms
        )
        # The best `limit` first, then a headline of those only (a headline reads its whole note).
        sql = (
            "SELECT b.key, b.rank, ts_headline(%(cfg)s::regconfig, b.body, b.q, 'StartSel=**, StopSel=**, "
            "MaxWords=16, MinWords=4, ShortWord=2, HighlightAll=false, MaxFragments=1, FragmentDelimiter=...'), "
            "b.tags FROM (SELECT m.key, m.body, m.tags, m.store_key, q, ts_rank(m.doc, q) AS rank "
            "FROM weald_memory_index m, to_tsquery(%(cfg)s::regconfig, %(q)s) AS q "
            "WHERE m.scope = %(scope)s AND m.doc @@ q ORDER BY rank DESC, m.store_key LIMIT %(limit)s) AS b "
            "ORDER BY b.rank DESC, b.store_key"
        )
        rows = self._read("a search of the notes", sql, {"cfg": _TS_CONFIG, "q": query, "scope": scope, "limit": limit})
        return [
            TextHit(
                key=key,
                score=float(rank),
                preview=" ".join(preview.split()),
                tags=tuple(tags.split(TAG_SEPARATOR)) if tags else (),
            )
            for key, rank, preview, tags in rows
        ]

    # -- nodes and placement --------------------------------------------------------------------

    def _node_call(self, what: str, sql: str, args: Any, *, lease_conn: bool = False) -> list[tuple[Any, ...]]:
        try:
            if lease_conn:
                with self._lease_lock:
                    conn = self._lease.get()
                    with conn.transaction():
                        cur = conn.execute(sql, args)
                        return cur.fetchall() if cur.description else []
            with self._conn() as conn, conn.transaction():
                cur = conn.execute(sql, args)
                return cur.fetchall() if cur.description else []
        except self._psycopg.Error as exc:
            raise self.failure(exc, what) from exc

    def join(self, node_id: str, lease: float, info: Mapping[str, Any]) -> NodeLease:
        rows = self._node_call(
            f"node {node_id!r}'s start",
            "INSERT INTO weald_nodes AS n (node_id, epoch, lease_until, info) "
            "VALUES (%(id)s, 1, now() + make_interval(secs => %(lease)s), %(info)s::jsonb) "
            "ON CONFLICT (node_id) DO UPDATE SET epoch = n.epoch + 1, lease_until = EXCLUDED.lease_until, "
            "started = now(), info = EXCLUDED.info RETURNING epoch, (SELECT coalesce(max(version), 0) "
            "FROM weald_placement)",
            {"id": node_id, "lease": lease, "info": msgspec.json.encode(dict(info)).decode()},
        )
        epoch, version = rows[0]
        self._seen_version = int(version)
        return NodeLease(node_id=node_id, epoch=int(epoch), lease=lease)

    def open_commit_log(self) -> None:
        # Nodes starting together: one creates the table, the others wait and find it.
        self._node_call(
            "the commit log",
            "DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('weald_commit_log')); "
            + _COMMIT_LOG_TABLE
            + "; END $$",
            None,
        )

    def renew(self, node: NodeLease, info: Mapping[str, Any] | None = None) -> bool:
        rows = self._node_call(
            f"node {node.node_id!r}'s lease",
            "UPDATE weald_nodes SET lease_until = now() + make_interval(secs => %s), info = info || %s::jsonb "
            "WHERE node_id = %s AND epoch = %s RETURNING 1",
            (node.lease, msgspec.json.encode(dict(info or {})).decode(), node.node_id, node.epoch),
            lease_conn=True,
        )
        return bool(rows)

    def leave(self, node: NodeLease) -> None:
        self._node_call(
            f"node {node.node_id!r}'s lease",
            "UPDATE weald_nodes SET lease_until = now() WHERE node_id = %s AND epoch = %s",
            (node.node_id, node.epoch),
            lease_conn=True,
        )

    def claim(self, node: NodeLease, session_ids: Iterable[str] | None) -> dict[str, int]:
        args: dict[str, Any] = {"me": node.node_id, "lease": node.lease}
        if session_ids is None:
            sql = (
                "UPDATE weald_placement p SET owner = %(me)s, epoch = p.epoch + 1, "  # noqa: S608 - constant SQL
                "lease = now() + make_interval(secs => %(lease)s), version = nextval('weald_placement_seq') "
                f"WHERE {_CLAIMABLE} RETURNING p.agent_id, p.epoch"
            )
            # Active sessions with no placement at all (from an older store, or migrated) are orphans too.
            adopt = (
                "INSERT INTO weald_placement (agent_id, owner, epoch, lease, version) "
                "SELECT key, %(me)s, 1, now() + make_interval(secs => %(lease)s), nextval('weald_placement_seq') "
                "FROM weald_kv k WHERE ns = 'sessions' "
                "AND convert_from(value, 'UTF8')::jsonb ->> 'status' IS DISTINCT FROM 'stopped' "
                "AND NOT EXISTS (SELECT 1 FROM weald_placement p WHERE p.agent_id = k.key) "
                "ON CONFLICT DO NOTHING RETURNING agent_id, epoch"
            )
            try:
                with self._conn() as conn, conn.transaction():
                    rows = conn.execute(sql, args).fetchall()
                    rows += conn.execute(adopt, args).fetchall()
            except self._psycopg.Error as exc:
                raise self.failure(exc, f"node {node.node_id!r}'s claim of its sessions") from exc
        else:
            ids = list(session_ids)
            if not ids:
                return {}
            args["ids"] = ids
            sql = (
                "INSERT INTO weald_placement AS p (agent_id, owner, epoch, lease, version) "  # noqa: S608
                "SELECT i, %(me)s, 1, now() + make_interval(secs => %(lease)s), nextval('weald_placement_seq') "
                "FROM unnest(%(ids)s::text[]) AS u(i) "
                "ON CONFLICT (agent_id) DO UPDATE SET owner = EXCLUDED.owner, epoch = p.epoch + 1, "
                f"lease = EXCLUDED.lease, version = EXCLUDED.version WHERE {_CLAIMABLE} "
                "RETURNING p.agent_id, p.epoch"
            )
            rows = self._node_call(f"node {node.node_id!r}'s claim of {len(ids)} sessions", sql, args)
        return {agent_id: int(epoch) for agent_id, epoch in rows}

    def claim_orphans(self, node: NodeLease) -> dict[str, int]:
        rows = self._node_call(
            f"node {node.node_id!r}'s claim of orphaned sessions",
            "UPDATE weald_placement p SET owner = %(me)s, epoch = p.epoch + 1, "  # noqa: S608 - constant SQL
            "lease = now() + make_interval(secs => %(lease)s), version = nextval('weald_placement_seq') "
            f"WHERE p.owner IS DISTINCT FROM %(me)s AND {_CLAIMABLE} RETURNING p.agent_id, p.epoch",
            {"me": node.node_id, "lease": node.lease},
        )
        return {agent_id: int(epoch) for agent_id, epoch in rows}

    def placed_here(self, node: NodeLease, session: str) -> bool:
        rows = self._read(
            f"the placement of session {session!r}",
            "SELECT 1 FROM weald_placement WHERE agent_id = %s AND owner = %s",
            (session, node.node_id),
        )
        return bool(rows)

    def release(self, node: NodeLease, session_ids: Iterable[str]) -> None:
        self._node_call(
            f"node {node.node_id!r}'s release of sessions",
            "DELETE FROM weald_placement WHERE agent_id = ANY(%s) AND owner = %s",
            (list(session_ids), node.node_id),
        )

    def placement_changes(self, node: NodeLease, held: Mapping[str, int]) -> tuple[list[str], list[str]]:
        rows = self._node_call(
            f"node {node.node_id!r}'s placement",
            "SELECT agent_id, owner, epoch, version FROM weald_placement WHERE version > %s ORDER BY version",
            (self._seen_version,),
            lease_conn=True,
        )
        lost = []
        arrived = []
        for agent_id, owner, epoch, version in rows:
            self._seen_version = max(self._seen_version, int(version))
            mine = held.get(agent_id)
            if mine is not None and (owner != node.node_id or int(epoch) != mine):
                lost.append(agent_id)
            elif mine is None and owner == node.node_id:
                arrived.append(agent_id)
        return lost, arrived

    def handover(self, node: NodeLease, held: Mapping[str, int], to: str) -> dict[str, int]:
        rows = self._node_call(
            f"node {node.node_id!r}'s handover of {len(held)} sessions to {to!r}",
            "UPDATE weald_placement p SET owner = %(to)s, epoch = p.epoch + 1, "
            "lease = now() + make_interval(secs => %(lease)s), version = nextval('weald_placement_seq') "
            "FROM unnest(%(ids)s::text[], %(epochs)s::bigint[]) AS h(id, epoch) "
            "WHERE p.agent_id = h.id AND p.owner = %(me)s AND p.epoch = h.epoch RETURNING p.agent_id, p.epoch",
            {"to": to, "lease": node.lease, "ids": list(held), "epochs": list(held.values()), "me": node.node_id},
        )
        return {agent_id: int(epoch) for agent_id, epoch in rows}

    def set_node_info(self, node_id: str, info: Mapping[str, Any]) -> bool:
        """Merge ``info`` into a node's row (a drain marks it ``draining``); False if there is no such node."""
        rows = self._node_call(
            f"node {node_id!r}'s row",
            "UPDATE weald_nodes SET info = info || %s::jsonb WHERE node_id = %s RETURNING 1",
            (msgspec.json.encode(dict(info)).decode(), node_id),
        )
        return bool(rows)

    def placement(self, session_ids: Iterable[str]) -> dict[str, tuple[str | None, int, bool]]:
        """Each placed session of ``session_ids``: (owner, epoch, whether the owner's lease is live)."""
        rows = self._read(
            "the placement of sessions",
            "SELECT p.agent_id, p.owner, p.epoch, coalesce(n.lease_until > now(), false) FROM weald_placement p "
            "LEFT JOIN weald_nodes n ON n.node_id = p.owner WHERE p.agent_id = ANY(%s)",
            (list(session_ids),),
        )
        return {agent_id: (owner, int(epoch), bool(live)) for agent_id, owner, epoch, live in rows}

    def placed_on(self, node_id: str) -> list[str]:
        """The sessions placed on ``node_id``, oldest claim first."""
        rows = self._read(
            f"node {node_id!r}'s sessions",
            "SELECT agent_id FROM weald_placement WHERE owner = %s ORDER BY version",
            (node_id,),
        )
        return [row[0] for row in rows]

    def cluster_snapshot(self, listed: int) -> dict[str, Any]:
        """The nodes and placement tables at one moment (one repeatable-read transaction); see `cluster_status`."""
        orphan = (
            "p.owner IS NULL OR NOT EXISTS (SELECT 1 FROM weald_nodes n WHERE n.node_id = p.owner "
            "AND n.lease_until > now())"
        )
        try:
            with self._conn() as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                as_of = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
                nodes = conn.execute(
                    "SELECT node_id, epoch, extract(epoch FROM lease_until)::float8, "
                    "extract(epoch FROM started)::float8, info, "
                    "(SELECT count(*) FROM weald_placement p WHERE p.owner = n.node_id) "
                    "FROM weald_nodes n ORDER BY node_id"
                ).fetchall()
                placed = conn.execute("SELECT count(*) FROM weald_placement").fetchone()
                orphaned = conn.execute(f"SELECT count(*) FROM weald_placement p WHERE {orphan}").fetchone()  # noqa: S608
                orphans = conn.execute(
                    f"SELECT agent_id FROM weald_placement p WHERE {orphan} ORDER BY agent_id LIMIT %s",  # noqa: S608
                    (listed,),
                ).fetchall()
        except self._psycopg.Error as exc:
            raise self.failure(exc, "the cluster's nodes and placement", reading=True) from exc
        assert as_of is not None
        assert placed is not None
        assert orphaned is not None
        return {
            "as_of": float(as_of[0]),
            "nodes": [
                {
                    "node_id": n,
                    "epoch": int(e),
                    "lease_until": float(lease),
                    "started": float(started),
                    "info": info,
                    "placed": int(count),
                }
                for n, e, lease, started, info, count in nodes
            ],
            "placed": int(placed[0]),
            "orphaned": int(orphaned[0]),
            "orphans": [row[0] for row in orphans],
        }

    def nodes(self) -> list[dict[str, Any]]:
        """Every node's row: id, epoch, whether its lease is live, when it started, what it said of itself."""
        rows = self._read(
            "its nodes",
            "SELECT node_id, epoch, lease_until > now(), extract(epoch FROM started), info, "
            "(SELECT count(*) FROM weald_placement p WHERE p.owner = n.node_id) FROM weald_nodes n ORDER BY node_id",
            (),
        )
        return [
            {"node_id": n, "epoch": int(e), "live": bool(live), "started": float(s), "info": info, "sessions": int(c)}
            for n, e, live, s, info, c in rows
        ]

    # -- lifecycle -------------------------------------------------------------------------------

    def failure(self, exc: BaseException, what: str, *, reading: bool = False) -> StoreError:
        if isinstance(exc, StoreError):
            return exc
        errors = self._psycopg.errors
        cause = _first_line(exc)
        doing = f"read {what}" if reading else f"commit {what}"
        error: StoreError
        if isinstance(exc, errors.DiskFull):
            error = StoreFullError(
                f"no space left on the database server of store {self.location}: it could not {doing} ({cause}); "
                "free space there and try again"
            )
        elif isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected):
            error = StoreConflictError(
                f"store {self.location} could not {doing}: the database refused it as conflicting with "
                f"another transaction ({cause})"
            )
        elif isinstance(exc, errors.ReadOnlySqlTransaction):
            error = StoreReadOnlyError(
                f"store {self.location} could not {doing}: the database takes no writes, it is read-only "
                f"(a standby?) ({cause})"
            )
        elif isinstance(exc, self._psycopg.OperationalError) or getattr(exc, "sqlstate", "") in (
            "57P01",
            "57P02",
            "57P03",
            "08000",
            "08003",
            "08006",
        ):
            error = StoreConnectionError(
                f"store {self.location} could not {doing}: the connection to the database was lost or refused ({cause})"
            )
        else:
            error = StoreError(f"store {self.location} could not {doing}: {cause}")
        error.__cause__ = exc
        return error

    def size(self) -> int:
        try:
            rows = self._read(
                "its size",
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.relname LIKE 'weald\\_%%' AND c.relkind = 'r'",
                (),
            )
        except StoreError:
            return 0
        return int(rows[0][0])

    def describe(self) -> Iterator[tuple[str, Any]]:
        yield "pool", {"connections": self._slots, "idle": len(self._idle), "size": _POOL_SIZE}

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._pool_lock.notify_all()
        for slot in idle:
            slot.close()
        with self._lease_lock:
            self._lease.close()
