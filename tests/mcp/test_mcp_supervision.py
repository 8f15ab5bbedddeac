"""MCP connections under the ``mcp`` supervisor: crashes, hangs, slow tools, servers that never start, shutdown.

Every test runs the real tree (root -> mcp -> one MCPConnection per server)
against the scripted SDK server or mcp-server-time, with short backoffs.
"""

from __future__ import annotations

import itertools
import os
import signal
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
from weald.runtime.testing import wait_for_event, wait_mcp_running, wait_until
from weald.supervisors import Backoff
from weald.tools import ToolContext, ToolRegistry, ToolResult, invoke

FAST = Backoff(initial=0.05, factor=2.0, cap=0.2, reset_after=60.0)


def start_mcp(
    system: ActorSystem,
    configs: list[ServerConfig],
    registry: ToolRegistry,
    *,
    running: tuple[str, ...] | None = None,
    **kwargs: Any,
) -> Ref[Any]:
    """Start the mcp subtree, then wait for the ``running`` servers (default: every enabled one) to connect."""
    mcp = system.root.proxy().start_child(mcp_supervisor_spec(configs, registry, **kwargs)).get(timeout=60)
    names = running if running is not None else tuple(c.name for c in configs if c.enabled)
    for name in names:
        wait_mcp_running(wait_until(lambda name=name: system.whereis(f"/mcp/{name}")))
    return mcp


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
    assert (server.status, server.restarts, server.failed_starts) == ("running", 1, 0)
    assert "crashing on purpose" in (server.last_error or "")
    assert mcp.is_alive()


def test_a_slow_tool_times_out_and_a_server_that_still_answers_pings_keeps_its_connection(system, scripted):
    registry = ToolRegistry()
    start_mcp(system, [scripted.config(call_timeout=0.5, ping_timeout=5.0)], registry, backoff=FAST)
    connection = system.whereis("/mcp/scripted")

    slow = call(system, registry, "mcp__scripted__slow", {"seconds": 30, "steps": 1})
    assert slow.ok is False
    assert "timed out after 0.5 s" in slow.output
    assert "not responding" not in slow.output
    snapshot = connection.proxy().snapshot().get(timeout=5)
    assert snapshot.session.pings >= 1  # the timeout was judged by a ping, which the server answered
    assert snapshot.session.pings_unanswered == 0
    assert call(system, registry, "mcp__scripted__echo", {"text": "still here"}).output == "still here"
    snapshot = connection.proxy().snapshot().get(timeout=5)
    assert (snapshot.status, snapshot.restarts, snapshot.consecutive_timeouts) == ("running", 0, 0)
    assert system.whereis("/mcp/scripted") is connection
    assert system.events.recent(100, topic="mcp.disconnected") == []


def test_timeouts_in_a_row_on_a_server_that_answers_pings_do_not_restart_it(system, scripted):
    registry = ToolRegistry()
    start_mcp(system, [scripted.config(call_timeout=0.5)], registry, backoff=FAST)
    connection = system.whereis("/mcp/scripted")
    hang = registry.get("mcp__scripted__hang")
    assert hang is not None

    async def hangs(n: int) -> list[ToolResult]:
        results: list[ToolResult] = []
        async with trio.open_nursery() as nursery:
            for _ in range(n):

                async def one() -> None:
                    results.append(await invoke(hang, ToolContext(working_dir="."), {}))

                nursery.start_soon(one)
        return results

    results = system.loop.run(hangs, 4)
    assert all("timed out after 0.5 s" in r.output for r in results), [r.output for r in results]
    snapshot = connection.proxy().snapshot().get(timeout=5)
    assert (snapshot.status, snapshot.restarts, snapshot.consecutive_timeouts) == ("running", 0, 4)
    assert system.whereis("/mcp/scripted") is connection
    assert system.events.recent(100, topic="mcp.disconnected") == []


def not_responding_output(server: str, tool: str, ping_timeout: float) -> str:
    return (
        f"MCP server {server!r} is not responding (it did not answer a ping within {ping_timeout:g} s), "
        f"so {tool} did not complete. The server is being restarted; try again in a moment."
    )


