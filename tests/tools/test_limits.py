from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from weald.tools import ToolResult
from weald.tools._limits import limit_output


def numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


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
    assert lines[:2000] == [f"line {i}" for i in range(1, 2001)]
    assert lines[2000] == (
        f"[output cut: showing the first 2000 of 5000 lines. The full output (5000 lines, {len(text)} bytes) "
        f"is saved at {saved}: read on with read_file(path={str(saved)!r}, offset=2001) or search it with grep.]"
    )
    assert len(lines) == 2001
    assert cut.ok
    assert cut.data == {"k": 1}
    assert cut.hints == ("keep me",)


def test_head_stops_at_the_byte_limit_on_a_line_boundary(tmp_path: Path) -> None:
    text = ("a" * 99 + "\n") * 1000  # 100 bytes a line, 100,000 bytes
    cut = limit_output(ToolResult.success(text), keep="head", save_dir=tmp_path, call_id="c")
    shown, notice = cut.output.rsplit("\n", 1)
    assert len((shown + "\n").encode()) == 512 * 100  # 51,200 bytes: 512 whole lines
    assert notice.startswith("[output cut: showing the first 512 of 1000 lines.")
    assert "offset=513" in notice


def test_tail_keeps_the_last_lines_with_the_notice_first(tmp_path: Path) -> None:
    text = numbered(3000)
    cut = limit_output(ToolResult.error(text), keep="tail", save_dir=tmp_path, call_id="build")
    lines = cut.output.split("\n")
    saved = tmp_path / "build.txt"
    assert lines[0] == (
        f"[output cut: showing the last 2000 of 3000 lines; the first 1000 were cut. The full output "
        f"(3000 lines, {len(text)} bytes) is saved at {saved}: read it with read_file(path={str(saved)!r}) "
        "or search it with grep.]"
    )
    assert lines[1:-1] == [f"line {i}" for i in range(1001, 3001)]
    assert lines[-1] == ""  # the final newline is kept
    assert not cut.ok
    assert saved.read_text() == text


def test_one_huge_line_is_cut_on_a_character_boundary(tmp_path: Path) -> None:
    text = "é" * 60_000  # 120,000 bytes, one line
    cut = limit_output(ToolResult.success(text), keep="head", save_dir=tmp_path, call_id="c")
    shown, notice = cut.output.rsplit("\n", 1)
    assert shown == "é" * (50 * 1024 // 2)
    assert "only the start of line 1, which is too long" in notice
    tail = limit_output(ToolResult.success(text + "€"), keep="tail", save_dir=tmp_path, call_id="d")
    notice, shown = tail.output.split("\n", 1)
    assert shown.endswith("€")
    assert len(shown.encode()) <= 50 * 1024
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
    text=st.text(st.sampled_from(["a", "é", "€", "😀", "\n", " "]), max_size=400),
    max_lines=st.integers(1, 20),
    max_bytes=st.integers(4, 200),
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
    if keep == "head":
        shown = cut.output.rsplit("\n", 1)[0]
        assert text.startswith(shown)
    else:
        shown = cut.output.split("\n", 1)[1]
        assert text.endswith(shown)
    assert len(shown.encode()) <= max_bytes
    assert shown.count("\n") <= max_lines
