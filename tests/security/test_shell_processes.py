"""Nothing a shell command starts outlives the actor system, not even a process that left its session.

Run through the real tool runner in a real `ActorSystem`: the command starts
a ``setsid`` sleeper (a session of its own, reparented to init, out of
reach of a process-group kill) and waits; leaving the ``with`` block must
stop it. These run with the OS sandbox off, to test the isolation shell
falls back on without it (the pid the command prints is then the real
one); test_sandbox_attacks.py runs the sandboxed twins.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sec_runner import RunnerHarness
from weald.runtime import ActorSystem
from weald.runtime.agents.tool_runner import RunTools, ToolCallRequest
from weald.runtime.testing import process_alive, wait_until


@pytest.mark.parametrize(
    "start",
    ["setsid sleep 300 >/dev/null 2>&1 &", "nohup setsid sleep 300 >/dev/null 2>&1 &"],
    ids=["setsid", "nohup setsid"],
)
def test_a_sleeper_that_left_the_session_does_not_outlive_the_actor_system(
    project: Path, tmp_path: Path, sleepers: list[int], start: str
) -> None:
    pid_file = project / "sleeper.pid"
    with ActorSystem(store_path=tmp_path / "store.db") as system:
        runner = RunnerHarness(system, project, options={"shell": {"sandbox": "off"}})
        request = ToolCallRequest("b1-c0", "shell", {"command": f"{start} echo $! > sleeper.pid; wait"})
        runner.runner.tell(RunTools("b1", (request,), None, runner.agent, agent_id="sec", agent_path="/agent"))
        wait_until(lambda: pid_file.read_text().strip() if pid_file.exists() else None, message="the sleeper's pid")
        sleepers.append(int(pid_file.read_text()))
        assert process_alive(sleepers[0])
    wait_until(lambda: not process_alive(sleepers[0]), timeout=15, message="the sleeper to be stopped")
