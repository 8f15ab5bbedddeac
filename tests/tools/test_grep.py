"""The grep tool on real trees, with the real ripgrep."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from weald.tools import SessionServices, ToolContext, ToolResult, invoke
from weald.tools._hashline import line_hash
from weald.tools._process import find_ripgrep
from weald.tools.grep import _Collector, grep


def command_lines() -> list[bytes]:
    """The command lines of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return found


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A project (not a git repository) with ignored, hidden and binary files."""
    root = tmp_path / "work"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "build").mkdir()
    (root / ".config").mkdir()
    (root / ".git").mkdir()
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    print('needle one')\n    return 0\n")
    (root / "src" / "pkg" / "util.ts").write_text("export const x = 1;\n// needle two\n")
    (root / "build" / "out.py").write_text("needle in ignored dir\n")
    (root / "debug.log").write_text("needle in ignored log\n")
    (root / ".config" / "settings.toml").write_text("needle = 'hidden'\n")
    (root / ".git" / "config").write_text("needle in git\n")
    (root / "image.bin").write_bytes(b"needle\x00\x01\x02binary")
    return root


@pytest.fixture
def ctx(tree: Path, tmp_path: Path) -> ToolContext:
    return ToolContext(working_dir=tree, session=SessionServices(output_dir=tmp_path / "out"))


async def search(ctx: ToolContext, **arguments: Any) -> ToolResult:
    return await invoke(grep, ctx, arguments)


def test_grep_is_declared_as_a_read_tool_allowed_by_default() -> None:
    assert grep.permission == "allow"
    assert grep.kind == "read"
    assert grep.timeout == 10
    assert grep.is_async


@pytest.mark.trio
async def test_matches_are_tagged_with_path_line_and_the_read_file_hash(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="needle")
    assert result.ok
    lines = result.output.splitlines()
    assert lines[0] == "Found 3 matching lines in 3 files:"
    hidden, one, two = "needle = 'hidden'", "    print('needle one')", "// needle two"
    assert lines[1:] == [
        f".config/settings.toml:1:{line_hash(hidden)}|{hidden}",
        f"src/app.py:4:{line_hash(one)}|{one}",
        f"src/pkg/util.ts:2:{line_hash(two)}|{two}",
    ]
    assert result.data == {"matches": 3, "files": 3, "shown": 3, "truncated": False}


@pytest.mark.trio
async def test_ignored_git_and_binary_files_are_skipped(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="needle")
    for skipped in ("build/out.py", "debug.log", ".git/config", "image.bin"):
        assert skipped not in result.output


@pytest.mark.trio
async def test_context_lines_are_marked_apart_from_matches(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="needle one", context=1)
    one = "    print('needle one')"
    assert result.output.splitlines()[1:] == [
        f"src/app.py-3-{line_hash('def main():')}|def main():",
        f"src/app.py:4:{line_hash(one)}|{one}",
        f"src/app.py-5-{line_hash('    return 0')}|    return 0",
    ]


@pytest.mark.trio
async def test_separate_groups_of_context_are_divided(ctx: ToolContext, tree: Path) -> None:
    (tree / "many.txt").write_text("hit\n" + "x\n" * 5 + "hit\n")
    result = await search(ctx, pattern="hit", path="many.txt", context=1)
    assert result.output.splitlines()[1:] == [
        f"many.txt:1:{line_hash('hit')}|hit",
        f"many.txt-2-{line_hash('x')}|x",
        "--",
        f"many.txt-6-{line_hash('x')}|x",
        f"many.txt:7:{line_hash('hit')}|hit",
    ]


@pytest.mark.trio
async def test_without_max_results_at_most_100_matching_lines_are_shown(ctx: ToolContext, tree: Path) -> None:
    many = tree / "many"
    many.mkdir()
    (many / "a.txt").write_text("".join(f"target {i}\n" for i in range(150)))
    result = await search(ctx, pattern="target", path="many")
    assert result.ok
    lines = result.output.splitlines()
    assert lines[0] == "Found 150 matching lines in 1 file; showing the first 100:"
    assert [line.rsplit("|", 1)[1] for line in lines if line.startswith("many/")] == [f"target {i}" for i in range(100)]
    assert lines[-1].startswith("[50 more matching lines not shown (max_results=100).")
    assert result.data == {"matches": 150, "files": 1, "shown": 100, "truncated": True}
    # Exactly 100 fit without a cut.
    (many / "a.txt").write_text("".join(f"target {i}\n" for i in range(100)))
    exact = await search(ctx, pattern="target", path="many")
    assert exact.data == {"matches": 100, "files": 1, "shown": 100, "truncated": False}


@pytest.mark.trio
async def test_max_results_cuts_the_list_and_says_how_many_more(ctx: ToolContext, tree: Path) -> None:
    many = tree / "many"
    many.mkdir()
    for i in range(30):
        (many / f"f{i:02}.txt").write_text(f"target {i}\nother\ntarget again {i}\n")
    result = await search(ctx, pattern="target", path="many", max_results=5)
    assert result.ok
    lines = result.output.splitlines()
    assert lines[0] == "Found 60 matching lines in 30 files; showing the first 5:"
    assert len([line for line in lines if line.startswith("many/")]) == 5
    assert lines[-1].startswith("[55 more matching lines not shown (max_results=5).")
    assert result.data == {"matches": 60, "files": 30, "shown": 5, "truncated": True}


@pytest.mark.trio
async def test_a_cut_list_with_a_path_filter_counts_only_the_files_it_selects(ctx: ToolContext, tree: Path) -> None:
    for folder in ("keep", "skip"):
        (tree / folder).mkdir()
        for i in range(20):
            (tree / folder / f"f{i:02}.txt").write_text("target\ntarget\n")
    result = await search(ctx, pattern="target", include="keep/*.txt", max_results=3)
    assert result.data == {"matches": 40, "files": 20, "shown": 3, "truncated": True}
    assert "skip/" not in result.output


@pytest.mark.trio
async def test_a_search_matching_almost_everything_is_counted_exactly(ctx: ToolContext, tree: Path) -> None:
    dense = tree / "dense"
    dense.mkdir()
    for i in range(10):
        (dense / f"big{i}.txt").write_text("".join(f"match number {n}\n" for n in range(5000)))
    result = await search(ctx, pattern="match", path="dense", max_results=10)
    assert result.data == {"matches": 50_000, "files": 10, "shown": 10, "truncated": True}
    assert "[49,990 more matching lines not shown" in result.output


@pytest.mark.trio
async def test_the_after_context_of_the_last_match_shown_is_kept(ctx: ToolContext, tree: Path) -> None:
    (tree / "one.txt").write_text("hit\nafter\nhit\nafter\n")
    result = await search(ctx, pattern="hit", path="one.txt", context=1, max_results=1)
    assert result.output.splitlines()[1:3] == [
        f"one.txt:1:{line_hash('hit')}|hit",
        f"one.txt-2-{line_hash('after')}|after",
    ]
    assert "1 more matching line not shown" in result.output


@pytest.mark.trio
async def test_an_invalid_regex_gets_a_message_that_says_how_to_fix_it(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="print(")
    assert not result.ok
    assert "invalid regular expression 'print('" in result.output
    assert "fixed_strings=true" in result.output
    literal = await search(ctx, pattern="print(", fixed_strings=True)
    assert literal.ok
    assert "src/app.py:4:" in literal.output


@pytest.mark.trio
async def test_a_pattern_with_a_line_end_asks_for_multiline_not_a_ripgrep_flag(ctx: ToolContext) -> None:
    result = await search(ctx, pattern=r"def main\(\):\n")
    assert not result.ok
    assert result.output == (
        r"the pattern 'def main\\(\\):\\n' matches a line end ('\n'), which needs multiline "
        r"mode: call grep again with the same pattern and multiline: true. (Or drop the '\n' to search single lines.)"
    )
    assert "--multiline" not in result.output


@pytest.mark.trio
async def test_multiline_matches_span_lines_and_tag_each_one(ctx: ToolContext, tree: Path) -> None:
    (tree / "calls.py").write_text("x = 1\ndef a(\n    b,\n)\ndef a(c)\ny = 2\n")
    result = await search(ctx, pattern=r"def a\(\n *b", path="calls.py", multiline=True, context=1)
    assert result.ok
    assert result.output.splitlines() == [
        "Found 2 matching lines in 1 file:",
        f"calls.py-1-{line_hash('x = 1')}|x = 1",
        f"calls.py:2:{line_hash('def a(')}|def a(",
        f"calls.py:3:{line_hash('    b,')}|    b,",
        f"calls.py-4-{line_hash(')')}|)",
    ]
    assert result.data == {"matches": 2, "files": 1, "shown": 2, "truncated": False}
    # '.' stops at a line end unless the pattern asks otherwise with (?s).
    plain = await search(ctx, pattern=r"a\(.*c\)", path="calls.py", multiline=True)
    assert plain.output.splitlines()[1:] == [f"calls.py:5:{line_hash('def a(c)')}|def a(c)"]
    dotall = await search(ctx, pattern="(?s)x = 1.*b,", path="calls.py", multiline=True)
    assert [line.split("|")[0].rsplit(":", 2)[1] for line in dotall.output.splitlines()[1:]] == ["1", "2", "3"]


@pytest.mark.trio
async def test_case_insensitive_search(ctx: ToolContext) -> None:
    assert not (await search(ctx, pattern="NEEDLE ONE")).data["matches"]
    assert (await search(ctx, pattern="NEEDLE ONE", case_insensitive=True)).data["matches"] == 1


@pytest.mark.trio
async def test_include_narrows_by_name_or_path_and_still_respects_gitignore(ctx: ToolContext) -> None:
    by_name = await search(ctx, pattern="needle", include="*.py")
    assert "src/app.py" in by_name.output
    assert "build/out.py" not in by_name.output
    assert "util.ts" not in by_name.output
    ignored = await search(ctx, pattern="needle", include="*.log")
    assert ignored.data["matches"] == 0
    by_path = await search(ctx, pattern="needle", include="src/**/*.ts")
    assert by_path.data == {"matches": 1, "files": 1, "shown": 1, "truncated": False}
    braces = await search(ctx, pattern="needle", include="*.{py,ts}")
    assert braces.data["matches"] == 2


@pytest.mark.trio
async def test_a_subdirectory_or_a_file_can_be_searched_and_paths_stay_relative(ctx: ToolContext) -> None:
    sub = await search(ctx, pattern="needle", path="src/pkg")
    assert sub.output.splitlines()[1].startswith("src/pkg/util.ts:2:")
    one = await search(ctx, pattern="needle", path="src/app.py")
    assert one.output.splitlines()[1].startswith("src/app.py:4:")


@pytest.mark.trio
async def test_an_explicit_binary_file_says_it_matches_without_dumping_it(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="needle", path="image.bin")
    assert result.output.splitlines()[1] == "image.bin: binary file matches (1 line)"


@pytest.mark.trio
async def test_no_match_is_not_an_error(ctx: ToolContext) -> None:
    result = await search(ctx, pattern="no such text anywhere")
    assert result.ok
    assert result.output.startswith("No matches for 'no such text anywhere'")
    assert result.hints


@pytest.mark.trio
async def test_paths_outside_the_sandbox_are_refused(ctx: ToolContext, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("needle outside\n")
    for path in ("../", str(tmp_path), "../secret.txt"):
        result = await search(ctx, pattern="needle", path=path)
        assert not result.ok
        assert "outside the sandbox" in result.output
    missing = await search(ctx, pattern="needle", path="nope")
    assert not missing.ok
    assert "does not exist" in missing.output


@pytest.mark.trio
async def test_non_utf8_lines_hash_as_read_file_decodes_them(ctx: ToolContext, tree: Path) -> None:
    (tree / "latin1.txt").write_bytes(b"caf\xe9 needle\n")
    result = await search(ctx, pattern="needle", path="latin1.txt")
    expected = line_hash(b"caf\xe9 needle".decode("utf-8", "surrogateescape"))
    assert result.output.splitlines()[1] == f"latin1.txt:1:{expected}|caf\ufffd needle"


@pytest.mark.trio
async def test_very_long_lines_are_cut_but_hashed_whole(ctx: ToolContext, tree: Path) -> None:
    line = "needle " + "x" * 2000
    (tree / "long.txt").write_text(line + "\n")
    result = await search(ctx, pattern="needle", path="long.txt")
    shown = result.output.splitlines()[1]
    assert shown.startswith(f"long.txt:1:{line_hash(line)}|needle xxx")
    assert shown.endswith("[1507 more characters]")


@pytest.mark.trio
async def test_a_match_far_into_a_long_line_is_shown_in_a_window_with_its_column(ctx: ToolContext, tree: Path) -> None:
    # The case: a match at column 10,000 used to be cut away with the rest of the line.
    line = "x" * 9_999 + "needle" + "y" * 9_995
    (tree / "long.txt").write_text("short needle\n" + line + "\n")
    result = await search(ctx, pattern="needle", path="long.txt")
    shown = result.output.splitlines()[2]
    prefix = f"long.txt:2:{line_hash(line)}|…"
    assert shown.startswith(prefix)
    window = shown[len(prefix) :].split("…")[0]
    assert window == "x" * 100 + "needle" + "y" * 394
    assert shown.endswith("… [match at column 10000 of 20000]")
    assert result.output.splitlines()[1] == f"long.txt:1:{line_hash('short needle')}|short needle"


@pytest.mark.trio
async def test_a_match_at_the_end_of_a_long_line_shows_the_lines_end(ctx: ToolContext, tree: Path) -> None:
    line = "é" * 3_000 + "needle"  # columns count characters, not UTF-8 bytes
    (tree / "long.txt").write_text(line + "\n")
    result = await search(ctx, pattern="needle", path="long.txt")
    shown = result.output.splitlines()[1]
    assert shown == f"long.txt:1:{line_hash(line)}|…{'é' * 494}needle [match at column 3001 of 3006]"


@pytest.mark.trio
async def test_a_cancelled_search_kills_ripgrep(
    ctx: ToolContext, tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in for rg that never ends; its own unique path is in its command line.
    slow_rg = tmp_path / f"rg-that-never-ends-{uuid.uuid4().hex}"
    slow_rg.write_text("#!/bin/sh\nsleep 1000\n")
    slow_rg.chmod(0o755)
    monkeypatch.setattr("weald.tools.grep.find_ripgrep", lambda: str(slow_rg))
    started = trio.Event()

    async def watch() -> None:
        while not any(str(slow_rg).encode() in cmdline for cmdline in command_lines()):  # noqa: ASYNC110 - /proc has no event
            await trio.sleep(0.01)
        started.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        with trio.move_on_after(10) as scope:
            async with trio.open_nursery() as inner:
                inner.start_soon(lambda: search(ctx, pattern="x"))
                await started.wait()
                inner.cancel_scope.cancel()
        assert not scope.cancelled_caught  # it did start, and was cancelled by us
    assert not any(str(slow_rg).encode() in cmdline for cmdline in command_lines())


@pytest.mark.trio
async def test_a_fifo_is_refused_rather_than_waited_on(ctx: ToolContext, tree: Path) -> None:
    fifo = tree / f"fifo-{uuid.uuid4().hex}"
    os.mkfifo(fifo)
    with trio.fail_after(5):
        result = await search(ctx, pattern="x", path=fifo.name)
    assert not result.ok
    assert "is not a regular file (it is a device, FIFO or socket)" in result.output


@pytest.mark.trio
async def test_a_missing_ripgrep_is_explained(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("weald.tools._process.find_executable", lambda name: None)
    result = await search(ctx, pattern="needle")
    assert not result.ok
    assert "ripgrep (rg) is not installed" in result.output


@pytest.mark.parametrize("chunk", [None, 512], ids=["all at once", "in pieces"])
def test_the_totals_past_the_limit_come_from_ripgreps_summary_however_its_output_arrives(
    tmp_path: Path, chunk: int | None
) -> None:
    # ripgrep's whole output (the matches past the limit and its summary) may arrive in
    # the read that reaches the limit: a loaded machine made it so, and the total said
    # 101 of 150.
    (tmp_path / "a.txt").write_text("".join(f"target {i}\n" for i in range(150)))
    rg = find_ripgrep()
    output = subprocess.run([rg, "--json", "target", "a.txt"], cwd=tmp_path, capture_output=True, check=True).stdout
    collector = _Collector(100, 0, None)
    pieces = [output] if chunk is None else [output[i : i + chunk] for i in range(0, len(output), chunk)]
    for piece in pieces:
        collector.feed(piece)
    collector.finish()
    assert collector.shown == 100
    assert collector.totals() == (150, 1)
