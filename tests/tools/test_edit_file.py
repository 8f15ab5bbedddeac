from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from weald.tools import ToolContext, ToolError, ToolResult, default_registry
from weald.tools import _sandbox as sandbox
from weald.tools._hashline import line_hash
from weald.tools._ledger import ReadLedger
from weald.tools.edit_file import edit_file
from weald.tools.read_file import read_file

Call = Callable[..., ToolResult]


def tag(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}|{content}"


def anchor(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}"


@pytest.fixture
def write_and_read(call: Call, project: Path) -> Callable[[str, bytes], Path]:
    """Create a file and read it in the session, as a model would before editing."""

    def make(name: str, data: bytes) -> Path:
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        assert call(read_file, path=name).ok
        return path

    return make


CODE = b"def f():\n    a = 1\n    b = 2\n    return a + b\n"


def test_edit_file_is_registered_with_its_defaults() -> None:
    tool = default_registry.get("edit_file")
    assert tool is edit_file
    assert (tool.permission, tool.timeout, tool.kind) == ("ask", 10.0, "write")
    props = tool.parameters["properties"]
    assert set(props) == {"path", "start", "through", "operation", "old_string", "new_string", "replace_all"}
    assert all(p.get("description") for p in props.values())


# --- by anchor ---------------------------------------------------------------


def test_replace_one_line_by_anchor(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start=anchor(2, "    a = 1"), new_string="    a = 10")
    assert result.ok, result.output
    assert path.read_bytes() == b"def f():\n    a = 10\n    b = 2\n    return a + b\n"
    assert result.output.startswith("Edited f.py: replaced line 2 with 1 line (+1 -1 lines).\n")
    assert tag(2, "    a = 10") in result.output
    assert result.data["lines_added"] == 1
    assert result.data["lines_removed"] == 1
    assert result.data["path"] == "f.py"
    assert "-    a = 1\n+    a = 10" in result.data["diff"]


