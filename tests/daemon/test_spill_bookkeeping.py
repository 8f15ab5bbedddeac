"""Spill bookkeeping in the store, through a real daemon: the count survives restarts, stops and sweeps clean up.

The spill files stay on the daemon's disk; their bytes and files per session
and node are rows of the store's ``spill`` namespace (tools/_spill.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from daemon_harness import DaemonProcess, recent_events
from weald.runtime import Store
from weald.runtime.testing import wait_until
from weald.tools import SPILL_NAMESPACE, SpillRow, session_spill, spill_key

FLOOD = {"name": "shell", "arguments": {"command": "seq 1 100000"}}  # 588,895 bytes of output


def spilled(directory: Path) -> dict[str, int]:
    """The spill files under a session's directory (its sandbox's /tmp aside), by name, with their sizes."""
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in directory.rglob("*")
        if p.is_file() and "tmp" not in p.relative_to(directory).parts
    }


def wait_for_spill_bytes(d: DaemonProcess, expected: int) -> None:
    """Wait until ``weald status --json`` has its ``spill_bytes`` (measured as the daemon starts); check it."""
    seen: list[dict[str, Any]] = [{}]

    def measured() -> bool:
        done = d.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        seen[0] = json.loads(done.stdout)
        return seen[0].get("spill_bytes") is not None

    wait_until(measured, timeout=60, message=lambda: f"spill_bytes to be measured; status: {seen[0]}")
    assert seen[0]["spill_bytes"] == expected, seen[0]


def rows_of(store_path: Path, session_id: str) -> list[SpillRow]:
    store = Store(store_path)
    try:
        return session_spill(store, session_id)
    finally:
        store.close()


def test_a_sessions_spill_count_is_kept_in_the_store_across_a_restart_and_its_limit_holds(tmp_path: Path) -> None:
    d = DaemonProcess(
        tmp_path,
        extra_config='[tools.permissions]\nshell = "allow"\n'
        "[spill]\nmax_call_bytes = 200000\nmax_session_bytes = 300000\n",
    )
    directory = tmp_path / "weald-outputs" / "a"
    try:
        d.start()
        model = d.script("flood", [{"text": "", "tool_calls": [FLOOD]}, {"text": "one"}] * 2)
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "a"}, timeout=60)
            assert c.call("agent.prompt", {"agent_id": "a", "text": "go"}, timeout=60)["ok"]
            files = spilled(directory)
            assert sum(files.values()) == 200_000, files  # one call's limit
            # The store's row says what the directory holds; status and debug_state read it.
            state = c.call("debug_state", {"agent_id": "a"}, timeout=30)
            node = c.call("daemon.status", timeout=30)["node"]["node_id"]
            assert state["spill"] == {"bytes": 200_000, "files": len(files), "nodes": {node: 200_000}}
        assert d.terminate() == 0
        [row] = rows_of(tmp_path / "store.db", "a")
        assert (row.node, row.directory, row.bytes, row.files) == (node, str(directory), 200_000, len(files))
        # Behind the budget's back the files go: a budget that walked the directory would count 0 and
        # grant the next call its whole 200,000 bytes. It goes by the row: 100,000 bytes are left.
        for name in files:
            (directory / name).unlink()
        d.start()
        # The daemon's total, measured from the rows as it starts (the directory is empty by now).
        wait_for_spill_bytes(d, 200_000)
        shown = d.cli("status").stdout
        assert "spill_bytes" in shown
        assert "200000" in shown
        with d.client() as c:
            assert c.call("agent.prompt", {"agent_id": "a", "text": "again"}, timeout=60)["ok"]
            history = json.dumps(c.call("agent.history", {"agent_id": "a"}, timeout=30))
            assert "spill.max_session_bytes" in history
            assert sum(spilled(directory).values()) == 100_000
            assert c.call("debug_state", {"agent_id": "a"}, timeout=30)["spill"]["bytes"] == 300_000
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_stopped_sessions_rows_go_with_its_directory_and_a_start_sweeps_the_rows_of_sessions_gone(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools.permissions]\nshell = "allow"\n')
    spill = tmp_path / "weald-outputs"
    store_path = tmp_path / "store.db"
    try:
        d.start()
        model = d.script("flood", [{"text": "", "tool_calls": [FLOOD]}, {"text": "ok"}])
        with d.client() as c:
            for agent_id in ("keep", "gone"):
                c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": agent_id}, timeout=60)
                assert c.call("agent.prompt", {"agent_id": agent_id, "text": "go"}, timeout=60)["ok"]
                assert c.call("debug_state", {"agent_id": agent_id}, timeout=30)["spill"]["bytes"] > 0
            node = c.call("daemon.status", timeout=30)["node"]["node_id"]
            assert c.call("agent.stop", {"agent_id": "gone"}, timeout=60)["stopped"]
            assert not (spill / "gone").exists()
        assert d.terminate() == 0
        assert rows_of(store_path, "gone") == []
        assert [row.node for row in rows_of(store_path, "keep")] == [node]
        # A session the store no longer runs, whose row and files a crash left behind: its files are fresh
        # (spill.retention, a day, has not passed), but its row says whose they are, so they go at start.
        ghost = spill / "ghost"
        ghost.mkdir()
        (ghost / "shell-x.log").write_bytes(b"x" * 1000)
        store = Store(store_path)
        try:
            row = SpillRow(session="ghost", node=node, directory=str(ghost), bytes=1000, files=1, changed=time.time())
            store.put(SPILL_NAMESPACE, spill_key("ghost", node), row)
        finally:
            store.close()
        d.start()
        assert not ghost.exists()
        assert (spill / "keep").is_dir()
        removals = recent_events(d, "daemon.spill_removed")
        assert [e["data"]["rows"] for e in removals] == [1], removals
        assert d.terminate() == 0
        assert rows_of(store_path, "ghost") == []
        assert [row.node for row in rows_of(store_path, "keep")] == [node]
    finally:
        d.close()


def test_on_a_cluster_a_start_removes_the_spill_of_a_session_another_node_runs_once_retention_passed(
    tmp_path: Path, pg_cluster: Any
) -> None:
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    d = DaemonProcess(
        tmp_path,
        store=f"url = {json.dumps(url)}\nnode_id = {json.dumps('n1')}",
        extra_config='[tools.permissions]\nshell = "allow"\n[spill]\nretention = 0\n',
    )
    spill = tmp_path / "weald-outputs"
    try:
        d.start()
        model = d.script("flood", [{"text": "", "tool_calls": [FLOOD]}, {"text": "ok"}])
        with d.client() as c:
            for agent_id in ("moved", "stays"):
                c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": agent_id}, timeout=60)
                assert c.call("agent.prompt", {"agent_id": agent_id, "text": "go"}, timeout=60)["ok"]
        assert d.terminate() == 0
        # Another live node runs "moved" now: its files here are stale once spill.retention (0 s) has passed.
        pg_cluster.psql(
            "INSERT INTO weald_nodes (node_id, epoch, lease_until) VALUES ('n2', 1, now() + interval '1 hour'); "
            "UPDATE weald_placement SET owner = 'n2', epoch = epoch + 1 WHERE agent_id = 'moved'",
            database,
        )
        d.start()
        assert not (spill / "moved").exists()
        assert (spill / "stays").is_dir()
        wait_for_spill_bytes(d, sum(spilled(spill / "stays").values()))  # "moved"'s rows are gone from the total
        assert d.terminate() == 0
        with contextlib.closing(Store(url=url)) as store:
            assert session_spill(store, "moved") == []
            assert [row.node for row in session_spill(store, "stays")] == ["n1"]
    finally:
        d.close()
