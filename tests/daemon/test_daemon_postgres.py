"""Real daemons (`weald serve --store postgresql://...`) on a real PostgreSQL server, one or several per database.

The scenarios of a daemon's life on the shared store: turns, tools, tasks and
memory through it; a restart; a store that cannot be opened; a session taken
over (its epoch bumped, its node frozen by SIGSTOP); the server restarted
under a running daemon; two daemons on one project's tasks; prompts sent
twice with one idempotency key. The kill -9 loop is in
tests/reliability/test_crash_postgres.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime import Store
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until
from weald.tools._taskstore import TaskError, apply_operations, list_tasks, scope_for_project


@pytest.fixture
def database(pg_cluster: Any) -> str:
    """A fresh database for one test."""
    return pg_cluster.create_database()


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Daemons a test started; each is stopped (and its log checked) afterwards."""
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        if daemon.proc is not None:
            with contextlib.suppress(OSError):
                os.kill(daemon.proc.pid, signal.SIGCONT)  # a frozen one first thaws
        daemon.close()


def pg_daemon(
    root: Path, url: str, node: str, daemons: list[DaemonProcess], *, lease: float = 5.0, extra: str = ""
) -> DaemonProcess:
    """A daemon on ``url`` as node ``node``, started."""
    root.mkdir(parents=True, exist_ok=True)
    daemon = DaemonProcess(
        root, store=f"url = {json.dumps(url)}\nnode_id = {json.dumps(node)}\nlease = {lease}", extra_config=extra
    )
    daemons.append(daemon)
    return daemon.start()


def start_agent(
    client: Client, daemon: DaemonProcess, agent_id: str, turns: list[dict[str, Any]], **extra: Any
) -> None:
    model = daemon.script(agent_id, turns)
    params = {"working_dir": str(extra.pop("working_dir", daemon.project)), "model": model, "agent_id": agent_id}
    client.call("agent.start", {**params, **extra}, timeout=60)


def running(daemon: DaemonProcess) -> dict[str, str]:
    """The daemon's agents and their states, the not running ones left out."""
    with daemon.client() as client:
        listed = client.call("agent.list", timeout=30)
    return {a["agent_id"]: a["state"] for a in listed if a["state"] not in ("not running", "stopped")}


def psql(cluster: Any, database: str, sql: str) -> str:
    return str(cluster.psql(sql, database)).strip()


def test_an_agent_uses_tools_tasks_and_memory_on_postgres_and_is_restored_after_a_restart(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons)
    turns = [
        {
            "tool_calls": [
                {
                    "name": "tasks",
                    "arguments": {"action": "batch", "operations": [{"op": "insert", "title": "ship it"}]},
                }
            ]
        },
        {"tool_calls": [{"name": "memory_set", "arguments": {"key": "deploy", "text": "deploy with make release"}}]},
        {"tool_calls": [{"name": "memory_search", "arguments": {"query": "release"}}]},
        {"text": "first done"},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"text": "second done"},
    ]
    with daemon.client() as client:
        start_agent(client, daemon, "pg1", turns)
        result = client.call("agent.prompt", {"agent_id": "pg1", "text": "go"}, timeout=120)
        assert result["ok"], result
        assert result["text"] == "first done"
        history = client.call("agent.history", {"agent_id": "pg1"}, timeout=30)["messages"]
        searched = [m for m in history if m["role"] == "tool" and m["name"] == "memory_search"]
        assert "deploy" in searched[0]["content"]
        tasks = client.call("tasks.list", {"working_dir": str(daemon.project)}, timeout=30)
        assert [t["title"] for t in tasks["tasks"]] == ["ship it"]
        status = client.call("daemon.status", timeout=30)
        assert status["store_kind"] == "postgresql"
        assert pg_cluster.password not in json.dumps(status)
        assert status["node"]["node_id"] == "node-a"
        assert status["node"]["epoch"] == 1
    assert daemon.terminate() == 0
    # Everything is in the database, not in the state directory's file.
    assert not (tmp_path / "a" / "store.db").exists()
    assert psql(pg_cluster, database, "SELECT owner, epoch FROM weald_placement WHERE agent_id = 'pg1'") == "node-a|1"
    daemon.start()
    assert running(daemon) == {"pg1": "hibernated"}
    with daemon.client() as client:
        assert client.call("daemon.status", timeout=30)["node"]["epoch"] == 2
        result = client.call("agent.prompt", {"agent_id": "pg1", "text": "again"}, timeout=120)
        assert result["ok"], result
        assert result["text"] == "second done"
        stopped = client.call("agent.stop", {"agent_id": "pg1"}, timeout=60)
        assert stopped["stopped"] is True
    assert psql(pg_cluster, database, "SELECT count(*) FROM weald_placement WHERE agent_id = 'pg1'") == "0"
    assert daemon.terminate() == 0


