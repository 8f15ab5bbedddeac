from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from weald.tools import ToolContext, ToolError, ToolResult, default_registry
from weald.tools._hashline import line_hash
from weald.tools._ledger import ReadLedger
from weald.tools._sandbox import write_atomic
from weald.tools.edit_file import edit_file
from weald.tools.read_file import read_file
from weald.tools.write_file import write_file

Call = Callable[..., ToolResult]


def umask() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise AssertionError("no Umask in /proc/self/status")


def test_write_file_is_registered_with_its_defaults() -> None:
    tool = default_registry.get("write_file")
    assert tool is write_file
    assert (tool.permission, tool.timeout, tool.kind) == ("ask", 10.0, "write")


def test_a_new_file_is_created_with_its_parent_directories(call: Call, project: Path) -> None:
    result = call(write_file, path="pkg/sub/mod.py", content="x = 1\ny = 2\n")
    assert result.ok, result.output
    path = project / "pkg" / "sub" / "mod.py"
    assert path.read_bytes() == b"x = 1\ny = 2\n"
    assert result.output == "Created pkg/sub/mod.py (12 bytes, 2 lines)."
    assert result.data == {"path": "pkg/sub/mod.py", "bytes": 12, "created": True}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask()


def test_overwriting_needs_a_read_first(call: Call, project: Path) -> None:
    (project / "a.txt").write_bytes(b"old\n")
    result = call(write_file, path="a.txt", content="new\n")
    assert result.output == (
        "a.txt has not been read in this session, so the change was refused: edits must start from the file's "
        "current content. Read it first with read_file, then make the change."
    )
    assert (project / "a.txt").read_bytes() == b"old\n"


def test_overwriting_a_read_file_works_and_says_so(call: Call, project: Path) -> None:
    (project / "a.txt").write_bytes(b"old\n")
    call(read_file, path="a.txt")
    result = call(write_file, path="a.txt", content="brand new\n")
    assert result.ok, result.output
    assert result.output == "Overwrote a.txt (10 bytes, 1 line; it had 4 bytes)."
    assert result.data == {"path": "a.txt", "bytes": 10, "created": False}
    assert (project / "a.txt").read_bytes() == b"brand new\n"


def test_a_file_changed_since_it_was_read_is_not_overwritten(call: Call, project: Path) -> None:
    path = project / "a.txt"
    path.write_bytes(b"old\n")
    call(read_file, path="a.txt")
    path.write_bytes(b"theirs\n")
    result = call(write_file, path="a.txt", content="mine\n")
    assert result.output.startswith("a.txt has changed on disk since you last read it (it is now 7 bytes, was 4)")
    assert path.read_bytes() == b"theirs\n"


def test_crlf_and_bom_of_an_existing_file_are_kept(call: Call, project: Path) -> None:
    path = project / "w.txt"
    path.write_bytes(b"\xef\xbb\xbfold\r\n")
    call(read_file, path="w.txt")
    result = call(write_file, path="w.txt", content="one\ntwo\n")
    assert result.ok, result.output
    assert path.read_bytes() == b"\xef\xbb\xbfone\r\ntwo\r\n"
    assert "Kept the file's CRLF line endings and UTF-8 BOM." in result.output


