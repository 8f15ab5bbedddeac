"""MCP connections under the ``mcp`` supervisor: crashes, hangs, servers that never start, shutdown.

Every test runs the real tree (root -> mcp -> one MCPConnection per server)
against the scripted SDK server or mcp-server-time, with short backoffs.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from weald.runtime import ActorSystem, Ref, StartError
from weald.runtime.mcp import MCPSupervisor, ServerConfig, mcp_supervisor_spec
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import Backoff
from weald.tools import ToolContext, ToolRegistry, ToolResult, invoke

FAST = Backoff(initial=0.05, factor=2.0, cap=0.2, reset_after=60.0)


def start_mcp(system: ActorSystem, configs: list[ServerConfig], registry: ToolRegistry, **kwargs: Any) -> Ref[Any]:
    return system.root.proxy().start_child(mcp_supervisor_spec(configs, registry, **kwargs)).get(timeout=60)


def call(system: ActorSystem, registry: ToolRegistry, name: str, arguments: Mapping[str, Any]) -> ToolResult:
    registered = registry.get(name)
    assert registered is not None, f"{name} is not registered: {registry.names()}"
    return system.loop.run(invoke, registered, ToolContext(working_dir="."), arguments)


def connected_events(system: ActorSystem, server: str) -> list[Any]:
    return system.events.recent(1000, topic="mcp.connected", where=lambda e: e.data["server"] == server)


def test_a_crash_mid_call_ends_the_call_clearly_and_the_connection_comes_back(system, scripted):
    registry = ToolRegistry()
    mcp = start_mcp(system, [scripted.config()], registry, backoff=FAST)
    first = system.whereis("/mcp/scripted")
    assert first is not None

    crashed = call(system, registry, "mcp__scripted__crash", {})
    assert crashed.ok is False
    assert crashed.output == (
        "MCP server 'scripted' disconnected while running tool mcp__scripted__crash; the call did not complete. "
        "The server is being restarted; try again in a moment."
    )
    assert "crashing on purpose" in crashed.data["error"]  # the stderr tail, for programs

    down = wait_for_event(system.events, "mcp.disconnected")
    assert down.data["during"] == "session"
    assert "crashing on purpose" in down.data["stderr_tail"]
    assert down.data["exit_code"] == 7
    wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["id"] == "scripted")
    wait_until(lambda: len(connected_events(system, "scripted")) == 2, message="a second mcp.connected")
    assert system.whereis("/mcp/scripted") is not first
    assert call(system, registry, "mcp__scripted__echo", {"text": "back"}).output == "back"

    (server,) = mcp.proxy().servers().get(timeout=5)
    assert (server.status, server.restarts, server.failed_starts) == ("connected", 1, 0)
    assert "crashing on purpose" in (server.last_error or "")
    assert mcp.is_alive()


def test_a_hung_tool_times_out_and_the_connection_stays(system, scripted):
    registry = ToolRegistry()
    start_mcp(system, [scripted.config(call_timeout=0.5)], registry, backoff=FAST)
    connection = system.whereis("/mcp/scripted")

    hung = call(system, registry, "mcp__scripted__hang", {})
    assert hung.ok is False
    assert "timed out after 0.5 s" in hung.output
    assert call(system, registry, "mcp__scripted__echo", {"text": "still here"}).output == "still here"
    snapshot = connection.proxy().snapshot().get(timeout=5)
    assert (snapshot.status, snapshot.restarts, snapshot.consecutive_timeouts) == ("connected", 0, 0)
    assert system.whereis("/mcp/scripted") is connection


def test_three_timeouts_in_a_row_restart_the_connection_as_hung(system, scripted):
    registry = ToolRegistry()
    start_mcp(system, [scripted.config(call_timeout=0.5)], registry, backoff=FAST)
    connection = system.whereis("/mcp/scripted")
    hang = registry.get("mcp__scripted__hang")
    assert hang is not None

    async def three_hangs() -> list[ToolResult]:
        results: list[ToolResult] = []
        async with trio.open_nursery() as nursery:
            for _ in range(3):

                async def one() -> None:
                    results.append(await invoke(hang, ToolContext(working_dir="."), {}))

                nursery.start_soon(one)
        return results

    results = system.loop.run(three_hangs)
    assert [r.ok for r in results] == [False] * 3
    assert all("timed out after 0.5 s" in r.output for r in results)
    down = wait_for_event(system.events, "mcp.disconnected")
    assert "did not answer 3 requests in a row" in down.data["reason"]
    assert "treating it as hung" in down.data["reason"]
    wait_until(lambda: len(connected_events(system, "scripted")) == 2, message="a second mcp.connected")
    assert system.whereis("/mcp/scripted") is not connection
    assert call(system, registry, "mcp__scripted__echo", {"text": "fresh"}).output == "fresh"


def test_a_server_that_never_starts_is_retried_with_backoff_and_the_tree_stays_up(system, scripted):
    registry = ToolRegistry()
    broken = attrs.evolve(scripted.config("--fail-at-start", "missing UPSTREAM_TOKEN"), name="broken")
    time_server = ServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time"])
    # The mcp supervisor starts although one of its servers cannot.
    mcp = start_mcp(system, [broken, time_server], registry, backoff=FAST)
    intensity = mcp.proxy().snapshot().get(timeout=5)
    assert (intensity.max_restarts, intensity.max_seconds) == MCPSupervisor.intensity_for(FAST, 2)

    def failures() -> list[Any]:
        return system.events.recent(
            1000, topic="mcp.disconnected", where=lambda e: e.data["server"] == "broken" and e.data["during"] == "start"
        )

    # Far more attempts than a fixed intensity of a few restarts would allow in 0.2 s windows.
    attempts = wait_until(lambda: (f := failures()) and len(f) >= 5 and f, timeout=30, message="5 failed starts")
    assert [e.data["attempt"] for e in attempts[:5]] == [1, 2, 3, 4, 5]
    assert all("missing UPSTREAM_TOKEN" in e.data["stderr_tail"] for e in attempts)
    assert all("missing UPSTREAM_TOKEN" in e.data["reason"] for e in attempts)
    # Backoff: each retry waited at least its delay (lower bounds only; never flaky).
    for n, (before, after) in enumerate(itertools.pairwise(attempts[:5]), start=1):
        assert after.time - before.time >= FAST.delay(n) * 0.9

    assert system.events.recent(100, topic="supervisor.gave_up") == []
    assert mcp.is_alive()
    assert system.root.is_alive()
    assert system.whereis("/mcp") is mcp
    assert call(system, registry, "mcp__time__get_current_time", {"timezone": "UTC"}).ok
    assert not any(n.startswith("mcp__broken__") for n in registry.names())

    broken_view, time_view = mcp.proxy().servers().get(timeout=5)
    assert broken_view.server == "broken"
    assert broken_view.status == "failed"
    assert broken_view.failed_starts >= 5
    assert broken_view.restarts >= 4
    assert "missing UPSTREAM_TOKEN" in (broken_view.last_error or "")
    assert (time_view.status, time_view.restarts) == ("connected", 0)


def test_stopping_the_system_kills_every_server_process_group(tmp_path, scripted, processes):
    registry = ToolRegistry()
    with ActorSystem(store_path=tmp_path / "store.db") as system:
        start_mcp(system, [scripted.config("--spawn-child")], registry, backoff=FAST)
        snapshot = system.whereis("/mcp/scripted").proxy().snapshot().get(timeout=5)
        pgid = snapshot.session.pid
        child = int(call(system, registry, "mcp__scripted__child_pid", {}).output)
        assert processes.alive(child)
    # The system is down: no server, no child that ignored SIGTERM, no tool left behind.
    assert not processes.alive(child)
    wait_until(lambda: not processes.group_exists(pgid), timeout=15, message=f"process group {pgid} to go")
    assert registry.names() == []


def test_two_servers_with_one_name_are_refused(system, scripted):
    with pytest.raises(StartError, match="two MCP servers are named 'scripted'"):
        start_mcp(system, [scripted.config(), scripted.config()], ToolRegistry())
    assert system.whereis("/mcp") is None


def test_disabled_servers_get_no_connection(system, scripted):
    registry = ToolRegistry()
    off = attrs.evolve(scripted.config(), name="off", enabled=False)
    mcp = start_mcp(system, [off, scripted.config()], registry, backoff=FAST)
    assert [c.id for c in mcp.proxy().which_children().get(timeout=5)] == ["scripted"]


# -- the restart intensity never trips on backoff-spaced restarts -----------------------------


def _crash_times(backoff: Backoff, uptimes: list[float]) -> list[float]:
    """When one child's crashes reach the supervisor, replaying its backoff (as `SupervisorBase` does)."""
    times: list[float] = []
    now = 0.0
    attempt = 0
    started_at = 0.0
    for uptime in uptimes:
        now = started_at + uptime  # it crashes after running `uptime` seconds
        times.append(now)
        if uptime >= backoff.reset_after:
            attempt = 0
        attempt += 1
        started_at = now + backoff.delay(attempt)
    return times