def _serve_fails(daemon: DaemonProcess, target: str) -> tuple[int, str]:
    done = daemon.cli("serve", "--store", target, "--socket", str(daemon.socket), timeout=120)
    return done.returncode, done.stderr


@pytest.mark.parametrize("case", ["bad-url", "wrong-password", "missing-database", "old-schema", "standby"])
def test_a_store_that_cannot_be_opened_stops_serve_with_one_line_exit_2_and_the_password_masked(
    tmp_path: Path, pg_cluster: Any, database: str, case: str
) -> None:
    daemon = DaemonProcess(tmp_path)
    secret = pg_cluster.password
    if case == "bad-url":
        target, expected = "postgresql://weald:hunter2-secret@[::1/x", "not a usable postgresql:// URL"
        secret = "hunter2-secret"
    elif case == "wrong-password":
        target, expected = pg_cluster.url(database, password="wrong-pw-123"), "password authentication failed"
        secret = "wrong-pw-123"
    elif case == "missing-database":
        target, expected = pg_cluster.url("no_such_db"), 'database "no_such_db" does not exist'
    elif case == "old-schema":
        target = pg_cluster.url(database)
        Store(url=target).close()
        pg_cluster.psql("UPDATE weald_meta SET value = '0' WHERE key = 'schema'", database)
        expected = "schema version 0"
    else:  # a real read-only standby of a weald database (pg_basebackup -R)
        Store(url=pg_cluster.url(database)).close()
        standby = pg_cluster.standby()
        try:
            code, stderr = _serve_fails(daemon, standby.url(database))
        finally:
            standby.remove()
        target, expected = "", "read-only (a standby?)"
    if target:
        code, stderr = _serve_fails(daemon, target)
    lines = [line for line in stderr.splitlines() if line.startswith("weald serve: ") and "warning" not in line]
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert expected in lines[0]
    assert secret not in stderr
    assert "***" in lines[0]
    assert not daemon.socket.exists()


def test_a_session_whose_epoch_is_bumped_is_refused_its_next_write_and_leaves_its_tree(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons, lease=30)  # renewals (and their look) every 10 s
    with daemon.client() as client:
        start_agent(client, daemon, "f1", [{"text": "one"}, {"text": "two"}])
        start_agent(client, daemon, "f2", [{"text": "kept"}])
        assert client.call("agent.prompt", {"agent_id": "f1", "text": "first"}, timeout=60)["ok"]
        seq = psql(pg_cluster, database, "SELECT max(seq) FROM weald_kv")
        # The session is taken from under the node (by hand here; a takeover does the same).
        psql(pg_cluster, database, "UPDATE weald_placement SET epoch = epoch + 1 WHERE agent_id = 'f1'")
        refused = client.call("agent.prompt", {"agent_id": "f1", "text": "second"}, timeout=60)
        assert refused["ok"] is False
        assert "StoreFencedError" in refused["error"]
        assert "is no longer node 'node-a''s" in refused["error"]
        wait_until(lambda: "f1" not in running(daemon), timeout=30, message="f1 to leave the tree")
        kept = client.call("agent.prompt", {"agent_id": "f2", "text": "still here"}, timeout=60)
        assert kept["ok"], kept  # the daemon and its other sessions go on
        events = client.call("debug_state", {"events": 200}, timeout=30)["recent_events"]
    assert any(e["topic"] == "daemon.session_fenced" and e["data"]["agent_id"] == "f1" for e in events)
    landed = psql(
        pg_cluster,
        database,
        f"SELECT count(*) FROM weald_kv WHERE seq > {seq} AND (key = 'f1' OR key LIKE 'f1/%' OR key LIKE 'f1.%')",
    )
    assert landed == "0"  # nothing of f1 from this node after the bump


