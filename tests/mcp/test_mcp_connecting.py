"""Connections never block the tree: each MCP server connects in its own task, concurrently.

A server that never completes its handshake (``/bin/sleep 3600``) holds
neither the daemon's first answer, nor the other servers, nor their
restarts, nor ``mcp.servers``; its handshake timeout counts as a crash. A
call to a tool of a server that is restarting says when it will be back.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import ActorSystem, Ref
from weald.runtime.mcp import ServerConfig, mcp_supervisor_spec
from weald.runtime.testing import wait_for_event, wait_mcp_running, wait_until
from weald.supervisors import Backoff
from weald.tools import ToolContext, ToolRegistry, invoke

sys.path.insert(0, str(Path(__file__).parents[1] / "daemon"))  # the daemon harness, shared

from daemon_harness import DaemonProcess, collect_until


def children_of(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live children of ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()
        if int(fields[1]) == pid and fields[0] not in (b"Z", b"X"):
            found.append((int(entry.name), cmdline))
    return found


@pytest.fixture
def hung_daemon(tmp_path: Path, node: str, everything_js: Path):
    """Two servers that never answer the handshake (one with a 2 s connect_timeout) beside two that work."""
    config = f"""
[mcp.servers.hung]
command = "/bin/sleep"
args = ["3600"]

[mcp.servers.quick_to_give_up]
command = "/bin/sleep"
args = ["3600"]
connect_timeout = 2

[mcp.servers.time]
command = "{sys.executable}"
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]

[mcp.servers.everything]
command = "{node}"
args = ["{everything_js}", "stdio"]

