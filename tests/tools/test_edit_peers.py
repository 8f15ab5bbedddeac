"""edit_file against the cases of its peers' test suites, and the fuzzy-matching bugs of issue 14.

Cases are carried from OpenCode (its replacer cascade: LineTrimmed,
WhitespaceNormalized, IndentationFlexible, BlockAnchor, EscapeNormalized,
replaceAll), probe (fuzzy matching: "realistic LLM scenario"), Aider
(editblock's replace_most_similar_chunk, issue 25) and Codex (apply-patch's
seek_sequence, Unicode punctuation). Where weald decides differently from a
peer (it never picks one of several places, and never guesses the middle of
a block), the test says so and checks the refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from weald.tools import ToolResult
from weald.tools._hashline import line_hash
from weald.tools.edit_file import edit_file
from weald.tools.read_file import read_file
from weald.tools.write_file import write_file

Call = Callable[..., ToolResult]


@pytest.fixture
def edit(call: Call, project: Path) -> Callable[..., tuple[ToolResult, str]]:
    """``edit(content, **arguments)``: write a file, read it, edit it; the result and the file after."""

    def run(content: str, **arguments: object) -> tuple[ToolResult, str]:
        path = project / "f.txt"
        path.write_bytes(content.encode())
        assert call(read_file, path="f.txt").ok
        result = call(edit_file, path="f.txt", **arguments)
        return result, path.read_bytes().decode()

    return run


Edit = Callable[..., tuple[ToolResult, str]]


# --- the four bugs of issue 14 ----------------------------------------------------------


def test_a_leading_blank_line_in_old_string_keeps_the_indentation_aider_issue_25(edit: Edit) -> None:
    result, after = edit(
        "    line1\n    line2\n    line3\n",
        old_string="\n  line1\n  line2\n",
        new_string="  new_line1\n  new_line2\n",
    )
    assert result.ok, result.output
    assert after == "    new_line1\n    new_line2\n    line3\n"


PROBE_FILE = """function validateUser(user) {
    if (!user.name) {
        throw new Error('Name required');
    }
    if (!user.email) {
        throw new Error('Email required');
    }
    return true;
}"""


def test_new_string_already_at_the_files_indentation_is_not_indented_twice_probe(edit: Edit) -> None:
    # probe's "realistic LLM scenario": old_string quoted at column 0, new_string at the real indent.
    result, after = edit(
        PROBE_FILE,
        old_string=(
            "if (!user.name) {\n    throw new Error('Name required');\n}\n"
            "if (!user.email) {\n    throw new Error('Email required');\n}"
        ),
        new_string=("    if (!user.name || !user.email) {\n        throw new Error('Name and email required');\n    }"),
    )
    assert result.ok, result.output
    assert after == (
        "function validateUser(user) {\n"
        "    if (!user.name || !user.email) {\n"
        "        throw new Error('Name and email required');\n"
        "    }\n"
        "    return true;\n"
        "}"
    )


def test_a_tolerant_match_never_lands_inside_a_longer_line(edit: Edit) -> None:
    result, after = edit("max = 10\n", old_string="x  = 1", new_string="x = 2")
    assert not result.ok
    assert result.output.startswith("old_string was not found in f.txt")
    assert after == "max = 10\n"


SCHEDULE = "09:00|standup\n10:00|review\n"


def test_pipe_delimited_lines_that_look_tagged_are_written_as_given_by_edit_file(edit: Edit) -> None:
    result, after = edit(
        "# schedule\n", start=f"1:{line_hash('# schedule')}", operation="insert_after", new_string=SCHEDULE
    )
    assert result.ok, result.output
    assert after == "# schedule\n" + SCHEDULE
    result, after = edit("# schedule\n", old_string="# schedule\n", new_string="# schedule\n" + SCHEDULE)
    assert result.ok, result.output
    assert after == "# schedule\n" + SCHEDULE


def test_pipe_delimited_lines_that_look_tagged_are_written_as_given_by_write_file(call: Call, project: Path) -> None:
    result = call(write_file, path="schedule.txt", content=SCHEDULE)
    assert result.ok, result.output
    assert (project / "schedule.txt").read_text() == SCHEDULE
    assert "so they were written as given" in result.output


def test_write_file_strips_a_whole_echo_of_read_file_output(call: Call, project: Path) -> None:
    lines = ["def f():", "    return 1"]
    echoed = "".join(f"{n}:{line_hash(line)}|{line}\n" for n, line in enumerate(lines, 1))
    assert call(write_file, path="f.py", content=echoed).ok
    assert (project / "f.py").read_text() == "def f():\n    return 1\n"
    # The same lines numbered from 5 are not what read_file shows for this file: kept.
    shifted = "".join(f"{n}:{line_hash(line)}|{line}\n" for n, line in enumerate(lines, 5))
    assert call(write_file, path="g.py", content=shifted).ok
    assert (project / "g.py").read_text() == shifted


def test_old_string_echoed_with_tags_of_other_lines_is_not_stripped(edit: Edit) -> None:
    content = "a = 1\nb = 2\n"
    result, after = edit(content, old_string=f"5:{line_hash('a = 1')}|a = 1", new_string="a = 3")
    assert not result.ok
    assert after == content


# --- OpenCode's replacers -----------------------------------------------------------------


def test_opencode_line_trimmed(edit: Edit) -> None:
    result, after = edit("line1\n  target  \n  match  \nline4", old_string="target\nmatch", new_string="hit\nfound")
    assert result.ok, result.output
    assert after == "line1\n  hit\n  found\nline4"


def test_opencode_whitespace_normalized_replaces_the_whole_line(edit: Edit) -> None:
    result, after = edit("const   x   =   1;\n", old_string="const x = 1;", new_string="const x = 2;")
    assert result.ok, result.output
    assert after == "const x = 2;\n"


def test_opencode_indentation_flexible(edit: Edit) -> None:
    result, after = edit(
        "    if (true) {\n      doStuff();\n    }\n",
        old_string="if (true) {\n  doStuff();\n}",
        new_string="if (true) {\n  doOther();\n}",
    )
    assert result.ok, result.output
    assert after == "    if (true) {\n      doOther();\n    }\n"


def test_opencode_block_anchor_is_named_but_not_guessed(edit: Edit) -> None:
    # OpenCode replaces a block whose first and last lines match; weald refuses and names it.
    content = "start\nmiddle stuff\nend\n"
    result, after = edit(content, old_string="start\nmiddle things\nend", new_string="start\nnew\nend")
    assert not result.ok
    assert "Its first and last lines match lines 1 and 3, but the lines between differ" in result.output
    assert f"start='1:{line_hash('start')}' through='3:{line_hash('end')}'" in result.output
    assert after == content


def test_opencode_escape_normalized_reads_new_string_the_same_way(edit: Edit) -> None:
    result, after = edit("line1\nline2\n", old_string="line1\\nline2", new_string="line1\\nLINE2")
    assert result.ok, result.output
    assert after == "line1\nLINE2\n"
    assert "new_string was read the same way" in result.output


def test_escaped_quotes_in_old_and_new_string(edit: Edit) -> None:
    result, after = edit('print("hi")\n', old_string='print(\\"hi\\")', new_string='print(\\"bye\\")')
    assert result.ok, result.output
    assert after == 'print("bye")\n'


def test_an_escape_old_string_did_not_use_stays_in_new_string(edit: Edit) -> None:
    # new_string's \t is code (a tab escape in a string literal), not something the model escaped.
    result, after = edit("a\nb\n", old_string="a\\nb", new_string='a\\nb = "x\\ty"')
    assert result.ok, result.output
    assert after == 'a\\nb = "x\\ty"\n'
    assert "new_string was written as given" in result.output


def test_opencode_replace_all_of_a_multi_line_block(edit: Edit) -> None:
    result, after = edit(
        "alpha\nbeta\nalpha\nbeta\n",
        old_string="alpha\nbeta",
        new_string="alpha\nbeta-updated",
        replace_all=True,
    )
    assert result.ok, result.output
    assert after == "alpha\nbeta-updated\nalpha\nbeta-updated\n"


# --- probe's fuzzy matching ---------------------------------------------------------------


def test_probe_line_trimmed_with_new_string_at_the_real_indent(edit: Edit) -> None:
    result, after = edit(
        'function greet() {\n  const name = "World";\n  console.log("Hello, " + name);\n}',
        old_string='const name = "World";\nconsole.log("Hello, " + name);',
        new_string='  const name = "Universe";\n  console.log("Hello, " + name);',
    )
    assert result.ok, result.output
    assert after == 'function greet() {\n  const name = "Universe";\n  console.log("Hello, " + name);\n}'


def test_probe_whitespace_normalized(edit: Edit) -> None:
    result, after = edit(
        "const x = foo(a, b, c);",
        old_string="const x = foo(a,  b,  c);",
        new_string="const x = bar(a, b, c);",
    )
    assert result.ok, result.output
    assert after == "const x = bar(a, b, c);"


def test_probe_two_space_old_string_against_four_space_file(edit: Edit) -> None:
    result, after = edit(
        "function test() {\n    const a = 1;\n    const b = 2;\n    return a + b;\n}",
        old_string="  const a = 1;\n  const b = 2;\n  return a + b;",
        new_string="    const a = 10;\n    const b = 20;\n    return a + b;",
    )
    assert result.ok, result.output
    assert after == "function test() {\n    const a = 10;\n    const b = 20;\n    return a + b;\n}"


def test_probe_extra_spaces_around_operators(edit: Edit) -> None:
    result, after = edit(
        "const result = items.filter(x => x.active).map(x => x.name);",
        old_string="const result = items.filter(x  =>  x.active).map(x  =>  x.name);",
        new_string="const result = items.filter(x => x.enabled).map(x => x.label);",
    )
    assert result.ok, result.output
    assert after == "const result = items.filter(x => x.enabled).map(x => x.label);"


PROBE_TWO_BLOCKS = 'function a() {\n  doStuff();\n  log("done");\n}\n\nfunction b() {\n  doStuff();\n  log("done");\n}'


def test_probe_fuzzy_replace_all(edit: Edit) -> None:
    result, after = edit(
        PROBE_TWO_BLOCKS,
        old_string='doStuff();\nlog("done");',
        new_string='  doOtherStuff();\n  log("complete");',
        replace_all=True,
    )
    assert result.ok, result.output
    assert after == PROBE_TWO_BLOCKS.replace("doStuff()", "doOtherStuff()").replace('"done"', '"complete"')
    assert "replaced 2 occurrences (lines 2, 7)" in result.output


def test_probe_several_fuzzy_matches_without_replace_all_are_refused(edit: Edit) -> None:
    result, after = edit(PROBE_TWO_BLOCKS, old_string='doStuff();\nlog("done");', new_string="x();")
    assert result.output.startswith("old_string does not occur exactly in f.txt, and it matches 2 places")
    assert after == PROBE_TWO_BLOCKS


def test_probe_exact_matches_are_preferred_and_must_be_unique(edit: Edit) -> None:
    result, _ = edit("const x = 1;\nconst x = 1;", old_string="const x = 1;", new_string="const x = 2;")
    assert result.output.startswith("old_string occurs 2 times in f.txt (at lines 1, 2).")


# --- Aider's replace_most_similar_chunk ---------------------------------------------------


def test_aider_missing_varied_leading_whitespace(edit: Edit) -> None:
    result, after = edit(
        "\n    line1\n    line2\n        line3\n    line4\n",
        old_string="line2\n    line3\n",
        new_string="new_line2\n    new_line3\n",
    )
    assert result.ok, result.output
    assert after == "\n    line1\n    new_line2\n        new_line3\n    line4\n"


def test_aider_missing_leading_whitespace(edit: Edit) -> None:
    result, after = edit(
        "    line1\n    line2\n    line3\n", old_string="line1\nline2\n", new_string="new_line1\nnew_line2\n"
    )
    assert result.ok, result.output
    assert after == "    new_line1\n    new_line2\n    line3\n"


def test_aider_just_some_missing_leading_whitespace(edit: Edit) -> None:
    result, after = edit(
        "    line1\n    line2\n    line3\n",
        old_string=" line1\n line2\n",
        new_string=" new_line1\n     new_line2\n",
    )
    assert result.ok, result.output
    assert after == "    new_line1\n        new_line2\n    line3\n"


def test_aider_multiple_matches_missing_whitespace_are_refused_not_the_first_taken(edit: Edit) -> None:
    # Aider replaces the first; weald never picks one of several places.
    content = "    line1\n    line2\n    line1\n    line3\n"
    result, after = edit(content, old_string="line1\n", new_string="new_line\n")
    assert result.output.startswith("old_string occurs 2 times in f.txt (at lines 1, 3).")
    assert after == content


def test_aider_elision_is_not_adopted_and_the_block_is_named(edit: Edit) -> None:
    content = "def f():\n    a = 1\n    b = 2\n    c = 3\n"
    result, after = edit(content, old_string="def f():\n...\n    c = 3\n", new_string="def f():\n...\n    c = 30\n")
    assert not result.ok
    assert "Its first and last lines match lines 1 and 4" in result.output
    assert after == content


# --- Codex's seek_sequence --------------------------------------------------------------------


def test_codex_trailing_whitespace_is_ignored(edit: Edit) -> None:
    result, after = edit("foo   \nbar\t\t\n", old_string="foo\nbar", new_string="FOO\nBAR")
    assert result.ok, result.output
    assert after == "FOO\nBAR\n"


def test_codex_leading_and_trailing_whitespace_is_ignored(edit: Edit) -> None:
    result, after = edit("    foo   \n    bar\t\n", old_string="foo\nbar", new_string="foo\nBAR")
    assert result.ok, result.output
    assert after == "    foo\n    BAR\n"


def test_codex_unicode_punctuation_is_read_as_ascii(edit: Edit) -> None:
    content = "import asyncio  # local import \u2013 avoids top\u2011level dep\nmsg = \u201chello\u201d\n"
    result, after = edit(
        content,
        old_string="import asyncio  # local import - avoids top-level dep",
        new_string="import asyncio  # HELLO",
    )
    assert result.ok, result.output
    assert after == "import asyncio  # HELLO\nmsg = \u201chello\u201d\n"
    assert "typographic dashes, quotes and spaces" in result.output
    result, after = edit(content, old_string='msg = "hello"', new_string='msg = "bye"')
    assert result.ok, result.output
    assert after.endswith('msg = "bye"\n')


def test_codex_a_pattern_longer_than_the_file_matches_nothing(edit: Edit) -> None:
    result, after = edit("just one line\n", old_string="too\nmany\nlines", new_string="x")
    assert not result.ok
    assert after == "just one line\n"


# --- the edit-scope guard -----------------------------------------------------------------------


def test_a_whitespace_match_across_blank_lines_old_string_lacks_is_refused(edit: Edit) -> None:
    content = "a = 1\n\n\n\nb = 2\n"
    result, after = edit(content, old_string="a = 1\nb = 2", new_string="a, b = 1, 2")
    assert result.output.startswith(
        "old_string matches lines 1-5 of f.txt only when whitespace is ignored, and that match reaches well past "
        "what old_string quotes (it spans 3 blank lines old_string does not have), so the edit was refused.",
    )
    assert after == content


def test_a_whitespace_match_far_longer_than_old_string_is_refused(edit: Edit) -> None:
    content = "f(a,\n" + " " * 200 + "b)\n"
    result, after = edit(content, old_string="f(a, b)", new_string="g(a, b)")
    assert "it is 207 characters long, old_string 7" in result.output
    assert after == content