def test_a_session_taken_while_idle_leaves_its_tree_within_one_lease(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    lease = 2.0
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons, lease=lease, extra="[limits]\nhibernate_after = 0\n")
    with daemon.client() as client:
        start_agent(client, daemon, "idle1", [{"text": "one"}])
        assert client.call("agent.prompt", {"agent_id": "idle1", "text": "first"}, timeout=60)["ok"]
    assert running(daemon) == {"idle1": "idle"}
    psql(pg_cluster, database, "UPDATE weald_placement SET owner = 'elsewhere', epoch = epoch + 1")
    bumped = time.monotonic()
    wait_until(lambda: "idle1" not in running(daemon), timeout=lease + 5, message="idle1 to leave the tree")
    # Within one lease (the node looks at its placement every third of it), with room for a loaded machine.
    assert time.monotonic() - bumped < lease + 3


def test_a_frozen_node_loses_its_sessions_to_another_and_its_turn_in_flight_fails_on_waking(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    lease = 2.0
    a = pg_daemon(tmp_path / "a", url, "node-a", daemons, lease=lease)
    b = pg_daemon(tmp_path / "b", url, "node-b", daemons, lease=lease)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "notes.txt").write_text("x\n")
    with a.client() as client:
        turns = [{"text": "one"}, {"text": "late answer", "delay": 4}, {"text": "on b"}]
        start_agent(client, a, "s1", turns, working_dir=shared)
        start_agent(client, a, "s2", [{"text": "idle"}], working_dir=shared)
        assert client.call("agent.prompt", {"agent_id": "s1", "text": "first"}, timeout=60)["ok"]
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        with a.client() as client:
            try:
                outcome["result"] = client.call("agent.prompt", {"agent_id": "s1", "text": "slow"}, timeout=120)
            except Exception as exc:
                outcome["error"] = exc

    thread = threading.Thread(target=in_flight)
    thread.start()
    wait_until(lambda: running(a).get("s1") == "streaming", timeout=30, message="s1's turn to be in flight")
    assert a.proc is not None
    os.kill(a.proc.pid, signal.SIGSTOP)  # frozen, or cut off: its lease runs out
    frozen = time.monotonic()
    wait_until(lambda: {"s1", "s2"} <= set(running(b)), timeout=lease + 10, message="b to take a's sessions")
    took = time.monotonic() - frozen
    os.kill(a.proc.pid, signal.SIGCONT)
    thread.join(120)
    assert "result" in outcome, outcome
    failed = outcome["result"]
    assert failed["ok"] is False
    assert "StoreFencedError" in failed["error"], failed
    wait_until(lambda: not running(a), timeout=30, message="a to stop the sessions it lost")
    assert psql(pg_cluster, database, "SELECT string_agg(DISTINCT owner, ',') FROM weald_placement") == "node-b"
    # Nothing of the turn a finished after waking landed: its answer is not in the history.
    with b.client() as client:
        history = client.call("agent.history", {"agent_id": "s1"}, timeout=30)["messages"]
        assert "late answer" not in [m["content"] for m in history]
        result = client.call("agent.prompt", {"agent_id": "s1", "text": "on b now"}, timeout=60)
        assert result["ok"], result
        assert result["text"] == "on b"
    assert took < lease + 2 + 3, f"b took a's sessions {took:.1f} s after a froze (lease {lease} s)"


