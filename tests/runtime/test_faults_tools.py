"""Tool faults through a real ToolRunner: hang, crash, delay, and killing a real subprocess mid-call."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from weald.runtime import ActorSystem, Ref
from weald.runtime import _faults_proc as proc
from weald.runtime.agents.tool_runner import (
    CallOutcome,
    RunnerConfig,
    RunTools,
    ToolCallRequest,
    ToolResults,
    ToolRunner,
)
from weald.runtime.faults import FaultInjector, ToolFault
from weald.runtime.testing import ResultCollector, wait_for_event, wait_until
from weald.tools import ToolContext, ToolRegistry, default_registry, tool

EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
REG = ToolRegistry()
shell_tool = default_registry.get("shell")
assert shell_tool is not None
REG.register(shell_tool)


@tool(name="quick", description="returns at once", parameters=EMPTY, registry=REG, timeout=0.5)
async def quick(ctx: ToolContext) -> str:
    return "quick done"


@tool(name="quick_sync", description="returns at once, in a thread", parameters=EMPTY, registry=REG, timeout=5)
def quick_sync(ctx: ToolContext) -> str:
    return "sync done"


@tool(name="sleeper", description="sleeps in a subprocess", parameters=EMPTY, registry=REG, timeout=20)
async def sleeper(ctx: ToolContext) -> str:
    # A tool that does not pass [tools.shell] env on to its subprocess.
    await trio.run_process(["sleep", "30"], start_new_session=True)
    return "slept"


class Harness:
    def __init__(self, system: ActorSystem, tmp_path: Path, registry: ToolRegistry) -> None:
        self.system = system
        config = RunnerConfig(permissions={"shell": "allow"}, permission_timeout=5)
        self.runner = system.spawn(
            ToolRunner,
            args=("s1", tmp_path),
            kwargs={"registry": registry, "config": config, "output_dir": tmp_path / "out"},
            name="runner",
        )
        self.collector: Ref[Any] = system.spawn(ResultCollector, name="collector")
        self._n = 0

    def call(
        self, name: str, arguments: dict[str, Any] | None = None, *, agent: str = "/sessions/s1/agent"
    ) -> CallOutcome:
        self._n += 1
        batch = f"b{self._n}"
        calls = (ToolCallRequest(f"{batch}-c0", name, arguments or {}),)
        snapshot = SimpleNamespace(path=agent)
        self.runner.tell(RunTools(batch, calls, snapshot, self.collector, agent_id="a1", agent_path=agent))
        results: ToolResults = wait_until(
            lambda: next((r for r in self.collector.proxy().received().get() if r.batch_id == batch), None),
            timeout=15,
            message=f"results of {batch}",
        )
        return results.outcomes[0]


@pytest.fixture
def injector(system: ActorSystem) -> FaultInjector:
    injector = FaultInjector(seed=5)
    injector.install(system)
    return injector


@pytest.fixture
def h(system: ActorSystem, tmp_path: Path, injector: FaultInjector) -> Harness:
    return Harness(system, tmp_path, injector.wrap_registry(REG))


def test_a_hanging_tool_is_ended_by_the_runners_timeout(
    system: ActorSystem, injector: FaultInjector, h: Harness
) -> None:
    injector.inject(ToolFault(id="stuck", kind="hang", tool="quick", count=1))
    hung = h.call("quick")
    assert not hung.result.ok
    assert hung.result.output.startswith("quick timed out after 0.5 s and was stopped")
    assert h.call("quick").result.output == "quick done"
    fired = wait_for_event(system.events, "fault.injected")
    assert fired.source == "/runner"
    assert {k: fired.data[k] for k in ("id", "kind", "tool", "call_id", "agent")} == {
        "id": "stuck",
        "kind": "hang",
        "tool": "quick",
        "call_id": "b1-c0",
        "agent": "/sessions/s1/agent",
    }
    assert injector.fault_counts_by_path() == {"/runner": 1}


def test_killing_the_shells_subprocess_mid_call_gives_an_error_result_and_no_orphan(
    system: ActorSystem, injector: FaultInjector, h: Harness
) -> None:
    injector.inject(ToolFault(id="kill-sleep", kind="kill_subprocess", tool="shell", seconds=0.1))
    outcome = h.call("shell", {"command": "sleep 30 & sleep 30; echo never"})
    assert not outcome.result.ok
    assert "The command failed: killed by SIGKILL." in outcome.result.output
    assert "never" not in outcome.result.output
    assert outcome.duration < 10
    fired = wait_for_event(system.events, "fault.injected", lambda e: e.data["id"] == "kill-sleep")
    pgid, mark = fired.data["pgid"], fired.data["mark"]
    assert isinstance(pgid, int)
    assert pgid != os.getpid()
    assert not proc.group_alive(pgid)
    assert proc.marked_processes(mark) == []  # the backgrounded sleep went with its group
    assert h.runner.is_alive()


def test_a_tool_that_does_not_pass_the_mark_has_its_new_subprocess_killed(
    system: ActorSystem, injector: FaultInjector, h: Harness
) -> None:
    injector.inject(ToolFault(id="kill-any", kind="kill_subprocess", tool="sleeper"))
    outcome = h.call("sleeper")
    assert not outcome.result.ok
    assert "sleeper failed with CalledProcessError" in outcome.result.output
    assert "SIGKILL" in outcome.result.output
    fired = wait_for_event(system.events, "fault.injected", lambda e: e.data["id"] == "kill-any")
    assert not proc.group_alive(fired.data["pgid"])


def test_a_kill_fault_on_a_call_that_starts_no_subprocess_says_so(
    system: ActorSystem, injector: FaultInjector, h: Harness
) -> None:
    injector.inject(ToolFault(id="nothing-to-kill", kind="kill_subprocess", tool="quick"))
    assert h.call("quick").result.output == "quick done"
    fired = wait_for_event(system.events, "fault.injected", lambda e: e.data["id"] == "nothing-to-kill")
    assert fired.data["pgid"] is None
    assert fired.data["note"] == "the call ended before it started a subprocess"


def test_an_injected_tool_crash_is_an_error_result_that_names_the_fault(injector: FaultInjector, h: Harness) -> None:
    injector.inject(ToolFault(id="boom", kind="crash", tool="quick_*"))
    outcome = h.call("quick_sync")
    assert not outcome.result.ok
    assert outcome.result.output.startswith(
        "quick_sync failed with InjectedFault: injected fault 'boom' (tool crash, fire 1): quick_sync crashed (call b1-c0)"
    )
    assert h.call("quick").result.output == "quick done"  # not matched by quick_*
    assert h.runner.is_alive()


def test_a_delay_applies_only_to_the_agent_its_pattern_names(injector: FaultInjector, h: Harness) -> None:
    injector.inject(ToolFault(id="slow-s1", kind="delay", tool="quick_sync", agent="/sessions/s1/*", seconds=0.2))
    slow = h.call("quick_sync", agent="/sessions/s1/agent")
    assert slow.result.output == "sync done"
    assert slow.duration >= 0.2
    assert h.call("quick_sync", agent="/sessions/s2/agent").result.ok
    (status,) = injector.list()
    assert (status.matches, status.fires) == (1, 1)


def test_tools_registered_after_wrapping_are_faulted_too(system: ActorSystem, tmp_path: Path) -> None:
    base = ToolRegistry()
    injector = FaultInjector(seed=1)
    view = injector.wrap_registry(base)
    h = Harness(system, tmp_path, view)

    @tool(name="late", description="registered late", parameters=EMPTY, registry=base)
    def late(ctx: ToolContext) -> str:
        return "late"

    assert "late" in view
    assert view.get("late") is base.get("late")  # registrars see the tool as registered
    injector.inject(ToolFault(id="late-crash", kind="crash", tool="late", count=1))
    assert "late-crash" in h.call("late").result.output
    assert h.call("late").result.output == "late"
    assert injector.statistics().fires_by_kind == {"tool.crash": 1}