def test_replace_a_range_by_anchor(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    result = call(
        edit_file,
        path="f.py",
        start=anchor(2, "    a = 1"),
        through=anchor(3, "    b = 2"),
        new_string="    a, b = 1, 2\n",
    )
    assert result.ok, result.output
    assert path.read_bytes() == b"def f():\n    a, b = 1, 2\n    return a + b\n"
    assert "replaced lines 2-3 with 1 line (+1 -2 lines)" in result.output


def test_replace_without_new_string_deletes_the_lines(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start=anchor(2, "    a = 1"), through=anchor(3, "    b = 2"))
    assert result.ok, result.output
    assert path.read_bytes() == b"def f():\n    return a + b\n"
    assert "deleted lines 2-3 (+0 -2 lines)" in result.output


def test_an_empty_new_string_deletes_too(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    assert call(edit_file, path="f.py", start=anchor(1, "def f():"), new_string="").ok
    assert path.read_bytes() == b"    a = 1\n    b = 2\n    return a + b\n"


def test_a_lone_newline_replaces_with_one_blank_line(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    assert call(edit_file, path="f.py", start=anchor(2, "    a = 1"), new_string="\n").ok
    assert path.read_bytes() == b"def f():\n\n    b = 2\n    return a + b\n"


def test_insert_before_and_after(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    result = call(
        edit_file,
        path="f.py",
        start=anchor(1, "def f():"),
        operation="insert_before",
        new_string="import os\n\n",
    )
    assert result.ok, result.output
    assert "inserted 2 lines before line 1 (+2 -0 lines)" in result.output
    # Tags shift: the def line is now line 3, and the result says so.
    assert tag(3, "def f():") in result.output
    result = call(
        edit_file,
        path="f.py",
        start=anchor(4, "    a = 1"),
        operation="insert_after",
        new_string="    a += 1",
    )
    assert result.ok, result.output
    assert path.read_bytes() == b"import os\n\ndef f():\n    a = 1\n    a += 1\n    b = 2\n    return a + b\n"


def test_insert_after_the_last_line(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("a.txt", b"one\ntwo\n")
    assert call(edit_file, path="a.txt", start=anchor(2, "two"), operation="insert_after", new_string="three").ok
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_insert_after_a_last_line_without_newline_keeps_the_file_without_one(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("a.txt", b"one\ntwo")
    assert call(edit_file, path="a.txt", start=anchor(2, "two"), operation="insert_after", new_string="three\n").ok
    assert path.read_bytes() == b"one\ntwo\nthree"


def test_replacing_and_deleting_the_last_line_keep_a_missing_final_newline_missing(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("a.txt", b"one\ntwo\nthree")
    assert call(edit_file, path="a.txt", start=anchor(3, "three"), new_string="3\n").ok
    assert path.read_bytes() == b"one\ntwo\n3"
    assert call(edit_file, path="a.txt", start=anchor(2, "two"), through=anchor(3, "3")).ok
    assert path.read_bytes() == b"one"


def test_deleting_every_line_empties_the_file(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("a.txt", b"one\ntwo\n")
    result = call(edit_file, path="a.txt", start=anchor(1, "one"), through=anchor(2, "two"))
    assert result.ok, result.output
    assert path.read_bytes() == b""
    assert "The file is now empty." in result.output


def test_a_stale_anchor_shows_the_current_lines_and_the_tag_to_retry_with(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
    ledger: ReadLedger,
) -> None:
    path = write_and_read("f.py", CODE)
    stale = anchor(3, "    b = 1")  # the model remembers a line that is not there
    assert stale != anchor(3, "    b = 2")
    result = call(edit_file, path="f.py", start=stale, new_string="x")
    assert not result.ok
    assert result.output.startswith(
        f"start='{stale}' is stale: line 3 of f.py now has tag {anchor(3, '    b = 2')}, so it is not the line "
        "you read. Lines 1-4 now are:\n",
    )
    for n, content in enumerate(CODE.decode().splitlines(), 1):
        assert tag(n, content) in result.output
    assert f"retry with start='{anchor(3, '    b = 2')}'" in result.output
    assert path.read_bytes() == CODE


def test_a_stale_anchor_suggests_where_the_line_moved(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    write_and_read("a.txt", b"".join(f"line {i}\n".encode() for i in range(1, 11)))
    # The model's tag for "line 5" but at line 4: as if a line above was deleted since.
    result = call(edit_file, path="a.txt", start=f"4:{line_hash('line 5')}", new_string="x")
    assert not result.ok
    assert f"The line you meant may have moved to line 5 ({anchor(5, 'line 5')})." in result.output


def test_an_anchor_past_the_end_says_how_many_lines_there_are(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start="9:ab", new_string="x")
    assert result.output.startswith("start='9:ab' is past the end of f.py, which has 4 lines. Its last lines are:\n")
    assert tag(4, "    return a + b") in result.output


def test_through_before_start_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start=anchor(3, "    b = 2"), through=anchor(2, "    a = 1"))
    assert result.output == (
        "through (line 2) comes before start (line 3). through is the last line of the range to replace, "
        "at or after start."
    )


def test_a_stale_through_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start=anchor(1, "def f():"), through="3:zz")
    assert result.output.startswith("through='3:zz' is not a line anchor.")


def test_echoed_tags_in_new_string_are_stripped(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    # Lines 2-3 become three lines, echoed with the tags they will have at lines 2-4.
    new = "\n".join([tag(2, "    a = 1"), tag(3, "    a += 5"), tag(4, "    b = 2")])
    result = call(
        edit_file,
        path="f.py",
        start=anchor(2, "    a = 1"),
        through=anchor(3, "    b = 2"),
        new_string=new,
    )
    assert result.ok, result.output
    assert path.read_bytes() == b"def f():\n    a = 1\n    a += 5\n    b = 2\n    return a + b\n"
    assert "The 'N:hh|' prefixes copied from read_file output were removed from new_string." in result.output


def test_tags_among_untagged_new_lines_are_kept_as_written_with_a_note(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("f.py", CODE)
    new = f"{tag(2, '    a = 1')}\n    a += 5\n{tag(3, '    b = 2')}"
    result = call(
        edit_file,
        path="f.py",
        start=anchor(2, "    a = 1"),
        through=anchor(3, "    b = 2"),
        new_string=new,
    )
    assert result.ok, result.output
    assert path.read_bytes() == ("def f():\n" + new + "\n    return a + b\n").encode()
    assert "so they were written as given" in result.output


def test_a_modified_echoed_line_is_written_as_given_with_a_note(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("f.py", CODE)
    new = f"2:{line_hash('    a = 1')}|    a = 100"  # the model edited the content after the tag
    result = call(edit_file, path="f.py", start=anchor(2, "    a = 1"), new_string=new)
    assert result.ok, result.output
    assert path.read_bytes() == f"def f():\n{new}\n    b = 2\n    return a + b\n".encode()
    assert "so they were written as given" in result.output


def test_anchoring_in_an_empty_file_points_to_write_file(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    write_and_read("e.txt", b"")
    result = call(edit_file, path="e.txt", start="1:00", new_string="x")
    assert result.output == "e.txt is empty, so it has no line to anchor to. Give it content with write_file."


# --- by text -----------------------------------------------------------------


def test_replace_unique_text(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="a + b", new_string="a * b")
    assert result.ok, result.output
    assert path.read_bytes() == CODE.replace(b"a + b", b"a * b")
    assert result.output.startswith("Edited f.py: replaced 1 occurrence at line 4 (+1 -1 lines).\n")
    assert tag(4, "    return a * b") in result.output


def test_several_matches_without_replace_all_are_refused_with_their_lines(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("a.txt", b"x = 1\ny = 2\nx = 1\nz\nx = 1\n")
    result = call(edit_file, path="a.txt", old_string="x = 1", new_string="x = 9")
    assert result.output == (
        "old_string occurs 3 times in a.txt (at lines 1, 3, 5). Include more surrounding lines in old_string so "
        "it matches exactly one place, set replace_all=true to change all 3, or edit by anchor "
        f"(e.g. start='{anchor(1, 'x = 1')}')."
    )
    assert path.read_bytes() == b"x = 1\ny = 2\nx = 1\nz\nx = 1\n"


def test_overlapping_occurrences_count_as_several(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    # "}\n}\n" is in "}\n}\n}\n" twice: the first is not simply taken.
    data = b"if a {\n}\n}\n}\nend\n"
    path = write_and_read("a.txt", data)
    result = call(edit_file, path="a.txt", old_string="}\n}\n", new_string="}\n")
    assert result.output.startswith("old_string occurs 2 times in a.txt (at lines 2, 3).")
    result = call(edit_file, path="a.txt", old_string="}\n}\n", new_string="}\n", replace_all=True)
    assert result.output.startswith("old_string matches a.txt at places that overlap (lines 2, 3)")
    assert path.read_bytes() == data


def test_replace_all_changes_every_occurrence(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("a.txt", b"x = 1\ny = 2\nx = 1\nz\nx = 1\n")
    result = call(edit_file, path="a.txt", old_string="x = 1", new_string="x = 9", replace_all=True)
    assert result.ok, result.output
    assert path.read_bytes() == b"x = 9\ny = 2\nx = 9\nz\nx = 9\n"
    assert "replaced 3 occurrences (lines 1, 3, 5) (+3 -3 lines)" in result.output


def test_replace_all_in_a_100000_line_file(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    data = b"".join(b"item %d\n" % i for i in range(100_000))
    path = write_and_read("big.txt", data)
    result = call(edit_file, path="big.txt", old_string="item 9999\n", new_string="ITEM\n", replace_all=True)
    assert result.ok, result.output
    assert path.read_bytes() == data.replace(b"\nitem 9999\n", b"\nITEM\n")
    assert result.data["lines_removed"] == 1


def test_same_old_and_new_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="a = 1", new_string="a = 1")
    assert result.output == "old_string and new_string are the same, so there is nothing to change."


def test_an_empty_old_string_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="", new_string="x")
    assert result.output.startswith("old_string is empty, so it names no place in the file.")


def test_old_string_needs_new_string(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="a = 1")
    assert result.output == ("new_string is required with old_string: the text to put in its place ('' deletes it).")


def test_an_empty_new_string_deletes_the_text(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    assert call(edit_file, path="f.py", old_string="    b = 2\n", new_string="").ok
    assert path.read_bytes() == b"def f():\n    a = 1\n    return a + b\n"


def test_start_and_old_string_together_are_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", start="1:00", old_string="a", new_string="b")
    assert result.output.startswith("give either start (edit by anchor) or old_string (edit by text), not both.")


def test_neither_start_nor_old_string_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", new_string="b")
    assert result.output == (
        "say what to change: either start='N:hh' (a line tag from read_file) with new_string, "
        "or old_string (text copied from the file) with new_string."
    )


def test_mixed_mode_arguments_are_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    assert call(edit_file, path="f.py", old_string="a", new_string="b", operation="insert_after").output.startswith(
        "operation insert_after applies to edits by anchor (start='N:hh')",
    )
    assert call(edit_file, path="f.py", start="1:00", new_string="b", replace_all=True).output == (
        "replace_all works with old_string only; an anchored edit changes the lines named."
    )
    assert call(
        edit_file,
        path="f.py",
        start="1:00",
        through="2:00",
        operation="insert_after",
        new_string="b",
    ).output.startswith("through applies to operation 'replace' only")
    assert call(edit_file, path="f.py", start="1:00", operation="insert_before").output == (
        "operation insert_before needs new_string: the lines to insert."
    )


def test_the_schema_rejects_unknown_and_dangling_arguments(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    write_and_read("f.py", CODE)
    assert "unknown argument(s) are not allowed ('old_str' was unexpected)" in (
        call(edit_file, path="f.py", old_str="a", new_string="b").output
    )
    assert "'start' is a dependency of 'through'" in call(edit_file, path="f.py", through="1:00").output
    assert "expected one of 'replace', 'insert_after', 'insert_before'" in (
        call(edit_file, path="f.py", start="1:00", operation="append").output
    )


# --- the tolerant cascade ----------------------------------------------------


def test_wrong_indentation_matches_and_new_string_is_reindented(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("f.py", b"class A:\n    def f(self):\n        return 1\n")
    result = call(
        edit_file,
        path="f.py",
        old_string="def f(self):\n    return 1",
        new_string="def f(self):\n    x = 2\n    return x",
    )
    assert result.ok, result.output
    assert path.read_bytes() == b"class A:\n    def f(self):\n        x = 2\n        return x\n"
    assert "matched after setting aside indentation and trailing whitespace" in result.output


def test_tabs_versus_spaces_match_by_trimmed_lines(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("m.go", b"func f() {\n\tif x {\n\t\treturn 1\n\t}\n}\n")
    result = call(
        edit_file,
        path="m.go",
        old_string="    if x {\n        return 1\n    }",
        new_string="    if x {\n        return 2\n    }",
    )
    assert result.ok, result.output
    assert path.read_bytes() == b"func f() {\n\tif x {\n\t\treturn 2\n\t}\n}\n"
    assert "matched after stripping the whitespace around every line" in result.output


def test_trailing_whitespace_differences_match(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("a.txt", b"alpha   \nbeta\t\ngamma\n")
    result = call(edit_file, path="a.txt", old_string="alpha\nbeta\n", new_string="ALPHA\nBETA\n")
    assert result.ok, result.output
    assert path.read_bytes() == b"ALPHA\nBETA\ngamma\n"


def test_runs_of_whitespace_match_any_whitespace(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("a.py", b"x = call(a,   b,\n         c)\ny = 2\n")
    result = call(edit_file, path="a.py", old_string="x = call(a, b, c)", new_string="x = call(a, b, c, d)")
    assert result.ok, result.output
    assert path.read_bytes() == b"x = call(a, b, c, d)\ny = 2\n"
    assert "treating every run of whitespace" in result.output


def test_an_ambiguous_tolerant_match_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    data = b"if a:\n    go()\nif b:\n  go()\n"
    path = write_and_read("a.py", data)
    result = call(edit_file, path="a.py", old_string="go()  ", new_string="stop()")
    assert result.output == (
        "old_string does not occur exactly in a.py, and it matches 2 places approximately (lines 2, 4), so the "
        "edit was refused rather than guess. Copy old_string exactly from read_file output (without the 'N:hh|' "
        "prefixes) and include enough lines to make it unique, set replace_all=true if every one of those places "
        "should change, or edit by anchor with start='N:hh'."
    )
    assert path.read_bytes() == data


def test_replace_all_changes_every_tolerant_match_at_its_own_indentation(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("a.py", b"if a:\n    go()\nif b:\n  go()\n")
    result = call(edit_file, path="a.py", old_string="go()  ", new_string="stop()", replace_all=True)
    assert result.ok, result.output
    assert path.read_bytes() == b"if a:\n    stop()\nif b:\n  stop()\n"
    assert "replaced 2 occurrences (lines 2, 4)" in result.output


def test_no_match_shows_the_closest_region(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="    b = 3\n    return a - b", new_string="x")
    assert result.output == (
        "old_string was not found in f.py, not even when ignoring differences in indentation, whitespace, "
        "typographic punctuation and backslash escapes. The most similar region is lines 3-4 (89% similar):\n"
        f"{tag(3, '    b = 2')}\n{tag(4, '    return a + b')}\n"
        "If that is the place, copy old_string exactly from it (without the 'N:hh|' prefixes), or edit it by "
        f"anchor with start='{anchor(3, '    b = 2')}' through='{anchor(4, '    return a + b')}'."
    )


def test_no_match_without_any_similar_region(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("f.py", CODE)
    result = call(edit_file, path="f.py", old_string="completely unrelated words", new_string="x")
    assert result.output == (
        "old_string was not found in f.py, not even when ignoring differences in indentation, whitespace, "
        "typographic punctuation and backslash escapes. Read the file again with read_file: it may not contain what you expect, or have changed."
    )


def test_echoed_tags_in_old_and_new_string_are_ignored(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("f.py", CODE)
    old = f"{tag(2, '    a = 1')}\n{tag(3, '    b = 2')}"
    new = f"{tag(2, '    a = 1')}\n{tag(3, '    b = 3')}"
    result = call(edit_file, path="f.py", old_string=old, new_string=new)
    assert result.ok, result.output
    assert path.read_bytes() == CODE.replace(b"b = 2", b"b = 3")
    assert "The 'N:hh|' prefixes copied into old_string were ignored." in result.output


# --- bytes preserved ---------------------------------------------------------


def test_crlf_files_stay_crlf(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("w.txt", b"one\r\ntwo\r\nthree\r\n")
    assert call(edit_file, path="w.txt", old_string="two\n", new_string="2\n2b\n").ok
    assert path.read_bytes() == b"one\r\n2\r\n2b\r\nthree\r\n"
    assert call(edit_file, path="w.txt", start=anchor(4, "three"), operation="insert_after", new_string="4").ok
    assert path.read_bytes() == b"one\r\n2\r\n2b\r\nthree\r\n4\r\n"


def test_lines_with_the_minority_line_ending_are_left_alone(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("m.txt", b"a\r\nb\nc\r\nd\r\n")
    assert call(edit_file, path="m.txt", old_string="c", new_string="C").ok
    assert path.read_bytes() == b"a\r\nb\nC\r\nd\r\n"


def test_a_bom_is_kept(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("b.txt", b"\xef\xbb\xbfhello\n")
    assert call(edit_file, path="b.txt", start=anchor(1, "hello"), new_string="bye").ok
    assert path.read_bytes() == b"\xef\xbb\xbfbye\n"


def test_a_missing_final_newline_stays_missing(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("n.txt", b"a\nb")
    assert call(edit_file, path="n.txt", old_string="a", new_string="A").ok
    assert path.read_bytes() == b"A\nb"


def test_invalid_utf8_elsewhere_survives_and_can_be_matched(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("l.txt", b"caf\xe9\nname = 'x'\nna\xefve\n")
    assert call(edit_file, path="l.txt", old_string="'x'", new_string="'y'").ok
    assert path.read_bytes() == b"caf\xe9\nname = 'y'\nna\xefve\n"
    # read_file showed the bad byte as U+FFFD; old_string may copy it.
    assert call(edit_file, path="l.txt", old_string="caf\ufffd", new_string="cafe").ok
    assert path.read_bytes() == b"cafe\nname = 'y'\nna\xefve\n"
    result = call(edit_file, path="l.txt", start=anchor(3, "na\udcefve"), new_string="naive")
    assert result.ok, result.output
    assert path.read_bytes() == b"cafe\nname = 'y'\nnaive\n"


def test_the_mode_is_kept_and_no_temporary_file_is_left(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
    project: Path,
) -> None:
    path = write_and_read("run.sh", b"#!/bin/sh\necho hi\n")
    path.chmod(0o751)
    # chmod changes ctime only; the ledger keys on mtime and size, so no re-read is needed.
    assert call(edit_file, path="run.sh", old_string="hi", new_string="bye").ok
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert sorted(p.name for p in project.iterdir()) == ["run.sh"]


@pytest.mark.parametrize("mode", [0o444, 0o400, 0o555], ids=oct)
def test_a_read_only_file_is_refused_though_root_could_replace_it(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
    project: Path,
    mode: int,
) -> None:
    path = write_and_read("pkg/locked.py", CODE)
    path.chmod(mode)
    result = call(edit_file, path="pkg/locked.py", old_string="a = 1", new_string="a = 10")
    assert not result.ok
    assert result.output == (
        f"pkg/locked.py is read-only (mode {mode:o}: no write permission for anyone), so it was not changed. "
        "Leave it as it is, or ask the user whether it should be made writable."
    )
    assert path.read_bytes() == CODE
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert sorted(p.name for p in path.parent.iterdir()) == ["locked.py"]
    # Writable by anyone at all is enough: the bits are the owner's call, not this tool's.
    path.chmod(0o464)
    assert call(edit_file, path="pkg/locked.py", old_string="a = 1", new_string="a = 10").ok
    assert stat.S_IMODE(path.stat().st_mode) == 0o464


def test_binary_files_are_refused(call: Call, project: Path) -> None:
    (project / "x.bin").write_bytes(b"\x00\x01\x02")
    result = call(edit_file, path="x.bin", old_string="a", new_string="b")
    assert result.output.startswith("x.bin looks like a binary file (it contains NUL bytes); edit_file edits UTF-8")


# --- the ledger --------------------------------------------------------------


def test_an_unread_file_is_refused(call: Call, project: Path) -> None:
    (project / "f.py").write_bytes(CODE)
    result = call(edit_file, path="f.py", old_string="a = 1", new_string="a = 2")
    assert result.output == (
        "f.py has not been read in this session, so the change was refused: edits must start from the file's "
        "current content. Read it first with read_file, then make the change."
    )
    assert (project / "f.py").read_bytes() == CODE


def test_a_file_changed_since_it_was_read_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    path.write_bytes(CODE + b"# added by someone else\n")
    result = call(edit_file, path="f.py", old_string="a = 1", new_string="a = 2")
    assert result.output == (
        f"f.py has changed on disk since you last read it (it is now {len(CODE) + 24} bytes, was {len(CODE)}); "
        "something else modified it. Read it again with read_file and redo the change against its current content."
    )


def test_a_same_size_change_is_refused(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    os.utime(path, ns=(0, 10**18))
    path.write_bytes(CODE.replace(b"1", b"7"))
    result = call(edit_file, path="f.py", old_string="a = 7", new_string="a = 2")
    assert "has changed on disk since you last read it (same size, modified since)" in result.output


def test_a_touched_but_unchanged_file_is_still_fresh(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    os.utime(path, ns=(10**18, 10**18))
    assert call(edit_file, path="f.py", old_string="a = 1", new_string="a = 2").ok


def test_consecutive_edits_need_no_rereading(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    path = write_and_read("f.py", CODE)
    first = call(edit_file, path="f.py", old_string="a = 1", new_string="a = 10")
    assert first.ok
    # The fresh tags from the result are good for the next edit.
    second = call(edit_file, path="f.py", start=anchor(2, "    a = 10"), new_string="    a = 11")
    assert second.ok, second.output
    third = call(edit_file, path="f.py", old_string="b = 2", new_string="b = 20")
    assert third.ok, third.output
    assert path.read_bytes() == b"def f():\n    a = 11\n    b = 20\n    return a + b\n"


def test_without_a_session_there_is_no_ledger_check(
    make_ctx: Callable[..., ToolContext],
    call: Call,
    project: Path,
) -> None:
    (project / "f.py").write_bytes(CODE)
    result = call(edit_file, ctx=make_ctx(session=None), path="f.py", old_string="a = 1", new_string="a = 2")
    assert result.ok, result.output


def test_ledger_check_fresh_messages(project: Path) -> None:
    ledger = ReadLedger()
    path = project / "gone.txt"
    path.write_bytes(b"x")
    ledger.record(path, b"x", path.stat())
    assert path in ledger
    assert len(ledger) == 1
    assert ledger.statistics().files == 1
    path.unlink()
    with pytest.raises(ToolError) as exc:
        ledger.check_fresh(path, name="gone.txt")
    assert str(exc.value) == (
        "gone.txt no longer exists: it was deleted or moved after you read it. "
        "Use glob to find it, or create it with write_file."
    )
    assert ledger.forget(path)
    assert not ledger.forget(path)


# --- the sandbox -------------------------------------------------------------


def test_files_outside_the_sandbox_cannot_be_edited(call: Call, project: Path, outside: Path, secret: bytes) -> None:
    (project / "link.txt").symlink_to(outside / "secret.txt")
    result = call(edit_file, path="link.txt", old_string="top", new_string="no")
    assert "leads outside the sandbox through a symlink" in result.output
    result = call(edit_file, path=str(outside / "secret.txt"), old_string="top", new_string="no")
    assert "is outside the sandbox" in result.output
    assert (outside / "secret.txt").read_bytes() == secret


def test_a_symlink_swapped_in_between_read_and_write_is_not_written_through(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
    outside: Path,
    monkeypatch: pytest.MonkeyPatch,
    secret: bytes,
) -> None:
    path = write_and_read("f.py", CODE)
    real_write = sandbox.write_atomic

    def swap_then_write(ctx: ToolContext, target: str, data: bytes, **kwargs: object) -> object:
        path.unlink()
        path.symlink_to(outside / "secret.txt")
        return real_write(ctx, target, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("weald.tools.edit_file.write_atomic", swap_then_write)
    result = call(edit_file, path="f.py", old_string="a = 1", new_string="a = 2")
    assert not result.ok
    assert "leads outside the sandbox through a symlink" in result.output
    assert (outside / "secret.txt").read_bytes() == secret


def test_the_diff_has_absolute_line_numbers(call: Call, write_and_read: Callable[[str, bytes], Path]) -> None:
    write_and_read("big.txt", b"".join(b"line %d\n" % i for i in range(1, 1001)))
    result = call(edit_file, path="big.txt", old_string="line 500\n", new_string="LINE 500\n")
    assert result.ok
    diff = result.data["diff"]
    assert diff.startswith("--- a/big.txt\n+++ b/big.txt\n@@ -497,7 +497,7 @@\n line 497\n")
    assert "-line 500\n+LINE 500\n" in diff
    assert tag(500, "LINE 500") in result.output


def test_an_aborted_call_writes_nothing(
    make_ctx: Callable[..., ToolContext],
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    path = write_and_read("f.py", CODE)
    ctx = make_ctx()
    ctx.abort.set("timed out")
    result = call(edit_file, ctx=ctx, path="f.py", old_string="a = 1", new_string="a = 2")
    assert result.output == "the call was timed out"
    assert path.read_bytes() == CODE


def test_the_closest_region_in_a_100000_line_file_is_found_quickly(
    call: Call,
    write_and_read: Callable[[str, bytes], Path],
) -> None:
    data = b"".join(b"    value_%d = compute(%d, 'some text here')\n" % (i, i) for i in range(100_000))
    write_and_read("big.py", data)
    # CPU time of this process (the tool may run on a worker thread): waiting for a CPU does not count.
    began = time.process_time()
    result = call(edit_file, path="big.py", old_string="value_7000O = compute(70000, 'some text here')", new_string="x")
    cpu = time.process_time() - began
    assert "The most similar region is lines 70001-70001 (98% similar):" in result.output
    assert tag(70001, "    value_70000 = compute(70000, 'some text here')") in result.output
    assert cpu < 3  # about 0.25 s; a quadratic search once took 6 s, close to the call's 10 s timeout
