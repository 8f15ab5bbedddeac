"""Stopping a real daemon by signal while a turn runs: the prompt is answered, then it exits 0."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, collect_until
from weald.runtime import Store
from weald.runtime.agents.agent import TurnRecord


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_mid_turn_answers_the_pending_prompt_stores_the_aborted_turn_and_exits_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    d = DaemonProcess(tmp_path, extra_config='[tools.permissions]\nshell = "allow"\n')
    model = d.script(
        "sleeper",
        [
            {"text": "waiting", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 30"}}]},
            {"text": "never reached"},
        ],
    )
    try:
        d.start()
        with d.client() as c:
            c.call("agent.start", {"working_dir": str(d.project), "model": model, "agent_id": "busy"})
            c.call("events.subscribe", {"agent_id": "busy", "topics": ["tool.started"]})
            pending = c.request("agent.prompt", {"agent_id": "busy", "text": "wait for me"})
            collect_until(c, lambda ns: any(n[0] == "event" for n in ns))  # the shell command runs
            assert d.terminate(sig) == 0, d.log.read_text()
            result = pending.get(timeout=10)  # the reply came before the connection closed
        assert (result["ok"], result["aborted"]) == (False, True)
        assert "shutting down" in result["error"]
        assert result["text"] == "waiting"
        assert not d.socket.exists()
        store = Store(tmp_path / "store.db")
        try:
            turns = [turn for _, turn in store.items("turns", "busy/", type=TurnRecord)]
            history = [entry["message"] for _, entry in store.items("history", "busy/")]
        finally:
            store.close()
        assert [t.status for t in turns] == ["aborted"]
        assert [m["role"] for m in history] == ["user", "assistant", "tool"]
        assert history[2]["content"] == "[aborted]"
        # The next start restores the agent (asleep: it was stopped cleanly) with that history.
        d.start()
        with d.client() as c:
            assert [(a["agent_id"], a["state"]) for a in c.call("agent.list")] == [("busy", "hibernated")]
            assert len(c.call("agent.history", {"agent_id": "busy"})["messages"]) == 3
        assert d.terminate() == 0
    finally:
        d.close()


def test_a_prompt_waiting_for_a_turn_slot_is_answered_when_the_daemon_stops(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[limits]\nmax_concurrent_turns = 1\n")
    slow = d.script("slow", [{"text": "too slow", "delay": 60}])
    try:
        d.start()
        with d.client() as c:
            for agent_id in ("running", "waiting"):
                c.call("agent.start", {"working_dir": str(d.project), "model": slow, "agent_id": agent_id})
            c.call("events.subscribe", {"topics": ["agent.message_start", "daemon.turn_queued"]})
            running = c.request("agent.prompt", {"agent_id": "running", "text": "go"})
            collect_until(c, lambda ns: any(n[1]["event"]["topic"] == "agent.message_start" for n in ns))
            waiting = c.request("agent.prompt", {"agent_id": "waiting", "text": "go"})
            collect_until(c, lambda ns: any(n[1]["event"]["topic"] == "daemon.turn_queued" for n in ns))
            assert d.terminate() == 0, d.log.read_text()
            first, second = running.get(timeout=10), waiting.get(timeout=10)
        assert (first["aborted"], second["aborted"]) == (True, True)
        assert "shutting down" in first["error"]
        assert "shutting down" in second["error"]
        assert second["steps"] == 0  # it never ran
    finally:
        d.close()