def test_an_existing_files_mode_is_kept(call: Call, project: Path) -> None:
    path = project / "run.sh"
    path.write_bytes(b"#!/bin/sh\n")
    path.chmod(0o700)
    call(read_file, path="run.sh")
    assert call(write_file, path="run.sh", content="#!/bin/sh\necho hi\n").ok
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_read_only_file_is_not_overwritten(call: Call, project: Path) -> None:
    path = project / "frozen.txt"
    path.write_bytes(b"keep me\n")
    path.chmod(0o444)
    call(read_file, path="frozen.txt")
    result = call(write_file, path="frozen.txt", content="replaced\n")
    assert not result.ok
    assert result.output == (
        "frozen.txt is read-only (mode 444: no write permission for anyone), so it was not changed. "
        "Leave it as it is, or ask the user whether it should be made writable."
    )
    assert path.read_bytes() == b"keep me\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_the_atomic_writer_itself_refuses_a_file_made_read_only_after_it_was_read(
    ctx: ToolContext, project: Path
) -> None:
    path = project / "late.txt"
    path.write_bytes(b"old\n")
    expect = path.stat()
    path.chmod(0o444)  # changes ctime only: the (inode, size, mtime) check still passes
    with pytest.raises(ToolError, match=r"^late\.txt is read-only \(mode 444: no write permission for anyone\)"):
        write_atomic(ctx, "late.txt", b"new\n", expect=expect)
    assert path.read_bytes() == b"old\n"


def test_identical_content_writes_nothing(call: Call, project: Path) -> None:
    path = project / "a.txt"
    path.write_bytes(b"same\n")
    call(read_file, path="a.txt")
    inode = path.stat().st_ino
    result = call(write_file, path="a.txt", content="same\n")
    assert result.output == "a.txt already has exactly this content; nothing was written."
    assert path.stat().st_ino == inode


def test_a_written_file_can_be_edited_at_once(call: Call, project: Path) -> None:
    assert call(write_file, path="n.py", content="a = 1\n").ok
    result = call(edit_file, path="n.py", start=f"1:{line_hash('a = 1')}", new_string="a = 2")
    assert result.ok, result.output
    assert (project / "n.py").read_bytes() == b"a = 2\n"


def test_the_ledger_records_the_written_state(call: Call, project: Path, ledger: ReadLedger) -> None:
    call(write_file, path="n.txt", content="abc")
    state = ledger.get(project / "n.txt")
    assert state is not None
    assert state.size == 3


def test_echoed_tags_are_stripped_from_the_content(call: Call, project: Path) -> None:
    content = f"1:{line_hash('a = 1')}|a = 1\n2:{line_hash('b = 2')}|b = 2\n"
    result = call(write_file, path="t.py", content=content)
    assert (project / "t.py").read_bytes() == b"a = 1\nb = 2\n"
    assert "The 'N:hh|' prefixes copied from read_file output were removed from the content." in result.output


def test_a_directory_is_not_overwritten(call: Call, project: Path) -> None:
    (project / "d").mkdir()
    result = call(write_file, path="d", content="x")
    assert result.output == "d is a directory, not a file. Use glob to list it (e.g. pattern 'd/*')."


def test_paths_outside_the_sandbox_are_refused(call: Call, project: Path, outside: Path, secret: bytes) -> None:
    result = call(write_file, path="../outside/secret.txt", content="pwned")
    assert "is outside the sandbox" in result.output
    (project / "out").symlink_to(outside)
    result = call(write_file, path="out/new.txt", content="pwned")
    assert "leads outside the sandbox through a symlink" in result.output
    assert (outside / "secret.txt").read_bytes() == secret
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_an_existing_binary_file_is_not_replaced(call: Call, project: Path) -> None:
    (project / "x.bin").write_bytes(b"\x00\x01")
    result = call(write_file, path="x.bin", content="text")
    assert result.output.startswith("x.bin looks like a binary file (it contains NUL bytes); write_file replaces UTF-8")


def test_lone_surrogates_in_content_are_refused(call: Call, project: Path) -> None:
    result = call(write_file, path="s.txt", content="bad \ud800")
    assert result.output.startswith("the content contains a character that cannot be written as UTF-8")
    assert not (project / "s.txt").exists()


def test_write_file_works_without_a_session(make_ctx: Callable[..., ToolContext], call: Call, project: Path) -> None:
    (project / "a.txt").write_bytes(b"old\n")
    assert call(write_file, ctx=make_ctx(session=None), path="a.txt", content="new\n").ok
    assert (project / "a.txt").read_bytes() == b"new\n"