backoffs = st.builds(
    lambda initial, factor, cap_over, reset_over: Backoff(
        initial=initial, factor=factor, cap=initial + cap_over, reset_after=initial + cap_over + reset_over
    ),
    initial=st.floats(0.01, 5.0),
    factor=st.floats(1.0, 4.0),
    cap_over=st.floats(0.0, 60.0),
    reset_over=st.floats(0.0, 120.0),
)


@settings(max_examples=300, deadline=None)
@given(
    backoff=backoffs,
    runs=st.lists(
        st.lists(st.one_of(st.just(0.0), st.floats(0.0, 200.0)), min_size=1, max_size=60), min_size=1, max_size=4
    ),
)
def test_the_intensity_bounds_any_sequence_of_backoff_spaced_restarts(backoff, runs):
    max_restarts, max_seconds = MCPSupervisor.intensity_for(backoff, len(runs))
    times = sorted(t for uptimes in runs for t in _crash_times(backoff, uptimes))
    # The supervisor's check: restarts within the last max_seconds, the new one included.
    for i, now in enumerate(times):
        window = [t for t in times[: i + 1] if t >= now - max_seconds]
        assert len(window) <= max_restarts, (backoff, now, window)


def test_the_intensity_of_the_default_backoff():
    assert MCPSupervisor.intensity_for(Backoff(initial=0.5, factor=2.0, cap=30.0, reset_after=60.0), 1) == (7, 30.0)
    assert MCPSupervisor.intensity_for(Backoff(initial=0.5, factor=2.0, cap=30.0, reset_after=60.0), 3) == (21, 30.0)
    assert MCPSupervisor.intensity_for(Backoff(initial=1.0, factor=1.0, cap=1.0, reset_after=60.0), 1) == (3, 1.0)
    with pytest.raises(ValueError, match="initial > 0"):
        MCPSupervisor.intensity_for(Backoff(initial=0.0), 1)
