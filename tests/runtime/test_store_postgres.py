"""The store on a real PostgreSQL server (runtime/_store_postgres.py): the same API, shared by several stores.

Each `Store` object here stands for one daemon: two on one database share it
as two daemons would (two connections, two committers, two nodes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_cluster import CutProxy
from weald.runtime import (
    Store,
    StoreConnectionError,
    StoreError,
    StoreFencedError,
    StoreSchemaError,
    mask_url,
)
from weald.runtime.testing import wait_until
from weald.tools import SpillBudget, SpillLedger, SpillLimits, session_spill
from weald.tools._memstore import MemoryNote, search_notes, set_note
from weald.tools._taskstore import TaskError, apply_operations, list_tasks, scope_for_project


@pytest.fixture(scope="module")
def pg_database(pg_cluster: Any) -> str:
    """A fresh database for this module."""
    return pg_cluster.create_database()


@pytest.fixture
def url(pg_cluster: Any) -> str:
    """A fresh database for one test (stores of different tests never share rows)."""
    return pg_cluster.url(pg_cluster.create_database())


@pytest.fixture
def stores(url: str) -> Iterator[Callable[..., Store]]:
    """Opens stores on the test's database; every one is closed afterwards."""
    opened: list[Store] = []

    def make(target: str | None = None, **options: Any) -> Store:
        store = Store(url=target or url, **options)
        opened.append(store)
        return store

    yield make
    for store in reversed(opened):
        store.close()


def test_values_round_trip_in_insertion_and_key_order(stores: Callable[..., Store]) -> None:
    s = stores()
    assert s.kind == "postgresql"
    assert s.path is None
    s.put("tasks", "b", {"n": 1})
    s.put("tasks", "a", [1, "two", None])
    s.put("tasks", "b", {"n": 2})  # rewritten: last in insertion order, as in sqlite
    assert s.get("tasks", "a") == [1, "two", None]
    assert s.keys("tasks") == ["a", "b"]
    assert s.items("tasks") == [("a", [1, "two", None]), ("b", {"n": 2})]
    assert ("tasks", "a") in s
    assert ("tasks", "zz") not in s
    assert s.count("tasks") == 2
    assert s.get("nothing_here", "k", "default") == "default"
    s.write_batch("tasks", {"c": 3}, ["a"])
    assert s.keys("tasks") == ["b", "c"]
    assert s.delete("tasks", "b") is True
    assert s.delete("tasks", "b") is False
    assert "tasks" in s.namespaces()


def test_ranges_compare_keys_by_code_point_as_sqlite_does(stores: Callable[..., Store]) -> None:
    s = stores()
    for i in range(30):
        s.enqueue_nowait("history", f"s/{i:08d}", {"i": i})
    # Keys a collation would sort otherwise: upper case, punctuation, beyond ASCII.
    for key in ("s/Z", "s/a", "s/_", "s/é", "t/0"):
        s.enqueue_nowait("history", key, key)
    s.flush().get(timeout=20)
    page = s.items_range("history", "s/", start="00000010", stop="00000013")
    assert [k for k, _ in page] == ["s/00000010", "s/00000011", "s/00000012"]
    newest = s.items_range("history", "s/", newest_first=True, limit=3)
    assert [k for k, _ in newest] == ["s/é", "s/a", "s/_"]
    assert [k for k, _ in s.items_range("history", "s/", start="Z")] == ["s/Z", "s/_", "s/a", "s/é"]
    assert len(s.items("history", "s/")) == 34


def test_a_group_commit_is_read_at_once_by_another_daemon(stores: Callable[..., Store]) -> None:
    one, two = stores(), stores()
    for i in range(200):
        one.enqueue_nowait("history", f"x/{i:05d}", {"n": i})
    one.flush().get(timeout=20)
    assert two.count("history") == 200
    assert two.get("history", "x/00199") == {"n": 199}
    assert one.statistics()["commits"] < 200


