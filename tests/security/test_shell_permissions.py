"""Shell permission patterns cannot be talked around: the attacks of issue 12, through a real runner and daemon.

With ``"echo ok*" = "allow"`` (or the documented ``"git status*"``), a
command line that runs something else beside the allowed command is asked
about, and with nobody to answer it never runs: no ``PWNED`` file appears.
A deny pattern holds against another path to the program, split flags and
leading spaces, even where a broader pattern allows the program. Each runs
through the real `ToolRunner` with a real bash, and the first through a real
`weald serve` whose client denies the request.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, collect_until
from sec_runner import RunnerHarness
from weald.runtime import ActorSystem
from weald.runtime.testing import wait_for_event

SMUGGLED = {
    "echo ok; touch PWNED": "echo ok*",
    "echo ok && touch PWNED": "echo ok*",
    "echo ok\ntouch PWNED": "echo ok*",
    "echo ok $(touch PWNED)": "echo ok*",
    "git status; touch PWNED": "git status*",
    "git status && touch PWNED": "git status*",
}


@pytest.mark.parametrize(("command", "pattern"), SMUGGLED.items())
def test_an_allow_pattern_does_not_let_a_second_command_run_unasked(
    system: ActorSystem, project: Path, command: str, pattern: str
) -> None:
    runner = RunnerHarness(system, project, permissions={"shell": {pattern: "allow"}}, permission_timeout=0.5)
    result = runner.call("shell", command=command)
    asked = wait_for_event(system.events, "permission.requested")
    assert asked.data["subject"] == command
    assert asked.data["reason"] == 'default for shell: no pattern allows "touch PWNED"'
    assert "counts as denied" in result.output
    assert not (project / "PWNED").exists()


def test_the_allowed_command_alone_still_runs_without_asking(system: ActorSystem, project: Path) -> None:
    runner = RunnerHarness(system, project, permissions={"shell": {"echo ok*": "allow"}}, permission_timeout=0.5)
    result = runner.call("shell", command="echo ok")
    assert result.ok, result.text()
    assert result.output == "ok"
    assert system.events.recent(topic="permission.requested") == []


@pytest.mark.parametrize("command", ["/bin/rm -rf victim", "rm -r -f victim", " rm -rf victim", "FOO=1 rm -fr victim"])
def test_a_deny_pattern_holds_against_other_spellings_of_the_command(
    system: ActorSystem, project: Path, command: str
) -> None:
    (project / "victim" / "deep").mkdir(parents=True)
    runner = RunnerHarness(system, project, permissions={"shell": {"rm *": "allow", "rm -rf *": "deny"}})
    result = runner.call("shell", command=command)
    assert not result.ok
    assert 'not allowed here (tools.permissions.shell "rm -rf *" = deny' in result.output
    assert (project / "victim" / "deep").is_dir()
    assert system.events.recent(topic="permission.requested") == []


def test_a_real_daemon_asks_before_the_smuggled_command_and_a_denial_stops_it(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, extra_config='[tools.permissions.shell]\n"echo ok*" = "allow"\n')
    model = daemon.script(
        "smuggle",
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo ok"}}]},
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo ok; touch PWNED"}}]},
            {"text": "done"},
        ],
    )
    daemon.start()
    try:
        with daemon.client() as c:
            c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "smuggler"})
            pending = c.request("agent.prompt", {"agent_id": "smuggler", "text": "go"})
            notes = collect_until(c, lambda ns: any(n[0] == "permission.request" for n in ns), timeout=60)
            requests = [n[1] for n in notes if n[0] == "permission.request"]
            assert [r["subject"] for r in requests] == ["echo ok; touch PWNED"]  # `echo ok` alone was not asked
            assert requests[0]["reason"] == 'default for shell: no pattern allows "touch PWNED"'
            c.call("permission.respond", {"request_id": requests[0]["request_id"], "decision": "deny"})
            assert pending.get(timeout=60)["text"] == "done"
            tools = [
                m["content"]
                for m in c.call("agent.history", {"agent_id": "smuggler"})["messages"]
                if m["role"] == "tool"
            ]
        assert tools[0].startswith("ok")
        assert "denied by the user" in tools[1]
        assert not (daemon.project / "PWNED").exists()
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()


def test_a_long_command_line_is_decided_off_the_loop_with_the_same_rules(system: ActorSystem, project: Path) -> None:
    # The runner parses in a worker thread; the decision is the same as for a short command line.
    allowed = "echo ok; " * 200
    (project / "victim").mkdir()
    rules = {"shell": {"echo ok*": "allow", "rm -rf *": "deny"}}
    runner = RunnerHarness(system, project, permissions=rules, permission_timeout=0.5)
    result = runner.call("shell", command=allowed)
    assert result.ok, result.text()
    assert result.output.splitlines() == ["ok"] * 200
    denied = runner.call("shell", command=allowed + "rm -rf victim")
    assert 'not allowed here (tools.permissions.shell "rm -rf *" = deny, matching "rm -rf victim")' in denied.output
    assert system.events.recent(topic="permission.requested") == []
    smuggled = allowed + "touch PWNED; " + allowed
    result = runner.call("shell", command=smuggled)
    asked = wait_for_event(system.events, "permission.requested")
    assert asked.data["reason"] == 'default for shell: no pattern allows "touch PWNED"'
    assert "counts as denied" in result.output
    assert not (project / "PWNED").exists()
    assert (project / "victim").is_dir()


def test_the_daemon_answers_while_long_command_lines_are_decided(tmp_path: Path) -> None:
    # Four 48 KB command lines (`echo` then 16,000 x '' and a backslash-newline) in one step: deciding
    # them took 13-28 s of CPU each, on the loop's process, and daemon.status took seconds to answer.
    command = "echo " + "''\\\n" * 16_000
    daemon = DaemonProcess(tmp_path, extra_config='[tools.permissions.shell]\n"echo *" = "allow"\n"rm *" = "deny"\n')
    calls = [{"name": "shell", "arguments": {"command": command}} for _ in range(4)]
    model = daemon.script("long", [{"tool_calls": calls}, {"text": "done"}])
    daemon.start()
    try:
        with daemon.client() as c, daemon.client() as watcher:
            c.call("agent.start", {"working_dir": str(daemon.project), "model": model, "agent_id": "long"})
            pending = c.request("agent.prompt", {"agent_id": "long", "text": "go"})
            slowest = 0.0
            # On the old checker the turn took 100 s here; now about 1 s (a loaded machine has 60).
            deadline = time.monotonic() + 60
            while not pending.done():
                assert time.monotonic() < deadline, "the four decisions and commands did not end in 60 s"
                started = time.monotonic()
                watcher.call("daemon.status", timeout=60)
                slowest = max(slowest, time.monotonic() - started)
            assert pending.get(timeout=10)["text"] == "done"
            results = [m for m in c.call("agent.history", {"agent_id": "long"})["messages"] if m["role"] == "tool"]
        assert len(results) == 4
        assert all(not r["is_error"] for r in results), results
        # A generous bound for a loaded machine: the decisions ran in worker threads, in milliseconds.
        assert slowest < 2.0, f"daemon.status took {slowest:.1f} s while the commands were decided"
        assert daemon.terminate() == 0, daemon.log.read_text()
    finally:
        daemon.close()
