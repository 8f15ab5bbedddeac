r"""Hashline tags (``N:hh|content``) and the decoded view of a text file.

read_file shows every line as ``12:3f|    return x``: the 1-based line
number, a colon, two hex digits hashing the line, a bar, then the line. A
model edits by anchor (``start="12:3f"``). The tag alone cannot prove the
line is the one the model saw (two lines share a tag one time in 256, and
equal lines always do), so edit_file also consults the session's ledger of
the versions of the file the model was shown (`weald.tools._ledger`): an
anchor is applied only where line number, tag and that history agree.

The hash is the low byte of zlib's CRC-32 of the whole line's UTF-8 bytes,
indentation and trailing whitespace included (the line ending is not part of
the line), as two lowercase hex digits. CRC-32 is stable across processes,
platforms and Python versions (unlike ``hash()``) and runs in C in one pass.
``}`` and ``  }`` get different tags, so an anchor cannot slide onto a line
that differs from it only in indentation.

`TextFile` is the one decoding every file tool shares, so read_file and
edit_file agree on what a line is:

- bytes decode as UTF-8 with ``surrogateescape``: an invalid byte becomes a
  lone surrogate, survives editing untouched and encodes back to itself; the
  model sees it as U+FFFD;
- a UTF-8 BOM is set aside and restored on write;
- CRLF reads as LF (the model never sees ``\r``), and text the model writes
  gets the file's dominant line ending; untouched lines keep theirs, byte for byte;
- a final newline ends the last line rather than starting an empty one.
"""

from __future__ import annotations

import bisect
import re
import zlib
from collections.abc import Iterable, Sequence

import attrs
from weald.tools._contract import ToolError

__all__ = [
    "UTF8_BOM",
    "Hunk",
    "TextFile",
    "binary_reason",
    "echoed_from",
    "format_line",
    "format_lines",
    "line_hash",
    "parse_anchor",
    "strip_echoed_tags",
    "tag_prefixed",
    "to_display",
]

UTF8_BOM = b"\xef\xbb\xbf"

# Every possible tag value, so the hot loop indexes instead of formatting.
_HEX = tuple(f"{i:02x}" for i in range(256))

# Lone surrogates from ``surrogateescape`` (one per undecodable byte).
_ESCAPED_RE = re.compile("[\udc80-\udcff]")

# A tag a model echoes back at the start of a line: ``12:3f|``.
_TAG_RE = re.compile(r"(\d+):([0-9a-f]{2})\|")

# A change to a file's lines: old lines ``a`` to ``b - 1`` (0-based) became
# ``c`` new lines starting at ``a``; ``a == b`` inserts before old line ``a``.
Hunk = tuple[int, int, int]

# An anchor argument: ``12:3f``, tolerating spaces, upper case and an echoed ``|content``.
_ANCHOR_RE = re.compile(r"\s*(\d+)\s*:\s*([0-9a-fA-F]{2})\s*(?:\|.*)?", re.DOTALL)

# How much of a file `binary_reason` inspects, and the share of undecodable
# bytes above which a file counts as binary rather than text with a few bad bytes.
_SNIFF_BYTES = 8192
_BINARY_INVALID_RATIO = 0.10
_BINARY_INVALID_MIN = 8


def line_hash(content: str) -> str:
    """The two-hex-digit tag of one line (without its line ending).

    Args:
        content: the whole line, indentation and trailing whitespace included.

    Returns:
        The low byte of CRC-32 of the line's UTF-8 bytes, e.g. ``"3f"``.
        Undecodable bytes (lone surrogates) hash as their ``surrogatepass`` encoding.
    """
    return _HEX[zlib.crc32(content.encode("utf-8", "surrogatepass")) & 0xFF]


def to_display(text: str) -> str:
    """``text`` with every undecodable byte shown as U+FFFD, as the model sees it."""
    return _ESCAPED_RE.sub("\ufffd", text)


def format_line(number: int, content: str) -> str:
    """One tagged line: ``N:hh|content`` (undecodable bytes shown as U+FFFD)."""
    return f"{number}:{line_hash(content)}|{to_display(content)}"


def format_lines(lines: Iterable[str], first: int = 1, *, escaped: bool = True) -> list[str]:
    """Tag consecutive lines, numbering from ``first``.

    This is read_file's hot loop: a 10,000-line file takes a few milliseconds.

    Args:
        lines: the lines, without line endings.
        first: the number of the first line.
        escaped: the lines may hold undecodable bytes to show as U+FFFD; pass
            False when the file decoded cleanly, to skip that pass.
    """
    hex_ = _HEX
    crc = zlib.crc32
    out = [
        f"{n}:{hex_[crc(line.encode('utf-8', 'surrogatepass')) & 0xFF]}|{line}" for n, line in enumerate(lines, first)
    ]
    if escaped:
        out = [to_display(t) for t in out]
    return out


