"""Idle sessions hibernate (limits.hibernate_after) and wake, transparently, on their next message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until


@pytest.fixture
def sleepy(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon whose sessions hibernate after 0.3 s of idleness."""
    proc = DaemonProcess(tmp_path, extra_config="[limits]\nhibernate_after = 0.3\n")
    proc.start()
    try:
        yield proc
        if proc.proc is not None:
            assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


def state_of(client: Client, agent_id: str) -> Any:
    return next(row["state"] for row in client.call("agent.list") if row["agent_id"] == agent_id)


def session_node(client: Client, agent_id: str) -> dict[str, Any]:
    tree = client.call("tree", {"path": "/sessions"})
    node: dict[str, Any] = next(n for n in tree["children"] if n["path"] == f"/sessions/{agent_id}")
    return node


def test_an_idle_session_hibernates_and_its_next_prompt_wakes_it_with_its_history(sleepy: DaemonProcess) -> None:
    model = sleepy.script("talk", [{"text": "first answer"}, {"text": "second answer"}])
    with sleepy.client() as client:
        client.call("agent.start", {"working_dir": str(sleepy.project), "model": model, "agent_id": "h1"})
        assert client.call("agent.prompt", {"agent_id": "h1", "text": "one"})["text"] == "first answer"
        # Asking agent.list and tree does not wake it: they show it hibernated.
        wait_until(lambda: state_of(client, "h1") == "hibernated", timeout=20)
        node = session_node(client, "h1")
        assert (node["status"], node["kind"]) == ("hibernated", "Supervisor")
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
