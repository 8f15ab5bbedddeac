"""``[limits]`` in a real daemon: the message size, concurrent turns and the number of agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from daemon_harness import DaemonProcess, collect_until
from weald.runtime.daemon.client import RPCCallError


def _events(notes: list[tuple[str, Any]], topic: str | None = None) -> list[dict[str, Any]]:
    events = [n[1]["event"] for n in notes if n[0] == "event"]
    return [e for e in events if topic is None or e["topic"] == topic]


def test_a_message_over_max_message_bytes_gets_an_error_and_the_connection_carries_on(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[limits]\nmax_message_bytes = 1024\n")
    # A valid request the default limit (16 MB) would answer.
    big = {"jsonrpc": "2.0", "id": 1, "method": "daemon.status", "params": {}, "padding": "x" * 2000}
    try:
        d.start()
        with d.client() as c:
            c.send_raw(msgspec.json.encode(big) + b"\n")
            notes = collect_until(c, lambda ns: any(n[0] == "_unmatched" for n in ns))
            reply = next(n[1] for n in notes if n[0] == "_unmatched")
            assert reply["id"] == 1  # the request's own id, read from the start of the line
            assert reply["error"]["code"] == -32600
            assert "message too large: over 1024 bytes" in reply["error"]["message"]
            assert "limits.max_message_bytes" in reply["error"]["message"]
            # The same connection carries on, and a message under the limit is served.
            status = c.call("daemon.status")
            assert status["max_message_bytes"] == 1024
            assert status["pid"] == d.proc.pid  # type: ignore[union-attr]
        assert d.terminate() == 0
    finally:
        d.close()


def test_with_max_concurrent_turns_1_three_prompts_to_three_agents_run_one_at_a_time_in_order(
    tmp_path: Path,
) -> None:
    d = DaemonProcess(tmp_path, extra_config="[limits]\nmax_concurrent_turns = 1\n")
    names = ["first", "second", "third"]
    # Each turn takes a while, so that without the limit they would overlap.
    models = {name: d.script(name, [{"text": f"answer of {name}", "delay": 0.4}]) for name in names}
    topics = ["agent.turn_start", "agent.turn_end", "daemon.turn_queued", "daemon.turn_admitted"]
    try:
        d.start()
        with d.client() as c:
            for name in names:
                c.call("agent.start", {"working_dir": str(d.project), "model": models[name], "agent_id": name})
            c.call("events.subscribe", {"topics": topics})
            notes: list[tuple[str, Any]] = []

            def until(topic: str, agent_id: str) -> None:
                notes.extend(collect_until(c, lambda ns: _in(notes + ns, topic, agent_id)))

            pending = [c.request("agent.prompt", {"agent_id": "first", "text": "go"})]
            until("agent.turn_start", "first")
            # The next two come while the first runs: they wait, in the order they came.
            pending.append(c.request("agent.prompt", {"agent_id": "second", "text": "go"}))
            until("daemon.turn_queued", "second")
            pending.append(c.request("agent.prompt", {"agent_id": "third", "text": "go"}))
            until("daemon.turn_queued", "third")
            assert c.call("daemon.status")["turns"]["waiting"] in (1, 2)  # the first may have just ended
            results = [p.get(timeout=60) for p in pending]
            assert [r["text"] for r in results] == [f"answer of {name}" for name in names]
            assert all(r["ok"] for r in results)
            notes.extend(collect_until(c, lambda ns: len(_events(notes + ns, "agent.turn_end")) == 3))
    finally:
        d.close()
    turns = sorted(
        (e for e in _events(notes) if e["topic"] in ("agent.turn_start", "agent.turn_end")), key=lambda e: e["seq"]
    )
    running: set[str] = set()
    starts: list[str] = []
    for event in turns:
        agent = event["data"]["agent_id"]
        if event["topic"] == "agent.turn_start":
            assert not running, f"{agent} started while {running} ran: {[(e['topic'], e['data']) for e in turns]}"
            running.add(agent)
            starts.append(agent)
        else:
            running.discard(agent)
    assert starts == names
    queued = [e["data"]["agent_id"] for e in _events(notes, "daemon.turn_queued")]
    assert queued == ["second", "third"]


def _in(notes: list[tuple[str, Any]], topic: str, agent_id: str) -> bool:
    return any(e["data"]["agent_id"] == agent_id for e in _events(notes, topic))


def test_max_agents_refuses_one_more_agent_with_a_clear_error(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[limits]\nmax_agents = 2\n")
    try:
        d.start()
        with d.client() as c:
            for agent_id in ("one", "two"):
                c.call("agent.start", {"working_dir": str(d.project), "agent_id": agent_id})
            with pytest.raises(RPCCallError, match=r"limit of 2 agents \(limits\.max_agents") as refused:
                c.call("agent.start", {"working_dir": str(d.project), "agent_id": "three"})
            assert refused.value.code == -32000
            assert "agent.stop" in refused.value.message
            assert [a["agent_id"] for a in c.call("agent.list")] == ["one", "two"]
            # Stopping one makes room; the count is of running top-level agents.
            assert c.call("agent.stop", {"agent_id": "one"}) == {"stopped": True}
            assert c.call("agent.start", {"working_dir": str(d.project), "agent_id": "three"}) == {"agent_id": "three"}
        assert d.terminate() == 0
    finally:
        d.close()
