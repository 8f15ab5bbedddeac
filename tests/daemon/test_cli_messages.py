"""Every error path of the ``weald`` command that a test can reach, read as a person reads it.

Each must fail with its exit status and say in words, on one line, what went
wrong: no traceback, no Python repr, no JSON-RPC method name (a person types
``weald agents``, not ``agent.list``).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess, serving

ROOT = Path(__file__).parents[2]

#: The protocol's method names, from docs/protocol.md's headings: none may reach a person.
METHODS = sorted(
    set(re.findall(r"^### ([a-z_]+(?:\.[a-z_]+)+)\s*$", (ROOT / "docs" / "protocol.md").read_text(), re.M))
    | {"debug_state"},
    key=len,
    reverse=True,
)
METHOD = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, METHODS)) + r")(?![\w-])")
PYTHON = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception|Fault)\(|\{'|\bNone\b|\bTrue\b|\bFalse\b")


def says_in_cli_terms(stderr: str, *, lines: int = 1) -> None:
    text = stderr.strip()
    assert text, "the error says nothing"
    assert len(text.splitlines()) == lines, f"expected {lines} line(s):\n{stderr}"
    assert not PYTHON.search(text), f"Python leaks into:\n{stderr}"
    found = METHOD.search(text)
    assert found is None, f"the protocol method {found.group(1)!r} reaches the user:\n{stderr}"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("cli-messages")) as proc:
        yield proc


AGAINST_A_DAEMON = [
    (("run", "--agent", "nope", "hi"), 1, "weald agents"),
    (("prompt", "nope", "hi"), 1, "weald agents"),
    (("abort", "nope"), 1, "weald agents"),
    (("history", "nope"), 1, "nope"),
    (("agent", "stop", "nope"), 1, "weald agents --all"),
    (("compact", "nope"), 1, "weald agents"),
    (("debug-state", "nope"), 1, "weald agents"),
    (("tree", "--path", "/nope"), 1, "/nope"),
    (("tasks", "--agent", "nope"), 1, "nope"),
    (("events", "--agent", "nope"), 1, "weald agents"),
    (("fault", "list"), 1, "--faults"),
    (("fault", "inject", "target=tool", "kind=crash"), 1, "--faults"),
    (("fault", "clear"), 1, "--faults"),
    (("answer", "nope", "allow"), 1, "weald permissions"),
    (("observe",), 1, "--http"),
    (("run", "--model", "scripted:no/such/script.json", "hi"), 1, "no/such/script.json"),
    (("run", "--cwd", "/nonexistent/dir", "hi"), 2, "/nonexistent/dir"),
    (("run", ""), 2, "empty"),
    (("tree", "--depth", "-1"), 2, "--depth"),
    (("history", "x", "--limit", "many"), 2, "--limit"),
]


@pytest.mark.parametrize(("args", "status", "names"), AGAINST_A_DAEMON, ids=[" ".join(a[0]) for a in AGAINST_A_DAEMON])
def test_each_error_against_a_daemon_is_one_line_in_cli_terms(
    shared: DaemonProcess, args: tuple[str, ...], status: int, names: str
) -> None:
    done = shared.cli(*args)
    assert done.returncode == status, done.stderr
    assert names in done.stderr
    if status == 2 and done.stderr.startswith("usage:"):  # argparse's: its usage, then the error
        says_in_cli_terms(done.stderr.splitlines()[-1])
    else:
        says_in_cli_terms(done.stderr)


def test_a_missing_script_is_named_by_its_absolute_path_from_the_users_directory(shared: DaemonProcess) -> None:
    done = shared.cli("run", "--model", "scripted:no/such/script.json", "hi")
    assert str(shared.project / "no" / "such" / "script.json") in done.stderr  # the user's cwd, not the daemon's


WITHOUT_A_DAEMON = [("agents",), ("status",), ("stop",), ("tree",), ("events",), ("abort", "x"), ("permissions",)]


@pytest.mark.parametrize("args", WITHOUT_A_DAEMON, ids=[" ".join(a) for a in WITHOUT_A_DAEMON])
def test_each_command_without_a_daemon_says_how_to_start_one(tmp_path: Path, args: tuple[str, ...]) -> None:
    d = DaemonProcess(tmp_path)  # configured, never started
    done = d.cli(*args)
    assert done.returncode == 1, done.stderr
    assert "start one with `weald serve`" in done.stderr
    says_in_cli_terms(done.stderr)


def test_a_socket_that_never_answers_is_named_with_how_long_weald_waited(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)  # configured, never started: a listener that accepts and stays silent in its place
    d.socket.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(d.socket))
        silent.listen(8)
        done = d.cli("status")
    assert done.returncode == 1, done.stderr
    assert f"the daemon on {d.socket} did not answer within 10 s" in done.stderr
    says_in_cli_terms(done.stderr)


def test_serve_on_a_public_address_says_why_in_one_line(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    done = d.cli("serve", "--socket", str(d.socket), "--http", "0.0.0.0:0", timeout=60)
    assert done.returncode == 1, done.stderr
    assert "the observer listens on loopback only, not 0.0.0.0" in done.stderr
    says_in_cli_terms(done.stderr)


def test_a_bad_fault_file_and_a_bad_configuration_are_named_with_their_path(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, extra_config="[tools]\nzzzz = 1\n")
    done = d.cli("agents")
    assert done.returncode == 2
    assert str(d.config) in done.stderr
    says_in_cli_terms(done.stderr, lines=2)  # the heading, then the problem
    ok = DaemonProcess(tmp_path / "other")
    missing = ok.cli("serve", "--faults", "nowhere.toml", timeout=60)
    assert missing.returncode == 2
    assert f"{ok.project / 'nowhere.toml'}: no such file" in missing.stderr
    says_in_cli_terms(missing.stderr)


def test_the_demo_shows_crashes_as_sentences_not_reprs(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    done = d.cli("demo", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "InjectedFault(" not in done.stdout
    assert "InjectedFault: injected fault 'agent-crash'" in " ".join(done.stdout.split())


def test_mcp_help_shows_no_docstring_markup(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path)
    helped = d.cli("mcp", "--help")
    assert helped.returncode == 0
    assert "``" not in helped.stdout
    assert "`" not in helped.stdout