def parse_anchor(value: str, *, argument: str = "start") -> tuple[int, str]:
    """Parse an anchor ``N:hh`` into ``(N, hh)``.

    Tolerates surrounding spaces, upper-case hex and a whole echoed tagged
    line (``12:3f|    return x``).

    Raises:
        ToolError: ``value`` is not an anchor; the message shows the form expected.
    """
    m = _ANCHOR_RE.fullmatch(value)
    if m is None or int(m[1]) < 1:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise ToolError(
            f"{argument}={shown!r} is not a line anchor. An anchor is the line number and hash that "
            f"read_file shows before the bar, e.g. {argument}='12:3f' for the line shown as "
            "'12:3f|    return x'. Read the file again if you do not have the line's tag.",
        )
    return int(m[1]), m[2].lower()


def echoed_from(text: str) -> int | None:
    """Where ``text`` was copied from read_file output, tags and all, if it was.

    Legitimate content can look like a tag (``09:00|standup`` in a table), so
    text counts as echoed only when every line carries a tag (a final newline
    ends the last line), the tags number consecutive lines, and each tag's
    hash is the one weald gives the text after it.

    Returns:
        The number of the first tag, or None when ``text`` is not an echo.
    """
    if "|" not in text:
        return None
    lines = text.split("\n")
    if lines[-1] == "" and len(lines) > 1:
        lines.pop()
    first: int | None = None
    for i, line in enumerate(lines):
        m = _TAG_RE.match(line)
        if m is None or line_hash(line[m.end() :]) != m[2]:
            return None
        number = int(m[1])
        if first is None:
            first = number
        elif number != first + i:
            return None
    return first


def tag_prefixed(text: str) -> bool:
    """Some line of ``text`` starts like a tag, ``N:hh|``, whatever its hash (a hint worth a note)."""
    return "|" in text and any(_TAG_RE.match(line) for line in text.split("\n"))


def strip_echoed_tags(text: str, *, first: int | None = None) -> str:
    """``text`` without the ``N:hh|`` prefixes a model copied into it, or ``text`` unchanged.

    The prefixes go only when `echoed_from` finds every line tagged as weald
    would tag it and, if ``first`` is given, numbered from ``first``: the tag
    weald itself would give each line at the number it will have. Anything
    else is kept as written, so content that merely looks tagged is never cut.

    Args:
        text: what the model sent (``new_string``, ``old_string`` or a file's content).
        first: the line number the text's first line will have, if known.
    """
    start = echoed_from(text)
    if start is None or (first is not None and start != first):
        return text
    return "\n".join(line[line.index("|") + 1 :] if line else line for line in text.split("\n"))


def binary_reason(data: bytes) -> str | None:
    """Why ``data`` looks like a binary file rather than text, or None if it looks like text.

    Looks at the first 8 KB: a NUL byte, or more than 10% of bytes that are not
    valid UTF-8 (and more than 8 of them, so one Latin-1 "é" in a short file
    stays text), mean binary. UTF-16 text counts as binary: it is full of NULs.
    """
    head = data[:_SNIFF_BYTES]
    if b"\x00" in head:
        return "it contains NUL bytes"
    if not head:
        return None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        # A multi-byte character cut at the sniff boundary is not an invalid byte.
        cut = head if len(data) <= _SNIFF_BYTES else head[: len(head) - 3]
        invalid = len(_ESCAPED_RE.findall(cut.decode("utf-8", "surrogateescape")))
        if invalid > _BINARY_INVALID_RATIO * len(cut) and invalid > _BINARY_INVALID_MIN:
            return f"{invalid} of its first {len(cut)} bytes are not valid UTF-8"
    return None


