from __future__ import annotations

import itertools
import subprocess
import sys
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from weald.tools import ToolError
from weald.tools._hashline import (
    TextFile,
    binary_reason,
    echoed_from,
    format_line,
    format_lines,
    line_hash,
    parse_anchor,
    strip_echoed_tags,
    tag_prefixed,
    to_display,
)

# --- line_hash ---------------------------------------------------------------


def test_line_hash_is_the_low_byte_of_crc32_of_the_whole_line() -> None:
    assert line_hash("    return x  ") == f"{zlib.crc32(b'    return x  ') & 0xFF:02x}"
    # A golden value: changing the algorithm invalidates every tag a model holds.
    assert line_hash("def main():") == "cd"


def test_line_hash_sees_indentation_and_trailing_whitespace() -> None:
    # The case: "}", "  }" and "    }" must not share a tag, nor "" and "    ".
    assert len({line_hash("}"), line_hash("  }"), line_hash("    }")}) == 3
    assert line_hash("") != line_hash("    ")
    assert line_hash("x = 1") != line_hash("x = 1 ")
    assert line_hash("x = 1") != line_hash("\tx = 1")


def test_line_hash_is_two_lowercase_hex_digits() -> None:
    for text in ["", "a", "\udcff", "é" * 100]:
        h = line_hash(text)
        assert len(h) == 2
        assert h == h.lower()
        int(h, 16)


def test_line_hash_is_the_same_in_another_process() -> None:
    code = "from weald.tools._hashline import line_hash; print(line_hash('import os'))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert out.stdout.strip() == line_hash("import os")


# --- formatting --------------------------------------------------------------


def test_format_line_is_number_colon_hash_bar_content() -> None:
    assert format_line(12, "    return x") == f"12:{line_hash('    return x')}|    return x"


def test_format_lines_numbers_from_first() -> None:
    tagged = format_lines(["a", "b"], 7)
    assert tagged == [f"7:{line_hash('a')}|a", f"8:{line_hash('b')}|b"]


def test_format_lines_shows_undecodable_bytes_as_replacement_characters() -> None:
    [tagged] = format_lines(["x = \udcff"], 1)
    assert tagged.endswith("|x = \ufffd")
    assert to_display("a\udc80b") == "a\ufffdb"


# --- parse_anchor ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("12:3f", (12, "3f")), (" 12 : 3F ", (12, "3f")), ("12:3f|    return x", (12, "3f")), ("1:00", (1, "00"))],
)
def test_parse_anchor_accepts_tags_as_read_file_shows_them(value: str, expected: tuple[int, str]) -> None:
    assert parse_anchor(value) == expected


@pytest.mark.parametrize("value", ["12", "abc", "0:00", "12:3g", "12:3", ":3f", "12:3f0"])
def test_parse_anchor_rejects_other_text_and_shows_the_expected_form(value: str) -> None:
    with pytest.raises(ToolError) as exc:
        parse_anchor(value, argument="through")
    message = str(exc.value)
    assert f"through={value!r} is not a line anchor" in message
    assert "through='12:3f'" in message
    assert "'12:3f|    return x'" in message


# --- strip_echoed_tags -------------------------------------------------------


def tag(n: int, content: str) -> str:
    return f"{n}:{line_hash(content)}|{content}"


def test_strip_removes_tags_when_every_line_carries_the_tag_read_file_gives_it() -> None:
    text = tag(12, "def f():") + "\n" + tag(13, "    return 2") + "\n"
    assert echoed_from(text) == 12
    assert strip_echoed_tags(text) == "def f():\n    return 2\n"
    assert strip_echoed_tags(text, first=12) == "def f():\n    return 2\n"


def test_strip_keeps_tags_numbered_for_another_place() -> None:
    text = tag(12, "def f():") + "\n" + tag(13, "    return 2")
    assert strip_echoed_tags(text, first=40) == text


def test_strip_removes_a_single_tag_whose_hash_matches_its_line() -> None:
    assert strip_echoed_tags(tag(40, "x = 1")) == "x = 1"


