"""``weald store migrate`` and ``weald store backup`` (runtime/daemon/_cli_store.py), on real stores and daemons."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime import Store
from weald.tools import SPILL_NAMESPACE, SpillRow, session_spill, spill_key


@pytest.fixture
def url(pg_cluster: Any) -> str:
    return str(pg_cluster.url(pg_cluster.create_database()))


def test_a_session_migrated_from_sqlite_to_postgresql_goes_on_there_and_comes_back(
    tmp_path: Path, url: str, pg_cluster: Any
) -> None:
    daemon = DaemonProcess(tmp_path / "d")
    model = daemon.script(
        "m",
        [
            {"tool_calls": [{"name": "memory_set", "arguments": {"key": "build", "text": "build with make release"}}]},
            {"text": "on sqlite"},
            {"tool_calls": [{"name": "memory_search", "arguments": {"query": "release"}}]},
            {"text": "on postgresql"},
        ],
    )
    daemon.start()
    try:
        with daemon.client() as client:
            client.call(
                "agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "mig"}, timeout=60
            )
            assert client.call("agent.prompt", {"agent_id": "mig", "text": "one"}, timeout=60)["ok"]
            sqlite_node = client.call("daemon.status", timeout=30)["node"]["node_id"]
        sqlite_file = tmp_path / "d" / "store.db"
        refused = daemon.cli("store", "migrate", "--from", f"sqlite:{sqlite_file}", "--to", url)
        assert refused.returncode == 2
        assert "another weald daemon (pid" in refused.stderr  # a live daemon holds it
        assert daemon.terminate() == 0
        # The spill bookkeeping is a namespace like the others (what a spill of the session would leave).
        directory = str(tmp_path / "d" / "weald-outputs" / "mig")
        spilled = SpillRow(session="mig", node=sqlite_node, directory=directory, bytes=123, files=1)
        with contextlib.closing(Store(sqlite_file)) as store:
            store.put(SPILL_NAMESPACE, spill_key("mig", sqlite_node), spilled)
        done = daemon.cli("store", "migrate", "--from", f"sqlite:{sqlite_file}", "--to", url, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["verified"] is True
        assert pg_cluster.password not in done.stdout + done.stderr
        by_namespace = {row["namespace"]: row for row in report["namespaces"]}
        assert by_namespace["history"]["source"] == by_namespace["history"]["target"] > 0
        assert {"sessions", "agents", "history", "turns", "memory"} <= set(by_namespace)
        assert by_namespace["spill"]["source"] == by_namespace["spill"]["target"] == 1
        with contextlib.closing(Store(url=url)) as store:
            assert [(r.node, r.bytes, r.files) for r in session_spill(store, "mig")] == [(sqlite_node, 123, 1)]
        again = daemon.cli("store", "migrate", "--from", f"sqlite:{sqlite_file}", "--to", url)
        assert again.returncode == 2
        assert "is not empty" in again.stderr
        # The same daemon, now on the database: the session is restored from there and goes on.
        daemon.start("--store", url, "--node-id", "migrated")
        with daemon.client() as client:
            assert client.call("daemon.status", timeout=30)["store_kind"] == "postgresql"
            # Node "migrated" never ran the session's spill: the row of the node the database never saw goes.
            assert client.call("debug_state", {"agent_id": "mig"}, timeout=30)["spill"]["nodes"] == {}
            result = client.call("agent.prompt", {"agent_id": "mig", "text": "two"}, timeout=60)
            assert result["ok"], result
            assert result["text"] == "on postgresql"
            history = client.call("agent.history", {"agent_id": "mig"}, timeout=30)["messages"]
        assert [m["content"] for m in history][:1] == ["one"]
        found = [m for m in history if m["role"] == "tool" and m["name"] == "memory_search"]
        assert "build" in found[-1]["content"]  # the note came over, indexed by the database
        live = daemon.cli("store", "migrate", "--from", url, "--to", f"sqlite:{tmp_path / 'back.db'}")
        assert live.returncode == 2
        assert "held by a live daemon: node migrated" in live.stderr
        assert daemon.terminate() == 0
        back = tmp_path / "back.db"
        done = daemon.cli("store", "migrate", "--from", url, "--to", f"sqlite:{back}", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["verified"] is True
    finally:
        daemon.close()
    source, copy = Store(url=url), Store(back)
    try:
        for namespace in source.namespaces():
            assert copy.items(namespace) == source.items(namespace), namespace
        assert [h.key for h in copy.search(copy.keys("memory")[0].split("/")[0], "release")] == ["build"]
    finally:
        source.close()
        copy.close()


def test_a_backup_of_a_running_daemons_store_is_a_whole_store(tmp_path: Path, url: str) -> None:
    daemon = DaemonProcess(tmp_path / "d")
    model = daemon.script("b", [{"text": "kept"}])
    daemon.start()
    try:
        with daemon.client() as client:
            client.call(
                "agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "bk"}, timeout=60
            )
            assert client.call("agent.prompt", {"agent_id": "bk", "text": "one"}, timeout=60)["ok"]
            target = tmp_path / "backup.db"
            done = daemon.cli("store", "backup", str(target), "--json")  # the daemon runs on
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["bytes"] > 0
            assert (
                client.call("agent.prompt", {"agent_id": "bk", "text": "two"}, timeout=60)["ok"] is False
            )  # script spent
        exists = daemon.cli("store", "backup", str(target))
        assert exists.returncode == 2
        assert "exists" in exists.stderr
        postgres = daemon.cli("store", "backup", str(tmp_path / "x.db"), "--store", url)
        assert postgres.returncode == 2
        assert "pg_dump" in postgres.stderr
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    copy = Store(target)
    try:
        assert [m["message"]["content"] for _, m in copy.items("history", "bk/")][:2] == ["one", "kept"]
        assert copy.get("sessions", "bk")["session_id"] == "bk"
    finally:
        copy.close()
    assert oct(target.stat().st_mode & 0o777) == "0o600"
