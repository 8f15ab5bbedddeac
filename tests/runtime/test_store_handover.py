"""The store's write-behind path: writes gathered per loop, handed to the committer together, in order.

Writes enqueued on a weald loop thread wait, gathered, for the next flush
or the hand-over delay; these tests check that gathering loses nothing and
reorders nothing: a synchronous write lands after the queued writes before
it, a loop that ends hands over what it gathered, `close` drains it, and a
flush with nothing to commit answers without waking the committer. Most
use a long hand-over delay, so that only the mechanism under test can move
the gathered writes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from weald.runtime import Loop, Store, StoreError
from weald.runtime.testing import wait_until

LONG = 60.0  # a hand-over delay no test waits out


@pytest.fixture
def loop() -> Iterator[Loop]:
    loop = Loop(name="test-store-loop")
    loop.start()
    yield loop
    loop.stop()


def committed_count(path: Path, namespace: str) -> int:
    """How many keys the file itself holds in ``namespace``: a store's reads also see queued writes."""
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f'SELECT count(*) FROM "{namespace}"').fetchone()[0])
    except sqlite3.OperationalError:  # no such table yet
        return 0
    finally:
        conn.close()


def on_loop(loop: Loop, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the loop thread and return its result."""

    async def call() -> Any:
        return fn()

    return trio.from_thread.run(call, trio_token=loop.token)


def test_writes_enqueued_on_a_loop_are_handed_over_together_without_a_flush(tmp_path: Path, loop: Loop) -> None:
    store = Store(tmp_path / "s.db")
    try:
        store.flush().get(timeout=10)
        rounds = store.statistics()["rounds"]

        def write() -> int:
            for i in range(50):
                store.enqueue_nowait("history", f"t/{i:03d}", {"n": i})
            queued: int = store.statistics()["queued"]
            return queued

        assert on_loop(loop, write) == 50  # gathered: the committer was not woken per write
        assert store.count("history") == 50  # reads see the gathered writes at once
        # Nobody flushes: the delay hands them over.
        wait_until(lambda: committed_count(store.path, "history") == 50, timeout=10)
        assert store.statistics()["rounds"] == rounds + 1
        assert store.statistics()["queued"] == 0
    finally:
        store.close()


def test_a_flush_with_nothing_enqueued_since_the_last_commit_does_not_wake_the_committer(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    try:
        store.enqueue_nowait("history", "a", 1)
        store.flush().get(timeout=10)
        rounds, commits = store.statistics()["rounds"], store.statistics()["commits"]
        for _ in range(20):
            flushed = store.flush()
            assert flushed.done()  # resolved in the call
            flushed.get(timeout=10)
        assert (store.statistics()["rounds"], store.statistics()["commits"]) == (rounds, commits)
        store.enqueue_nowait("history", "b", 2)  # something to commit again: a real round trip
        store.flush().get(timeout=10)
        assert store.statistics()["rounds"] == rounds + 1
        assert store.get("history", "b") == 2
    finally:
        store.close()


def test_a_synchronous_write_lands_after_the_writes_queued_before_it(tmp_path: Path, loop: Loop) -> None:
    store = Store(tmp_path / "s.db", handover_delay=LONG)
    try:

        def queue_then_write() -> None:
            store.enqueue_nowait("sessions", "s1", {"v": "queued"})
            store.enqueue_nowait("sessions", "s2", {"v": "queued"})
            store.enqueue_nowait("sessions", "s3", {"v": "queued"})

        on_loop(loop, queue_then_write)
        store.put("sessions", "s1", {"v": "synchronous"})
        store.delete("sessions", "s2")
        store.write_batch("sessions", {"s4": {"v": "batch"}}, deletes=["s3"])
        store.flush().get(timeout=10)
        assert store.items("sessions") == [("s1", {"v": "synchronous"}), ("s4", {"v": "batch"})]
    finally:
        store.close()


@contextlib.contextmanager
def refusing(path: Path) -> Iterator[tuple[Store, sqlite3.Connection]]:
    """A store whose ``broken`` namespace refuses every insert (a trigger), and the connection that set it."""
    store = Store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        store.put("broken", "seed", 0)
        other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        yield store, other
    finally:
        other.close()
        store.close()


def test_a_synchronous_write_is_refused_while_a_queued_write_of_its_key_cannot_be_committed(tmp_path: Path) -> None:
    with refusing(tmp_path / "s.db") as (store, other):
        store.enqueue_nowait("broken", "b", "queued")
        store.enqueue_nowait("tasks", "t", "queued")
        with pytest.raises(StoreError, match=r"writes queued before it cannot be committed .*refused"):
            store.put("tasks", "t", "synchronous")  # else the queued value would land over it later
        assert store.get("tasks", "t") == "queued"  # the queued write, kept for another attempt
        store.put("tasks", "other", 1)  # a key with nothing queued does not wait for them
        assert store.get("tasks", "other") == 1
        other.execute("DROP TRIGGER refuse")
        store.put("tasks", "t", "synchronous")  # the kept writes land first, then this one
        assert store.get("tasks", "t") == "synchronous"
        assert store.get("broken", "b") == "queued"
        store.flush().get(timeout=10)
        assert store.get("tasks", "t") == "synchronous"


def test_writes_gathered_by_a_loop_that_ends_are_handed_over(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db", handover_delay=LONG)
    loop = Loop(name="test-store-ending-loop")
    loop.start()
    try:
        on_loop(loop, lambda: store.enqueue_nowait("history", "late", 1))
        assert store.statistics()["queued"] == 1
    finally:
        loop.stop()
    # No flush: the ending run handed it over.
    wait_until(lambda: committed_count(store.path, "history") == 1, timeout=10)
    store.close()


def test_close_commits_what_a_loop_gathered(tmp_path: Path, loop: Loop) -> None:
    store = Store(tmp_path / "s.db", handover_delay=LONG)
    on_loop(loop, lambda: [store.enqueue_nowait("history", f"k{i}", i) for i in range(10)])
    store.close()  # before the loop's timer, and before any committer thread was started
    reopened = Store(tmp_path / "s.db")
    try:
        assert reopened.count("history") == 10
    finally:
        reopened.close()


def test_a_flush_after_close_is_answered_by_what_the_file_holds(tmp_path: Path) -> None:
    with refusing(tmp_path / "s.db") as (store, _):
        store.enqueue_nowait("broken", "b", 1)
        store.close()  # its last round fails: the write is not committed, and never will be now
        with pytest.raises(StoreError, match="refused"):
            store.flush().get(timeout=10)  # answered at once, not left waiting for a committer that has ended
    clean = Store(tmp_path / "clean.db")
    clean.enqueue_nowait("history", "a", 1)
    clean.close()
    clean.flush().get(timeout=10)  # everything landed: a flush after close succeeds


# -- ordering and durability over random interleavings ----------------------------------------------------

KEYS = ("a", "b", "c")

operation = st.one_of(
    st.tuples(st.sampled_from(["loop", "thread"]), st.sampled_from(KEYS), st.integers(0, 99)),
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(100, 199)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("check")),
)


@pytest.fixture(scope="module")
def shared_loop() -> Iterator[Loop]:
    loop = Loop(name="test-store-property-loop")
    loop.start()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store-property")


_examples = iter(range(1_000_000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operation, min_size=1, max_size=25), delay=st.sampled_from([0.0, 0.002, LONG]))
def test_the_store_ends_as_the_writes_were_made_in_order(
    shared_loop: Loop, workdir: Path, ops: list[tuple[Any, ...]], delay: float
) -> None:
    """Any mix of queued writes (from the loop and from other threads), synchronous puts and deletes
    and flushes leaves each key with the value of its last write, in the file; and a read at any
    point sees every write made before it, committed yet or not."""
    store = Store(workdir / f"p{next(_examples)}.db", handover_delay=delay)
    model: dict[str, int] = {}
    try:
        for op in ops:
            kind = op[0]
            if kind == "loop":
                on_loop(shared_loop, lambda op=op: store.enqueue_nowait("kv", op[1], op[2]))
                model[op[1]] = op[2]
            elif kind == "thread":
                writer = threading.Thread(target=store.enqueue_nowait, args=("kv", op[1], op[2]))
                writer.start()
                writer.join()
                model[op[1]] = op[2]
            elif kind == "put":
                store.put("kv", op[1], op[2])
                model[op[1]] = op[2]
            elif kind == "delete":
                store.delete("kv", op[1])
                model.pop(op[1], None)
            elif kind == "flush":
                store.flush().get(timeout=10)
                assert dict(store.items("kv")) == model
            else:
                # Reads see their writes: every write made so far, queued or not.
                assert dict(store.items("kv")) == model
                for key in KEYS:
                    assert store.get("kv", key) == model.get(key)
        store.flush().get(timeout=10)
        assert dict(store.items("kv")) == model
    finally:
        store.close()
    reopened = Store(store.path)
    try:
        assert dict(reopened.items("kv")) == model  # and all of it is in the file
    finally:
        reopened.close()


def test_a_flush_disarms_its_loops_timer_so_a_later_turn_gets_no_extra_round(tmp_path: Path, loop: Loop) -> None:
    # Turns write, keep writing a while (a turn's tool calls), then flush,
    # back to back. The timer armed by an earlier turn's first write must not
    # fire inside a later turn (the flush took the writes it was armed for):
    # it would commit that turn's first writes in a round of their own.
    store = Store(tmp_path / "s.db", handover_delay=0.1)
    try:
        store.flush().get(timeout=10)
        rounds = store.statistics()["rounds"]

        async def turns() -> None:
            for turn in range(15):  # 15 turns of ~20 ms span the delay 3 times
                store.enqueue_nowait("history", f"t{turn}/0", {"n": 0})
                await trio.sleep(0.018)
                store.enqueue_nowait("history", f"t{turn}/1", {"n": 1})
                await trio.sleep(0.002)
                await store.flush()

        trio.from_thread.run(turns, trio_token=loop.token)
        assert store.count("history") == 30
        assert store.statistics()["rounds"] == rounds + 15  # one round per flush, none from the timer
    finally:
        store.close()
