"""The ``weald`` command through real subprocesses: its exit codes, its errors and its ``--json`` output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

#: The installed console script: what a person types.
WEALD = Path(sys.executable).with_name("weald")


def weald(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real ``weald`` executable and wait for it to exit."""
    assert WEALD.exists(), f"the weald console script is not installed next to {sys.executable}"
    return subprocess.run(
        [str(WEALD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def isolated_env(tmp_path: Path, config: str = "") -> dict[str, str]:
    """An environment whose weald.toml is ``config`` (in ``tmp_path``), with the store and socket there too."""
    toml = tmp_path / "weald.toml"
    toml.write_text(
        f'[store]\npath = "{tmp_path / "store.db"}"\n[server]\nsocket = "{tmp_path / "weald.sock"}"\n' + config
    )
    env = dict(os.environ, WEALD_CONFIG=str(toml))
    env.pop("WEALD_SOCKET", None)
    return env


# --- weald serve: a bad fault file ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        (
            "bad.toml",
            '[[faults]]\ntarget = "actor"\nkind = "explode"\n',
            'faults[0].kind: expected "crash", "delay", "drop" or "fatal_signal", got "explode"',
        ),
        ("missing.toml", None, "no such file"),
        ("bad.json", '{"faults": [', "invalid JSON: Expecting value (at line 1, column 13)"),
    ],
    ids=["invalid-declaration", "missing-file", "invalid-json"],
)
def test_serve_with_a_bad_fault_file_says_what_is_wrong_in_one_line_and_exits_2(
    tmp_path: Path, name: str, content: str | None, problem: str
) -> None:
    faults = tmp_path / name
    if content is not None:
        faults.write_text(content)
    run = weald("serve", "--faults", str(faults), cwd=tmp_path, env=isolated_env(tmp_path), timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"weald serve: bad fault file: {faults}: {problem}"]
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "weald.sock").exists()


def test_serve_with_a_bad_fault_file_named_in_weald_toml_fails_the_same_way(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, '[faults]\nenabled = true\nfile = "nowhere.toml"\n')
    run = weald("serve", cwd=tmp_path, env=env, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"weald serve: bad fault file: {tmp_path / 'nowhere.toml'}: no such file"]


# --- weald config: mistakes are reported, not dropped -----------------------------------------------


def test_a_misspelt_option_of_a_built_in_tool_fails_weald_config_with_its_path(tmp_path: Path) -> None:
    run = weald("config", "--json", cwd=tmp_path, env=isolated_env(tmp_path, "[tools.shell]\ntimout = 5\n"))
    assert run.returncode == 2
    assert run.stdout == ""
    assert (
        f"  {tmp_path / 'weald.toml'}: tools.shell.timout: unknown option; did you mean timeout? "
        "(known options: env, env_keep, hidden, kill_grace, network, readable, sandbox, timeout, writable)"
    ) in run.stderr.splitlines()


def test_config_errors_are_printed_as_written_on_one_line_each(tmp_path: Path) -> None:
    # "[tools]" and "[tools.NAME]" in the message are text, not rich markup; long lines are not wrapped.
    run = weald("config", cwd=tmp_path, env=isolated_env(tmp_path, "[tools]\nzzzz = 1\n"))
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "invalid configuration (1 problem):",
        f"  {tmp_path / 'weald.toml'}: tools.zzzz: unknown key; [tools] takes enabled, max_output_bytes, "
        "max_output_lines, modules, permission_timeout, permissions, timeouts (a [tools.NAME] table holds a tool's options)",
    ]


def test_weald_config_json_is_the_merged_configuration(tmp_path: Path) -> None:
    run = weald("config", "--json", cwd=tmp_path, env=isolated_env(tmp_path, "[agent]\nmax_steps = 7\n"))
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    assert shown["files"] == [str(tmp_path / "weald.toml")]
    assert shown["config"]["agent"]["max_steps"] == 7
    assert shown["config"]["limits"] == {
        "max_agents": 20000,
        "max_message_bytes": 16 * 1024 * 1024,
        "max_buffered_bytes": 64 * 1024 * 1024,
        "hibernate_after": 600.0,
    }


