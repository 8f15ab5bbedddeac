"""A cluster on one machine: three nodes (real `weald serve --listen` processes) on one PostgreSQL database, behind a front.

Started once for the module, with 1,000 sessions asleep on each node. The
tests kill, freeze, drain and restart nodes and the front under load, and
check what a client sees (every session answers, every acknowledged turn is
in its history once) and what the database and each node hold (never two
owners). Each test leaves the three nodes running.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import (
    Cluster,
    Load,
    check_exactly_once,
    check_one_owner_each,
    prompt_all,
    running_on,
    sessions_of,
    weald,
)
from weald.runtime import Store
from weald.runtime.daemon.client import RPCCallError
from weald.runtime.testing import wait_until

NODES = ("n1", "n2", "n3")
PER_NODE = 1000
LEASE = 5.0
TURNS = 40  # scripted answers each session has


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    url = pg_cluster.url(pg_cluster.create_database())
    cluster = Cluster(root, url, lease=LEASE, commit_log=True)
    script = root / "answers.json"
    script.write_text(json.dumps({"turns": [{"text": f"answer {i}"} for i in range(TURNS)]}))
    cluster.model = f"scripted:{script}"  # type: ignore[attr-defined]
    cluster.project = root / "project"  # type: ignore[attr-defined]
    cluster.project.mkdir()  # type: ignore[attr-defined]
    try:
        cluster.start_nodes(*NODES)
        cluster.start_front()
        with cluster.client() as client:
            for batch in range(len(NODES) * PER_NODE // 1000):
                starts = [
                    {"working_dir": str(cluster.project), "model": cluster.model, "agent_id": f"s{batch}-{i:04d}"}  # type: ignore[attr-defined]
                    for i in range(1000)
                ]
                results = client.call("agents.start", {"agents": starts}, timeout=300)["results"]
                assert all("result" in r for r in results), [r for r in results if "error" in r][:3]
        # Where each session was placed at its start (a node that missed its lease
        # renewals on a loaded machine since has had its sessions adopted, rightly).
        cluster.placed = sessions_of(cluster)  # type: ignore[attr-defined]
        yield cluster
    finally:
        cluster.close()


def ensure_up(cluster: Cluster) -> None:
    """Every node running (a node a test stopped or killed is started again, same id: a new epoch)."""
    down = [name for name, proc in cluster.nodes.items() if proc.proc is None or proc.proc.poll() is not None]
    for name in down:
        cluster.nodes[name].proc = None
    if down:
        cluster.start_nodes(*down)
    cluster.wait_live(*NODES)


# -- the tests ----------------------------------------------------------------------------------------


def test_sessions_are_spread_over_the_nodes_and_each_is_served_by_its_own(cluster: Cluster) -> None:
    placed = cluster.placed  # type: ignore[attr-defined]
    assert sorted(placed) == list(NODES)
    assert all(abs(len(ids) - PER_NODE) <= 10 for ids in placed.values()), {n: len(i) for n, i in placed.items()}
    ensure_up(cluster)
    by_node = sessions_of(cluster)
    assert sorted(by_node) == list(NODES)
    with cluster.client() as client:
        for _name, ids in by_node.items():
            for agent_id in ids[:5]:
                reply = client.call("agent.prompt", {"agent_id": agent_id, "text": "hello"}, timeout=60)
                assert reply["ok"], reply
                assert "node" not in reply  # the reply a daemon gives, unchanged
        listed = client.call("agent.list", timeout=120)
        # In pages, every node's pages of the one store merged: each session once, in id order, its node named.
        paged: list[dict[str, Any]] = []
        after = None
        while True:
            page = client.call("agent.list", {"limit": 700, "after": after}, timeout=120)
            assert len(page["rows"]) <= 700
            paged += page["rows"]
            after = page["next_after"]
            if after is None:
                break
    placement = cluster.placement()
    assert len(listed) == len(placement)
    assert all(row["node"] == placement[row["agent_id"]] for row in listed)
    ids = [row["agent_id"] for row in paged]
    assert ids == sorted(placement) == [row["agent_id"] for row in listed]
    assert all(row["node"] == placement[row["agent_id"]] for row in paged)
    tree = weald("tree", "--path", f"/sessions/{by_node['n2'][0]}", env=cluster.front.env(), cwd=cluster.root)  # type: ignore[union-attr]
    assert tree.returncode == 0, tree.stderr


def test_a_nested_project_file_trusted_through_the_front_is_trusted_on_every_node(cluster: Cluster) -> None:
    ensure_up(cluster)
    project = cluster.root / "trusting"
    (project / ".git").mkdir(parents=True)
    (project / "sub").mkdir()
    nested = project / "sub" / "weald.toml"
    nested.write_text("[agent]\nmax_steps = 4\n")
    start = {"working_dir": str(project / "sub"), "model": cluster.model}  # type: ignore[attr-defined]
    with cluster.client() as client:
        with pytest.raises(RPCCallError) as refused:
            client.call("agent.start", start, timeout=60)
        assert refused.value.code == -32005, refused.value.message
        assert refused.value.data["file"] == str(nested)
        trusted = client.call("config.trust", {"path": str(nested)}, timeout=60)
        assert sorted(trusted["nodes"]) == list(NODES)
        assert all(outcome["result"]["path"] == str(nested) for outcome in trusted["nodes"].values()), trusted
        assert str(nested) in [r["path"] for r in client.call("config.trusted", timeout=60)["trusted"]]
    # Each node has the trust in memory: a start on each, asked of the node itself, is taken.
    for name, node in cluster.nodes.items():
        with node.client() as client:
            agent_id = client.call("agent.start", {**start, "agent_id": f"trusting-{name}"}, timeout=60)["agent_id"]
            client.call("agent.stop", {"agent_id": agent_id}, timeout=60)


def test_a_killed_node_s_sessions_answer_from_the_survivors_within_seconds_and_nothing_acknowledged_is_lost(
    cluster: Cluster,
) -> None:
    ensure_up(cluster)
    by_node = sessions_of(cluster)
    victims = by_node["n1"]
    everyone = [s for ids in by_node.values() for s in ids]
    with Load(cluster, everyone, threads=4) as load:
        load.wait_for(20)
        acked_before = list(load.acked)
        killed = time.monotonic()
        cluster.kill("n1")

        def moved() -> bool:
            placement = cluster.placement()
            return all(placement.get(s) in ("n2", "n3") for s in victims)

        wait_until(moved, timeout=60, message="n1's sessions to be adopted by n2 and n3")
        adopted_after = time.monotonic() - killed
        # Every one of n1's sessions answers a prompt, from a survivor.
        answered = prompt_all(cluster, victims, threads=16, text="are you there?")
        all_answered = time.monotonic() - killed
        load.wait_for(10)
    print(
        f"failover of {len(victims)} sessions: adopted {adopted_after:.1f} s after the kill, all answered "
        f"{all_answered:.1f} s after; slowest prompt {max(answered.values()):.2f} s; load: {len(load.acked)} acked, "
        f"{len(load.errors)} errors"
    )
    assert adopted_after <= LEASE + 5, adopted_after
    assert max(answered.values()) <= 10, max(answered.values())
    assert not load.errors, load.errors[:5]
    assert len(acked_before) >= 20
    check_exactly_once(cluster, load.acked)
    check_one_owner_each(cluster, ("n2", "n3"), len(everyone))
    # Never two owners, from the nodes' own commits: n1's sessions it wrote before its
    # death were written by a survivor after it, under a newer epoch, never in between.
    _, writers = cluster.commit_log_owners()
    written_by_n1 = {a["agent_id"] for a in acked_before} & set(victims)
    assert written_by_n1
    assert all("n1" in writers[s] and writers[s] & {"n2", "n3"} for s in written_by_n1), written_by_n1


def test_a_prompt_in_flight_on_a_node_that_dies_is_retried_by_the_front_and_runs_once(cluster: Cluster) -> None:
    ensure_up(cluster)
    script = cluster.root / "inflight.json"
    script.write_text(json.dumps({"turns": [{"text": "never seen", "delay": 60}, {"text": "ran again"}]}))
    with cluster.nodes["n3"].client() as direct:  # placed on n3: started there
        direct.call(
            "agent.start", {"working_dir": str(cluster.project), "model": f"scripted:{script}", "agent_id": "inflight"}
        )  # type: ignore[attr-defined]
    outcome: dict[str, Any] = {}

    def prompt() -> None:
        with cluster.client() as client:
            outcome["reply"] = client.call("agent.prompt", {"agent_id": "inflight", "text": "do it once"}, timeout=180)

    thread = threading.Thread(target=prompt)
    thread.start()

    def model_called() -> bool:
        with cluster.client() as client:
            events = client.call("debug_state", {"agent_id": "inflight", "events": 50})["recent_events"]
        return any(e["topic"] == "agent.message_start" for e in events)

    wait_until(model_called, timeout=60, message="the turn to call its model on n3")
    cluster.kill("n3")
    thread.join(180)
    reply = outcome["reply"]
    assert reply["ok"], reply
    assert reply["text"] == "ran again"
    store = Store(url=cluster.url)
    try:
        statuses = sorted(t["status"] for _, t in store.items("turns", "inflight/"))
        users = [
            e["message"]["content"] for _, e in store.items("history", "inflight/") if e["message"]["role"] == "user"
        ]
    finally:
        store.close()
    assert statuses == ["done", "interrupted"]
    assert users.count("do it once") <= 2
    assert cluster.placement()["inflight"] in ("n1", "n2")


def test_a_session_handed_over_and_never_adopted_is_adopted_by_its_new_node_within_a_lease(cluster: Cluster) -> None:
    """A front that dies between a drain's handover and the adoption leaves no session run nowhere."""
    ensure_up(cluster)
    by_node = sessions_of(cluster)
    moving = by_node["n2"][:3]
    with cluster.nodes["n2"].client() as n2:  # what a drain does first, without its front's adoption after
        handed = n2.call("cluster.handover", {"agent_ids": moving, "to": "n3"}, timeout=60)
    assert sorted(handed["handed"]) == sorted(moving)
    handed_at = time.monotonic()
    with cluster.client() as client:
        for agent_id in moving:
            assert client.call("agent.prompt", {"agent_id": agent_id, "text": "who runs you?"}, timeout=60)["ok"]
    answered_after = time.monotonic() - handed_at
    print(f"handed over and not adopted: answered from n3 {answered_after:.1f} s after the handover")
    assert answered_after <= 4 * LEASE, answered_after  # noticed within a third of one, adopted a lease later
    assert all(cluster.placement()[s] == "n3" for s in moving)
    assert set(moving) <= running_on(cluster, "n3")


