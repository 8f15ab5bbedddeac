"""The persistent store: msgspec JSON values on sqlitedict, committed before returning."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import msgspec
import pytest
import trio
import trio.lowlevel
from weald.runtime import (
    ActorSystem,
    StartError,
    Store,
    StoreClosedError,
    StoreCodecError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
)
from weald.runtime.testing import fill_disk, wait_until


@attrs.frozen
class Task:
    id: str
    title: str
    status: str = "open"


class Note(msgspec.Struct):
    key: str
    text: str


def committed(path: Path, namespace: str, key: str) -> object:
    """What the file itself holds under ``key`` (None: nothing): a store's reads also see queued writes."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute(f'SELECT value FROM "{namespace}" WHERE key = ?', (key,)).fetchone()
    except sqlite3.OperationalError:  # no such table
        return None
    finally:
        conn.close()
    return None if row is None else msgspec.json.decode(row[0])


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "s.db")
    yield s
    s.close()


def test_values_round_trip_and_decode_into_types(store: Store) -> None:
    store.put("tasks", "1", {"id": "1", "title": "write tests", "status": "open"})
    store.put("memory", "n", Note("n", "hello"))
    assert store.get("tasks", "1") == {"id": "1", "title": "write tests", "status": "open"}
    assert store.get("tasks", "1", type=Task) == Task("1", "write tests")
    assert store.get("memory", "n", type=Note) == Note("n", "hello")
    assert store.get("tasks", "missing", "default") == "default"


def test_a_write_is_committed_before_put_returns(store: Store) -> None:
    store.put("sessions", "a1", {"messages": 3})
    # A separate connection sees the row at once: it was committed.
    conn = sqlite3.connect(store.path)
    try:
        rows = conn.execute('SELECT key, value FROM "sessions"').fetchall()
    finally:
        conn.close()
    assert rows == [("a1", b'{"messages":3}')]


def test_values_are_json_never_pickle(store: Store) -> None:
    store.put("tasks", "1", {"a": [1, 2]})
    conn = sqlite3.connect(store.path)
    try:
        (raw,) = conn.execute('SELECT value FROM "tasks"').fetchone()
    finally:
        conn.close()
    assert msgspec.json.decode(raw) == {"a": [1, 2]}
    assert not raw.startswith(b"\x80")  # pickle protocol header


def test_a_tampered_pickle_value_cannot_execute_code(tmp_path: Path, store: Store) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    store.put("tasks", "1", "placeholder")
    conn = sqlite3.connect(store.path)
    conn.execute('UPDATE "tasks" SET value = ? WHERE key = ?', (pickle.dumps(Exploit()), "1"))
    conn.commit()
    conn.close()
    with pytest.raises(StoreCodecError, match="tasks/1"):
        store.get("tasks", "1")
    assert not marker.exists()


def test_keys_items_prefix_count_and_delete(store: Store) -> None:
    store.put_many("tasks", {"p1/a": 1, "p1/b": 2, "p2/a": 3})
    assert store.keys("tasks") == ["p1/a", "p1/b", "p2/a"]
    assert store.items("tasks", "p1/") == [("p1/a", 1), ("p1/b", 2)]
    assert store.count("tasks") == 3
    assert store.delete("tasks", "p1/a") is True
    assert store.delete("tasks", "p1/a") is False
    assert store.keys("tasks") == ["p1/b", "p2/a"]
    assert ("tasks", "p2/a") in store


def test_a_batch_with_a_value_that_cannot_be_encoded_writes_nothing(store: Store) -> None:
    store.put("tasks", "keep", 1)
    with pytest.raises(StoreCodecError, match="tasks/bad"):
        store.put_many("tasks", {"new": 2, "bad": object()})
    assert store.keys("tasks") == ["keep"]


def test_write_batch_applies_puts_and_deletes_together(store: Store) -> None:
    store.put_many("tasks", {"a": 1, "b": 2})
    store.write_batch("tasks", puts={"c": 3}, deletes=["a"])
    assert store.items("tasks") == [("b", 2), ("c", 3)]


def test_a_typed_decode_failure_names_the_key(store: Store) -> None:
    store.put("tasks", "1", {"id": 1})
    with pytest.raises(StoreCodecError, match=r"tasks/1.*Expected `str`"):
        store.get("tasks", "1", type=Task)


