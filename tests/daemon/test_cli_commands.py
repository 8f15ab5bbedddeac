"""The ``weald`` commands that work on agents, through the real CLI against a real daemon.

``run`` and its agent's life (stopped at the end unless ``--keep``/``--name``,
reaped when its run dies), ``prompt``, ``history``, ``abort``, ``agent stop``,
``events``, ``fault``, ``permissions``/``answer``, and the small things a
person meets: empty prompts, bad options, empty tables, status without nulls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.testing import wait_until

WEALD_CLI = (sys.executable, "-m", "weald.runtime.daemon.cli")
PERMISSIONS = """
[tools.permissions]
shell = "ask"
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon for the module's tests; each test uses agents of its own names."""
    with serving(tmp_path_factory.mktemp("cli-commands"), extra_config=PERMISSIONS) as proc:
        yield proc


def agents(daemon: DaemonProcess, *extra: str) -> dict[str, dict[str, Any]]:
    listed = daemon.cli("agents", "--json", *extra)
    assert listed.returncode == 0, listed.stderr
    return {row["agent_id"]: row for row in json.loads(listed.stdout)}


def unique(name: str) -> str:
    return f"{name}-{os.urandom(3).hex()}"


# --- an agent's life: a run's own agent goes with it ---------------------------------------------------


def test_a_run_without_keep_stops_its_agent_and_keep_or_name_keep_it(shared: DaemonProcess) -> None:
    model = shared.script(unique("once"), [{"text": "done"}])
    gone = shared.cli("run", "--json", "--model", model, "first prompt of a run")
    assert gone.returncode == 0, gone.stderr
    gone_id = json.loads(gone.stdout)["agent_id"]
    assert json.loads(gone.stdout)["kept"] is False
    assert gone_id not in agents(shared)
    assert agents(shared, "--all")[gone_id]["status"] == "stopped"

    kept = shared.cli("run", "--json", "--keep", "--model", model, "a kept one")
    kept_id = json.loads(kept.stdout)["agent_id"]
    assert agents(shared)[kept_id]["title"] == "a kept one"

    name = unique("reviewer")
    named = shared.cli("run", "--name", name, "--model", model, "review the code")
    assert named.returncode == 0, named.stderr
    assert f"agent {name} ·" in named.stderr
    row = agents(shared)[name]
    assert row["title"] == "review the code"
    assert "ephemeral" not in row
    shown = shared.cli("agents")
    assert name in shown.stdout
    assert "review the code" in shown.stdout
    assert "first prompt" in shown.stdout


def test_the_daemon_stops_the_agent_of_a_run_that_was_killed(shared: DaemonProcess) -> None:
    model = shared.script(unique("slow"), [{"text": "never seen", "delay": 120}])
    with subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "run", "--json", "--model", model, "a killed run"],
        env=shared.env(),
        cwd=shared.project,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    ) as proc:
        found: list[str] = []

        def started() -> bool:
            found[:] = [a for a, row in agents(shared).items() if row.get("title") == "a killed run"]
            return bool(found) and bool(agents(shared)[found[0]].get("turn_id"))

        wait_until(started, timeout=60, message="the run's agent to start its turn")
        assert agents(shared)[found[0]]["ephemeral"] is True
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    wait_until(
        lambda: agents(shared, "--all")[found[0]]["status"] == "stopped",
        timeout=60,
        message="the killed run's agent to be reaped",
    )


def test_a_restarted_daemon_reaps_the_agents_of_runs_that_died_with_it(tmp_path: Path) -> None:
    proc = DaemonProcess(tmp_path)
    try:
        proc.start()
        model = proc.script("hello", [{"text": "hi"}])
        with proc.client() as client:
            for agent_id, ephemeral in (("left", True), ("kept", False)):
                params = {"working_dir": str(proc.project), "model": model, "agent_id": agent_id}
                client.call("agent.start", {**params, "ephemeral": ephemeral, "asleep": False})
        proc.kill9()
        proc.start()
        listed = agents(proc, "--all")
        assert listed["left"]["status"] == "stopped"
        assert listed["kept"]["status"] == "active"
        events = json.loads(proc.cli("debug-state", "--json", "--events", "200").stdout)["recent_events"]
        reaped = [e["data"] for e in events if e["topic"] == "daemon.reaped"]
        assert reaped == [{"agent_id": "left", "reason": "the run that started it ended with the daemon"}]
        assert proc.terminate() == 0, proc.log.read_text()
    finally:
        proc.close()