def test_a_frozen_node_loses_its_sessions_and_commits_nothing_once_it_thaws(cluster: Cluster) -> None:
    ensure_up(cluster)
    by_node = sessions_of(cluster)
    frozen = by_node.get("n2", [])
    assert frozen
    everyone = [s for ids in by_node.values() for s in ids]
    with Load(cluster, everyone, threads=3) as load:
        load.wait_for(10)
        cluster.stop_signal("n2", signal.SIGSTOP)
        try:

            def moved() -> bool:
                placement = cluster.placement()
                return all(placement.get(s) != "n2" for s in frozen)

            wait_until(
                moved,
                timeout=60,
                message="n2's sessions to move while it is frozen",
            )
            time.sleep(1.0)
        finally:
            cluster.stop_signal("n2", signal.SIGCONT)
        load.wait_for(10)
    assert not load.errors, load.errors[:5]

    def emptied() -> bool:
        return not running_on(cluster, "n2")

    wait_until(emptied, timeout=60, message="the thawed node to show no sessions")
    with cluster.nodes["n2"].client() as direct:
        commits = direct.call("debug_state")["system"]["store"]["commits"]
        assert direct.call("daemon.status")["node"]["sessions"] == 0
    time.sleep(2 * LEASE / 3 + 0.5)  # a renewal or two later
    with cluster.nodes["n2"].client() as direct:
        assert direct.call("debug_state")["system"]["store"]["commits"] == commits
    assert not running_on(cluster, "n2")
    check_exactly_once(cluster, load.acked)
    cluster.commit_log_owners()  # the frozen node's sessions: a new owner, a newer epoch, never two at once


