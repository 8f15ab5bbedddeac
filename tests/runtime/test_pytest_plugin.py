"""weald's pytest plugin, used as docs/faults.md tells users to: its example test files, run exactly as written.

Each file is cut from the docs with the pytest configuration shown there, and
run by a fresh pytest (``pytester.runpytest_subprocess``) with weald installed
as users install it: the plugin comes from its ``pytest11`` entry point.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from weald.runtime.testing import DaemonHarness

sys.path.append(str(Path(__file__).resolve().parent))
from fake_openai import FakeOpenAI

DOC = Path(__file__).resolve().parents[2] / "docs" / "faults.md"

pytestmark = pytest.mark.timeout(240)


def doc_block(kind: str, name: str) -> str:
    """The fenced block of docs/faults.md between ``<!-- test-{kind}: {name} -->`` and its end marker."""
    found = re.search(
        rf"<!-- test-{kind}: {re.escape(name)} -->\n```\w+\n(.*?)```\n<!-- /test-{kind} -->", DOC.read_text(), re.DOTALL
    )
    assert found, f"docs/faults.md has no test-{kind} block {name}"
    return found.group(1)


def user_project(pytester: pytest.Pytester, *files: str) -> None:
    (pytester.path / "pyproject.toml").write_text(doc_block("config", "pyproject.toml"))
    for name in files:
        (pytester.path / name).write_text(doc_block("file", name))


def test_the_docs_test_of_a_tool_whose_subprocess_is_killed_passes(pytester: pytest.Pytester) -> None:
    user_project(pytester, "test_line_count.py")

    result = pytester.runpytest_subprocess("-q")

    result.assert_outcomes(passed=1)


def test_the_docs_test_that_replays_a_recording_under_a_fault_passes(pytester: pytest.Pytester) -> None:
    record_the_docs_session(pytester)
    user_project(pytester, "test_count_replay.py")

    result = pytester.runpytest_subprocess("-q")

    result.assert_outcomes(passed=1)


def test_both_docs_tests_pass_in_one_project_each_daemon_with_its_own_tools(pytester: pytest.Pytester) -> None:
    # line_count, defined in one file, does not join the other file's daemon (its replay would diverge).
    record_the_docs_session(pytester)
    user_project(pytester, "test_line_count.py", "test_count_replay.py")

    result = pytester.runpytest_subprocess("-q")

    result.assert_outcomes(passed=2)


def test_a_test_can_ask_for_every_tool_of_the_process(pytester: pytest.Pytester) -> None:
    tool = (
        "from weald.tools import ToolContext, tool\n\n"
        "@tool(name='only_in_a', description='x', parameters={'type': 'object', 'properties': {}})\n"
        "async def only_in_a(ctx: ToolContext) -> str:\n    return 'a'\n\n"
        "def test_a(weald_registry):\n    assert 'only_in_a' in weald_registry\n"
    )
    other = (
        "import pytest\n\n"
        "def test_own(weald_registry):\n    assert 'only_in_a' not in weald_registry\n    assert 'read_file' in weald_registry\n\n"
        "@pytest.mark.weald_shared_tools\n"
        "def test_shared(weald_registry):\n    assert 'only_in_a' in weald_registry\n"
    )
    pytester.makepyfile(test_a=tool, test_b=other)

    result = pytester.runpytest_subprocess("-q", "-p", "weald")

    result.assert_outcomes(passed=3)


def record_the_docs_session(pytester: pytest.Pytester) -> None:
    # The recording the docs' test keeps with it, made as a user makes one: a real daemon, a
    # model behind the OpenAI wire format (a loopback fake here), the same tools.
    recordings = pytester.path / "recordings"
    recordings.mkdir()
    with FakeOpenAI() as model:
        model.tool_calls(("shell", {"command": "sleep 1; wc -l < notes.txt"}), text="Let me count.")
        model.text("notes.txt has 3 lines.")
        provider = {"kind": "openai", "base_url": model.url, "api_key_required": False}
        with DaemonHarness(pytester.path / "recording", config={"providers": {"fake": provider}}) as daemon:
            (daemon.project / "notes.txt").write_text("alpha\nbeta\ngamma\n")
            agent = daemon.start_agent("fake:gpt-test", record=recordings / "count.json")
            assert daemon.prompt(agent, "how many lines has notes.txt?")["ok"]


def test_the_fixtures_stay_off_unless_the_project_asks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_uses_it="def test_it(weald_daemon):\n    pass\n")

    result = pytester.runpytest("-q")  # in this process: the entry point is loaded, and asked for nothing

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*weald_daemon: weald's pytest fixtures are off in this project: turn them on with -p weald*"]
    )
    assert "Traceback" not in result.stdout.str()
