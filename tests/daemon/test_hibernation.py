"""Idle sessions hibernate (limits.hibernate_after) and wake, transparently, on their next message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until


@pytest.fixture
def sleepy(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose sessions hibernate after 0.3 s of idleness."""
    with serving(tmp_path, extra_config="[limits]\nhibernate_after = 0.3\n") as proc:
        yield proc


def state_of(client: Client, agent_id: str) -> Any:
    return next(row["state"] for row in client.call("agent.list") if row["agent_id"] == agent_id)


def session_node(client: Client, agent_id: str) -> dict[str, Any]:
    tree = client.call("tree", {"path": "/sessions"})
    node: dict[str, Any] = next(n for n in tree["children"] if n["path"] == f"/sessions/{agent_id}")
    return node


def test_an_idle_session_hibernates_and_its_next_prompt_wakes_it_with_its_history(sleepy: DaemonProcess) -> None:
    model = sleepy.script("talk", [{"text": "first answer"}, {"text": "second answer"}])
    with sleepy.client() as client:
        start = {"working_dir": str(sleepy.project), "model": model, "agent_id": "h1", "asleep": False}
        client.call("agent.start", start)
        assert client.call("agent.prompt", {"agent_id": "h1", "text": "one"})["text"] == "first answer"
        # Asking agent.list and tree does not wake it: they show it hibernated.
        wait_until(lambda: state_of(client, "h1") == "hibernated", timeout=20)
        node = session_node(client, "h1")
        assert (node["status"], node["kind"]) == ("hibernated", "Supervisor")
        # Its children are drawn asleep too, as they were.
        children = {child["path"]: (child["kind"], child["status"]) for child in node["children"]}
        assert children == {
            "/sessions/h1/tool_runner": ("ToolRunner", "hibernated"),
            "/sessions/h1/agent": ("Agent", "hibernated"),
        }
        assert state_of(client, "h1") == "hibernated"
        result = client.call("agent.prompt", {"agent_id": "h1", "text": "two"})
        assert (result["ok"], result["text"]) == (True, "second answer")
        messages = client.call("agent.history", {"agent_id": "h1"})["messages"]
        assert [m["content"] for m in messages] == ["one", "first answer", "two", "second answer"]
        # It hibernates again once idle.
        wait_until(lambda: state_of(client, "h1") == "hibernated", timeout=20)
        events = client.call("debug_state", {"events": 200})["recent_events"]
        topics = [e["topic"] for e in events if e["source"] == "/sessions"]
        # Each wake follows a hibernation, and it is asleep now. (Under load it may
        # already have slept once between its start and the first prompt.)
        woken = topics.count("supervisor.child_woken")
        assert woken >= 1
        assert topics.count("supervisor.child_hibernated") == woken + 1


def test_debug_state_of_a_hibernated_agent_wakes_it_and_agent_stop_stops_it_asleep(sleepy: DaemonProcess) -> None:
    model = sleepy.script("talk", [{"text": "hello"}])
    with sleepy.client() as client:
        client.call("agent.start", {"working_dir": str(sleepy.project), "model": model, "agent_id": "h2"})
        client.call("agent.prompt", {"agent_id": "h2", "text": "hi"})
        wait_until(lambda: state_of(client, "h2") == "hibernated", timeout=20)
        state = client.call("debug_state", {"agent_id": "h2"})
        assert (state["agent"], state["status"]) == ("/sessions/h2/agent", "idle")
        assert [m["content"] for m in state["messages"]] == ["hi", "hello"]
        assert session_node(client, "h2")["status"] == "running"
        # Stopping a hibernated agent does not wake it, and it stays stopped.
        wait_until(lambda: state_of(client, "h2") == "hibernated", timeout=20)
        assert client.call("agent.stop", {"agent_id": "h2"}) == {"stopped": True}
        assert state_of(client, "h2") == "stopped"
        assert client.call("daemon.status")["agents"] == 0


def test_a_compaction_keeps_a_session_awake_and_it_wakes_from_its_compacted_context(sleepy: DaemonProcess) -> None:
    script = sleepy.scripts / "compact.json"
    # A first answer long enough that a summary of the conversation is shorter than it.
    first = "first answer: " + "a detail of the answer to keep in mind. " * 20
    turns = [{"text": first}, {"text": "second answer"}, {"text": "third answer"}]
    # The summary takes 1.5 s, five idle periods: the session must not sleep through it.
    script.write_text(json.dumps({"turns": turns, "summary": "They said one and two.", "summary_delay": 1.5}))
    with sleepy.client() as client:
        client.call(
            "agent.start", {"working_dir": str(sleepy.project), "model": f"scripted:{script}", "agent_id": "c1"}
        )
        client.call("agent.prompt", {"agent_id": "c1", "text": "one"})
        client.call("agent.prompt", {"agent_id": "c1", "text": "two"})
        done = client.call("agent.compact", {"agent_id": "c1"}, timeout=60)
        assert (done["compacted"], done.get("detail")) == (True, None)
        awake = client.call("debug_state", {"agent_id": "c1"})
        assert (awake["context"]["summarized"], awake["context"]["compactions"]) == (True, 1)
        wait_until(lambda: state_of(client, "c1") == "hibernated", timeout=20)
        # A page of the stored history leaves it asleep.
        page = client.call("agent.history", {"agent_id": "c1", "limit": 2})
        assert page["messages"][0]["content"] == "second answer"
        assert page["messages"][1]["compaction"]["reason"] == "manual"  # the summary, appended
        assert page["next_before"] is not None
        assert state_of(client, "c1") == "hibernated"
        # It wakes with the context it had: the summary and what was kept after it.
        woken = client.call("debug_state", {"agent_id": "c1"})
        assert woken["messages"] == awake["messages"]
        assert woken["messages"][0]["content"].endswith("They said one and two.")
        keys = ("summarized", "compactions", "messages", "pruned_before")
        assert {k: woken["context"][k] for k in keys} == {k: awake["context"][k] for k in keys}
        assert client.call("agent.prompt", {"agent_id": "c1", "text": "three"})["text"] == "third answer"
        history = client.call("agent.history", {"agent_id": "c1"})["messages"]
        assert [m["seq"] for m in history] == list(range(len(history)))
        assert [m["content"] for m in history if "compaction" not in m] == [
            "one",
            first,
            "two",
            "second answer",
            "three",
            "third answer",
        ]


