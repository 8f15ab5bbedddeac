from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from weald.tools import ToolContext, ToolResult, default_registry, invoke
from weald.tools._hashline import line_hash
from weald.tools._ledger import ReadLedger
from weald.tools.read_file import read_file

Call = Callable[..., ToolResult]


def tag(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}|{content}"


def test_read_file_is_registered_with_its_defaults() -> None:
    tool = default_registry.get("read_file")
    assert tool is read_file
    assert (tool.permission, tool.timeout, tool.kind) == ("allow", 10.0, "read")
    assert tool.subject is not None
    assert tool.subject({"path": "a.py"}) == "a.py"


def test_every_line_is_tagged_with_its_number_and_hash(call: Call, project: Path) -> None:
    (project / "a.py").write_text("def f():\n    return 1\n\nx = f()\n")
    result = call(read_file, path="a.py")
    assert result.ok
    assert result.output == "\n".join(
        [tag(1, "def f():"), tag(2, "    return 1"), tag(3, ""), tag(4, "x = f()")],
    )
    assert result.hints == ()
    assert result.data == {"path": "a.py", "total_lines": 4, "start": 1, "end": 4}


def test_crlf_and_bom_are_invisible(call: Call, project: Path) -> None:
    (project / "w.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    result = call(read_file, path="w.txt")
    assert result.output == f"{tag(1, 'one')}\n{tag(2, 'two')}"
    assert "\r" not in result.output
    assert "\ufeff" not in result.output


def test_a_missing_final_newline_adds_no_line(call: Call, project: Path) -> None:
    (project / "a.txt").write_bytes(b"one\ntwo")
    result = call(read_file, path="a.txt")
    assert result.output == f"{tag(1, 'one')}\n{tag(2, 'two')}"
    assert result.data["total_lines"] == 2


def test_offset_and_limit_select_lines_and_a_hint_says_how_to_continue(call: Call, project: Path) -> None:
    (project / "a.txt").write_text("".join(f"l{i}\n" for i in range(1, 11)))
    result = call(read_file, path="a.txt", offset=3, limit=4)
    assert result.output == "\n".join(tag(i, f"l{i}") for i in range(3, 7))
    assert result.hints == ("Showing lines 3-6 of 10. Call read_file with offset=7 to continue.",)
    last = call(read_file, path="a.txt", offset=7)
    assert last.output.split("\n")[-1] == tag(10, "l10")
    assert last.hints == ()


def test_an_offset_past_the_end_is_an_error_naming_the_line_count(call: Call, project: Path) -> None:
    (project / "a.txt").write_text("a\nb\n")
    result = call(read_file, path="a.txt", offset=5)
    assert not result.ok
    assert result.output == "offset 5 is past the end of a.txt, which has 2 lines. Use an offset from 1 to 2."


def test_an_empty_file_says_so(call: Call, project: Path) -> None:
    (project / "empty.txt").write_bytes(b"")
    result = call(read_file, path="empty.txt")
    assert result.ok
    assert result.output == ""
    assert result.hints == ("empty.txt is empty (0 lines).",)


def test_binary_files_are_refused(call: Call, project: Path) -> None:
    (project / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    result = call(read_file, path="img.png")
    assert not result.ok
    assert result.output == (
        "img.png looks like a binary file (it contains NUL bytes); read_file shows UTF-8 text only. "
        "Inspect it with shell instead (e.g. `file`, `xxd | head`)."
    )


def test_files_of_mostly_invalid_utf8_are_refused(call: Call, project: Path) -> None:
    (project / "blob").write_bytes(bytes(range(0x80, 0x100)) * 8)
    result = call(read_file, path="blob")
    assert not result.ok
    assert "looks like a binary file (1024 of its first 1024 bytes are not valid UTF-8)" in result.output


def test_a_few_invalid_bytes_show_as_replacement_characters_with_a_note(call: Call, project: Path) -> None:
    (project / "latin.txt").write_bytes(b"caf\xe9\nok\n")
    result = call(read_file, path="latin.txt")
    assert result.ok
    first = result.output.split("\n")[0]
    assert first.endswith("|caf\ufffd")
    assert result.hints == (
        "The file has 1 bytes that are not valid UTF-8, shown as \ufffd. Edits keep those bytes unchanged; "
        "to match them in old_string, copy the \ufffd as shown.",
    )


def test_a_directory_points_to_glob(call: Call, project: Path) -> None:
    (project / "src").mkdir()
    result = call(read_file, path="src")
    assert result.output == "src is a directory, not a file. Use glob to list it (e.g. pattern 'src/*')."


def test_a_missing_file_points_to_glob(call: Call, project: Path) -> None:
    (project / "README.md").write_text("")
    result = call(read_file, path="README.txt")
    assert result.output == (
        "README.txt does not exist. Did you mean 'README.md'? Use glob to find the file (e.g. pattern '**/README.txt')."
    )


def test_files_over_the_size_limit_are_refused(make_ctx: Callable[..., ToolContext], call: Call, project: Path) -> None:
    (project / "log.txt").write_text("x\n" * 100)
    ctx = make_ctx(options={"files": {"max_read_bytes": 150}})
    result = call(read_file, ctx=ctx, path="log.txt")
    assert result.output == (
        "log.txt is 200 bytes, more than the file tools read (150 bytes). "
        "Search it with grep, or look at parts of it with shell (e.g. head, tail, sed -n '100,200p')."
    )


def test_files_outside_the_sandbox_are_refused(call: Call, outside: Path) -> None:
    result = call(read_file, path="../outside/secret.txt")
    assert not result.ok
    assert "is outside the sandbox" in result.output
    assert "top secret" not in result.output


def test_bad_arguments_are_reported_by_the_schema(call: Call, project: Path) -> None:
    (project / "a.txt").write_text("a\n")
    result = call(read_file, path="a.txt", limit=5000)
    assert result.output.startswith("invalid arguments for read_file: limit: 5000 is greater than the maximum of 2000")
    assert "offset" in call(read_file, path="a.txt", offset=0).output
    assert (
        "unknown argument(s) are not allowed ('lines' was unexpected)" in call(read_file, path="a.txt", lines=3).output
    )


def test_the_read_is_recorded_in_the_ledger(call: Call, project: Path, ledger: ReadLedger) -> None:
    (project / "a.txt").write_text("hello\n")
    call(read_file, path="a.txt", offset=1, limit=1)
    state = ledger.get(project / "a.txt")
    assert state is not None
    assert state.size == 6


def test_read_file_works_without_a_session(make_ctx: Callable[..., ToolContext], call: Call, project: Path) -> None:
    (project / "a.txt").write_text("hello\n")
    result = call(read_file, ctx=make_ctx(session=None), path="a.txt")
    assert result.output == tag(1, "hello")


def test_long_lines_are_shown_cut(call: Call, project: Path) -> None:
    (project / "min.js").write_text("x" * 5000 + "\nshort\n")
    result = call(read_file, path="min.js")
    first, second = result.output.split("\n")
    assert first == f"1:{line_hash('x' * 5000)}|{'x' * 2000}[... 3000 more characters cut; grep can show them]"
    assert second == tag(2, "short")
    assert "Lines longer than 2000 characters are shown cut." in result.hints


def test_output_stays_within_50_kb(call: Call, project: Path) -> None:
    (project / "wide.txt").write_text("".join(f"{i:05d}" + "y" * 995 + "\n" for i in range(1, 2001)))
    result = call(read_file, path="wide.txt")
    shown = result.output.split("\n")
    assert len(result.output.encode()) <= 50 * 1024
    assert len(shown) == result.data["end"] < 2000
    assert result.hints[0] == (
        f"Showing lines 1-{len(shown)} of 2000. Call read_file with offset={len(shown) + 1} to continue."
    )


def test_output_of_non_ascii_lines_stays_within_50_kb(call: Call, project: Path) -> None:
    (project / "greek.txt").write_text("".join("αβγδ" * 50 + "\n" for _ in range(2000)))
    result = call(read_file, path="greek.txt")
    size = len(result.output.encode())
    assert 49 * 1024 < size <= 50 * 1024
    assert result.output.count("\n") + 1 == result.data["end"]


@pytest.fixture
def big_file(project: Path) -> Path:
    path = project / "big.py"
    path.write_text("".join(f"    value_{i} = compute({i}, 'some text here')\n" for i in range(1, 100_001)))
    return path


def test_a_100000_line_file_reads_in_pages(call: Call, big_file: Path) -> None:
    first = call(read_file, path="big.py")
    lines = first.output.split("\n")
    assert len(first.output.encode()) <= 50 * 1024  # about 950 of these lines fit in 50 KB
    assert lines[0] == tag(1, "    value_1 = compute(1, 'some text here')")
    n = len(lines)
    assert first.hints == (f"Showing lines 1-{n} of 100000. Call read_file with offset={n + 1} to continue.",)
    last = call(read_file, path="big.py", offset=99_501, limit=500)
    assert last.output.split("\n")[-1] == tag(100_000, "    value_100000 = compute(100000, 'some text here')")
    assert last.hints == ()


def test_paging_through_a_10000_line_file_by_the_hints_shows_every_line_once_in_order(
    ctx: ToolContext, project: Path
) -> None:
    # How fast it is, is measured in benchmarks/bench_read_file.py.
    lines = [f"    value_{i} = compute({i}, 'some text here')" for i in range(10_000)]
    (project / "mid.py").write_text("".join(f"{line}\n" for line in lines))

    async def page_through() -> list[tuple[int, int]]:
        pages = []
        offset = 1
        while offset <= len(lines):
            result = await invoke(read_file, ctx, {"path": "mid.py", "offset": offset})
            assert result.ok, result.output
            assert result.data["start"] == offset
            pages.append((result.data["start"], result.data["end"]))
            for n in range(result.data["start"], result.data["end"] + 1):
                assert tag(n, lines[n - 1]) in result.output
            offset = result.data["end"] + 1
        return pages

    pages = trio.run(page_through)
    assert pages[0][0] == 1
    assert pages[-1][1] == 10_000
    assert all(later[0] == earlier[1] + 1 for earlier, later in itertools.pairwise(pages))
