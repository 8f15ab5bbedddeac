"""The ``weald`` command at a real terminal (a pty) and in pipes: Ctrl-C, closed pipes, a daemon that goes away.

No command prints a traceback in any of them; each says in one line what happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, serving
from pty_harness import Terminal

WEALD = (sys.executable, "-m", "weald.runtime.daemon.cli")
PERMISSIONS = """
[tools.permissions]
write_file = "ask"
"""

#: A turn that shows a tool call, then waits (two minutes) for a model answer that Ctrl-C interrupts.
SLOW = [
    {"text": "looking first", "tool_calls": [{"name": "glob", "arguments": {"pattern": "*.txt"}}]},
    {"text": "never shown", "delay": 120},
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("cli-terminal"), extra_config=PERMISSIONS) as proc:
        yield proc


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text
    assert "KeyboardInterrupt" not in text, text
    assert "Error(" not in text, text


def agent_list(daemon: DaemonProcess) -> dict[str, dict[str, object]]:
    return {row["agent_id"]: row for row in json.loads(daemon.cli("agents", "--all", "--json").stdout)}


# --- Ctrl-C on weald run -------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [False, True], ids=["its-own-agent", "a-kept-agent"])
def test_ctrl_c_aborts_the_turn_and_exits_130_with_one_line(shared: DaemonProcess, keep: bool) -> None:
    name = f"interrupted-{os.urandom(3).hex()}"
    model = shared.script(name, SLOW)
    term = Terminal(
        [*WEALD, "run", "--name" if keep else "--quiet", *([name] if keep else []), "--model", model, "go"],
        env=shared.env(),
        cwd=shared.project,
    )
    try:
        if keep:
            term.read_until("✓ glob")
        else:
            # --quiet shows nothing: the agent's turn is seen from the daemon.
            from weald.runtime.testing import wait_until

            wait_until(
                lambda: any(r.get("model") == model and r.get("turn_id") for r in agent_list(shared).values()),
                timeout=60,
                message="the run's turn to start",
            )
        started = time.monotonic()
        term.ctrl_c()
        assert term.wait() == 130, term.text
        assert time.monotonic() - started < 20
    finally:
        term.close()
    no_traceback(term.text)
    lines = [line for line in term.text.splitlines() if line.startswith("aborted:")]
    assert len(lines) == 1, term.text
    rows = [r for r in agent_list(shared).values() if r.get("model") == model]
    assert len(rows) == 1
    agent_id = rows[0]["agent_id"]
    if keep:
        assert (
            lines[0]
            == f"aborted: the turn was stopped; the agent keeps its history (weald run --agent {name} to continue)"
        )
        assert rows[0]["status"] == "active"
        assert not rows[0].get("turn_id")  # the turn was aborted, the agent stayed
    else:
        assert lines[0].startswith(f"aborted: the turn was stopped, and agent {agent_id} with this run")
        assert rows[0]["status"] == "stopped"


def test_a_second_ctrl_c_exits_at_once_when_the_daemon_does_not_answer(shared: DaemonProcess) -> None:
    model = shared.script(f"frozen-{os.urandom(3).hex()}", SLOW)
    term = Terminal([*WEALD, "run", "--keep", "--model", model, "go"], env=shared.env(), cwd=shared.project)
    assert shared.proc is not None
    try:
        term.read_until("✓ glob")
        shared.proc.send_signal(signal.SIGSTOP)  # the abort gets no answer
        try:
            term.ctrl_c()
            term.read_until("Ctrl-C again exits at once")
            started = time.monotonic()
            term.ctrl_c()
            assert term.wait(timeout=10) == 130, term.text
            assert time.monotonic() - started < 3
        finally:
            shared.proc.send_signal(signal.SIGCONT)
    finally:
        term.close()
    no_traceback(term.text)
    assert "interrupted again: exiting now" in term.text


def test_ctrl_c_on_weald_run_with_an_embedded_daemon(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)  # no daemon runs: weald run starts one in its own process
    model = d.script("slow", SLOW)
    term = Terminal([*WEALD, "run", "--model", model, "go"], env=d.env(), cwd=d.project)
    try:
        term.read_until("✓ glob")
        term.ctrl_c()
        assert term.wait() == 130, term.text
    finally:
        term.close()
    no_traceback(term.text)
    assert [line for line in term.text.splitlines() if line.startswith("aborted:")], term.text


def test_ctrl_c_on_a_following_command_ends_it_in_one_line(shared: DaemonProcess) -> None:
    term = Terminal([*WEALD, "events"], env=shared.env(), cwd=shared.project)
    try:
        term.read_until("following events")
        term.ctrl_c()
        assert term.wait() == 130, term.text
    finally:
        term.close()
    no_traceback(term.text)
    assert term.text.strip().splitlines()[-1] == "weald events: interrupted"


# --- the order of what weald run shows ------------------------------------------------------------------


def test_a_permission_prompt_comes_after_the_line_of_the_tool_asking(shared: DaemonProcess) -> None:
    model = shared.script(
        f"asks-{os.urandom(3).hex()}",
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "ordered.txt", "content": "x"}}]},
            {"text": "done"},
        ],
    )
    term = Terminal([*WEALD, "run", "--model", model, "write it"], env=shared.env(), cwd=shared.project)
    try:
        term.read_until("allow?")
        term.send(b"n\n")
        assert term.wait() == 0, term.text
    finally:
        term.close()
    assert term.text.index("▶ write_file") < term.text.index("wants to run"), term.text


# --- pipes and a daemon that goes away -------------------------------------------------------------------------


def test_a_closed_pipe_ends_a_command_quietly(shared: DaemonProcess) -> None:
    model = shared.script(f"piped-{os.urandom(3).hex()}", [{"text": "ok"}])
    for _ in range(3):
        assert shared.cli("run", "--keep", "--model", model, "fill the list").returncode == 0
    weald = " ".join(WEALD)
    for pipeline in (f"{weald} agents | true", f"{weald} agents | head -1", f"{weald} config show | head -1"):
        done = subprocess.run(
            ["bash", "-c", f"{pipeline}; echo status=${{PIPESTATUS[0]}}"],
            env=shared.env(),
            cwd=shared.project,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.stderr == "", f"{pipeline}: {done.stderr}"
        assert done.stdout.splitlines()[-1] in ("status=0", "status=141"), done.stdout


def test_a_daemon_that_stops_under_a_following_command_is_one_line(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    try:
        d.start()
        with subprocess.Popen(
            [*WEALD, "events"], env=d.env(), cwd=d.project, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        ) as follower:
            assert follower.stderr is not None
            assert "following events" in follower.stderr.readline()
            assert d.terminate() == 0
            assert follower.wait(60) == 1
            rest = follower.stderr.read()
        assert rest.strip() == "weald events: the daemon closed the connection (it stopped)", rest
    finally:
        d.close()