def test_a_hibernated_agent_reports_its_restarts_without_waking(tmp_path: Path) -> None:
    """tree and agent.list read a sleeping agent's restarts from its record; waking is not a restart."""
    config = "[limits]\nhibernate_after = 0.3\n\n[faults]\nenabled = true\n"
    proc = DaemonProcess(tmp_path, extra_config=config)
    proc.start()
    try:
        model = proc.script(
            "reader",
            [
                {"text": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"text": "done"},
            ],
        )
        with proc.client() as client:
            client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "r1"})
            fault = {"target": "actor", "kind": "crash", "path": "/sessions/r1/tool_runner", "message": "RunTools"}
            client.call("fault.inject", {"fault": {**fault, "count": 1}})
            result = client.call("agent.prompt", {"agent_id": "r1", "text": "read it"}, timeout=60)
            assert result["interrupted"] is True
            wait_until(lambda: state_of(client, "r1") == "hibernated", timeout=20)
            (row,) = [r for r in client.call("agent.list") if r["agent_id"] == "r1"]
            assert (row["state"], row["restarts"]) == ("hibernated", 1)
            agent = client.call("tree", {"path": "/sessions/r1/agent"})
            assert (agent["status"], agent["restarts"]) == ("hibernated", 1)
            session = client.call("tree", {"path": "/sessions/r1"})
            assert [(c["path"], c["restarts"]) for c in session["children"] if c["kind"] == "Agent"] == [
                ("/sessions/r1/agent", 1)
            ]
            assert state_of(client, "r1") == "hibernated"
            # Waking is not a restart.
            assert client.call("debug_state", {"agent_id": "r1"})["restarts"] == 1
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def test_a_restart_restores_cleanly_stopped_sessions_asleep_and_killed_ones_awake(sleepy: DaemonProcess) -> None:
    model = sleepy.script("talk", [{"text": "first"}, {"text": "second"}, {"text": "third"}])
    with sleepy.client() as client:
        for agent_id in ("r1", "r2"):
            client.call("agent.start", {"working_dir": str(sleepy.project), "model": model, "agent_id": agent_id})
        assert client.call("agent.prompt", {"agent_id": "r1", "text": "one"})["text"] == "first"
    assert sleepy.terminate() == 0, sleepy.log.read_text()
    # A clean stop: both come back hibernated, and nothing of them runs until asked.
    sleepy.start()
    with sleepy.client() as client:
        assert {row["agent_id"]: row["state"] for row in client.call("agent.list")} == {
            "r1": "hibernated",
            "r2": "hibernated",
        }
        status = client.call("daemon.status")
        assert (status["agents"], status["hibernated"]) == (2, 2)
        restored = [
            e for e in client.call("debug_state", {"events": 500})["recent_events"] if e["topic"] == "daemon.restored"
        ]
        assert [e["data"] for e in restored] == [{"sessions": 2, "of": 2, "hibernated": 2}]
        # The first prompt wakes r1 with its history (a wake, not a restart).
        result = client.call("agent.prompt", {"agent_id": "r1", "text": "two"})
        assert (result["ok"], result["text"]) == (True, "second")
        messages = client.call("agent.history", {"agent_id": "r1"})["messages"]
        assert [m["content"] for m in messages] == ["one", "first", "two", "second"]
        assert client.call("debug_state", {"agent_id": "r1"})["restarts"] == 0
        wait_until(lambda: state_of(client, "r1") == "hibernated", timeout=20)
        # r2 wakes for a turn (acknowledged once committed: its record says it runs) and is killed awake.
        assert client.call("agent.prompt", {"agent_id": "r2", "text": "three"})["text"] == "first"  # its own script
    # kill -9: r2 may have a turn to mark interrupted, so it is restored at once; r1 slept.
    sleepy.kill9()
    sleepy.start()
    with sleepy.client() as client:
        events = client.call("debug_state", {"events": 500})["recent_events"]
        restored = [e["data"] for e in events if e["topic"] == "daemon.restored"]
        assert restored == [{"sessions": 2, "of": 2, "hibernated": 1}]
        recovered = [e["source"] for e in events if e["topic"] == "agent.recovered"]
        assert recovered == ["/sessions/r2/agent"]
        rows = {row["agent_id"]: row for row in client.call("agent.list")}
        assert (rows["r1"]["state"], rows["r1"]["restarts"]) == ("hibernated", 0)
        assert rows["r2"]["restarts"] == 1  # the restore from the store after the kill counts