# --- going on with an agent, reading it, stopping it -----------------------------------------------------


def test_prompt_goes_on_with_the_conversation_and_history_shows_it_as_run_did(shared: DaemonProcess) -> None:
    (shared.project / "story.txt").write_text("once\n")
    model = shared.script(
        unique("talk"),
        [
            {"text": "Reading it.", "tool_calls": [{"name": "read_file", "arguments": {"path": "story.txt"}}]},
            {"text": "It says once."},
            {"text": "Still here."},
        ],
    )
    name = unique("talker")
    first = shared.cli("run", "--name", name, "--model", model, "read story.txt")
    assert first.returncode == 0, first.stderr
    second = shared.cli("prompt", name, "are you there?")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["Still here."]
    same = shared.cli("agent", "prompt", name, "--json", "and now?")
    assert same.returncode == 1  # the script has no fourth turn: the same agent was asked
    assert "has none" in json.loads(same.stdout)["error"]

    history = shared.cli("history", name)
    assert history.returncode == 0, history.stderr
    assert history.stdout.splitlines()[:3] == ["> read story.txt", "Reading it.", "It says once."]
    assert "> are you there?" in history.stdout
    assert '▶ read_file {"path": "story.txt"}' in history.stderr
    assert "✓ read_file" in history.stderr

    last = shared.cli("history", name, "--limit", "1")
    assert len(last.stdout.splitlines()) == 1
    match = re.search(r"weald history \S+ --before (\d+)", last.stderr)
    assert match, last.stderr
    earlier = shared.cli("history", name, "--limit", "1", "--before", match.group(1))
    assert earlier.stdout.strip() != last.stdout.strip()
    page = json.loads(shared.cli("history", name, "--json").stdout)
    assert [m["role"] for m in page["messages"]][:2] == ["user", "assistant"]


def test_abort_and_agent_stop_say_what_they_did(shared: DaemonProcess) -> None:
    model = shared.script(unique("idle"), [{"text": "ok"}, {"text": "ok"}])
    first, second = unique("idle-a"), unique("idle-b")
    for name in (first, second):
        assert shared.cli("run", "--name", name, "--model", model, "hi").returncode == 0
    aborted = shared.cli("abort", first)
    assert aborted.returncode == 0, aborted.stderr
    assert aborted.stdout.strip() == f"{first} had no turn running; nothing to abort"
    assert json.loads(shared.cli("abort", first, "--json").stdout) == {"agent_id": first, "aborted": False}

    stopped = shared.cli("agent", "stop", first)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"stopped {first}"
    assert first not in agents(shared)
    assert shared.cli("history", first).returncode == 0  # its history stays

    idle = shared.cli("agent", "stop", "--all-idle", "--json")
    assert idle.returncode == 0, idle.stderr
    assert {"agent_id": second, "stopped": True} in json.loads(idle.stdout)
    assert second not in agents(shared)

    both = shared.cli("agent", "stop", "--all-idle", first)
    assert both.returncode == 2
    assert both.stderr.strip() == "weald agent stop: give agent ids, or --all-idle (not both)"