def test_a_page_read_decodes_like_one_value_at_a_time_and_still_names_a_value_at_fault(store: Store) -> None:
    # A typed page is decoded as one JSON array (a wake reads a history so); anything
    # it cannot take is decoded one by one, and the value at fault named.
    for i in range(5):
        store.put("tasks", f"p/{i}", {"id": str(i), "title": f"t{i}", "status": "open"})
    page = store.items_range("tasks", "p/", type=Task)
    assert page == [(f"p/{i}", store.get("tasks", f"p/{i}", type=Task)) for i in range(5)]
    assert store.items_range("tasks", "p/", start="3", type=Task) == page[3:]
    store.put("tasks", "p/2", {"id": 2})
    with pytest.raises(StoreCodecError, match=r"tasks/p/2.*Expected `str`"):
        store.items_range("tasks", "p/", type=Task)
    conn = sqlite3.connect(store.path)
    # Not JSON alone, yet two of them would make a valid array of two: still refused by name.
    conn.execute('UPDATE "tasks" SET value = ? WHERE key = ?', (b'{"id": "1", "title": "a", "status": "x"}, 7', "p/1"))
    conn.execute('UPDATE "tasks" SET value = ? WHERE key = ?', (b'{"id": "2", "title": "b", "status": "y"}', "p/2"))
    conn.commit()
    conn.close()
    with pytest.raises(StoreCodecError, match=r"tasks/p/1"):
        store.items_range("tasks", "p/", type=Task)


def test_bad_namespaces_and_keys_are_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="bad namespace 'Tasks!'"):
        store.put("Tasks!", "1", 1)
    with pytest.raises(StoreError, match=r"bad namespace 'tasks\\n'"):  # "$" in a pattern lets a final newline in
        store.put("tasks\n", "1", 1)
    with pytest.raises(StoreError, match="non-empty strings"):
        store.put("tasks", "", 1)