def test_a_server_that_stops_answering_is_killed_its_calls_end_clearly_and_it_comes_back(system, scripted, processes):
    registry = ToolRegistry()
    config = scripted.config(call_timeout=1.0, ping_timeout=0.5, ping_interval=600.0)
    mcp = start_mcp(system, [config], registry, backoff=FAST)
    first = system.whereis("/mcp/scripted")
    pgid = first.proxy().snapshot().get(timeout=5).session.pid
    freeze, hang = registry.get("mcp__scripted__freeze"), registry.get("mcp__scripted__hang")

    async def freeze_with_a_call_in_flight() -> dict[str, ToolResult]:
        results: dict[str, ToolResult] = {}
        async with trio.open_nursery() as nursery:
            for tool in (hang, freeze):

                async def one(tool: Any = tool) -> None:
                    results[tool.name] = await invoke(tool, ToolContext(working_dir="."), {})

                nursery.start_soon(one)
        return results

    results = system.loop.run(freeze_with_a_call_in_flight)
    # The frozen call timed out, the ping went unanswered: both calls say so.
    for name, result in results.items():
        assert result.ok is False
        assert result.output == not_responding_output("scripted", name, 0.5)
        assert result.data["kind"] == "MCPNotResponding"
    down = wait_for_event(system.events, "mcp.disconnected")
    assert down.data["during"] == "session"
    assert "is not responding: it did not answer a ping within 0.5 s" in down.data["reason"]
    assert down.data["restarting"] is True
    # The frozen server (and its process group) is gone, not orphaned.
    system.loop.run(processes.wait_group_gone, pgid)
    wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["id"] == "scripted")
    wait_until(lambda: len(connected_events(system, "scripted")) == 2, message="a second mcp.connected")
    back = connected_events(system, "scripted")[-1]
    assert back.time - down.time >= FAST.delay(1) * 0.9  # restarted after its backoff
    assert system.whereis("/mcp/scripted") is not first
    assert {"mcp__scripted__echo", "mcp__scripted__freeze"} <= set(registry.names())
    assert call(system, registry, "mcp__scripted__echo", {"text": "fresh"}).output == "fresh"
    (server,) = mcp.proxy().servers().get(timeout=5)
    assert (server.status, server.restarts) == ("running", 1)
    assert "not responding" in (server.last_error or "")


def test_a_stopped_server_is_found_by_the_periodic_ping_long_before_its_calls_time_out(system, scripted, processes):
    registry = ToolRegistry()
    config = scripted.config(call_timeout=120.0, ping_timeout=0.5, ping_interval=0.5)
    start_mcp(system, [config], registry, backoff=FAST)
    first = system.whereis("/mcp/scripted")
    pid = first.proxy().snapshot().get(timeout=5).session.pid
    hang = registry.get("mcp__scripted__hang")

    async def stop_the_server_during_a_call() -> tuple[ToolResult, float]:
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            results: list[ToolResult] = []

            async def one() -> None:
                results.append(await invoke(hang, ToolContext(working_dir="."), {}))

            nursery.start_soon(one)
            with trio.fail_after(30):
                while (await first.proxy().snapshot()).calls_in_flight == 0:  # noqa: ASYNC110 - another actor's count, polled
                    await trio.sleep(0.01)
            os.kill(pid, signal.SIGSTOP)
        return results[0], trio.current_time() - started

    result, took = system.loop.run(stop_the_server_during_a_call)
    assert result.output == not_responding_output("scripted", "mcp__scripted__hang", 0.5)
    assert took < 60  # far inside its 120 s deadline: the periodic ping found the hang
    system.loop.run(processes.wait_group_gone, pid)  # stopped, then killed: no orphan
    wait_until(lambda: len(connected_events(system, "scripted")) == 2, message="a second mcp.connected")
    assert call(system, registry, "mcp__scripted__echo", {"text": "fresh"}).output == "fresh"


def test_a_server_that_never_starts_is_retried_with_backoff_and_the_tree_stays_up(system, scripted):
    registry = ToolRegistry()
    broken = attrs.evolve(scripted.config("--fail-at-start", "missing UPSTREAM_TOKEN"), name="broken")
    time_server = ServerConfig(name="time", command=sys.executable, args=["-m", "mcp_server_time"])
    # The mcp supervisor starts although one of its servers cannot.
    mcp = start_mcp(system, [broken, time_server], registry, running=("time",), backoff=FAST)
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
    assert (time_view.status, time_view.restarts) == ("running", 0)


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
