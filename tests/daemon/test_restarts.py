"""An agent's ``restarts``, one number in tree, agent.list and debug_state, and a tool runner crash told as such.

``restarts`` (docs/protocol.md): the times the agent came back from an
unplanned end since the daemon started (its own crash, or a crash of the
tool runner it depends on), plus a restore from the store after the daemon
ended without stopping it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon.client import Client


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[DaemonProcess]:
    with serving(tmp_path, extra_config="[faults]\nenabled = true\n") as proc:
        yield proc


def restarts_everywhere(client: Client, agent_id: str) -> dict[str, int]:
    """The agent's restarts as tree, agent.list and debug_state give them, and its tool runner's in the tree."""
    session = client.call("tree", {"path": f"/sessions/{agent_id}"})
    nodes = {child["path"].rsplit("/", 1)[1]: child for child in session["children"]}
    (row,) = [a for a in client.call("agent.list") if a["agent_id"] == agent_id]
    return {
        "tree": nodes["agent"]["restarts"],
        "agent.list": row["restarts"],
        "debug_state": client.call("debug_state", {"agent_id": agent_id})["restarts"],
        "tool_runner": nodes["tool_runner"]["restarts"],
    }


def test_a_tool_runner_crash_tells_the_prompt_what_happened_and_counts_one_restart_everywhere(
    faulty: DaemonProcess,
) -> None:
    model = faulty.script(
        "reader",
        [
            {"text": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"text": "notes.txt has three lines."},
        ],
    )
    with faulty.client() as client:
        client.call("agent.start", {"working_dir": str(faulty.project), "model": model, "agent_id": "reader"})
        fault: dict[str, Any] = {
            "target": "actor",
            "kind": "crash",
            "path": "/sessions/reader/tool_runner",
            "message": "RunTools",
            "count": 1,
        }
        client.call("fault.inject", {"fault": fault})
        result = client.call("agent.prompt", {"agent_id": "reader", "text": "read it"}, timeout=60)
        assert result["ok"] is False
        assert result["interrupted"] is True
        assert result["aborted"] is False
        assert "tool runner crashed and was restarted" in result["error"]
        assert "the turn was interrupted" in result["error"]
        assert "stopped" not in result["error"]
        assert restarts_everywhere(client, "reader") == {
            "tree": 1,
            "agent.list": 1,
            "debug_state": 1,
            "tool_runner": 1,
        }
        history = client.call("agent.history", {"agent_id": "reader"})["messages"]
        assert history[-1]["role"] == "tool"
        assert history[-1]["content"].startswith("[interrupted] the session's tool runner crashed")
        # The agent carries on: the next prompt gets the next answer of its script.
        again = client.call("agent.prompt", {"agent_id": "reader", "text": "and now?"}, timeout=60)
        assert again["ok"], again
        assert again["text"] == "notes.txt has three lines."
        assert restarts_everywhere(client, "reader")["agent.list"] == 1


def test_a_restore_after_kill_9_is_one_restart_everywhere_and_a_clean_restart_counts_none(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path)
    proc.start()
    try:
        model = proc.script("calm", [{"text": "hello"}, {"text": "again"}, {"text": "and again"}])
        with proc.client() as client:
            client.call("agent.start", {"working_dir": str(proc.project), "model": model, "agent_id": "calm"})
            assert client.call("agent.prompt", {"agent_id": "calm", "text": "hi"}, timeout=60)["ok"]
            assert set(restarts_everywhere(client, "calm").values()) == {0}
        proc.kill9()
        proc.start()
        with proc.client() as client:
            assert restarts_everywhere(client, "calm") == {
                "tree": 1,
                "agent.list": 1,
                "debug_state": 1,
                "tool_runner": 0,
            }
            assert client.call("agent.prompt", {"agent_id": "calm", "text": "hi"}, timeout=60)["ok"]
        assert proc.terminate(signal.SIGTERM) == 0, proc.log.read_text()
        proc.start()
        with proc.client() as client:
            assert set(restarts_everywhere(client, "calm").values()) == {0}
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()
