"""Text from a model, a tool or a server reaches the terminal shown, never obeyed.

A model (or a tool's output, or an MCP server's error) can hold the bytes a
terminal acts on: ``ESC [2K`` erases the line, ``ESC ] 0;`` sets the window
title, ``ESC ] 52;`` writes the clipboard, ``ESC [2J`` clears the screen, the
one-byte C1 ``CSI`` does the same, and U+202E turns the rest of a line around.
Every command below is the real ``weald`` executable against a real daemon;
the permission prompt is read through a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, serving
from weald.runtime.daemon._render import PrintableFormatter, printable

SCRIPTED_SERVER = Path(__file__).resolve().parents[1] / "mcp" / "scripted_server.py"

# What a hostile text carries: a window title, a clipboard write, a clear screen
# (as ESC [ and as the one-byte C1 CSI), a bell, and a right-to-left override.
PAYLOAD = "\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x1b[H\x9b2J\u202eevil"
# None of these may reach the terminal as they are.
RAW = ("\x1b]0;", "\x1b]52;", "\x1b[2J", "\x1b[H", "\x9b", "\u202e", "\x07")
# What the terminal shows instead.
SHOWN = ("\\x1b]0;owned", "\\x1b]52;c;", "\\x1b[2J", "\\x9b2J", "\\u202eevil")

# Everything a terminal acts on but tab and newline (and, on a terminal, rich's own colours).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def wide(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``weald ARGS`` with room for whole lines (rich cuts table cells to an 80-column width otherwise)."""
    return subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", *args],
        env={**daemon.env(), "COLUMNS": "400"},
        cwd=daemon.project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_shown_not_obeyed(output: str, *, shown: tuple[str, ...] = SHOWN) -> None:
    found = sorted({repr(m.group()) for m in _CONTROL.finditer(output)})
    assert found == [], f"control characters reached the terminal: {found}\n{output!r}"
    for piece in shown:
        assert piece in output, f"{piece!r} is not shown:\n{output}"


def read_pty(proc: subprocess.Popen[bytes], primary: int, answer: bytes, *, timeout: float = 90) -> bytes:
    """Everything the process writes to its terminal; ``answer`` typed at its first ``allow?``."""
    seen = b""
    answered = False
    deadline = time.monotonic() + timeout
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
            os.write(primary, answer)
            answered = True
    assert answered, seen.decode(errors="replace")
    return seen


def test_a_permission_prompt_cannot_be_spoofed_with_terminal_escapes(daemon: DaemonProcess) -> None:
    (daemon.project / "victim").mkdir()
    spoof = "rm -rf victim #\x1b[2K\x1b[200D\x1b[1;33mshell\x1b[0m wants to run: ls -la"
    model = daemon.script(
        "spoofing",
        [
            {
                "text": f"Listing the files. {PAYLOAD}",
                "tool_calls": [{"name": "shell", "arguments": {"command": spoof}}],
            },
            {"text": f"done {PAYLOAD}"},
        ],
    )
    primary, secondary = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "run", "--model", model, "list the files"],
        env={**daemon.env(), "TERM": "xterm-256color", "COLUMNS": "200"},
        cwd=daemon.project,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    try:
        seen = read_pty(proc, primary, b"n\n")
        assert proc.wait(30) == 0
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    shown = seen.decode("utf-8", errors="replace")
    for raw in (*RAW, "\x1b[2K", "\x1b[200D"):
        assert raw not in shown, f"{raw!r} reached the terminal:\n{shown!r}"
    # The prompt's line holds the real command, with the escapes written out.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown).replace("\r", "")  # rich's own colours aside
    prompt = next(line for line in plain.splitlines() if line.startswith("shell wants to run"))
    assert prompt.startswith("shell wants to run: rm -rf victim #\\x1b[2K\\x1b[200D\\x1b[1;33mshell"), prompt
    for piece in SHOWN:
        assert piece in plain, piece  # the streamed text, escaped
    assert (daemon.project / "victim").is_dir()


