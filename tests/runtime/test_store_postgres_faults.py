"""The store's errors on a real PostgreSQL server, each caused for real and named for what it is.

A read-only standby (a real one, made by ``pg_basebackup -R`` and streaming
from the primary), a server whose disk is full (the database's tablespace on a
real tmpfs, filled), a deadlock between a store's transaction and another
session of the same database: each maps onto the `StoreError` tree with a
message that names the cause, and nothing acknowledged is lost. And a node
frozen (SIGSTOP) inside a transaction, holding the fence's locks, does not
hold up the takeover of its sessions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from weald.runtime import Store, StoreClosedError, StoreConflictError, StoreFullError, StoreReadOnlyError
from weald.runtime._store_postgres import IDLE_IN_TRANSACTION
from weald.runtime.testing import wait_until


@contextlib.contextmanager
def _closing(store: Store) -> Iterator[Store]:
    try:
        yield store
    finally:
        store.close()


def test_a_standby_serves_reads_and_refuses_writes_by_name_while_the_primary_takes_them(
    pg_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    database = pg_cluster.create_database()
    with _closing(Store(url=pg_cluster.url(database))) as primary:
        primary.put("tasks", "before", {"n": 1})
        standby = pg_cluster.standby()
        try:
            with _closing(Store(url=standby.url(database))) as replica:
                assert replica.get("tasks", "before") == {"n": 1}
                # A synchronous write says read-only, with the password masked.
                with pytest.raises(StoreReadOnlyError, match=r"read-only \(a standby\?\)") as refused:
                    replica.put("tasks", "b", {"n": 2})
                assert pg_cluster.password not in str(refused.value)
                assert "***" in str(refused.value)
                # A queued write: its flush fails by name, and the write is kept, not dropped.
                replica.enqueue_nowait("tasks", "c", {"n": 3})
                with pytest.raises(StoreReadOnlyError, match="read-only"):
                    replica.flush().get(timeout=30)
                assert replica.get("tasks", "c") == {"n": 3}  # still the store's (queued), not lost
                # The primary writes; the standby replays it.
                primary.put("tasks", "after", {"n": 4})
                wait_until(lambda: replica.get("tasks", "after") == {"n": 4}, timeout=30)
                assert replica.get("tasks", "b") is None
        finally:
            standby.remove()
    # The store names the error; psycopg's own "error ignored terminating <Pipeline>" is not logged beside it.
    assert "error ignored" not in caplog.text


def test_a_full_disk_on_the_server_fails_writes_by_name_and_they_land_once_there_is_room(pg_cluster: Any) -> None:
    tablespace = pg_cluster.small_tablespace("24m")
    database = pg_cluster.create_database(tablespace=tablespace)
    where = next(p for p in pg_cluster.dir.iterdir() if p.name == tablespace)
    with _closing(Store(url=pg_cluster.url(database))) as store:
        store.put("blobs", "seed", "x")
        # Fill the tmpfs under the tablespace; the server then cannot extend a table file.
        filler = where / "filler"
        with filler.open("wb") as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * (1 << 20))
                out.flush()
                os.fsync(out.fileno())
        values = {f"k{i:03d}": os.urandom(4096).hex() for i in range(400)}  # 3.2 MB: new pages for sure
        with pytest.raises(StoreFullError, match="no space left on the database server") as full:
            store.put_many("blobs", values)
        assert pg_cluster.password not in str(full.value)
        assert store.get("blobs", "k000") is None  # nothing of the refused transaction landed
        # Queued writes: the flush fails by name and keeps them.
        for key, value in values.items():
            store.enqueue_nowait("blobs", key, value)
        with pytest.raises(StoreFullError, match="free space there"):
            store.flush().get(timeout=30)
        # Room again: the kept writes are committed, every one of them.
        filler.unlink()
        wait_until(lambda: _flushed(store), timeout=60)
    with _closing(Store(url=pg_cluster.url(database))) as again:
        assert dict(again.items("blobs")) == {"seed": "x", **values}


def _flushed(store: Store) -> bool:
    try:
        store.flush().get(timeout=30)
    except StoreFullError:
        return False
    return True


def test_a_deadlock_with_another_session_fails_the_transaction_by_name_and_writes_nothing(pg_cluster: Any) -> None:
    url = pg_cluster.url(pg_cluster.create_database())
    with _closing(Store(url=url)) as store:
        store.put("tasks", "x", {"by": "nobody"})
        lock = "project:/work/p"
        other = psycopg.connect(url)
        try:
            # The other session locks row x and (later) asks for the store's lock; the store's
            # transaction holds that lock and asks for row x: a real deadlock. The other session
            # waits longer before checking, so the server breaks the cycle on the store's side.
            other.execute("SET deadlock_timeout = '60s'")
            other.execute("UPDATE weald_kv SET value = value WHERE ns = 'tasks' AND key = 'x'")
            holding = threading.Event()
            failure: list[BaseException] = []

            def store_side() -> None:
                try:
                    with store.transaction(lock=lock) as tx:
                        holding.set()
                        tx.write_batch("tasks", {"x": {"by": "store"}, "y": {"by": "store"}})
                except BaseException as exc:
                    failure.append(exc)
                finally:
                    holding.set()

            thread = threading.Thread(target=store_side)
            thread.start()
            assert holding.wait(30)
            wait_until(lambda: _waiting_on_a_lock(url), timeout=30)
            other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
            thread.join(60)
            assert not thread.is_alive()
            other.execute("UPDATE weald_kv SET value = convert_to('{\"by\":\"other\"}', 'UTF8') WHERE key = 'x'")
            other.commit()
        finally:
            other.close()
        assert len(failure) == 1, failure
        assert isinstance(failure[0], StoreConflictError), failure
        assert "conflicting with another transaction" in str(failure[0])
        assert "deadlock" in str(failure[0])
        assert store.get("tasks", "x") == {"by": "other"}
        assert store.get("tasks", "y") is None  # nothing of the store's transaction landed


def _waiting_on_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0] >= 1)


# A node's store that takes the fence's share lock in a transaction and is then frozen (SIGSTOP) before
# its COMMIT goes out; when thawed, it tries to commit and says what happened.
_FROZEN_MID_TRANSACTION = """
import os, signal, sys
from weald.runtime import Store
store = Store(url=sys.argv[1])
store.join("frozen", lease=1.0)
epoch = store.claim(["s"])["s"]
conn = store.backend.connect()
conn.execute("BEGIN")
conn.execute("SELECT weald_fence(%s, %s::text[], %s::bigint[])", ("frozen", ["s"], [epoch]))
conn.execute("INSERT INTO weald_kv (ns, key, value) VALUES ('tasks', 'late', '1')")
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
try:
    conn.execute("COMMIT")