def test_events_follows_the_daemon_live_and_names_ids_once(shared: DaemonProcess) -> None:
    name = unique("watched")
    model = shared.script(unique("watched"), [{"text": "seen"}, {"text": "seen again"}])
    assert shared.cli("run", "--name", name, "--model", model, "hi").returncode == 0
    with subprocess.Popen(
        [*WEALD_CLI, "events", "--agent", name, "--topic", "agent.turn_*", "--count", "2"],
        env=shared.env(),
        cwd=shared.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        assert "following events" in proc.stderr.readline()  # subscribed: what comes next is seen
        assert shared.cli("prompt", name, "again").returncode == 0
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert [line.split()[1] for line in lines] == ["agent.turn_start", "agent.turn_end"]
    assert all(f"/sessions/{name}/agent" in line for line in lines)
    assert not any("session_id=" in line or f"agent_id={name}" in line for line in lines), lines


# --- faults from the shell ----------------------------------------------------------------------------------


def test_fault_inject_list_and_clear_against_a_daemon_with_faults_on(tmp_path: Path) -> None:
    with serving(tmp_path, extra_config="[faults]\nenabled = true\n") as d:
        injected = d.cli("fault", "inject", "id=read-crash", "target=tool", "kind=crash", "tool=read_file", "count=1")
        assert injected.returncode == 0, injected.stderr
        assert injected.stdout.strip() == "injected fault read-crash (weald fault clear read-crash removes it)"
        model = d.script(
            "reads", [{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"text": "ok"}]
        )
        assert d.cli("run", "--model", model, "read").returncode == 0
        listed = d.cli("fault", "list", columns=200)
        assert listed.returncode == 0, listed.stderr
        row = next(line for line in listed.stdout.splitlines() if line.startswith("read-crash"))
        assert row.split()[1] == "1"  # fired once
        assert "tool=read_file" in row
        assert json.loads(d.cli("fault", "list", "--json").stdout)["faults"][0]["fires"] == 1
        bad = d.cli("fault", "inject", "target=tool", "kind=explode")
        assert bad.returncode == 1
        assert "kind" in bad.stderr
        assert "Traceback" not in bad.stderr
        cleared = d.cli("fault", "clear")
        assert cleared.stdout.strip() == "cleared 1 fault"
        assert "no faults" in d.cli("fault", "list").stdout


# --- requests waiting for a person ---------------------------------------------------------------------------


def test_permissions_lists_what_waits_and_answer_answers_it(shared: DaemonProcess) -> None:
    name = unique("asker")
    model = shared.script(
        unique("asker"),
        [
            {"tool_calls": [{"name": "shell", "arguments": {"command": "echo allowed-by-answer"}}]},
            {
                "tool_calls": [
                    {"name": "ask_user", "arguments": {"question": "Which colour?", "choices": ["red", "blue"]}}
                ]
            },
            {"text": "finished"},
        ],
    )
    with shared.client() as client:
        client.call("agent.start", {"working_dir": str(shared.project), "model": model, "agent_id": name})
        turn = client.request("agent.prompt", {"agent_id": name, "text": "go"})

        def waiting(kind: str) -> dict[str, Any]:
            found: dict[str, Any] = {}

            def listed() -> bool:
                shown = json.loads(shared.cli("permissions", "--agent", name, "--json").stdout)
                found.update(shown)
                return bool(shown[kind])

            wait_until(listed, timeout=60, message=f"a waiting {kind}")
            return found

        request = waiting("permissions")["permissions"][0]
        shown = shared.cli("permissions")
        assert request["request_id"] in shown.stdout
        assert "echo allowed-by-answer" in shown.stdout
        wrong = shared.cli("answer", request["request_id"], "perhaps")
        assert wrong.returncode == 2
        assert "answer allow, deny or always" in wrong.stderr
        assert shared.cli("answer", request["request_id"], "allow").returncode == 0

        question = waiting("questions")["questions"][0]
        answered = shared.cli("answer", question["question_id"], "2")
        assert answered.stdout.strip() == f"answered {question['question_id']}: blue"
        assert turn.get(timeout=60)["text"] == "finished"
        history = client.call("agent.history", {"agent_id": name})["messages"]
    results = [m["content"] for m in history if m["role"] == "tool"]
    assert "allowed-by-answer" in results[0]
    assert "blue" in results[1]
    gone = shared.cli("answer", "nothing-waits", "allow")
    assert gone.returncode == 1
    assert "weald permissions lists what waits" in gone.stderr


def test_without_a_terminal_a_question_is_not_answered_by_guessing(shared: DaemonProcess) -> None:
    model = shared.script(
        unique("question"),
        [
            {
                "tool_calls": [
                    {"name": "ask_user", "arguments": {"question": "Delete the branch?", "choices": ["yes", "no"]}}
                ]
            },
            {"text": "I will not delete it."},
        ],
    )
    name = unique("careful")
    run = shared.cli("run", "--name", name, "--model", model, "clean up", input_text="")
    assert run.returncode == 0, run.stderr
    assert "not answered (no terminal to ask; --answer TEXT answers it)" in run.stderr
    results = [m for m in json.loads(shared.cli("history", name, "--json").stdout)["messages"] if m["role"] == "tool"]
    assert results[0]["is_error"] is True
    assert "no one could be asked" in results[0]["content"]
    assert "yes" not in results[0]["content"]

    given = unique("told")
    run = shared.cli("run", "--name", given, "--answer", "no", "--model", model, "clean up", input_text="")
    assert run.returncode == 0, run.stderr
    told = [m for m in json.loads(shared.cli("history", given, "--json").stdout)["messages"] if m["role"] == "tool"]
    assert told[0]["content"] == "The user answered: no"


# --- small things a person meets -----------------------------------------------------------------------------


def test_an_empty_prompt_and_an_unknown_option_are_usage_errors_of_weald_run(shared: DaemonProcess) -> None:
    empty = shared.cli("run", "  ")
    assert empty.returncode == 2
    assert empty.stderr.strip() == "weald run: the prompt is empty: say what the agent should do"
    bogus = shared.cli("run", "--bogus", "x")
    assert bogus.returncode == 2
    assert bogus.stderr.startswith("usage: weald run ")
    assert "unrecognized arguments: --bogus" in bogus.stderr
    nested = shared.cli("agent", "stop", "--bogus")
    assert nested.stderr.startswith("usage: weald agent stop ")
    depth = shared.cli("tree", "--depth", "-1")
    assert depth.returncode == 2
    assert "argument --depth: expected 0 or more, got -1" in depth.stderr
    both = shared.cli("run", "--agent", "x", "--keep", "hi")
    assert both.returncode == 2
    assert "--keep applies to a new agent" in both.stderr


def test_tasks_says_when_there_are_none_refuses_a_missing_project_and_draws_a_tree(shared: DaemonProcess) -> None:
    project = shared.root / unique("tasks-project")
    project.mkdir()
    none = shared.cli("tasks", "--cwd", str(project))
    assert none.returncode == 0
    assert none.stdout.strip() == f"no tasks for {project}"
    missing = shared.cli("tasks", "--cwd", "/nonexistent/project")
    assert missing.returncode == 2
    assert missing.stderr.strip() == "weald tasks: --cwd /nonexistent/project: no such directory"

    model = shared.script(
        unique("planner"),
        [
            {
                "tool_calls": [
                    {
                        "name": "tasks",
                        "arguments": {
                            "action": "batch",
                            "operations": [
                                {"op": "insert", "ref": "top", "title": "ship it"},
                                {"op": "insert", "title": "write tests", "parent_id": "top"},
                            ],
                        },
                    }
                ]
            },
            {"text": "planned"},
        ],
    )
    run = shared.cli("run", "--cwd", str(project), "--model", model, "plan")
    assert run.returncode == 0, run.stderr + run.stdout
    tree = shared.cli("tasks", "--cwd", str(project), "--view", "tree")
    assert tree.returncode == 0, tree.stderr
    lines = tree.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if "ship it" in line)
    sub = next(i for i, line in enumerate(lines) if "write tests" in line)
    assert sub > top
    indent = len(lines[sub]) - len(lines[sub].lstrip("│├└─ "))
    assert indent > len(lines[top]) - len(lines[top].lstrip("│├└─ "))  # nested under its parent


def test_status_says_in_words_what_a_missing_value_means(shared: DaemonProcess) -> None:
    status = shared.cli("status")
    assert status.returncode == 0, status.stderr
    assert "null" not in status.stdout
    assert "no limit" in status.stdout
    assert "none (writes reach the store)" in status.stdout


def test_stop_says_the_daemon_stopped(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    try:
        d.start()
        assert d.proc is not None
        pid = d.proc.pid
        stopped = d.cli("stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.strip() == f"stopped the weald daemon (pid {pid})"
        assert d.proc.wait(60) == 0
        d.proc = None
    finally:
        d.close()
