from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from weald.tools import ToolResult
from weald.tools._limits import limit_output

LIMIT_LINES = 2000
LIMIT_BYTES = 50 * 1024  # 51,200


def numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


def line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def assert_within(output: str, max_lines: int = LIMIT_LINES, max_bytes: int = LIMIT_BYTES) -> None:
    """What reaches the model, notice included, is within both limits."""
    assert line_count(output) <= max_lines
    assert len(output.encode("utf-8", "surrogatepass")) <= max_bytes


def test_output_within_the_limits_is_untouched(tmp_path: Path) -> None:
    result = ToolResult.success("short\noutput\n", data={"k": 1}, hints=["h"])
    assert limit_output(result, keep="head", save_dir=tmp_path / "out", call_id="c1") is result
    assert not (tmp_path / "out").exists()


def test_exactly_at_the_limits_is_untouched(tmp_path: Path) -> None:
    text = "x" * 99 + "\n" + "y" * 100  # 2 lines, 200 bytes
    result = ToolResult.success(text)
    assert limit_output(result, keep="head", max_lines=2, max_bytes=200, save_dir=tmp_path, call_id="c") is result


def test_head_keeps_the_first_lines_and_saves_everything(tmp_path: Path) -> None:
    text = numbered(5000)
    result = ToolResult.success(text, data={"k": 1}, hints=["keep me"])
    cut = limit_output(result, keep="head", save_dir=tmp_path / "out", call_id="call_7")
    saved = tmp_path / "out" / "call_7.txt"
    assert saved.read_text() == text
    assert cut.full_output_path == str(saved)
    lines = cut.output.split("\n")
    # The notice and the hint are two of the 2,000 lines the model reads.
    assert lines[:1998] == [f"line {i}" for i in range(1, 1999)]
    assert lines[1998] == (
        f"[output cut: showing the first 1998 of 5000 lines. The full output (5000 lines, {len(text)} bytes) "
        f"is saved at {saved}: read on with read_file(path={str(saved)!r}, offset=1999) or search it with grep.]"
    )
    assert len(lines) == 1999
    assert cut.text().split("\n")[1999:] == ["Hint: keep me"]
    assert_within(cut.text())
    assert cut.ok
    assert cut.data == {"k": 1}
    assert cut.hints == ("keep me",)


def test_head_stops_at_the_byte_limit_on_a_line_boundary(tmp_path: Path) -> None:
    text = ("a" * 99 + "\n") * 1000  # 100 bytes a line, 100,000 bytes
    cut = limit_output(ToolResult.success(text), keep="head", save_dir=tmp_path, call_id="c")
    shown, notice = cut.output.rsplit("\n", 1)
    kept = len((shown + "\n").encode()) // 100
    assert (shown + "\n") == text[: kept * 100]  # whole lines only
    # As many whole lines as leave room for the notice within 51,200 bytes, and not one fewer.
    assert len(cut.output.encode()) <= LIMIT_BYTES < len(cut.output.encode()) + 100
    assert notice.startswith(f"[output cut: showing the first {kept} of 1000 lines.")
    assert f"offset={kept + 1})" in notice


def test_tail_keeps_the_last_lines_with_the_notice_first(tmp_path: Path) -> None:
    text = numbered(3000)
    cut = limit_output(ToolResult.error(text), keep="tail", save_dir=tmp_path, call_id="build")
    lines = cut.output.split("\n")
    saved = tmp_path / "build.txt"
    assert lines[0] == (
        f"[output cut: showing the last 1999 of 3000 lines; the first 1001 were cut. The full output "
        f"(3000 lines, {len(text)} bytes) is saved at {saved}: read it with read_file(path={str(saved)!r}) "
        "or search it with grep.]"
    )
    assert lines[1:-1] == [f"line {i}" for i in range(1002, 3001)]
    assert lines[-1] == ""  # the final newline is kept
    assert_within(cut.output)
    assert not cut.ok
    assert saved.read_text() == text


def test_one_huge_line_is_cut_on_a_character_boundary(tmp_path: Path) -> None:
    text = "é" * 60_000  # 120,000 bytes, one line
    cut = limit_output(ToolResult.success(text), keep="head", save_dir=tmp_path, call_id="c")
    shown, notice = cut.output.rsplit("\n", 1)
    assert set(shown) == {"é"}
    assert len(shown) > 25_000  # nearly all of the 50 KB, less the notice
    assert "only the start of line 1, which is too long" in notice
    assert_within(cut.output)
    tail = limit_output(ToolResult.success(text + "€"), keep="tail", save_dir=tmp_path, call_id="d")
    notice, shown = tail.output.split("\n", 1)
    assert shown.endswith("€")
    assert_within(tail.output)
    assert set(shown[:-1]) == {"é"}
    assert "only the end of line 1, which is too long" in notice


