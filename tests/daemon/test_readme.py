"""The README as a newcomer uses it: its tour, run from a fresh clone; its CLI table and the docs against ``--help``.

The tour is the README's block between ``<!-- tour -->`` and ``<!-- /tour -->``,
run as it is written (bash, in an empty directory of a fresh ``git clone`` of
this checkout) with the ``weald`` this environment installed from it, and a
private ``WEALD_HOME``. What the README says the reader will see is checked.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from weald.runtime.daemon.cli import COMMAND_GROUPS, build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def block(text: str, marker: str) -> str:
    found = re.search(rf"<!-- {marker} -->\n(.*?)<!-- /{marker} -->", text, re.DOTALL)
    assert found, f"README.md has no <!-- {marker} --> block"
    return found.group(1)


def test_the_readme_tour_runs_as_written_from_a_fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.mktemp("tour")
    clone = base / "clone"
    done = subprocess.run(
        ["git", "clone", "--quiet", str(ROOT), str(clone)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    script = block((clone / "README.md").read_text(), "tour")
    script = script.strip().removeprefix("```sh").removesuffix("```")
    work = clone / "weald-tour"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("WEALD_CONFIG", "WEALD_SOCKET")}
    env["WEALD_HOME"] = str(base / "home")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    assert shutil.which("weald", path=env["PATH"]), "the weald command is not installed beside this Python"
    tour = subprocess.run(
        ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    out = tour.stdout + tour.stderr
    try:
        assert tour.returncode == 0, out  # the last command, weald stop, stopped the daemon
        (url,) = [line for line in tour.stdout.splitlines() if line.startswith("http://127.0.0.1:")]
        assert "notes.txt has 3 lines: alpha, beta and gamma." in tour.stdout
        assert '▶ read_file {"path": "notes.txt"}' in tour.stderr
        assert "injected fault" in tour.stdout
        assert "agent restarted by its supervisor (restart 1)" in tour.stderr
        # The interrupted turn still reports the tokens its model call used (it said 0 in / 0 out).
        assert re.search(r"agent crashy · 1 step · [1-9][\d,]* in / [1-9][\d,]* out tokens", tour.stderr), out
        assert "the agent crashed (InjectedFault: injected fault 'actor-crash-1'" in tour.stderr
        assert re.search(r"agent Agent running restarts=1 faults=1", tour.stdout), out
        assert "> what is in notes.txt?" in tour.stdout  # the history, after the crash
        assert re.search(r"^actor-crash-1\s+1\s", tour.stdout, re.MULTILINE), out
        assert (work / "session.json").is_file()
        assert tour.stdout.count("notes.txt has 3 lines: alpha, beta and gamma.") == 3  # run, record, replay
        assert "stopped the weald daemon" in tour.stdout
        assert "Traceback" not in out
        assert "InjectedFault(" not in out
    finally:
        subprocess.run(["weald", "stop"], cwd=work, env=env, capture_output=True, timeout=120, check=False)
    with pytest.raises(OSError):  # the observer went with the daemon
        urllib.request.urlopen(url, timeout=5)


def test_the_readme_lists_the_commands_weald_help_lists_in_the_same_words() -> None:
    rows = re.findall(r"^\| `weald ([\w-]+)` \| (.*) \|$", block(README.read_text(), "cli"), re.MULTILINE)
    listed = {name: text.replace("\\|", "|") for name, text in rows}
    grouped = {name: text for _, commands in COMMAND_GROUPS for name, text in commands}
    assert listed == grouped
    helped = subprocess.run(
        [sys.executable, "-m", "weald.runtime.daemon.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name, text in grouped.items():
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(text)}$", helped, re.MULTILINE), name
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    shown = set(re.findall(r"^  ([\w-]+)  ", helped, re.MULTILINE))
    hidden = {name for name in commands if name not in shown}
    assert hidden <= {"compact"}, f"commands weald --help does not list: {hidden}"


def _options(parser: argparse.ArgumentParser, words: list[str]) -> set[str] | None:
    """The options the command ``words`` names takes (None: ``words[0]`` is no command)."""
    current, depth = parser, 0
    for word in words:
        sub = next((a for a in current._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        current, depth = sub.choices[word], depth + 1
    if depth == 0:
        return None
    return {flag for action in current._actions for flag in action.option_strings}


DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_every_weald_command_line_in_the_docs_is_one_weald_accepts(doc: Path) -> None:
    parser = build_parser()
    text = doc.read_text()
    spans: list[str] = []
    fence: str | None = None  # the language of the fenced block we are in
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else (line.strip().removeprefix("```") or "plain")
            continue
        if fence is None:
            spans += [part for part in line.split("`")[1::2] if part.startswith("weald ")]  # inside `...`
        elif fence in ("sh", "console", "bash", "shell"):
            command = re.match(r"^\s*(?:\$ )?(weald [^#]*)", line)
            if command:
                spans.append(command.group(1).strip())
    checked = 0
    for span in spans:
        words = span.split()[1:]
        if not words or not re.fullmatch(r"[a-z][\w-]*", words[0]):
            continue
        options = _options(parser, [w for w in words if not w.startswith("-")][:2])
        assert options is not None, f"{doc.name}: `{span}`: weald has no command {words[0]!r}"
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span):
            assert flag in options, f"{doc.name}: `{span}`: weald {words[0]} has no option {flag}"
        checked += 1
    if doc == README:
        assert checked > 20