[tools.permissions]
mcp__time__get_current_time = "allow"
mcp__everything__echo = "allow"
"""
    daemon = DaemonProcess(tmp_path, extra_config=config)
    try:
        yield daemon
        if daemon.proc is not None:
            assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()


def states(servers: list[dict[str, Any]]) -> dict[str, str]:
    return {s["server"]: s["status"] for s in servers}


def test_servers_that_never_handshake_hold_neither_the_daemon_nor_the_others_nor_their_restarts(
    hung_daemon: DaemonProcess, everything_js: Path
) -> None:
    spawned = time.monotonic()
    hung_daemon.start()
    answered = time.monotonic() - spawned
    with hung_daemon.client() as c:
        asked = time.monotonic()
        first = c.call("mcp.servers", timeout=10)
        took = time.monotonic() - asked
    # The daemon answered before the hung handshakes could end (30 s): it did not wait for them.
    assert states(first)["hung"] == "connecting", first
    assert answered < 30, f"the daemon took {answered:.1f} s to answer"
    assert took < 2.0, f"mcp.servers took {took:.2f} s"

    servers = states(hung_daemon.wait_mcp("time", "everything"))
    assert servers["hung"] == "connecting"

    # The 2 s handshake timeout counts as a crash: reported, retried after the backoff.
    def given_up() -> dict[str, Any] | None:
        with hung_daemon.client() as c:
            view = next(s for s in c.call("mcp.servers") if s["server"] == "quick_to_give_up")
        return view if view["failed_starts"] >= 1 and view["retry_at"] is not None else None

    view = wait_until(given_up, timeout=30, message="quick_to_give_up to fail its start")
    assert "did not complete the handshake within 2 s (connect_timeout)" in view["last_error"]
    assert view["status"] in ("failed", "connecting")

    # The working servers' tools are callable meanwhile, through an agent.
    model = hung_daemon.script(
        "tools",
        [
            {"tool_calls": [{"name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"tool_calls": [{"name": "mcp__everything__echo", "arguments": {"message": "still here"}}]},
            {"text": "done"},
        ],
    )
    with hung_daemon.client() as c:
        c.call("agent.start", {"working_dir": str(hung_daemon.project), "model": model, "agent_id": "m"})
        assert c.call("agent.prompt", {"agent_id": "m", "text": "go"}, timeout=60)["ok"]
        history = c.call("agent.history", {"agent_id": "m"})["messages"]
    assert "UTC" in history[2]["content"]
    assert history[4]["content"] == "Echo: still here"

    # kill -9 of a working server: it is back after its 0.5 s backoff, not after the hung handshake.
    assert hung_daemon.proc is not None
    (server_pid,) = [pid for pid, line in children_of(hung_daemon.proc.pid) if str(everything_js) in line]
    os.kill(server_pid, signal.SIGKILL)
    killed = time.monotonic()

    def back() -> bool:
        with hung_daemon.client() as c:
            view = next(s for s in c.call("mcp.servers") if s["server"] == "everything")
        return view["status"] == "running" and view["restarts"] == 1

    wait_until(back, timeout=30, message="everything to restart")
    restarted = time.monotonic() - killed
    assert restarted < 20, f"the restart took {restarted:.1f} s"
    with hung_daemon.client() as c:
        assert states(c.call("mcp.servers"))["hung"] == "connecting"

    # weald tree draws every server's connection state.
    drawn = hung_daemon.cli("tree", "--path", "/mcp")
    assert drawn.returncode == 0, drawn.stderr
    assert "mcp running" in drawn.stdout
    assert "mcp connecting" in drawn.stdout


FAST = Backoff(initial=0.05, factor=2.0, cap=0.2, reset_after=60.0)


def start_mcp(system: ActorSystem, configs: list[ServerConfig], registry: ToolRegistry, **kwargs: Any) -> Ref[Any]:
    return system.root.proxy().start_child(mcp_supervisor_spec(configs, registry, **kwargs)).get(timeout=60)


def test_a_call_to_a_restarting_servers_tool_says_when_it_will_be_back(system: ActorSystem, scripted) -> None:
    registry = ToolRegistry()
    slow = Backoff(initial=30.0, factor=2.0, cap=60.0, reset_after=600.0)
    mcp = start_mcp(system, [scripted.config()], registry, permission="allow", backoff=slow)
    wait_mcp_running(system.whereis("/mcp/scripted"))
    crash, echo = registry.get("mcp__scripted__crash"), registry.get("mcp__scripted__echo")
    assert crash is not None
    assert echo is not None
    system.loop.run(invoke, crash, ToolContext(working_dir="."), {})
    wait_for_event(system.events, "mcp.disconnected")

    def restarting() -> Any:
        (view,) = mcp.proxy().servers().get(timeout=5)
        return view if view.retry_at is not None else None

    view = wait_until(restarting, message="the restart to be scheduled")
    assert (view.status, view.attempt) == ("restarting", 1)
    assert 25 < view.retry_at - time.time() <= 30
    # The tools stay registered while the server restarts: the model learns when to come back.
    assert "mcp__scripted__echo" in registry
    result = system.loop.run(invoke, echo, ToolContext(working_dir="."), {"text": "anyone?"})
    assert result.ok is False
    assert result.output.startswith(
        "mcp__scripted__echo did not run: MCP server 'scripted' is restarting (attempt 1, retry in "
    )
    assert " s); try again then. It last failed with: " in result.output
    seconds = int(result.output.split("retry in ")[1].split(" s)")[0])
    assert 25 < seconds <= 30


def test_a_hung_idle_server_is_found_by_the_periodic_ping_and_restarted(system: ActorSystem, scripted) -> None:
    registry = ToolRegistry()
    config = scripted.config(ping_timeout=0.5, ping_interval=0.5)
    start_mcp(system, [config], registry, backoff=FAST)
    first = wait_mcp_running(system.whereis("/mcp/scripted"))
    os.kill(first.session.pid, signal.SIGSTOP)  # no call in flight: only the periodic ping can tell
    down = wait_for_event(system.events, "mcp.disconnected", timeout=30)
    assert "is not responding: it did not answer a ping within 0.5 s" in down.data["reason"]
    assert down.data["requests_cut"] == 0
    wait_until(lambda: len(system.events.recent(100, topic="mcp.connected")) == 2, timeout=30, message="a reconnection")


def test_ten_servers_start_at_once_and_connect_concurrently(system: ActorSystem) -> None:
    registry = ToolRegistry()
    configs = [ServerConfig(name=f"time{n}", command=sys.executable, args=["-m", "mcp_server_time"]) for n in range(10)]
    mcp = start_mcp(system, configs, registry)
    # The subtree started without waiting for a single handshake (each takes about half a second)...
    assert {view.status for view in mcp.proxy().servers().get(timeout=5)} == {"connecting"}
    # ...and every server is connecting meanwhile, each in its own task.
    for config in configs:
        wait_mcp_running(system.whereis(f"/mcp/{config.name}"), timeout=120)
    assert {f"mcp__time{n}__get_current_time" for n in range(10)} <= set(registry.names())
    connected = system.events.recent(100, topic="mcp.connected")
    assert len(connected) == 10


def test_an_agent_started_before_a_server_connects_sees_its_tools_from_its_next_step(
    tmp_path: Path, node: str, everything_js: Path
) -> None:
    """A server that connects late announces its tools; the agent's next model call offers them."""
    slow_start = tmp_path / "slow_start.sh"
    # The server starts 3 s late: long enough for a first turn to run without it.
    slow_start.write_text(f'#!/bin/sh\nsleep 3\nexec "{node}" "{everything_js}" stdio\n')
    slow_start.chmod(0o755)
    daemon = DaemonProcess(tmp_path, extra_config=f'[mcp.servers.late]\ncommand = "{slow_start}"\n')
    try:
        daemon.start()
        model = daemon.script("two", [{"text": "first"}, {"text": "second"}])
        with daemon.client() as c:
            c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "a"})
            assert states(c.call("mcp.servers"))["late"] == "connecting"
            before = c.call("debug_state", {"agent_id": "a"})["tools"]
            assert not any(name.startswith("mcp__late__") for name in before)
            c.call("events.subscribe", {"topics": ["mcp.connected"]})
            notes = collect_until(c, lambda ns: any(n[0] == "event" for n in ns), timeout=60)
            event = next(n[1]["event"] for n in notes if n[0] == "event")
            assert "mcp__late__echo" in event["data"]["tool_names"]
            after = c.call("debug_state", {"agent_id": "a"})["tools"]
            assert "mcp__late__echo" in after
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()
