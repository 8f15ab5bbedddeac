"""An injected fault that makes a session's supervisor give up: the escalation shows in events and in `weald tree`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from daemon_harness import DaemonProcess
from weald.runtime.daemon.client import Client
from weald.runtime.testing import wait_until

#: Crash the agent on every tool result: each prompt that calls a tool costs the session one restart.
FAULTS = """
seed = 5

[[faults]]
id = "agent-crash"
target = "actor"
kind = "crash"
path = "/sessions/*/agent"
message = "ToolResults"
"""

#: The session supervisor's restart intensity (runtime/agents/session.py): 5 restarts within 30 s.
SESSION_MAX_RESTARTS = 5


def child(node: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in node["children"] if c["path"].rsplit("/", 1)[-1] == name)


def agent_restarts(client: Client) -> int | None:
    """The agent's restart count while it runs under a running session supervisor, else None."""
    session = child(client.call("tree", {"path": "/sessions"}), "s1")
    agent = child(session, "agent") if session["children"] else None
    if session["status"] != "running" or agent is None or agent["status"] != "running":
        return None
    restarts: int = agent["restarts"]
    return restarts


def events(client: Client, topic: str, source: str) -> list[dict[str, Any]]:
    recent = client.call("debug_state", {"events": 500})["recent_events"]
    return [e for e in recent if e["topic"] == topic and e["source"] == source]


def test_a_session_supervisor_that_gives_up_is_drawn_with_its_escalation_in_weald_tree(tmp_path: Path) -> None:
    faults = tmp_path / "faults.toml"
    faults.write_text(FAULTS)
    d = DaemonProcess(tmp_path / "d", faults=faults)
    d.start()
    try:
        model = d.script("reader", [{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}] * 10)
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "s1"})
            for crash in range(SESSION_MAX_RESTARTS):
                turn = c.call("agent.prompt", {"agent_id": "s1", "text": "read the notes"}, timeout=30)
                assert turn["interrupted"], turn
                wait_until(lambda n=crash + 1: agent_restarts(c) == n, timeout=30, message="the agent's restart")
            before = child(c.call("tree", {"path": "/sessions"}), "s1")
            assert "escalations" not in before  # restarts within the limit are not escalations

            # One crash more than the session supervisor allows: it gives up, /sessions restarts the session.
            c.call("agent.prompt", {"agent_id": "s1", "text": "read the notes"}, timeout=30)
            session = wait_until(
                lambda: (s := child(c.call("tree", {"path": "/sessions"}), "s1")).get("escalations") and s,
                timeout=30,
                message="the session's escalation in the tree",
            )
            assert (session["escalations"], session["restarts"], session["kind"]) == (1, 1, "Supervisor")
            # The fresh session's agent came back once more: an agent's restarts count every
            # unplanned restart since the daemon started (docs/protocol.md), whoever restarted it.
            wait_until(
                lambda: agent_restarts(c) == SESSION_MAX_RESTARTS + 1, timeout=30, message="the session's fresh agent"
            )
            assert "escalations" not in child(child(c.call("tree", {"path": "/sessions"}), "s1"), "agent")

            gave_up = events(c, "supervisor.gave_up", "/sessions/s1")
            assert len(gave_up) == 1
            assert gave_up[0]["data"]["max_restarts"] == SESSION_MAX_RESTARTS
            assert "child 'agent'" in gave_up[0]["data"]["reason"]
            escalated = [e for e in events(c, "supervisor.child_crashed", "/sessions") if e["data"]["id"] == "s1"]
            assert len(escalated) == 1
            assert escalated[0]["data"]["error"].startswith("RestartIntensityError(")

        tree = d.cli("tree", "--path", "/sessions")
        assert tree.returncode == 0, tree.stderr
        lines = {line.split()[1]: line for line in tree.stdout.splitlines()[1:] if len(line.split()) > 1}
        assert lines["s1"].endswith("s1 Supervisor running restarts=1 escalations=1")
        assert "escalations=" not in lines["agent"]
        drawn = json.loads(d.cli("tree", "--json", "--path", "/sessions").stdout)
        assert child(drawn, "s1")["escalations"] == 1
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()