def test_a_file_that_is_not_a_database_is_reported_by_name_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StoreCorruptError, match=str(path)):
        Store(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_corrupted_database_is_reported_and_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    s = Store(path)
    s.put_many("tasks", {str(i): "x" * 200 for i in range(500)})
    s.close()
    data = bytearray(path.read_bytes())
    data[4096 : 4096 + 64] = b"\xff" * 64  # scribble over the second page
    path.write_bytes(bytes(data))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(StoreCorruptError, match=str(path)):
        Store(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_directory_in_place_of_the_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def test_a_store_file_that_cannot_be_opened_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    # Root reads any file whatever its mode; a socket in the file's place cannot be opened by anyone.
    path = tmp_path / "s.db"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(StoreError, match=re.escape(f"store file {path} cannot be read: No such device or address")):
            Store(path)
        # Through the actor system the error still names the file.
        with (
            pytest.raises(StartError, match=re.escape(f"store file {path} cannot be read")),
            ActorSystem(store_path=path),
        ):
            pass


def test_a_store_path_under_a_regular_file_is_a_clear_error_naming_that_file(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be\n")
    with pytest.raises(
        StoreError, match=re.escape(f"cannot create the store's directory {blocker}: {blocker} is not a directory")
    ):
        Store(blocker / "s.db")
    assert blocker.read_text() == "a file where the store's directory should be\n"


def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    s = Store(tmp_path / "s.db")
    s.close()
    with pytest.raises(StoreClosedError):
        s.put("tasks", "1", 1)


@pytest.mark.trio
async def test_async_variants_run_off_the_trio_thread(store: Store) -> None:
    await store.aput("tasks", "1", {"x": 1})
    assert await store.aget("tasks", "1") == {"x": 1}
    assert await store.aitems("tasks") == [("1", {"x": 1})]
    assert await store.adelete("tasks", "1") is True


WRITER = textwrap.dedent(
    """
    import sys
    from weald.runtime import Store
    s = Store(sys.argv[1])
    i = 0
    while True:
        s.put("tasks", f"k{i:06d}", {"n": i, "pad": "x" * 100})
        print(i, flush=True)
        i += 1
    """
)


def test_every_acknowledged_write_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    acked = -1
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked = int(line)
            if acked >= 300:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    s = Store(path)
    try:
        for i in range(acked + 1):
            assert s.get("tasks", f"k{i:06d}") == {"n": i, "pad": "x" * 100}
    finally:
        s.close()


def test_statistics_count_reads_and_writes(store: Store) -> None:
    store.put("tasks", "1", 1)
    store.get("tasks", "1")
    stats = store.statistics()
    assert stats["writes"] == 1
    assert stats["reads"] == 1
    assert stats["namespaces"] == ["tasks"]
    assert store.namespaces() == ["tasks"]


def test_trio_thread_is_not_blocked_by_a_write(store: Store) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.aput, "tasks", "x", 1)
            await trio.lowlevel.checkpoint()
        assert store.get("tasks", "x") == 1

    trio.run(main)


def test_enqueued_writes_are_committed_in_groups_and_flush_waits_for_them(store: Store) -> None:
    for i in range(500):
        store.enqueue_nowait("history", f"s/{i:05d}", {"n": i})
    store.flush().get(timeout=10)
    assert store.count("history") == 500
    assert store.get("history", "s/00499") == {"n": 499}
    assert store.statistics()["commits"] < 500  # grouped, not one commit per write


def test_each_commit_is_timed_and_the_newest_durations_summarised(store: Store) -> None:
    store.put("tasks", "a", 1)  # a synchronous write: one commit
    for i in range(50):
        store.enqueue_nowait("history", f"t/{i:03d}", i)
    store.flush().get(timeout=10)
    stats = store.statistics()
    latency = stats["commit_latency"]
    assert latency["count"] == stats["commits"] >= 2
    assert latency["window"] == latency["count"]
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    # The mean over the window is the time counted in commit_seconds over the commits (all in the window here).
    assert latency["mean_ms"] == pytest.approx(stats["commit_seconds"] / stats["commits"] * 1000, abs=0.01)


def test_a_queued_group_is_one_transaction_across_namespaces(tmp_path: Path) -> None:
    path = tmp_path / "group.db"
    s = Store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        s.put("turns", "seed", 0)
        s.put("broken", "seed", 0)  # creates both tables
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        other.execute("BEGIN IMMEDIATE")  # holds the write lock: the committer's next group waits
        s.enqueue_nowait("history", "first", 1)
        wait_until(lambda: s.statistics()["queued"] == 0)  # the committer took it and waits for the lock
        s.enqueue_nowait("turns", "t", 1)
        s.enqueue_nowait("broken", "b", 1)  # same group as "t": the trigger fails it
        flushed = s.flush()
        other.execute("ROLLBACK")
        with pytest.raises(StoreError, match="could not commit queued writes: refused"):
            flushed.get(timeout=20)
        assert committed(path, "history", "first") == 1
        assert committed(path, "turns", "t") is None  # rolled back with the failed write, not half-committed
        assert s.get("turns", "t") == 1  # and still what a read of it sees: it is kept for the next attempt
    finally:
        other.close()
        s.close()


def test_a_failed_group_is_kept_and_fails_every_flush_until_its_cause_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    s = Store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        s.put("broken", "seed", 0)
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        s.enqueue_nowait("broken", "b", 1)
        with pytest.raises(StoreError, match="could not commit queued writes: refused"):
            s.flush().get(timeout=20)
        assert isinstance(s.write_failure, StoreError)
        # A later flush with nothing new queued still waits on the failed write: it is not acknowledged.
        with pytest.raises(StoreError, match="refused"):
            s.flush().get(timeout=20)
        s.enqueue_nowait("turns", "later", 2)  # accepted, not refused for good
        with pytest.raises(StoreError, match="refused"):
            s.flush().get(timeout=20)
        assert committed(path, "turns", "later") is None  # one group with the failed write: nothing half-committed
        assert s.get("turns", "later") == 2  # a read sees what it wrote all the same
        other.execute("DROP TRIGGER refuse")
        s.flush().get(timeout=20)  # no restart: the kept writes and the new one land
        assert s.get("broken", "b") == 1
        assert s.get("turns", "later") == 2
        assert s.write_failure is None
        assert s.statistics()["retained"] == 0
    finally:
        other.close()
        s.close()


def test_kept_writes_are_retried_on_their_own_once_the_cause_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "retry.db"
    s = Store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        s.put("broken", "seed", 0)
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        s.enqueue_nowait("broken", "b", 1)
        with pytest.raises(StoreError):
            s.flush().get(timeout=20)
        other.execute("DROP TRIGGER refuse")
        # Nobody writes or flushes: the committer tries again by itself.
        wait_until(lambda: other.execute("SELECT count(*) FROM broken WHERE key = 'b'").fetchone()[0] == 1, timeout=20)
        assert s.write_failure is None
    finally:
        other.close()
        s.close()


def test_new_writes_are_refused_while_too_much_waits_to_be_committed(tmp_path: Path) -> None:
    path = tmp_path / "bound.db"
    s = Store(path, max_retained_bytes=1000)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        s.put("broken", "seed", 0)
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        s.enqueue_nowait("broken", "big", "x" * 2000)
        with pytest.raises(StoreError):
            s.flush().get(timeout=20)
        with pytest.raises(StoreError, match=r"refuses new writes: 2,002 bytes of earlier ones wait .*refused"):
            s.enqueue_nowait("turns", "t", 1)
        other.execute("DROP TRIGGER refuse")
        wait_until(lambda: s.write_failure is None, timeout=20)
        s.enqueue_nowait("turns", "t", 1)
        s.flush().get(timeout=20)
        assert s.get("turns", "t") == 1
    finally:
        other.close()
        s.close()


def test_enqueue_refuses_a_value_it_cannot_encode_in_the_caller(store: Store) -> None:
    with pytest.raises(StoreCodecError, match="history/bad"):
        store.enqueue_nowait("history", "bad", object())


def test_close_drains_the_queue_first(tmp_path: Path) -> None:
    s = Store(tmp_path / "q.db")
    for i in range(100):
        s.enqueue_nowait("history", f"k{i:03d}", i)
    s.close()
    reopened = Store(tmp_path / "q.db")
    try:
        assert reopened.count("history") == 100
    finally:
        reopened.close()
    with pytest.raises(StoreClosedError):
        s.enqueue_nowait("history", "late", 1)


@pytest.mark.trio
async def test_flush_is_awaitable_from_trio(store: Store) -> None:
    store.enqueue_nowait("history", "x", 1)
    await store.flush()
    assert store.get("history", "x") == 1


def _integrity(path: Path) -> list[tuple[str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA integrity_check").fetchall()
    finally:
        conn.close()


def test_a_full_disk_fails_writes_by_name_keeps_the_file_intact_and_passes_once_space_returns(tmpfs) -> None:
    state = tmpfs("3m")
    s = Store(state / "store.db")
    try:
        s.put("tasks", "before", {"n": 0})
        s.enqueue_nowait("history", "s/0", {"n": 0})
        s.flush().get(timeout=10)
        filler = fill_disk(state)
        big = {"text": "x" * 200_000}  # more than the WAL's free pages: it must grow
        with pytest.raises(StoreFullError, match=f"no space left on the device holding {state}"):
            s.put("tasks", "during", big)
        for i in range(1, 4):
            s.enqueue_nowait("history", f"s/{i}", big)
        with pytest.raises(StoreFullError, match=f"no space left on the device holding {state}"):
            s.flush().get(timeout=10)
        assert isinstance(s.write_failure, StoreFullError)
        assert _integrity(state / "store.db") == [("ok",)]
        assert s.get("tasks", "before") == {"n": 0}  # reads go on
        assert (s.get("never", "k"), s.items("never"), s.count("never")) == (None, [], 0)  # and write nothing
        filler.unlink()
        # No reopening: the refused put works now, and the kept queued writes land.
        s.put("tasks", "during", big)
        s.flush().get(timeout=10)
        assert s.write_failure is None
        assert s.keys("history") == ["s/0", "s/1", "s/2", "s/3"]
        assert _integrity(state / "store.db") == [("ok",)]
    finally:
        s.close()
    reopened = Store(state / "store.db")
    try:
        assert reopened.get("tasks", "during") == big
        assert reopened.count("history") == 4
    finally:
        reopened.close()