def test_a_note_written_by_one_daemon_is_found_by_another_at_once(stores: Callable[..., Store], tmp_path: Path) -> None:
    one, two = stores(), stores()
    scope = scope_for_project(tmp_path)
    set_note(one, scope, "deploy", "How to deploy the app to production with kubectl", ["ops"])
    set_note(one, scope, "cats", "Cats are small animals")
    hits = search_notes(two, scope, "deploying production")
    assert [h.key for h in hits] == ["deploy"]
    assert hits[0].tags == ("ops",)
    assert "**deploy**" in hits[0].preview
    assert [h.key for h in search_notes(two, scope, "anim*")] == ["cats"]
    assert search_notes(two, "elsewhere", "cats") == []
    # Query syntax is never syntax: tsquery operators and quotes are words.
    for query in ("deploy & !cats", "'; DROP TABLE weald_kv; --", "cats:* | (deploy", "\\", "&|!<->"):
        search_notes(two, scope, query)
    two.delete("memory", f"{scope}/cats")
    assert search_notes(one, scope, "animals") == []
    two.put("memory", f"{scope}/junk", {"not": "a note"})  # stored, not indexed
    assert one.get("memory", f"{scope}/junk") == {"not": "a note"}


def test_two_daemons_adding_and_linking_tasks_at_once_lose_no_update(
    stores: Callable[..., Store], tmp_path: Path
) -> None:
    one, two = stores(), stores()
    scope = scope_for_project(tmp_path)
    errors: list[BaseException] = []

    def add(store: Store, who: str) -> None:
        try:
            for i in range(15):
                apply_operations(
                    store,
                    scope,
                    [
                        {"op": "insert", "ref": "a", "title": f"{who} {i} first"},
                        {"op": "insert", "title": f"{who} {i} second", "blocked_by": ["a"]},
                    ],
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(s, w)) for s, w in ((one, "one"), (two, "two"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    tasks = list_tasks(one, scope)
    assert len(tasks) == 60
    assert sorted(int(t.id) for t in tasks) == list(range(1, 61))  # no id handed out twice
    by_title = {t.title: t for t in tasks}
    for who in ("one", "two"):
        for i in range(15):
            second = by_title[f"{who} {i} second"]
            assert second.blocked_by == (by_title[f"{who} {i} first"].id,)
    # Cycles are still refused, whichever daemon asks.
    first, second = by_title["one 0 first"], by_title["one 0 second"]
    with pytest.raises(TaskError, match="blocked_by cycle"):
        apply_operations(two, scope, [{"op": "update", "id": first.id, "blocked_by": [second.id]}])


def test_a_takeover_fences_the_old_owner_and_keeps_its_other_sessions(
    stores: Callable[..., Store], pg_cluster: Any, url: str
) -> None:
    a = stores()
    a.join("node-a", lease=5)
    assert a.claim(["s1", "s2"]) == {"s1": 1, "s2": 1}
    lost: list[tuple[tuple[str, ...], str]] = []
    a.on_fenced = lambda sessions, error: lost.append((sessions, str(error)))
    a.enqueue_nowait("agents", "s1", {"v": 1}, session="s1")
    a.flush("s1").get(timeout=20)
    b = stores()
    b.join("node-b", lease=5)
    # node-a is alive: its sessions are not b's to claim.
    assert b.claim(["s1"]) == {}
    # What a takeover does (an operator, or a node finding node-a dead): owner and epoch change.
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_placement SET owner = 'node-b', epoch = epoch + 1 WHERE agent_id = 's1'", database)
    a.enqueue_nowait("agents", "s1", {"v": 2}, session="s1")
    a.enqueue_nowait("agents", "s2", {"v": 2}, session="s2")
    with pytest.raises(StoreFencedError, match="session 's1' is no longer node 'node-a''s"):
        a.flush("s1").get(timeout=20)
    a.flush("s2").get(timeout=20)  # the other session's write in the same group landed
    assert b.get("agents", "s1") == {"v": 1}
    assert b.get("agents", "s2") == {"v": 2}
    assert [sessions for sessions, _ in lost] == [("s1",)]
    # Later writes for it are dropped at once; its flushes keep failing.
    a.enqueue_nowait("agents", "s1", {"v": 3}, session="s1")
    with pytest.raises(StoreFencedError):
        a.flush("s1").get(timeout=20)
    assert b.get("agents", "s1") == {"v": 1}
    assert a.statistics()["node"]["fenced_sessions"] == 1


def test_takeover_and_commit_races_never_let_a_stale_commit_land(stores: Callable[..., Store], url: str) -> None:
    import psycopg

    a, b = stores(), stores()
    a.join("race-a", lease=30)
    takeover = psycopg.connect(url, autocommit=True)
    rounds = 1000
    stale = 0
    a_landed = refused = 0
    for i in range(rounds):
        session = f"r{i}"
        a.claim([session])
        a.enqueue_nowait("agents", session, {"by": "a"}, session=session)
        flushed = a.flush(session)
        # The session is taken over as a's commit is in flight (the epoch bumped, another owner), and written.
        with takeover.transaction():
            takeover.execute(
                "UPDATE weald_placement SET owner = 'race-b', epoch = epoch + 1 WHERE agent_id = %s", (session,)
            )
        b.put("agents", session, {"by": "takeover"})
        try:
            flushed.get(timeout=20)
            a_landed += 1
        except StoreFencedError:
            refused += 1
        if b.get("agents", session) != {"by": "takeover"}:
            stale += 1
    takeover.close()
    assert stale == 0
    # Each round's write either landed before the takeover (and was overwritten), or was refused.
    assert a_landed + refused == rounds
    assert a_landed > 0
    assert refused > 0


def test_a_node_that_cannot_renew_its_lease_stops_writing_its_sessions_and_recovers(
    stores: Callable[..., Store], pg_cluster: Any, url: str
) -> None:
    proxy = CutProxy(pg_cluster.port)
    try:
        through = url.replace(f":{pg_cluster.port}/", f":{proxy.port}/")
        a = stores(through)
        a.join("lease-a", lease=1.2)
        a.claim(["s"])
        lost: list[tuple[str, ...]] = []
        back = threading.Event()
        a.on_fenced = lambda sessions, error: lost.append(sessions)
        a.on_lease_back = back.set
        a.enqueue_nowait("agents", "s", {"v": 1}, session="s")
        a.flush("s").get(timeout=20)
        proxy.cut()  # a partition: the database is there, this node cannot reach it
        a.enqueue_nowait("agents", "s", {"v": 2}, session="s")
        with pytest.raises(StoreConnectionError, match=r"connect to the database|connection to the database was lost"):
            a.flush("s").get(timeout=20)
        wait_until(lambda: lost == [("s",)], timeout=20, message="the node to give up its session")
        assert a.statistics()["node"]["lease_lost"] is not None
        proxy.restore()
        wait_until(back.is_set, timeout=30, message="the lease to come back")
        observer = stores()
        wait_until(lambda: a.write_failure is None, timeout=30, message="the retained writes to be dealt with")
        assert observer.get("agents", "s") == {"v": 1}  # the write after the lease ran out never landed
        assert a.claim(["s"]) == {"s": 2}  # its own again: a new epoch
        a.enqueue_nowait("agents", "s", {"v": 3}, session="s")
        a.flush("s").get(timeout=20)
        assert observer.get("agents", "s") == {"v": 3}
    finally:
        proxy.close()


def test_a_lost_connection_fails_flushes_by_name_and_loses_nothing(
    stores: Callable[..., Store], pg_cluster: Any, url: str
) -> None:
    proxy = CutProxy(pg_cluster.port)
    try:
        s = stores(url.replace(f":{pg_cluster.port}/", f":{proxy.port}/"))
        s.put("tasks", "before", 1)
        proxy.cut()
        s.enqueue_nowait("tasks", "during", 2)
        with pytest.raises(StoreConnectionError) as caught:
            s.flush().get(timeout=20)
        assert "\n" not in str(caught.value)
        assert pg_cluster.password not in str(caught.value)
        with pytest.raises(StoreConnectionError):
            s.get("tasks", "before")
        proxy.restore()
        wait_until(lambda: s.write_failure is None, timeout=30, message="the kept writes to be committed")
        s.flush().get(timeout=20)
        assert stores().items("tasks") == [("before", 1), ("during", 2)]
    finally:
        proxy.close()


def test_a_starting_node_claims_its_own_sessions_and_expired_orphans_only(
    stores: Callable[..., Store], url: str, pg_cluster: Any
) -> None:
    a = stores()
    a.join("own", lease=30)
    a.claim(["mine-1", "mine-2"])
    b = stores()
    b.join("alive", lease=30)
    b.claim(["theirs"])
    c = stores()
    c.join("dead", lease=0.2)
    c.claim(["orphan"])
    c.close()  # a clean stop ends its lease at once
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_placement SET lease = now() - interval '1 second'", database)
    d = stores()
    d.put("sessions", "never-placed", {"status": "active"})  # from an older store: no placement row
    d.put("sessions", "stopped-one", {"status": "stopped"})
    node = d.join("own", lease=30)  # the next start of node "own"
    assert node.epoch == 2
    assert d.claim() == {"mine-1": 2, "mine-2": 2, "orphan": 2, "never-placed": 1}
    # The first start of "own" has been superseded: its writes are refused.
    a.enqueue_nowait("agents", "mine-1", {"stale": True}, session="mine-1")
    with pytest.raises(StoreFencedError):
        a.flush("mine-1").get(timeout=20)


def test_a_session_on_its_way_to_a_node_is_arriving_there_from_the_claim_s_statement_on(
    stores: Callable[..., Store], url: str, pg_cluster: Any
) -> None:
    """What a node answers for a session it does not run yet: "ask again" while it is coming, never "no such"."""
    import psycopg

    dead = stores()
    dead.join("dead", lease=0.2)
    dead.claim(["orphan"])
    dead.close()
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_placement SET lease = now() - interval '1 second'", database)
    heir = stores()
    heir.join("heir", lease=30)
    other = stores()
    other.join("other", lease=30)
    other.claim(["elsewhere", "handed"])
    assert not any(heir.arriving(s) for s in ("orphan", "elsewhere", "nowhere"))
    # The claim's statement waits on a row lock another session holds: the database is about to
    # name the heir, which does not hold the session yet. It is arriving all along.
    with psycopg.connect(url, autocommit=True) as locker, psycopg.connect(url, autocommit=True) as watcher:
        with locker.transaction():
            locker.execute("SELECT 1 FROM weald_placement WHERE agent_id = 'orphan' FOR UPDATE")
            claimed: list[dict[str, int]] = []
            claiming = threading.Thread(target=lambda: claimed.append(heir.claim_orphans()))
            claiming.start()
            wait_until(
                lambda: bool(
                    watcher.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE weald_placement%'"
                    ).fetchall()
                ),
                timeout=20,
                message="the claim to wait on the lock",
            )
            assert heir.arriving("orphan")
        claiming.join(20)
    assert claimed == [{"orphan": 2}]
    assert heir.arriving("orphan")  # held: being restored, or running
    assert heir.claim_orphans() == {}
    assert heir.claim(["orphan"], new_only=True) == {}  # held already: claimed again (epoch 3), not new
    assert heir.claim(["orphan"]) == {"orphan": 4}
    # Handed over by its node: placed on the heir, which has not claimed it yet.
    assert other.hand_over(["handed"], "heir") == ["handed"]
    assert heir.arriving("handed")
    assert not other.arriving("handed")
    assert heir.claim(["handed"], new_only=True) == {"handed": 3}  # epoch 2 was the handover
    assert not heir.arriving("elsewhere")


def test_a_node_notices_sessions_handed_to_it_that_it_has_not_claimed(stores: Callable[..., Store]) -> None:
    giver = stores()
    giver.join("giver", lease=30)
    giver.claim(["kept", "handed", "taken"])
    taker = stores()
    taker.join("taker", lease=0.6)  # its lease's thread looks at the placement every 0.2 s
    assert giver.hand_over(["handed", "taken"], "taker") == ["handed", "taken"]
    wait_until(lambda: sorted(taker.stranded(0)) == ["handed", "taken"], timeout=20, message="the handover noticed")
    assert taker.stranded(60) == []  # not stranded yet: its front may still have it adopted
    assert taker.claim(["taken"]) == {"taken": 3}
    assert taker.stranded(0) == ["handed"]
    taker.forget_arrived(["handed"])
    assert taker.stranded(0) == []
    assert giver.stranded(0) == []


def test_a_claim_of_10000_sessions_takes_one_statement(stores: Callable[..., Store]) -> None:
    a = stores()
    a.join("many", lease=30)
    ids = [f"m{i:05d}" for i in range(10_000)]
    claimed = a.claim(ids)
    assert len(claimed) == 10_000
    again = stores()
    again.join("many", lease=30)
    assert len(again.claim()) == 10_000


@pytest.mark.parametrize(
    ("make_url", "expected"),
    [
        (lambda c, db: c.url(db, password="wrong-password"), "password authentication failed"),
        (lambda c, db: c.url("no_such_database"), 'database "no_such_database" does not exist'),
        (lambda c, db: f"postgresql://weald:secret-pw@127.0.0.1:{_closed_port()}/{db}", "Connection refused"),
        (lambda c, db: "postgresql://weald:secret-pw@[::1/x", "not a usable postgresql:// URL"),
    ],
    ids=["wrong-password", "missing-database", "nothing-listening", "bad-url"],
)
def test_a_store_that_cannot_be_opened_says_why_in_one_line_with_the_password_masked(
    pg_cluster: Any, pg_database: str, make_url: Callable[[Any, str], str], expected: str
) -> None:
    target = make_url(pg_cluster, pg_database)
    with pytest.raises(StoreError) as caught:
        Store(url=target)
    message = str(caught.value)
    assert expected.lower() in message.lower()
    assert "\n" not in message
    for secret in ("wrong-password", "secret-pw", pg_cluster.password):
        assert secret not in message
    assert mask_url(target).split("@")[0] in message


def test_a_database_with_another_schema_version_is_refused_and_left_untouched(
    stores: Callable[..., Store], url: str, pg_cluster: Any
) -> None:
    stores().put("tasks", "k", 1)
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_meta SET value = '0' WHERE key = 'schema'", database)
    with pytest.raises(StoreSchemaError, match="schema version 0, and this weald uses version 1"):
        Store(url=url)
    assert pg_cluster.psql("SELECT count(*) FROM weald_kv", database).strip() == "1"


def test_the_password_is_masked_wherever_the_store_is_named(url: str, pg_cluster: Any) -> None:
    assert mask_url(url) == url.replace(pg_cluster.password, "***")
    assert mask_url("postgresql://u@h/db?password=abc&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    store = Store(url=url)
    try:
        text = f"{store!r} {store.location} {store.statistics()}"
        assert pg_cluster.password not in text
        assert "***" in text
    finally:
        store.close()


def test_a_note_and_a_task_batch_commit_in_their_own_transactions(stores: Callable[..., Store], tmp_path: Path) -> None:
    s = stores()
    with s.transaction("demo") as tx:
        tx.write_batch("memory", {"p/k": MemoryNote(key="k", text="inside a transaction")})
        assert tx.get("memory", "p/k", type=MemoryNote).text == "inside a transaction"
    assert [h.key for h in s.search("p", "transaction")] == ["k"]

    def fail_inside() -> None:
        with s.transaction("demo") as tx:
            tx.write_batch("memory", {"p/gone": MemoryNote(key="gone", text="rolled back")})
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fail_inside()
    assert s.get("memory", "p/gone") is None
    assert s.search("p", "rolled") == []


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_statistics_name_the_node_and_its_lease(stores: Callable[..., Store]) -> None:
    s = stores()
    node = s.join("stats", lease=3)
    s.claim(["x"])
    stats = s.statistics()["node"]
    assert stats["node_id"] == "stats"
    assert stats["epoch"] == node.epoch
    assert stats["sessions"] == 1
    assert 0 < stats["lease_left"] <= 3
    wait_until(lambda: s.lease_renewals >= 1, timeout=10, message="a renewal")


def test_a_node_with_a_commit_log_logs_each_fenced_commit_and_not_a_refused_one(
    stores: Callable[..., Store], pg_cluster: Any, url: str, tmp_path: Path
) -> None:
    import psycopg

    a = stores()
    node = a.join("log-a", lease=5, commit_log=True)
    assert node.commit_log
    assert a.claim(["l1", "l2"]) == {"l1": 1, "l2": 1}
    a.enqueue_nowait("agents", "l1", {"v": 1}, session="l1")
    a.enqueue_nowait("agents", "l2", {"v": 1}, session="l2")
    a.flush().get(timeout=20)
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_placement SET owner = 'log-b', epoch = epoch + 1 WHERE agent_id = 'l1'", database)
    a.enqueue_nowait("agents", "l1", {"v": 2}, session="l1")
    with pytest.raises(StoreFencedError):
        a.flush("l1").get(timeout=20)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT node_id, node_epoch, agent_ids, epochs FROM weald_commit_log WHERE node_id = 'log-a' ORDER BY seq"
        ).fetchall()
    # Each session's commit once (in one group or two), under this start's epoch; the
    # refused one left no row (its transaction rolled back).
    assert {(n, e) for n, e, _, _ in rows} == {("log-a", node.epoch)}
    assert sorted(pair for _, _, ids, epochs in rows for pair in zip(ids, epochs, strict=True)) == [
        ("l1", 1),
        ("l2", 1),
    ]
    # Without a database that fences, there is nothing to log: said at once.
    local = Store(tmp_path / "store.db")
    try:
        with pytest.raises(StoreError, match=r"commit_log .* PostgreSQL"):
            local.join("n", commit_log=True)
    finally:
        local.close()


def test_a_spill_row_of_a_node_fenced_out_of_its_session_does_not_land(
    stores: Callable[..., Store], pg_cluster: Any, url: str, tmp_path: Path
) -> None:
    a = stores()
    a.join("node-a", lease=5)
    assert a.claim(["s1"]) == {"s1": 1}
    spill = SpillBudget(tmp_path / "s1", SpillLimits(), ledger=SpillLedger(lambda: a, "s1", "node-a"))
    assert spill.grant(1000, 0) == (1000, None)
    a.flush("s1").get(timeout=20)
    b = stores()
    b.join("node-b", lease=5)
    assert [(r.node, r.bytes) for r in session_spill(b, "s1")] == [("node-a", 1000)]
    # Taken over: node-a's next spill row is refused with the rest of its writes for the session.
    database = url.rsplit("/", 1)[1]
    pg_cluster.psql("UPDATE weald_placement SET owner = 'node-b', epoch = epoch + 1 WHERE agent_id = 's1'", database)
    assert spill.grant(2000, 0) == (2000, None)
    with pytest.raises(StoreFencedError, match="session 's1' is no longer node 'node-a''s"):
        a.flush("s1").get(timeout=20)
    assert [(r.node, r.bytes) for r in session_spill(b, "s1")] == [("node-a", 1000)]


def test_a_session_spill_limit_holds_across_the_nodes_that_ran_it(stores: Callable[..., Store], tmp_path: Path) -> None:
    a, b = stores(), stores()
    a.join("node-a", lease=5)
    assert a.claim(["s1"]) == {"s1": 1}
    limits = SpillLimits(max_session_bytes=5000)
    on_a = SpillBudget(tmp_path / "a" / "s1", limits, ledger=SpillLedger(lambda: a, "s1", "node-a"))
    assert on_a.grant(3000, 0) == (3000, None)
    a.flush("s1").get(timeout=20)
    a.release(["s1"])
    b.join("node-b", lease=5)
    assert list(b.claim(["s1"])) == ["s1"]
    # node-b's disk holds none of it, but the session has 3,000 of its 5,000 bytes on node-a's.
    on_b = SpillBudget(tmp_path / "b" / "s1", limits, ledger=SpillLedger(lambda: b, "s1", "node-b"))
    granted, why = on_b.grant(4000, 0)
    assert granted == 2000
    assert why is not None
    assert "spill.max_session_bytes" in why
    b.flush("s1").get(timeout=20)
    assert sorted((r.node, r.bytes) for r in session_spill(a, "s1")) == [("node-a", 3000), ("node-b", 2000)]