@attrs.frozen
class TextFile:
    r"""A text file decoded for the file tools.

    Attributes:
        raw: the content decoded as UTF-8 with ``surrogateescape``, BOM removed,
            line endings as on disk.
        text: ``raw`` with every CRLF read as LF: what the model sees, and what
            offsets and line numbers refer to.
        bom: the file starts with a UTF-8 BOM (kept out of ``raw``; restored by `encode`).
        eol: the file's dominant line ending (``"\n"`` or ``"\r\n"``), given to new text.
        invalid_bytes: how many bytes are not valid UTF-8.
    """

    raw: str
    text: str
    bom: bool
    eol: str
    invalid_bytes: int

    @classmethod
    def decode(cls, data: bytes) -> TextFile:
        """Decode a file's bytes (check `binary_reason` first)."""
        bom = data.startswith(UTF8_BOM)
        if bom:
            data = data[len(UTF8_BOM) :]
        try:
            raw = data.decode("utf-8")
            invalid = 0
        except UnicodeDecodeError:
            raw = data.decode("utf-8", "surrogateescape")
            invalid = len(_ESCAPED_RE.findall(raw))
        crlf = raw.count("\r\n") if "\r" in raw else 0  # the test alone runs at memchr speed
        if crlf:
            text = raw.replace("\r\n", "\n")
            eol = "\r\n" if crlf > raw.count("\n") - crlf else "\n"
        else:
            text = raw
            eol = "\n"
        return cls(raw=raw, text=text, bom=bom, eol=eol, invalid_bytes=invalid)

    @property
    def final_newline(self) -> bool:
        """The file ends with a line ending."""
        return self.text.endswith("\n")

    def lines(self) -> list[str]:
        """The lines of `text`, without line endings (a final newline adds no empty line)."""
        if not self.text:
            return []
        lines = self.text.split("\n")
        if self.final_newline:
            lines.pop()
        return lines

    def encode(self, raw: str | None = None) -> bytes:
        """Bytes for ``raw`` (default: this file's `raw`), with the BOM if the file had one.

        Raises:
            ToolError: ``raw`` holds a lone surrogate that is not an escaped byte.
        """
        body = self.raw if raw is None else raw
        try:
            encoded = body.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise ToolError(
                f"the new text contains a character that cannot be written as UTF-8 ({exc.reason}); "
                "remove lone surrogate escapes such as \\ud800 from it.",
            ) from exc
        return UTF8_BOM + encoded if self.bom else encoded

    def replace(self, edits: Sequence[tuple[int, int, str]]) -> str:
        """Apply edits given in `text` coordinates to `raw`, returning the new raw text.

        Each edit is ``(start, end, replacement)`` with offsets into `text`;
        edits must not overlap. Replacement text uses LF and gets the file's
        `eol`; everything outside the edited spans stays byte for byte,
        including lines with the minority line ending.
        """
        ordered = sorted(edits, key=lambda e: e[0])
        crs = self._crlf_positions()
        pieces: list[str] = []
        pos = 0
        for start, end, replacement in ordered:
            raw_start = start + bisect.bisect_left(crs, start)
            raw_end = end + bisect.bisect_left(crs, end)
            pieces.append(self.raw[pos:raw_start])
            new = replacement.replace("\r\n", "\n")
            pieces.append(new.replace("\n", self.eol) if self.eol != "\n" else new)
            pos = raw_end
        pieces.append(self.raw[pos:])
        return "".join(pieces)

    def line_hunks(self, edits: Sequence[tuple[int, int, str]], *, total: int | None = None) -> tuple[Hunk, ...]:
        """Which of the file's lines ``edits`` (as `replace` takes them) change, as hunks.

        A line is unchanged when the edits touch neither its text nor its line
        ending and it still begins and ends a line afterwards; every other line
        they reach is changed (replaced), however similar its new text. Edits
        whose changed lines meet, or that touch each other, make one hunk.

        Args:
            edits: ``(start, end, replacement)`` in `text` coordinates, not overlapping.
            total: ``len(self.lines())``, if the caller has it.

        Returns:
            Hunks ``(a, b, c)`` in ascending order, in this file's line numbers (0-based).
        """
        text = self.text
        if total is None:
            total = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
        ordered = sorted(edits, key=lambda e: e[0])
        merged: list[tuple[int, int, str]] = []
        for start, end, new in ordered:
            if merged and start == merged[-1][1]:  # edits that touch act as one
                first, _, text_before = merged[-1]
                merged[-1] = (first, end, text_before + new)
            else:
                merged.append((start, end, new))
        groups: list[list[int]] = []  # [a, b, change in line count]
        for start, end, new in merged:
            a, b = self._touched_lines(start, end, new, total)
            delta = new.count("\n") - text.count("\n", start, end)
            if groups and a < groups[-1][1]:
                group = groups[-1]
                group[0] = min(group[0], a)
                group[1] = max(group[1], b)
                group[2] += delta
            else:
                groups.append([a, b, delta])
        if groups and groups[-1][1] == total:
            # A last line without a newline counts as a line too: the new text may gain or lose one.
            start, end, new = merged[-1]
            last = text[-1:] if end < len(text) else new[-1:] or text[start - 1 : start]
            groups[-1][2] += (last not in ("", "\n")) - (text[-1:] not in ("", "\n"))
        return tuple((a, b, b - a + delta) for a, b, delta in groups)

    def _touched_lines(self, start: int, end: int, new: str, total: int) -> tuple[int, int]:
        """The lines ``a`` to ``b - 1`` that one edit changes (see `line_hunks`)."""
        text = self.text
        a = before = text.count("\n", 0, start)  # lines whose newline lies before the edit
        if a < total and (start == len(text) or text[start] == "\n"):
            # The edit starts where line `a` ends: the line is untouched if it still
            # ends there afterwards (at the end of the text only if it is not empty).
            follows = new[:1] or text[end : end + 1]
            if follows == "\n" or (not follows and start > 0 and text[start - 1] != "\n"):
                a += 1
        b = before + text.count("\n", start, end)
        if b >= total:
            b = total
        elif not (end == 0 or text[end - 1] == "\n") or (new[-1:] or text[start - 1 : start] or "\n") != "\n":
            b += 1  # the edit reaches into line `b`, or that line no longer starts a line afterwards
        return min(a, b), max(a, b)

    def _crlf_positions(self) -> list[int]:
        """Offsets in `text` of each LF that is a CRLF in `raw`, ascending.

        A `text` offset ``n`` maps to the `raw` offset ``n + bisect_left(positions, n)``:
        an offset at such an LF lands before its CR, so a CRLF is never split.
        """
        positions: list[int] = []
        find = self.raw.find
        i = find("\r\n")
        while i >= 0:
            positions.append(i - len(positions))
            i = find("\r\n", i + 2)
        return positions