def test_the_call_id_cannot_escape_the_save_directory(tmp_path: Path) -> None:
    save_dir = tmp_path / "a" / "b"
    cut = limit_output(ToolResult.success(numbered(10)), keep="head", max_lines=2, save_dir=save_dir, call_id="../../x")
    assert cut.full_output_path is not None
    assert Path(cut.full_output_path).parent == save_dir
    assert Path(cut.full_output_path).name == "_.._x.txt"


def test_undecodable_bytes_in_output_survive_saving(tmp_path: Path) -> None:
    text = "bad \udcff byte\n" * 10
    cut = limit_output(ToolResult.success(text), keep="head", max_lines=3, save_dir=tmp_path, call_id="c")
    assert cut.full_output_path is not None
    assert Path(cut.full_output_path).read_bytes() == text.encode("utf-8", "surrogateescape")


@settings(max_examples=60)
@given(
    text=st.text(st.sampled_from(["a", "é", "€", "😀", "\n", " "]), max_size=1500),
    max_lines=st.integers(1, 20),
    # The notice alone is a few hundred bytes: most limits here leave room for some output too.
    max_bytes=st.integers(4, 1500),
    keep=st.sampled_from(["head", "tail"]),
)
def test_what_is_kept_is_an_end_of_the_output_within_both_limits(
    tmp_path_factory: pytest.TempPathFactory,
    text: str,
    max_lines: int,
    max_bytes: int,
    keep: Literal["head", "tail"],
) -> None:
    save_dir = tmp_path_factory.mktemp("limits")
    result = ToolResult.success(text)
    cut = limit_output(result, keep=keep, max_lines=max_lines, max_bytes=max_bytes, save_dir=save_dir, call_id="p")
    if cut is result:
        assert len(text.encode()) <= max_bytes
        return
    assert_within(cut.output, max_lines, max_bytes)
    assert cut.full_output_path is not None
    if "\n" not in cut.output:  # only the notice fits (or only part of it)
        assert "[output cut: showing the first 0 of".startswith(cut.output) or cut.output.startswith("[output cut")
        return
    if keep == "head":
        shown = cut.output.rsplit("\n", 1)[0]
        assert text.startswith(shown)
    else:
        shown = cut.output.split("\n", 1)[1]
        assert text.endswith(shown)


@pytest.mark.parametrize("keep", ["head", "tail"])
@pytest.mark.parametrize(
    "text",
    [
        numbered(5000),  # too many lines
        ("x" * 1000 + "\n") * 200,  # too many bytes in long lines
        "é" * 60_000,  # one line longer than the byte limit
        "\n" * 10_000,  # empty lines only
    ],
    ids=["lines", "long-lines", "one-huge-line", "empty-lines"],
)
def test_the_cut_output_with_its_notice_is_at_most_2000_lines_and_51200_bytes(
    tmp_path: Path, text: str, keep: Literal["head", "tail"]
) -> None:
    cut = limit_output(
        ToolResult.success(text), keep=keep, save_dir=tmp_path / ("a-long-directory-name" * 3), call_id="c"
    )
    assert cut.output.count("[output cut:") == 1
    assert_within(cut.output)


def test_limits_too_small_for_the_notice_give_the_notice_alone_within_them(tmp_path: Path) -> None:
    text = numbered(100)
    for max_lines, max_bytes in ((1, 10_000), (50, 40)):
        cut = limit_output(
            ToolResult.success(text),
            keep="head",
            max_lines=max_lines,
            max_bytes=max_bytes,
            save_dir=tmp_path,
            call_id="c",
        )
        assert "[output cut: showing the first 0 of 100 lines. The full output".startswith(cut.output[:60])
        assert_within(cut.output, max_lines, max_bytes)
        assert cut.full_output_path is not None
        assert Path(cut.full_output_path).read_text() == text


@pytest.mark.parametrize("keep", ["head", "tail"])
def test_hints_are_kept_and_counted_in_the_limits(tmp_path: Path, keep: Literal["head", "tail"]) -> None:
    hints = ["narrow the search", "or raise max_results " + "x" * 500]
    result = ToolResult.error(numbered(5000), hints=hints)
    cut = limit_output(result, keep=keep, save_dir=tmp_path, call_id="c")
    assert cut.hints == tuple(hints)
    assert not cut.ok
    assert_within(cut.text())
    # Output that fits on its own but not with its hints is cut too.
    lines = ToolResult.success(numbered(1999), hints=hints)
    assert_within(limit_output(lines, keep=keep, save_dir=tmp_path, call_id="d").text())