def test_the_server_restarted_under_a_running_daemon_fails_the_turn_in_flight_and_the_daemon_serves_again(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons, lease=60)
    with daemon.client() as client:
        turns = [{"text": "before"}, {"text": "during", "delay": 1}, {"text": "after"}]
        start_agent(client, daemon, "r1", turns)
        acknowledged = client.call("agent.prompt", {"agent_id": "r1", "text": "one"}, timeout=60)
        assert acknowledged["ok"]
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        with daemon.client() as client:
            outcome["result"] = client.call("agent.prompt", {"agent_id": "r1", "text": "two"}, timeout=120)

    thread = threading.Thread(target=in_flight)
    thread.start()
    wait_until(lambda: running(daemon).get("r1") == "streaming", timeout=30, message="the turn to be in flight")
    pg_cluster.stop("fast")  # every connection is cut
    try:
        thread.join(120)
    finally:
        pg_cluster.start()
    failed = outcome["result"]
    assert failed["ok"] is False
    assert "connection to the database was lost" in failed["error"] or "connect to the database" in failed["error"]
    with daemon.client() as client:
        wait_until(
            lambda: client.call("daemon.status", timeout=30)["store_write_failure"] is None,
            timeout=60,
            message="the kept writes to land once the server is back",
        )
        again = client.call("agent.prompt", {"agent_id": "r1", "text": "three"}, timeout=60)
        assert again["ok"], again  # no restart of the daemon
        history = client.call("agent.history", {"agent_id": "r1"}, timeout=30)["messages"]
    contents = [m["content"] for m in history]
    assert contents[:2] == ["one", "before"]  # what was acknowledged is there
    assert "two" in contents  # and the failed turn's messages were kept and committed later
    assert daemon.terminate() == 0