def test_the_front_killed_and_restarted_under_load_loses_nothing_acknowledged(cluster: Cluster) -> None:
    ensure_up(cluster)
    everyone = [s for ids in sessions_of(cluster).values() for s in ids]
    front = cluster.front
    assert front is not None
    with Load(cluster, everyone, threads=4) as load:
        load.wait_for(10)
        front.kill9()
        restarted = len(load.acked)
        cluster.start_front()
        load.wait_for(20)
    assert load.reconnects >= 1 or len(load.acked) > restarted
    assert not load.errors, load.errors[:5]
    check_exactly_once(cluster, load.acked)


def test_a_drained_node_hands_every_session_over_and_stops(cluster: Cluster) -> None:
    ensure_up(cluster)
    by_node = sessions_of(cluster)
    # The node holding the most sessions (which one depends on who adopted whose in the tests before).
    name = max(NODES, key=lambda n: len(by_node.get(n, [])))
    others = tuple(n for n in NODES if n != name)
    leaving = by_node[name]
    assert leaving
    before = cluster.placement()
    total = len(before)
    held = [s for s, owner in before.items() if owner == name]  # the module's and a test's own (adopted)
    # Under load on the sessions that move: a prompt for one between its handover and its adoption
    # waits for it, never "no such agent".
    with Load(cluster, leaving, threads=8) as load:
        load.wait_for(10)
        done = weald("cluster", "drain", name, "--json", env=cluster.front.env(), cwd=cluster.root, timeout=600)  # type: ignore[union-attr]
        load.wait_for(10)
    print(f"drain under load: {len(load.acked)} prompts acknowledged, {len(load.errors)} errors; {done.stdout}")
    assert done.returncode == 0, done.stderr
    assert not load.errors, load.errors[:5]
    check_exactly_once(cluster, load.acked)
    report = json.loads(done.stdout)
    assert report["moved"] == len(held)
    assert report["stopped"] is True
    cluster.nodes[name].proc.wait(60)  # type: ignore[union-attr]
    cluster.nodes[name].proc = None
    placement = cluster.placement()
    assert len(placement) == total
    assert all(placement[s] in others for s in held)
    with cluster.client() as client:
        for agent_id in random.Random(7).sample(leaving, min(30, len(leaving))):
            assert client.call("agent.prompt", {"agent_id": agent_id, "text": "moved?"}, timeout=60)["ok"]
    check_one_owner_each(cluster, others, total)
    cluster.commit_log_owners()  # handed over with epoch + 1: the drained node wrote nothing after
    # Back with a label pinning a project to it: that project's new sessions go there, others do not.
    pinned = cluster.root / "pinned"
    pinned.mkdir(exist_ok=True)
    cluster.nodes.pop(name)
    cluster.start_nodes(name, labels={name: {"project": str(pinned)}})
    cluster.wait_live(*NODES)
    with cluster.client() as client:

        def front_sees_the_label() -> bool:
            nodes = client.call("daemon.status")["cluster"]["nodes"]
            return any(n["node_id"] == name and n["live"] and n["labels"] == {"project": str(pinned)} for n in nodes)

        wait_until(front_sees_the_label, timeout=30, message="the front to read the node's label")
        client.call("agent.start", {"working_dir": str(pinned), "model": cluster.model, "agent_id": "pinned-1"})  # type: ignore[attr-defined]
        client.call("agent.start", {"working_dir": str(cluster.project), "model": cluster.model, "agent_id": "free-1"})  # type: ignore[attr-defined]
    placement = cluster.placement()
    assert placement["pinned-1"] == name
    assert placement["free-1"] != name