except Exception as exc:
    print("commit failed:", type(exc).__name__, str(exc).splitlines()[0], flush=True)
else:
    print("committed", flush=True)
"""


def test_a_node_frozen_inside_a_transaction_does_not_hold_up_the_takeover_of_its_sessions(pg_cluster: Any) -> None:
    url = pg_cluster.url(pg_cluster.create_database())
    Store(url=url).close()  # the schema
    frozen = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_MID_TRANSACTION, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline().strip() == "locked", frozen.stderr.read() if frozen.stderr else ""
        wait_until(lambda: _state_of(frozen.pid) == "T", timeout=30, message="the node to be stopped")
        stopped = time.monotonic()
        with _closing(Store(url=url)) as heir:
            heir.join("heir", lease=30)
            # The claim waits for the frozen transaction's share lock until the server ends that
            # transaction (IDLE_IN_TRANSACTION after it went quiet), then takes the session once the
            # frozen node's 1 s lease is out.
            # (In a thread: without the timeout the claim would wait for as long as the node is frozen;
            # the test then fails here, and the kill below lets the claim go.)
            claims: list[dict[str, int]] = []

            def claim() -> None:
                while not claims:
                    try:
                        got = heir.claim(["s"])
                    except StoreClosedError:
                        return  # the test gave up and closed it
                    if got:
                        claims.append(got)
                    else:
                        time.sleep(0.05)

            threading.Thread(target=claim, daemon=True).start()
            claimed = wait_until(lambda: claims[0] if claims else None, timeout=60, message="the heir to claim s")
            took = time.monotonic() - stopped
            assert claimed == {"s": 2}
            assert took < 1.0 + IDLE_IN_TRANSACTION + 5.0, took  # lease + the timeout, with room for a loaded host
            assert heir.get("tasks", "late") is None
        os.kill(frozen.pid, signal.SIGCONT)
        out, err = frozen.communicate(timeout=60)
        assert out.startswith("commit failed: "), (out, err)
        assert "idle-in-transaction timeout" in out
    finally:
        if frozen.poll() is None:
            frozen.kill()
            frozen.wait(30)
    with _closing(Store(url=url)) as after:
        assert after.get("tasks", "late") is None  # nothing of the frozen node's transaction landed


def _state_of(pid: int) -> str:
    """The one-letter state of process ``pid`` (``T``: stopped) from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