def test_pipe_delimited_content_that_looks_tagged_is_kept() -> None:
    # The data-loss case: a schedule whose first column looks like a tag.
    text = "09:00|standup\n10:00|review\n"
    assert tag_prefixed(text)
    assert echoed_from(text) is None
    assert strip_echoed_tags(text) == text
    assert strip_echoed_tags(text, first=9) == text


def test_strip_keeps_text_with_one_unverified_tag() -> None:
    # Two good echoes and one line whose hash is not the one its text has.
    text = "\n".join([tag(5, "a"), tag(6, "b"), "7:00|c"])
    assert line_hash("c") != "00"
    assert strip_echoed_tags(text) == text


def test_strip_keeps_tags_that_do_not_number_consecutive_lines() -> None:
    text = tag(10, "standup") + "\n" + tag(14, "review")
    assert strip_echoed_tags(text) == text


def test_strip_keeps_echoed_tags_among_untagged_lines() -> None:
    # A model inserted a line among echoed ones: not every line carries a tag, so nothing is cut.
    text = "\n".join([tag(5, "def f():"), "    new_line()", tag(6, "    return 1")])
    assert strip_echoed_tags(text) == text


def test_strip_needs_blank_lines_tagged_too() -> None:
    tagged = tag(1, "a") + "\n" + tag(2, "") + "\n" + tag(3, "b") + "\n"
    assert strip_echoed_tags(tagged) == "a\n\nb\n"
    untagged_blank = tag(1, "a") + "\n\n" + tag(3, "b") + "\n"
    assert strip_echoed_tags(untagged_blank) == untagged_blank


def test_strip_leaves_text_without_tags_alone() -> None:
    for text in ["", "plain", "a | b", "x = {1: 2}|y", "\n"]:
        assert strip_echoed_tags(text) == text
        assert not tag_prefixed(text)


# --- binary_reason -----------------------------------------------------------


def test_nul_bytes_mean_binary() -> None:
    assert binary_reason(b"PK\x03\x04\x00\x00") == "it contains NUL bytes"


def test_utf16_text_counts_as_binary() -> None:
    assert binary_reason("hello".encode("utf-16")) is not None


def test_mostly_undecodable_bytes_mean_binary() -> None:
    reason = binary_reason(bytes(range(0x80, 0x100)) * 4)
    assert reason is not None
    assert "not valid UTF-8" in reason


def test_text_with_a_few_invalid_bytes_is_text() -> None:
    assert binary_reason(b"caf\xe9 au lait, " * 20) is None


def test_a_character_cut_at_the_sniff_boundary_is_not_invalid() -> None:
    data = b"a" * 8191 + "é".encode() * 10
    assert binary_reason(data) is None


def test_empty_and_plain_files_are_text() -> None:
    assert binary_reason(b"") is None
    assert binary_reason(b"print('hi')\n") is None


# --- TextFile ----------------------------------------------------------------


def test_decode_sets_the_bom_aside() -> None:
    doc = TextFile.decode(b"\xef\xbb\xbfa\n")
    assert doc.bom
    assert doc.text == "a\n"
    assert doc.encode() == b"\xef\xbb\xbfa\n"


def test_decode_reads_crlf_as_lf_and_detects_the_dominant_ending() -> None:
    doc = TextFile.decode(b"a\r\nb\r\nc\n")
    assert doc.text == "a\nb\nc\n"
    assert doc.eol == "\r\n"
    assert TextFile.decode(b"a\nb\nc\r\n").eol == "\n"
    assert TextFile.decode(b"no newline").eol == "\n"


def test_lines_of_a_final_newline_add_no_empty_line() -> None:
    assert TextFile.decode(b"a\nb\n").lines() == ["a", "b"]
    assert TextFile.decode(b"a\nb").lines() == ["a", "b"]
    assert TextFile.decode(b"a\n\n").lines() == ["a", ""]
    assert TextFile.decode(b"").lines() == []
    assert TextFile.decode(b"\n").lines() == [""]


def test_decode_counts_invalid_bytes() -> None:
    doc = TextFile.decode(b"a\xffb\xfe\n")
    assert doc.invalid_bytes == 2
    assert doc.encode() == b"a\xffb\xfe\n"


