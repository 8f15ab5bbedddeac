"""MCP faults on a real MCP server subprocess under the real MCP supervisor: kill the server, hang its calls."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from weald.runtime import ActorSystem
from weald.runtime import _faults_proc as proc
from weald.runtime.agents.tool_runner import RunnerConfig, RunTools, ToolCallRequest, ToolResults, ToolRunner
from weald.runtime.faults import FaultInjector, MCPFault
from weald.runtime.mcp import ServerConfig, mcp_supervisor_spec
from weald.runtime.testing import wait_for_event, wait_until
from weald.supervisors import Backoff
from weald.tools import ToolContext, ToolRegistry, ToolResult, invoke

SCRIPTED_SERVER = Path(__file__).parents[1] / "mcp" / "scripted_server.py"
ECHO = "mcp__scripted__echo"


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry()


@pytest.fixture
def injector(system: ActorSystem) -> FaultInjector:
    injector = FaultInjector(seed=3)
    injector.install(system)
    return injector


@pytest.fixture
def server(system: ActorSystem, registry: ToolRegistry, injector: FaultInjector) -> Iterator[int]:
    """The scripted server under /mcp, connected; yields its first pid."""
    config = ServerConfig(
        name="scripted", command=sys.executable, args=[str(SCRIPTED_SERVER)], call_timeout=30.0, connect_timeout=20.0
    )
    backoff = Backoff(initial=0.05, factor=2.0, cap=1.0, reset_after=60.0)
    spec = mcp_supervisor_spec([config], registry, permission="allow", backoff=backoff)
    system.root.proxy().start_child(spec).get(timeout=30)
    connected = wait_for_event(system.events, "mcp.connected", timeout=30)
    yield connection_pid(system)
    assert connected.source == "/mcp/scripted"


def connection_pid(system: ActorSystem) -> int:
    ref = wait_until(lambda: system.whereis("/mcp/scripted"))
    snapshot = ref.proxy().snapshot().get(timeout=10)
    assert snapshot.status == "running"
    pid: int = snapshot.session.pid
    return pid


def call_echo(system: ActorSystem, registry: ToolRegistry, text: str) -> ToolResult:
    registered = registry.get(ECHO)
    assert registered is not None, registry.names()
    return system.loop.run(invoke, registered, ToolContext(working_dir=".", tool_name=ECHO), {"text": text})


def test_kill_server_on_a_call_kills_the_server_mid_call_and_the_supervisor_restarts_it(
    system: ActorSystem, registry: ToolRegistry, injector: FaultInjector, server: int
) -> None:
    assert call_echo(system, registry, "before").output == "before"
    injector.inject(MCPFault(id="kill-on-echo", kind="kill_server", server="scripted", tool="echo", count=1))
    killed = call_echo(system, registry, "during")
    assert not killed.ok
    assert "disconnected while running tool mcp__scripted__echo" in killed.output
    fired = wait_for_event(system.events, "fault.injected")
    assert (fired.source, fired.data["pid"], fired.data["tool"], fired.data["server"]) == (
        "/mcp/scripted",
        server,
        "echo",
        "scripted",
    )
    crashed = wait_for_event(system.events, "supervisor.child_crashed", lambda e: e.data["path"] == "/mcp/scripted")
    wait_for_event(system.events, "supervisor.child_restarted", lambda e: e.data["path"] == "/mcp/scripted")
    assert fired.seq < crashed.seq
    wait_for_event(system.events, "mcp.connected", since=crashed.seq, timeout=30)
    assert connection_pid(system) != server
    assert not proc.group_alive(server)
    assert call_echo(system, registry, "after").output == "after"
    assert injector.fault_counts_by_path() == {"/mcp/scripted": 1}


def test_kill_server_now_kills_a_connected_server_at_once(
    system: ActorSystem, registry: ToolRegistry, injector: FaultInjector, server: int
) -> None:
    injector.inject({"id": "kill-now", "target": "mcp", "kind": "kill_server", "server": "scr*", "trigger": "now"})
    fired = wait_for_event(system.events, "fault.injected")
    assert (fired.data["id"], fired.data["trigger"], fired.data["pid"]) == ("kill-now", "now", server)
    lost = wait_for_event(system.events, "mcp.disconnected", lambda e: e.data["during"] == "session")
    wait_for_event(system.events, "mcp.connected", since=lost.seq, timeout=30)
    (status,) = injector.list()
    assert (status.matches, status.fires) == (1, 1)


def run_hung_call(system: ActorSystem, registry: ToolRegistry, injector: FaultInjector, tmp_path: Path) -> Any:
    runner = system.spawn(
        ToolRunner,
        args=("s1", tmp_path),
        kwargs={"registry": injector.wrap_registry(registry), "config": RunnerConfig(timeouts={ECHO: 0.5})},
        name="runner",
    )
    results: list[ToolResults] = []

    class Reply:
        # Stands in for the agent's ref: the runner only tells it the results.
        def is_alive(self) -> bool:
            return True

        def tell(self, message: ToolResults) -> None:
            results.append(message)

    injector.inject(MCPFault(id="mcp-hang", kind="hang", server="scripted", count=1))
    calls = (ToolCallRequest("c1", ECHO, {"text": "hello?"}),)
    runner.tell(RunTools("b1", calls, None, Reply()))  # type: ignore[arg-type]
    (batch,) = wait_until(lambda: results, timeout=10)
    return batch.outcomes[0]


def test_hung_mcp_calls_are_ended_by_the_runners_deadline(
    system: ActorSystem, registry: ToolRegistry, injector: FaultInjector, server: int, tmp_path: Path
) -> None:
    outcome = run_hung_call(system, registry, injector, tmp_path)
    assert not outcome.result.ok
    assert 0.5 <= outcome.duration < 5
    fired = wait_for_event(system.events, "fault.injected")
    assert (fired.source, fired.data["message"], fired.data["tool"]) == ("/mcp/scripted", "CallTool", "echo")
    assert call_echo(system, registry, "answered").output == "answered"  # count = 1: the next call goes through


def test_a_hung_mcp_call_reads_as_timed_out(
    system: ActorSystem, registry: ToolRegistry, injector: FaultInjector, server: int, tmp_path: Path
) -> None:
    outcome = run_hung_call(system, registry, injector, tmp_path)
    assert outcome.result.output.startswith(f"{ECHO} timed out after 0.5 s")