def test_cluster_status_json_is_what_the_nodes_and_placement_tables_hold(tmp_path: Path, pg_cluster: Any) -> None:
    url = pg_cluster.url(pg_cluster.create_database())
    small = Cluster(tmp_path, url, lease=LEASE)
    try:
        small.start_nodes("a", "b")
        with small.nodes["a"].client() as client:
            for i in range(3):
                client.call("agent.start", {"working_dir": str(tmp_path), "agent_id": f"st{i}"})
        small.wait_live("a", "b")
        time.sleep(2 * LEASE / 3 + 1.0)  # a measure, then a renewal, has written each node's figures
        for name in ("a", "b"):
            small.stop_signal(name, signal.SIGSTOP)  # nothing changes the tables now
        try:
            env = small.nodes["a"].env()
            done = weald("cluster", "status", "--json", "--store", url, env=env, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            status = json.loads(done.stdout)
            import psycopg

            with psycopg.connect(url) as conn:
                nodes = conn.execute(
                    "SELECT node_id, epoch, extract(epoch FROM lease_until)::float8, "
                    "extract(epoch FROM started)::float8, info FROM weald_nodes ORDER BY node_id"
                ).fetchall()
                owners = dict(conn.execute("SELECT owner, count(*) FROM weald_placement GROUP BY owner").fetchall())
                placed = conn.execute("SELECT count(*) FROM weald_placement").fetchone()[0]
        finally:
            for name in ("a", "b"):
                small.stop_signal(name, signal.SIGCONT)
        assert "***" in status["store"]
        assert small.url.split(":")[2].split("@")[0] not in status["store"]
        assert status["sessions"] == placed == 3
        as_of = status["as_of"]
        expected = [
            {
                "node_id": node_id,
                "epoch": epoch,
                "live": lease_until > as_of,
                "lease_until": lease_until,
                "lease_left": round(max(0.0, lease_until - as_of), 3),
                "started": started,
                "address": info.get("address"),
                "labels": info.get("labels") or {},
                "draining": bool(info.get("draining")),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "sessions": owners.get(node_id, 0),
                "awake": info.get("awake"),
                "asleep": info.get("asleep"),
                "cpu": info.get("cpu"),
                "last_commit": info.get("last_commit"),
            }
            for node_id, epoch, lease_until, started, info in nodes
        ]
        assert status["nodes"] == expected
        assert [n["sessions"] for n in status["nodes"]] == [3, 0]
        assert status["nodes"][0]["asleep"] == 3
        orphaned = [] if all(n["live"] for n in expected) else [f"st{i}" for i in range(3)]
        assert status["orphaned"] == {"count": len(orphaned), "sessions": orphaned}
        shown = weald("cluster", "status", "--store", url, env=env, cwd=tmp_path)
        assert shown.returncode == 0
        assert "st0" not in shown.stdout
        assert "a " in shown.stdout
    finally:
        small.close()


def test_a_node_without_the_secret_is_refused_and_a_bad_setup_is_one_line(tmp_path: Path, pg_cluster: Any) -> None:
    url = pg_cluster.url(pg_cluster.create_database())
    small = Cluster(tmp_path / "good", url, lease=LEASE)
    other = Cluster(tmp_path / "bad", url, lease=LEASE)  # another secret
    try:
        small.start_nodes("g1")
        other.start_front()
        with other.client() as client, pytest.raises(RPCCallError, match=r"no node of the cluster|cannot be reached"):
            client.call("agent.start", {"working_dir": str(tmp_path)}, timeout=60)
        log = small.nodes["g1"].log.read_text()
        assert other.secret not in log
        assert small.secret not in log
        with contextlib.suppress(Exception), small.nodes["g1"].client() as direct:
            events = direct.call("events.query", {"topic": "server.refused"})["events"]
            assert any("another [cluster] secret" in e["data"].get("reason", "") for e in events)
        # No secret: a node with --listen, and a front, each stop with one line (exit 2).
        bare = tmp_path / "bare"
        bare.mkdir()
        (bare / "weald.toml").write_text(
            f'[store]\npath = "{bare / "s.db"}"\nurl = "{url}"\n[server]\nsocket = "{bare / "s.sock"}"\n'
        )
        env = {**small.nodes["g1"].env(), "WEALD_CONFIG": str(bare / "weald.toml")}
        for args in (("serve", "--listen", "127.0.0.1:0"), ("serve", "--front")):
            done = weald(*args, env=env, cwd=bare, timeout=120)
            assert done.returncode == 2, (args, done.stderr)
            assert "needs a shared secret" in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    finally:
        other.close()
        small.close()
