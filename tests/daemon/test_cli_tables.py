"""What ``weald`` prints at 80 and 200 columns: ids and values a command needs are never cut.

Long values wrap, and a narrow terminal drops the less useful columns first
(as ``kubectl get`` and ``docker ps`` do). Paths given to ``weald run`` are the
user's, whatever directory the daemon runs in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from daemon_harness import DaemonProcess, serving

LONG_NAME = "a-readable-agent-name-that-is-long-enough-to-hurt"
LONG_ARGS = ["-y", "@modelcontextprotocol/server-filesystem", "/srv/projects/a-directory-with-a-long-name/src"]
CONFIG = f"""
[mcp.servers.files]
command = "npx"
args = {json.dumps(LONG_ARGS)}
enabled = false
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with serving(tmp_path_factory.mktemp("cli-tables"), extra_config=CONFIG) as proc:
        deep = proc.project / "a" / "rather" / "deep" / "working" / "directory" / "for" / "the" / "agent"
        deep.mkdir(parents=True)
        model = proc.script("tables", [{"text": "ok"}, {"text": "ok"}])
        run = proc.cli("run", "--name", LONG_NAME, "--cwd", str(deep), "--model", model, "summarize the release notes")
        assert run.returncode == 0, run.stderr
        yield proc


def squeezed(text: str) -> str:
    """The output without whitespace and table rules: what is left of wrapped values, in order."""
    return re.sub(r"[\s│─━┃┼╇╈┡┩]+", "", text)


@pytest.mark.parametrize("columns", [80, 200])
def test_agents_never_cut_an_id_and_drop_columns_when_narrow(shared: DaemonProcess, columns: int) -> None:
    shown = shared.cli("agents", columns=columns)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert all(len(line) <= columns for line in lines), shown.stdout
    assert any(line.startswith(LONG_NAME + " ") for line in lines), shown.stdout  # whole, on one line
    assert "…" not in squeezed(shown.stdout).split(LONG_NAME)[0]
    heading = lines[0]
    assert heading.split()[:2] == ["agent", "state"]
    if columns == 200:
        assert {"first", "prompt", "working", "dir", "model", "context", "restarts"} <= set(heading.split())
        assert "summarize the release notes" in shown.stdout
        start, end = heading.index("working dir"), heading.index("model")
        column = "".join(line[start:end].strip() for line in lines[2:])  # the column's wrapped lines, joined
        assert column.endswith("/a/rather/deep/working/directory/for/the/agent"), column
    else:
        assert "restarts" not in heading  # dropped first
        assert "first prompt" in heading  # kept: it says what the agent is for


@pytest.mark.parametrize("columns", [80, 200])
def test_config_show_wraps_long_values_and_cuts_none(shared: DaemonProcess, columns: int) -> None:
    shown = shared.cli("config", "show", columns=columns)
    assert shown.returncode == 0, shown.stderr
    assert all(len(line) <= columns for line in shown.stdout.splitlines())
    assert "…" not in shown.stdout
    lines = shown.stdout.splitlines()
    heading = next(line for line in lines if line.split()[:2] == ["key", "value"])
    start, end = heading.index("value"), heading.index("from")
    first = next(i for i, line in enumerate(lines) if line.split() and line.split()[0] == "mcp.servers.files.args")
    value = ""
    for line in lines[first:]:
        if value and line[:start].strip():
            break  # the next key
        value += line[start:end].strip()
    assert squeezed(value) == squeezed(json.dumps(LONG_ARGS, ensure_ascii=False))  # wrapped, whole


def test_debug_state_events_do_not_repeat_the_ids_their_source_names(shared: DaemonProcess) -> None:
    shown = shared.cli("debug-state", LONG_NAME, "--events", "30", columns=80)
    assert shown.returncode == 0, shown.stderr
    assert all(len(line) <= 80 for line in shown.stdout.splitlines())
    assert f"/sessions/{LONG_NAME}" in squeezed(shown.stdout)
    assert "session_id=" not in shown.stdout
    assert f"agent_id={LONG_NAME}" not in shown.stdout
    assert "turn_id=" in squeezed(shown.stdout)  # what the source does not say is still there


@pytest.mark.parametrize("columns", [80, 200])
def test_status_fits_and_reads_in_words(shared: DaemonProcess, columns: int) -> None:
    shown = shared.cli("status", columns=columns)
    assert shown.returncode == 0, shown.stderr
    assert all(len(line) <= columns for line in shown.stdout.splitlines())
    assert "null" not in shown.stdout


def test_record_and_replay_paths_are_the_users_not_the_daemons(shared: DaemonProcess) -> None:
    here = shared.root / "elsewhere"  # the user's directory; the daemon runs in its project
    here.mkdir()
    (here / "scripts").mkdir()
    (here / "scripts" / "hello.json").write_text(json.dumps({"turns": [{"text": "hello from a relative script"}]}))
    recorded = shared.cli("run", "--model", "scripted:scripts/hello.json", "--record", "session.json", "hi", cwd=here)
    assert recorded.returncode == 0, recorded.stderr
    assert (here / "session.json").is_file()
    replayed = shared.cli("run", "--model", "scripted:session.json", "hi", cwd=here)
    assert replayed.returncode == 0, replayed.stderr
    assert "hello from a relative script" in replayed.stdout
