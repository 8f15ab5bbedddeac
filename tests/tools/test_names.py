r"""Names that are not valid UTF-8 (tools/_names.py): shown as ``\xHH``, accepted back, never a crash.

Every file here is real, created with a name of raw bytes; every tool call
goes through `invoke`, which is where the model's view is made safe to encode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from weald.tools import ToolContext, ToolRegistry, ToolResult, tool
from weald.tools._names import show, unescape
from weald.tools.edit_file import edit_file
from weald.tools.glob import glob
from weald.tools.grep import grep
from weald.tools.read_file import read_file
from weald.tools.write_file import write_file

Call = Callable[..., ToolResult]
SHOWN = "bad\\xffname.txt"


def make(project: Path, name: bytes, content: bytes = b"hello needle\n") -> None:
    path = os.fsencode(project) + b"/" + name
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)


def encodable(result: ToolResult) -> None:
    """What the model, the events and the store get must encode as UTF-8 JSON."""
    msgspec.json.encode({"output": result.output, "hints": result.hints, "data": result.data})
    json.dumps(result.output, ensure_ascii=False).encode("utf-8")


@pytest.fixture
def odd(project: Path) -> Path:
    make(project, b"bad\xffname.txt")
    make(project, b"good.txt", b"needle too\n")
    return project


def test_show_escapes_undecodable_bytes_and_unescape_takes_them_back() -> None:
    name = os.fsdecode(b"bad\xff\xfename.txt")
    assert show(name) == "bad\\xff\\xfename.txt"
    assert unescape(show(name)) == name
    assert os.fsencode(unescape(show(name))) == b"bad\xff\xfename.txt"
    assert show("caf\u00e9 \u2603") == "caf\u00e9 \u2603"  # valid text is left alone
    assert show("lone \ud800") == "lone \\ud800"
    assert unescape("plain \\x41 and \\n") == "plain \\x41 and \\n"  # only bytes 80-ff are escapes
    text = "no escapes"
    assert show(text) is text
    assert unescape(text) is text


def test_grep_lists_the_name_escaped(call: Call, odd: Path) -> None:
    result = call(grep, pattern="needle")
    assert result.ok, result.output
    encodable(result)
    assert f"{SHOWN}:1:" in result.output


def test_glob_lists_the_name_escaped_and_matches_an_escaped_pattern(call: Call, odd: Path) -> None:
    listed = call(glob, pattern="*.txt")
    encodable(listed)
    assert SHOWN in listed.output.splitlines()
    assert SHOWN in listed.data["files"]
    for pattern in ["bad\\xff*", "**/bad\\xffname.txt", "*\\xff*"]:
        named = call(glob, pattern=pattern)
        assert named.data["files"] == [SHOWN], (pattern, named.output)


def test_grep_takes_the_escaped_name_as_path_and_include(call: Call, odd: Path) -> None:
    for arguments in [{"path": SHOWN}, {"include": "bad\\xff*"}, {"include": "*\\xff*.txt"}]:
        result = call(grep, pattern="needle", **arguments)
        assert result.ok, (arguments, result.output)
        assert result.output.splitlines()[1:] == [f"{SHOWN}:1:80|hello needle"], arguments


def test_the_file_tools_take_the_escaped_name_back(call: Call, odd: Path) -> None:
    read = call(read_file, path=SHOWN)
    assert read.ok, read.output
    assert read.output == "1:80|hello needle"
    edited = call(edit_file, path=SHOWN, old_string="hello", new_string="goodbye")
    assert edited.ok, edited.output
    encodable(edited)
    written = call(write_file, path="bad\\xffdir/new.txt", content="x\n")  # no such directory: taken literally
    assert written.ok, written.output
    raw = os.fsencode(odd)
    with open(raw + b"/bad\xffname.txt", "rb") as f:
        assert f.read() == b"goodbye needle\n"
    assert (odd / "bad\\xffdir" / "new.txt").read_text() == "x\n"


def test_a_new_file_in_a_directory_named_with_such_bytes_goes_into_it(call: Call, project: Path) -> None:
    make(project, b"dir\xfe/old.txt")
    written = call(write_file, path="dir\\xfe/new.txt", content="new\n")
    assert written.ok, written.output
    encodable(written)
    assert "dir\\xfe/new.txt" in written.output
    with open(os.fsencode(project) + b"/dir\xfe/new.txt", "rb") as f:
        assert f.read() == b"new\n"


def test_a_name_that_really_contains_the_escape_wins(call: Call, project: Path) -> None:
    (project / "bad\\xffname.txt").write_text("the literal one\n")
    make(project, b"bad\xffname.txt", b"the byte one\n")
    assert call(read_file, path=SHOWN).output.endswith("|the literal one")


def test_a_missing_file_suggests_close_names_in_the_escaped_form(call: Call, odd: Path) -> None:
    result = call(read_file, path="bad\\xffnam.txt")
    assert not result.ok
    encodable(result)
    assert f"Did you mean '{SHOWN}'?" in result.output


def test_any_tool_that_returns_such_text_is_made_printable(ctx: ToolContext, call: Call) -> None:
    registry = ToolRegistry()

    @tool(name="lister", description="lists", parameters={"type": "object"}, registry=registry)
    def lister(ctx: ToolContext) -> ToolResult:
        name = os.fsdecode(b"x\x80y")
        return ToolResult.success(f"found {name}", data={"names": [name], name: 1}, hints=[f"open {name}"])

    @tool(name="raiser", description="raises", parameters={"type": "object"}, registry=registry)
    def raiser(ctx: ToolContext) -> Any:
        raise OSError("cannot open " + os.fsdecode(b"z\xc0"))

    listed = call(lister)
    encodable(listed)
    assert listed.output == "found x\\x80y"
    assert listed.data == {"names": ["x\\x80y"], "x\\x80y": 1}
    assert listed.hints == ("open x\\x80y",)
    raised = call(raiser)
    encodable(raised)
    assert "cannot open z\\xc0" in raised.output