def test_two_daemons_add_and_link_tasks_in_one_project_without_losing_an_update(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    project = tmp_path / "project"
    project.mkdir()
    rounds = 8

    def turns(who: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(rounds):
            operations = [
                {"op": "insert", "ref": "first", "title": f"{who} {i} first"},
                {"op": "insert", "title": f"{who} {i} second", "blocked_by": ["first"]},
            ]
            out.append({"tool_calls": [{"name": "tasks", "arguments": {"action": "batch", "operations": operations}}]})
            out.append({"text": f"{who} {i}"})
        return out

    nodes = [pg_daemon(tmp_path / name, url, name, daemons) for name in ("node-a", "node-b")]
    for node, who in zip(nodes, ("a", "b"), strict=True):
        with node.client() as client:
            start_agent(client, node, f"t{who}", turns(who), working_dir=project)
    errors: list[Any] = []

    def drive(node: DaemonProcess, agent_id: str) -> None:
        with node.client() as client:
            for i in range(rounds):
                result = client.call("agent.prompt", {"agent_id": agent_id, "text": f"round {i}"}, timeout=120)
                if not result["ok"]:
                    errors.append(result)

    threads = [threading.Thread(target=drive, args=(n, f"t{w}")) for n, w in zip(nodes, ("a", "b"), strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors
    store = Store(url=url)
    try:
        tasks = list_tasks(store, scope_for_project(project))
        assert len(tasks) == 4 * rounds
        assert sorted(int(t.id) for t in tasks) == list(range(1, 4 * rounds + 1))
        by_title = {t.title: t for t in tasks}
        for who in ("a", "b"):
            for i in range(rounds):
                assert by_title[f"{who} {i} second"].blocked_by == (by_title[f"{who} {i} first"].id,)
        first, second = by_title["a 0 first"], by_title["a 0 second"]
        with pytest.raises(TaskError, match="blocked_by cycle"):
            apply_operations(
                store, scope_for_project(project), [{"op": "update", "id": first.id, "blocked_by": [second.id]}]
            )
    finally:
        store.close()


def _send_twice(
    daemon: DaemonProcess, agent_ids: list[str], prompts: int
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each agent gets ``prompts`` prompts, each sent twice at once on two connections with one key."""
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drive(agent_id: str) -> None:
        try:
            with daemon.client() as one, daemon.client() as two:
                for i in range(prompts):
                    params = {"agent_id": agent_id, "text": f"prompt {i}", "idempotency_key": f"{agent_id}-{i}"}
                    first = one.request("agent.prompt", params)
                    second = two.request("agent.prompt", params)
                    got = (first.get(timeout=120), second.get(timeout=120))
                    with lock:
                        pairs.append(got)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(agent_id,)) for agent_id in agent_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not errors, errors
    return pairs


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_prompts_sent_twice_with_one_idempotency_key_run_one_turn_each(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess], backend: str
) -> None:
    agents, prompts = (10, 100) if backend == "postgresql" else (4, 25)
    url = pg_cluster.url(database)
    if backend == "postgresql":
        daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons)
    else:
        daemon = DaemonProcess(tmp_path / "a")
        daemons.append(daemon)
        daemon.start()
    ids = [f"k{i}" for i in range(agents)]
    with daemon.client() as client:
        for agent_id in ids:
            start_agent(client, daemon, agent_id, [{"text": f"answer {i}"} for i in range(prompts)])
    pairs = _send_twice(daemon, ids, prompts)
    assert len(pairs) == agents * prompts
    for first, second in pairs:
        assert first["ok"], first
        assert first == second  # the same turn, its result twice
    # A repeat long after: the recorded outcome, no new turn.
    with daemon.client() as client:
        again = client.call(
            "agent.prompt", {"agent_id": "k0", "text": "prompt 0", "idempotency_key": "k0-0"}, timeout=60
        )
    assert again["ok"]
    assert again in [first for first, _ in pairs]
    assert daemon.terminate() == 0
    store = Store(url=url) if backend == "postgresql" else Store(tmp_path / "a" / "store.db")
    try:
        turns = [t for agent_id in ids for _, t in store.items("turns", f"{agent_id}/")]
    finally:
        store.close()
    assert len(turns) == agents * prompts
    assert all(t["status"] == "done" for t in turns)


def test_a_key_whose_turn_died_with_its_daemon_runs_once_on_the_next(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    url = pg_cluster.url(database)
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons)
    with daemon.client() as client:
        start_agent(client, daemon, "d1", [{"text": "never seen", "delay": 30}, {"text": "ran again"}])
    thread = threading.Thread(
        target=lambda: _swallow(daemon, {"agent_id": "d1", "text": "do it", "idempotency_key": "once"}), daemon=True
    )
    thread.start()
    wait_until(lambda: running(daemon).get("d1") == "streaming", timeout=30, message="the turn to run")
    # Killed once the prompt (and its key) is committed: the turn is known, and never ends.
    wait_until(
        lambda: psql(pg_cluster, database, "SELECT count(*) FROM weald_kv WHERE ns = 'prompt_keys'") == "1",
        timeout=30,
        message="the prompt's key to be committed",
    )
    daemon.kill9()
    thread.join(30)
    daemon.start()
    with daemon.client() as client:
        first = client.call("agent.prompt", {"agent_id": "d1", "text": "do it", "idempotency_key": "once"}, timeout=60)
        second = client.call("agent.prompt", {"agent_id": "d1", "text": "do it", "idempotency_key": "once"}, timeout=60)
    assert first["ok"], first
    assert first["text"] == "ran again"
    assert second == first
    store = Store(url=url)
    try:
        statuses = sorted(t["status"] for _, t in store.items("turns", "d1/"))
    finally:
        store.close()
    assert statuses == ["done", "interrupted"]


def _swallow(daemon: DaemonProcess, params: dict[str, Any]) -> None:
    with contextlib.suppress(Exception), daemon.client() as client:
        client.call("agent.prompt", params, timeout=60)


def test_a_daemon_with_more_sessions_than_a_page_of_records_restarts_on_postgres_with_every_one(
    tmp_path: Path, pg_cluster: Any, database: str, daemons: list[DaemonProcess]
) -> None:
    # 10,001 records: the passes over every session at a start read them 10,000 at a time, each page
    # after the last key of the one before (PostgreSQL refuses a NUL in a key: the next page's start
    # once appended one, and such a daemon could not start again).
    url = pg_cluster.url(database)
    daemon = pg_daemon(tmp_path / "a", url, "node-a", daemons, extra="[limits]\nmax_agents = 11000\n")
    model = daemon.script("ok", [{"text": "ok"}])
    n = 10_001
    with daemon.client() as client:
        for first in range(0, n, 1000):
            starts = [
                {"working_dir": str(daemon.project), "model": model, "agent_id": f"p{i:05d}", "asleep": True}
                for i in range(first, min(n, first + 1000))
            ]
            results = client.call("agents.start", {"agents": starts}, timeout=300)["results"]
            assert all("result" in r for r in results), [r for r in results if "error" in r][:3]
    assert daemon.terminate() == 0
    daemon.start()
    listed = running(daemon)
    assert len(listed) == n
    assert set(listed.values()) == {"hibernated"}
    with daemon.client() as client:
        assert client.call("agent.prompt", {"agent_id": f"p{n - 1:05d}", "text": "go"}, timeout=120)["ok"]
