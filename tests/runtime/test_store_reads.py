"""The store's reads see its writes: a value enqueued and not yet committed is what a read returns.

Agents queue their history and records (write-behind) and readers in other
threads (``recall``, ``agent.history``, a restore) read them back at once;
these tests interleave the two across agents, with the committer running,
gathering on a loop, or kept from committing by a failed group, and check
every read against every write acknowledged before it began.
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

LONG = 60.0  # a hand-over delay no test waits out: only a flush moves the gathered writes


@pytest.fixture(scope="module")
def shared_loop() -> Iterator[Loop]:
    loop = Loop(name="test-store-reads-loop")
    loop.start()
    yield loop
    loop.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store-reads")


def on_loop(loop: Loop, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on the loop thread (where agents write) and return its result."""

    async def call() -> Any:
        return fn()

    return trio.from_thread.run(call, trio_token=loop.token)


@contextlib.contextmanager
def refusing(path: Path, refuse: bool) -> Iterator[sqlite3.Connection]:
    """With ``refuse``, the store file's ``broken`` namespace refuses every insert (a trigger) until the end."""
    seed = Store(path)
    seed.put("broken", "seed", 0)
    seed.close()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        if refuse:
            other.execute("CREATE TRIGGER refuse BEFORE INSERT ON \"broken\" BEGIN SELECT RAISE(ABORT, 'refused'); END")
        yield other
    finally:
        other.close()


def test_every_read_sees_a_queued_write_gathered_committing_or_kept_after_a_failed_commit(
    workdir: Path, shared_loop: Loop
) -> None:
    path = workdir / "kinds.db"
    with refusing(path, refuse=True) as other:
        store = Store(path, handover_delay=LONG)
        try:
            on_loop(shared_loop, lambda: store.enqueue_nowait("history", "a/00000001", {"text": "gathered"}))
            assert store.get("history", "a/00000001") == {"text": "gathered"}
            assert ("history", "a/00000001") in store
            assert store.keys("history", "a/") == ["a/00000001"]
            assert store.count("history") == 1
            # A group that fails is kept for the next attempt, and read as if it were in the file.
            store.enqueue_nowait("broken", "b", 1)
            store.enqueue_nowait("history", "a/00000000", {"text": "kept"})
            with pytest.raises(StoreError, match="refused"):
                store.flush().get(timeout=20)
            on_loop(shared_loop, lambda: store.enqueue_nowait("history", "a/00000001", {"text": "newer"}))
            assert store.items_range("history", "a/", newest_first=True, limit=1) == [("a/00000001", {"text": "newer"})]
            # In the order the file will have them (a key's first write placed it).
            assert store.items("history", "a/") == [
                ("a/00000001", {"text": "newer"}),
                ("a/00000000", {"text": "kept"}),
            ]
            good, bad = store.scan("history", "a/")
            assert (len(good), bad) == (2, [])
            assert other.execute('SELECT count(*) FROM "history"').fetchone()[0] == 0  # none of it in the file
            other.execute("DROP TRIGGER refuse")
            store.flush().get(timeout=20)
            # In the order the file will have them (a key's first write placed it).
            assert store.items("history", "a/") == [
                ("a/00000001", {"text": "newer"}),
                ("a/00000000", {"text": "kept"}),
            ]
        finally:
            store.close()


# -- agents writing and reading at once ------------------------------------------------------------------

step = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 300)),  # a history message of that many characters
    st.tuples(
        st.just("record"),
    ),  # the agent's record, written again
    st.tuples(st.just("read_own"), st.integers(1, 8)),  # a page of its newest messages, as agent.history reads
    st.tuples(st.just("read_other"), st.integers(0, 3)),  # another agent's history and record, as a reader would
    st.tuples(
        st.just("flush"),
    ),
)