# --- weald demo ----------------------------------------------------------------------------------------


def test_weald_demo_runs_to_the_end_and_every_check_holds(tmp_path: Path) -> None:
    run = weald("demo", cwd=tmp_path, env=isolated_env(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks held" in run.stdout
    assert "scripted" in run.stdout  # it says plainly that the model is scripted
    assert "api_key_env" in run.stdout  # and how to use a real one


def test_weald_demo_json_reports_each_check(tmp_path: Path) -> None:
    run = weald("demo", "--json", cwd=tmp_path, env=isolated_env(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["ok"] is True
    assert len(report["checks"]) >= 10
    assert [c for c in report["checks"] if not c["ok"]] == []
    assert {c["check"] for c in report["checks"]} >= {
        "an injected tool crash became an error result",
        "the agent crashed mid-turn and the turn was reported interrupted",
        "the daemon stopped cleanly (exit 0)",
    }
    assert report["tree"]["path"] == "/"
    fired = {f["id"]: f["fires"] for f in report["faults"]["faults"]}
    assert fired == {"grep-crash": 1, "kill-job": 1, "agent-crash": 1}


# --- weald run: the exit code says how the turn ended -------------------------------------------------


def test_weald_run_exits_0_when_the_turn_succeeds_and_1_when_it_fails(daemon: DaemonProcess) -> None:
    fine = daemon.script("fine", [{"text": "all good"}])
    run = daemon.cli("run", "--model", fine, "hello")
    assert run.returncode == 0, run.stderr
    assert "all good" in run.stdout

    failing = daemon.script("failing", [{"error": {"status": 500, "message": "upstream overloaded"}}])
    run = daemon.cli("run", "--model", failing, "hello")
    assert run.returncode == 1
    assert "turn ended:" in run.stderr
    assert "upstream overloaded" in run.stderr

    run = daemon.cli("run", "--json", "--model", failing, "hello")
    assert run.returncode == 1
    result = json.loads(run.stdout)
    assert result["ok"] is False
    assert "upstream overloaded" in result["error"]


def test_weald_run_streams_the_answer_and_each_tool_call_with_its_outcome(daemon: DaemonProcess) -> None:
    (daemon.project / "notes.txt").write_text("one\ntwo\n")
    model = daemon.script(
        "activity",
        [
            {
                "text": "reading",
                "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "notes.txt"}},
                    {"name": "read_file", "arguments": {"path": "missing.txt"}},
                ],
            },
            {"text": "notes.txt has 2 lines."},
        ],
    )
    run = daemon.cli("run", "--model", model, "count lines")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["reading", "notes.txt has 2 lines."]
    activity = run.stderr.splitlines()
    assert '▶ read_file {"path": "notes.txt"}' in activity
    assert '▶ read_file {"path": "missing.txt"}' in activity
    assert any(line.startswith("✓ read_file ") for line in activity), activity
    assert any(line.startswith("✗ read_file ") for line in activity), activity  # the missing file
    assert any("2 steps" in line for line in activity), activity

    quiet = daemon.cli("run", "--quiet", "--model", model, "count lines")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines() == ["notes.txt has 2 lines."]  # the answer only, not the first step's text
    assert "read_file" not in quiet.stderr

    one = daemon.script("one-step", [{"text": "done"}])
    single = daemon.cli("run", "--model", one, "hi")
    assert any(" 1 step " in line for line in single.stderr.splitlines()), single.stderr


def test_weald_run_with_no_terminal_tells_the_model_nobody_was_asked(daemon: DaemonProcess) -> None:
    model = daemon.script(
        "writer",
        [
            {
                "text": "Writing the file now.",
                "tool_calls": [{"name": "write_file", "arguments": {"path": "new.txt", "content": "x"}}],
            },
            {"text": "gave up"},
        ],
    )
    run = daemon.cli("run", "--json", "--model", model, "write it", input_text="")  # stdin is not a terminal
    assert run.returncode == 0, run.stderr
    assert "not running write_file" in run.stderr
    assert not (daemon.project / "new.txt").exists()
    agent_id = json.loads(run.stdout)["agent_id"]
    with daemon.client() as client:
        history = client.call("agent.history", {"agent_id": agent_id})
    tool_results = [m["content"] for m in history["messages"] if m["role"] == "tool"]
    assert len(tool_results) == 1
    assert "no one could be asked: run with a terminal, or allow it in weald.toml" in tool_results[0]
    assert "denied by the user" not in tool_results[0]


def test_weald_run_fails_when_the_model_runs_out_of_script(daemon: DaemonProcess) -> None:
    short = daemon.script("short", [{"tool_calls": [{"name": "glob", "arguments": {"pattern": "*.txt"}}]}])
    run = daemon.cli("run", "--json", "--model", short, "look around")
    assert run.returncode == 1
    result = json.loads(run.stdout)
    assert result["ok"] is False
    assert "has none" in result["error"]


def test_weald_run_fails_when_there_is_no_such_agent(daemon: DaemonProcess) -> None:
    run = daemon.cli("run", "--agent", "nobody", "hello")
    assert run.returncode == 1
    assert "nobody" in run.stderr


# --- weald tree: faults where they fired ---------------------------------------------------------------

FAULTS = """
seed = 3

[[faults]]
id = "read-crash"
target = "tool"
kind = "crash"
tool = "read_file"
count = 1

[[faults]]
id = "agent-crash"
target = "actor"
kind = "crash"
path = "/sessions/*/agent"
message = "ToolResults"
count = 1
"""


def test_weald_tree_draws_the_faults_fired_at_each_node(tmp_path: Path) -> None:
    faults = tmp_path / "faults.toml"
    faults.write_text(FAULTS)
    d = DaemonProcess(tmp_path / "d", faults=faults)
    d.start()
    try:
        model = d.script(
            "crashy",
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"text": "after the restart"},
            ],
        )
        run = d.cli("run", "--json", "--keep", "--model", model, "read the notes")
        assert run.returncode == 1, run.stderr  # the turn was interrupted by the agent's crash
        agent_id = json.loads(run.stdout)["agent_id"]

        tree = d.cli("tree", "--path", f"/sessions/{agent_id}")
        assert tree.returncode == 0, tree.stderr
        lines = {line.split()[1]: line for line in tree.stdout.splitlines()[1:] if len(line.split()) > 1}
        assert lines["tool_runner"].endswith("ToolRunner running faults=1")
        assert lines["agent"].endswith("Agent running restarts=1 faults=1")
        assert "faults=" not in lines["sub_agents"]

        drawn = json.loads(d.cli("tree", "--json", "--path", f"/sessions/{agent_id}").stdout)
        by_name = {child["path"].rsplit("/", 1)[-1]: child for child in drawn["children"]}
        assert (by_name["tool_runner"]["faults"], by_name["agent"]["faults"]) == (1, 1)
        assert "faults" not in by_name["sub_agents"]
        assert d.terminate() == 0, d.log.read_text()
    finally:
        d.close()


# --- --help everywhere, --json that parses -------------------------------------------------------------

COMMANDS = ["serve", "run", "agents", "tree", "debug-state", "tasks", "demo", "status", "stop", "config"]


def test_every_command_has_help(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    top = weald("--help", cwd=tmp_path, env=env)
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        helped = weald(command, "--help", cwd=tmp_path, env=env)
        assert helped.returncode == 0, helped.stderr
        assert f"usage: weald {command}" in helped.stdout
        assert "--json" in helped.stdout
        assert "``" not in helped.stdout, f"weald {command} --help shows docstring markup"


# --- what a person reads: tables and panels, never a Python repr ---------------------------------------

PYTHON_REPR = ("{'", "': ", "True", "False", "None")


def _no_python_repr(text: str) -> None:
    for mark in PYTHON_REPR:
        assert mark not in text, f"{mark!r} in:\n{text}"


def test_status_debug_state_and_config_read_as_tables(daemon: DaemonProcess) -> None:
    model = daemon.script("one", [{"text": "one step"}])
    agent_id = json.loads(daemon.cli("run", "--json", "--keep", "--model", model, "hi").stdout)["agent_id"]

    status = daemon.cli("status")
    assert status.returncode == 0, status.stderr
    _no_python_repr(status.stdout)
    assert "weald daemon running" in status.stdout
    assert "turns.running" in status.stdout

    agent = daemon.cli("debug-state", agent_id)
    assert agent.returncode == 0, agent.stderr
    _no_python_repr(agent.stdout)
    assert f"/sessions/{agent_id}/agent" in agent.stdout
    assert "one step" in agent.stdout  # the last message, one line
    whole = daemon.cli("debug-state")
    assert whole.returncode == 0, whole.stderr
    _no_python_repr(whole.stdout)
    assert "events by topic" in whole.stdout
    events = [line for line in whole.stdout.splitlines() if "server.connected" in line]
    assert events, whole.stdout
    assert all(len(line) <= 200 for line in whole.stdout.splitlines()), "an event should fit on one line"

    for args in (("config",), ("config", "show")):
        shown = daemon.cli(*args)
        assert shown.returncode == 0, shown.stderr
        _no_python_repr(shown.stdout.replace("false", "").replace("true", ""))
        assert str(daemon.config) in shown.stdout.replace("\n", "")
        assert "tools.max_output_lines" in shown.stdout
    assert json.loads(daemon.cli("config", "show", "--json").stdout)["files"] == [str(daemon.config)]


def test_serve_json_prints_one_line_with_the_socket_and_pid(tmp_path: Path) -> None:
    env = isolated_env(tmp_path)
    args = [str(WEALD), "serve", "--json"]
    with subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = json.loads(proc.stdout.readline())
            node = line.pop("node")
            assert line == {
                "socket": str(tmp_path / "weald.sock"),
                "pid": proc.pid,
                "store": str(tmp_path / "store.db"),
            }
            assert node["epoch"] == 1  # the first start of this node on this store
            assert re.fullmatch(r".+-[0-9a-f]{8}", node["node_id"])  # host name, state directory's hash
            stop = weald("stop", "--json", cwd=tmp_path, env=env)
            assert stop.returncode == 0, stop.stderr
            assert proc.wait(60) == 0
            assert proc.stdout.read() == ""  # nothing else on stdout
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_permission_prompt_on_a_terminal_never_lands_inside_the_streamed_text(daemon: DaemonProcess) -> None:
    import pty
    import select

    text = "Writing the file now, in one piece."
    model = daemon.script(
        "prompted",
        [
            {"text": text, "tool_calls": [{"name": "write_file", "arguments": {"path": "new.txt", "content": "x"}}]},
            {"text": "stopped"},
        ],
    )
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "run", "--model", model, "write it"],
        env=daemon.env(),
        cwd=daemon.project,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    seen = b""
    answered = False
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None or select.select([primary], [], [], 0)[0]:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if not select.select([primary], [], [], 0.1)[0]:
                continue
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the child closed its side
                break
            seen += chunk
            if not answered and b"allow? " in seen:
                os.write(primary, b"n\n")
                answered = True
        assert proc.wait(30) == 0
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    shown = seen.decode(errors="replace").replace("\r", "")
    assert answered, shown
    before_prompt = shown.split("wants to run")[0]
    assert text in before_prompt.splitlines(), shown  # whole, on its own line, before the prompt
    assert not (daemon.project / "new.txt").exists()