@given(st.binary())
def test_decode_then_encode_gives_back_the_same_bytes(data: bytes) -> None:
    assert TextFile.decode(data).encode() == data


def test_replace_gives_new_text_the_files_line_ending_and_keeps_the_rest() -> None:
    doc = TextFile.decode(b"one\r\ntwo\nthree\r\nfour\r\n")
    start = doc.text.index("three")
    new = doc.replace([(start, start + len("three\n"), "3\n3b\n")])
    assert doc.encode(new) == b"one\r\ntwo\n3\r\n3b\r\nfour\r\n"


def test_replace_never_splits_a_crlf() -> None:
    doc = TextFile.decode(b"a\r\nb\r\n")
    end_of_a = doc.text.index("\n")
    assert doc.replace([(end_of_a, end_of_a, "X")]) == "aX\r\nb\r\n"
    assert doc.replace([(0, end_of_a + 1, "")]) == "b\r\n"


@given(
    st.lists(st.sampled_from(["a", "bb", " ", "\r\n", "\n", "\udcff", "é"]), max_size=30),
    st.data(),
)
def test_replace_keeps_every_byte_outside_the_edit(pieces: list[str], data: st.DataObject) -> None:
    raw = "".join(pieces)
    doc = TextFile.decode(raw.encode("utf-8", "surrogateescape"))
    start = data.draw(st.integers(0, len(doc.text)))
    end = data.draw(st.integers(start, len(doc.text)))
    new = doc.replace([(start, end, "<X>")])
    before, after = new.split("<X>")
    assert raw.startswith(before)
    assert raw.endswith(after)
    assert before.replace("\r\n", "\n") == doc.text[:start]
    assert after.replace("\r\n", "\n") == doc.text[end:]


# --- line_hunks ----------------------------------------------------------------------


def test_line_hunks_of_a_replaced_line_and_an_insertion() -> None:
    doc = TextFile.decode(b"a\nb\nc\n")
    b = doc.text.index("b")
    assert doc.line_hunks([(b, b + 1, "B")]) == ((1, 2, 1),)
    assert doc.line_hunks([(b, b, "x\n")]) == ((1, 1, 1),)  # a whole line before "b": "b" is untouched
    assert doc.line_hunks([(b, b + 2, "")]) == ((1, 2, 0),)  # "b\n" deleted
    assert doc.line_hunks([(0, 1, "A"), (4, 5, "C")]) == ((0, 1, 1), (2, 3, 1))


def test_line_hunks_at_the_end_of_a_file_without_a_final_newline() -> None:
    doc = TextFile.decode(b"a\nb")
    assert doc.line_hunks([(3, 3, "\nc")]) == ((2, 2, 1),)  # "b" gains a newline, its text is untouched
    assert doc.line_hunks([(1, 3, "")]) == ((1, 2, 0),)  # "\nb" removed: "a" is the last line now


@given(
    st.lists(st.sampled_from(["a", "", "b\n", "\n", "\n\n", "cc", "\nd"]), max_size=10),
    st.data(),
)
def test_line_hunks_account_for_every_line(pieces: list[str], data: st.DataObject) -> None:
    # Lines outside the hunks keep their text at their shifted number, and the counts add up.
    text = "".join(pieces)
    doc = TextFile.decode(text.encode())
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    edits = [
        (cuts[i], cuts[i + 1], data.draw(st.sampled_from(["", "\n", "x", "x\n", "\nx", "\n\n", "y\nz"])))
        for i in range(0, len(cuts) - 1, 2)
    ]
    old = doc.lines()
    new = TextFile.decode(doc.replace(edits).encode()).lines()
    hunks = doc.line_hunks(edits)
    assert all(b1 <= a2 for (_, b1, _), (a2, _, _) in itertools.pairwise(hunks))
    assert len(new) == len(old) + sum(c - (b - a) for a, b, c in hunks)
    shift = previous = 0
    for a, b, c in [*hunks, (len(old), len(old), 0)]:
        for x in range(previous, a):
            assert old[x] == new[x + shift]
        shift += c - (b - a)
        previous = b