def test_a_command_of_several_lines_shows_each_line_behind_a_gutter(daemon: DaemonProcess) -> None:
    command = "rm -rf victim\n" + "\n" * 3 + "shell wants to run: ls -la"
    model = daemon.script(
        "lines", [{"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}, {"text": "done"}]
    )
    run = daemon.cli("run", "--model", model, "go", input_text="")  # no terminal: refused, and said so
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    start = lines.index("not running shell: (no terminal to ask; --yes allows it)")
    assert lines[start + 1 : start + 6] == [
        "  │ rm -rf victim",
        "  │ ",
        "  │ ",
        "  │ ",
        "  │ shell wants to run: ls -la",
    ]
    assert not any(line.startswith("shell wants to run") for line in lines)


def test_streamed_answers_tool_lines_agents_debug_state_and_tasks_show_escapes(daemon: DaemonProcess) -> None:
    model = daemon.script(
        f"model{PAYLOAD}",
        [
            {
                "text": f"adding a task {PAYLOAD}",
                "tool_calls": [
                    {"name": "tasks", "arguments": {"action": "insert", "title": f"task {PAYLOAD}"}},
                    {"name": "read_file", "arguments": {"path": f"missing{PAYLOAD}"}},
                ],
            },
            {"text": f"the answer {PAYLOAD}"},
        ],
    )
    streamed = daemon.cli("run", "--keep", "--model", model, "go")
    assert streamed.returncode == 0, streamed.stderr
    (agent_id,) = [a["agent_id"] for a in json.loads(daemon.cli("agents", "--json").stdout)]
    assert_shown_not_obeyed(streamed.stdout)
    assert_shown_not_obeyed(streamed.stderr)  # the tool lines: its arguments and its error

    tasks = wide(daemon, "tasks")
    assert tasks.returncode == 0, tasks.stderr
    assert_shown_not_obeyed(tasks.stdout)  # the task's title

    agents = wide(daemon, "agents")
    assert agents.returncode == 0, agents.stderr
    assert_shown_not_obeyed(agents.stdout)  # the model's name

    state = wide(daemon, "debug-state", agent_id)
    assert state.returncode == 0, state.stderr
    assert_shown_not_obeyed(state.stdout, shown=("\\x1b]0;owned",))  # the messages (cut at 100 characters)


def test_what_mcp_servers_say_is_shown_escaped_by_mcp_list_and_tree(tmp_path: Path) -> None:
    config = f"""
[mcp.servers.hostile]
command = "{sys.executable}"
args = ["{SCRIPTED_SERVER}", "--fail-at-start", {json.dumps(PAYLOAD)}]

[mcp.servers.chatty]
command = "{sys.executable}"
args = ["{SCRIPTED_SERVER}"]

[tools.permissions]
mcp__chatty__log = "allow"
"""
    with serving(tmp_path, extra_config=config) as daemon:
        daemon.wait_mcp("chatty")
        model = daemon.script(
            "logger",
            [{"tool_calls": [{"name": "mcp__chatty__log", "arguments": {"message": PAYLOAD}}]}, {"text": "logged"}],
        )
        run = daemon.cli("run", "--model", model, "log it")
        assert run.returncode == 0, run.stderr
        listed = wide(daemon, "mcp", "list")
        assert listed.returncode == 0, listed.stderr
        assert_shown_not_obeyed(listed.stdout, shown=("\\x1b]0;owned",))  # the failing server's arguments
        tree = wide(daemon, "tree")
        assert tree.returncode == 0, tree.stderr
        assert_shown_not_obeyed(tree.stdout, shown=("log warning: \\x1b]0;owned",))  # the server's last log line


@pytest.mark.parametrize("command", [["config"], ["mcp", "list"]])
def test_configuration_values_are_shown_escaped(tmp_path: Path, command: list[str]) -> None:
    config = f"""
[tools.permissions.shell]
{json.dumps("echo " + PAYLOAD)} = "allow"

[mcp.servers.odd]
command = {json.dumps("server" + PAYLOAD)}
enabled = false
"""
    daemon = DaemonProcess(tmp_path, extra_config=config)
    shown = wide(daemon, *command)
    assert shown.returncode == 0, shown.stderr
    assert_shown_not_obeyed(shown.stdout + shown.stderr, shown=("\\x1b]0;owned",))


def test_printable_writes_out_every_character_that_steers_a_terminal_and_keeps_the_rest() -> None:
    steering = "".join(chr(c) for c in [*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)])
    steering += "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ud800\udfff"
    shown = printable(steering)
    assert _CONTROL.search(shown) is None
    assert shown.isascii()
    assert shown.count("\\") == len(steering)  # one escape each
    kept = "tab\there\nnew line, é, 漢字, 👩\u200d💻, [bold]markup[/bold] \\x1b"
    assert printable(kept) == kept
    assert printable("ok\x1b[2K") == "ok\\x1b[2K"
    assert printable("\u202e") == "\\u202e"
    assert printable(3) == "3"


def test_the_daemons_log_lines_are_printable() -> None:
    import logging

    record = logging.LogRecord("weald", logging.WARNING, __file__, 1, "server said %s", (PAYLOAD,), None)
    line = PrintableFormatter("weald serve: %(levelname)s: %(message)s").format(record)
    assert _CONTROL.search(line) is None
    assert line.startswith("weald serve: WARNING: server said \\x1b]0;owned")