_examples = iter(range(1_000_000))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    plans=st.lists(st.lists(step, min_size=1, max_size=25), min_size=2, max_size=4),
    delay=st.sampled_from([0.0, 0.002, LONG]),
    refuse=st.booleans(),
)
def test_every_read_sees_every_write_acknowledged_before_it_across_agents(
    workdir: Path, shared_loop: Loop, plans: list[list[tuple[Any, ...]]], delay: float, refuse: bool
) -> None:
    """Agents (one thread each) queue history messages and records on the loop, as agents do, and read
    their own and each other's back at once, in whatever order the threads run. A read sees every write
    acknowledged (``enqueue_nowait`` returned) before it began: its own agent's exactly, another
    agent's at least. With ``refuse``, no group commits until the end: every read is served from writes
    kept after a failed commit and writes gathered since."""
    path = workdir / f"agents-{next(_examples)}.db"
    with refusing(path, refuse) as other:
        store = Store(path, handover_delay=delay)
        lock = threading.Lock()
        acked: list[dict[str, str]] = [{} for _ in plans]  # per agent: history key -> text, once acknowledged
        versions = [0] * len(plans)  # per agent: the last acknowledged version of its record
        failures: list[str] = []
        if refuse:
            store.enqueue_nowait("broken", "b", 1)  # every group with it fails until the trigger goes

        def agent(index: int, plan: list[tuple[Any, ...]]) -> None:
            prefix = f"a{index}/"
            seq = 0
            try:
                for op in plan:
                    kind = op[0]
                    if kind == "write":
                        key, text = f"{prefix}{seq:08d}", f"{index}:{seq}:" + "x" * op[1]
                        seq += 1
                        on_loop(shared_loop, lambda k=key, t=text: store.enqueue_nowait("history", k, {"text": t}))
                        with lock:
                            acked[index][key] = text
                    elif kind == "record":
                        version = versions[index] + 1
                        on_loop(shared_loop, lambda v=version: store.enqueue_nowait("agents", f"a{index}", {"v": v}))
                        with lock:
                            versions[index] = version
                    elif kind == "read_own":
                        mine = sorted(acked[index].items(), reverse=True)[: op[1]]
                        page = store.items_range("history", prefix, newest_first=True, limit=op[1])
                        if [(k, v["text"]) for k, v in page] != mine:
                            failures.append(f"agent {index} read its page {page!r}, wrote {mine!r}")
                        record = store.get("agents", f"a{index}")
                        if (record["v"] if record else 0) != versions[index]:
                            failures.append(f"agent {index} read its record {record!r}, wrote {versions[index]}")
                    elif kind == "read_other":
                        whom = op[1] % len(plans)
                        with lock:
                            theirs, version = dict(acked[whom]), versions[whom]
                        seen = {k: v["text"] for k, v in store.items("history", f"a{whom}/")}
                        missed = {k for k, text in theirs.items() if seen.get(k) != text}
                        if missed:
                            failures.append(f"agent {index} missed {sorted(missed)} of agent {whom}")
                        record = store.get("agents", f"a{whom}")
                        if (record["v"] if record else 0) < version:
                            failures.append(f"agent {index} read agent {whom}'s record {record!r}, acked {version}")
                    else:
                        with contextlib.suppress(StoreError):  # refused groups fail their flushes
                            store.flush().get(timeout=20)
            except Exception as exc:  # reported below, with the others
                failures.append(f"agent {index} raised {exc!r}")

        threads = [threading.Thread(target=agent, args=(i, plan)) for i, plan in enumerate(plans)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not failures, failures
            if refuse:
                other.execute("DROP TRIGGER refuse")
            store.flush().get(timeout=20)
        finally:
            store.close()
    reopened = Store(path)
    try:
        everything = {k: v["text"] for k, v in reopened.items("history")}
        assert everything == {k: v for mine in acked for k, v in mine.items()}  # and all of it is in the file
        for index, version in enumerate(versions):
            assert (reopened.get("agents", f"a{index}") or {"v": 0})["v"] == version
    finally:
        reopened.close()
