"""The examples of docs/tools.md are real: each call, run in order, gives the output shown.

An example is a fenced block whose first line is ``<tool> {json arguments}``
(the JSON may run over several lines), then a blank line, then the output.
The file they work on is the one the first read_file example shows.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from weald.runtime import Store
from weald.tools import SessionServices, ToolContext, default_registry, invoke
from weald.tools._ledger import ReadLedger

DOC = Path(__file__).resolve().parents[2] / "docs" / "tools.md"
_BLOCK = re.compile(r"^```\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CALL = re.compile(r"^([a-z_]+) (\{.*)", re.DOTALL)


def examples() -> list[tuple[str, dict[str, object], str]]:
    found = []
    for block in _BLOCK.findall(DOC.read_text(encoding="utf-8")):
        head, _, output = block.partition("\n\n")
        m = _CALL.match(head)
        if m is None:
            continue
        found.append((m[1], json.loads(m[2]), output.rstrip("\n")))
    return found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.db")
    yield s
    s.close()


def test_the_docs_have_examples_of_the_file_tools() -> None:
    names = [name for name, _, _ in examples()]
    for tool in ("read_file", "edit_file", "write_file", "glob", "shell", "tasks", "memory_set"):
        assert tool in names


def test_every_example_in_docs_tools_gives_the_output_shown(tmp_path: Path, store: Store) -> None:
    project = tmp_path / "project"
    project.mkdir()
    found = examples()
    first_read = next(output for name, _, output in found if name == "read_file")
    content = "".join(line.split("|", 1)[1] + "\n" for line in first_read.split("\n"))
    (project / "app.py").write_text(content)
    session = SessionServices(
        output_dir=tmp_path / "out",
        ledger=ReadLedger(),
        runtime=types.SimpleNamespace(store=store),
    )
    ctx = ToolContext(working_dir=project, session=session)
    for name, arguments, expected in found:
        tool = default_registry.get(name)
        assert tool is not None, name
        result = trio.run(invoke, tool, ctx, arguments)
        assert result.ok, (name, result.output)
        assert result.output == expected, (name, arguments)
