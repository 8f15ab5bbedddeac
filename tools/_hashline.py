r"""Hashline tags (``N:hh|content``) and the decoded view of a text file.

read_file shows every line as ``12:3f|    return x``: the 1-based line
number, a colon, two hex digits hashing the line, a bar, then the line. A
model edits by anchor (``start="12:3f"``); the hash proves the line is still
the one the model saw, so an edit never lands on a line that moved or changed.

The hash is the low byte of zlib's CRC-32 of the line's UTF-8 bytes after
``str.strip()`` (leading and trailing whitespace removed), as two lowercase
hex digits. CRC-32 is stable across processes, platforms and Python versions
(unlike ``hash()``), runs in C in one pass, and ignoring the surrounding
whitespace makes the tag blind to re-indentation and to CRLF versus LF.

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
import itertools
import re
import zlib
from collections.abc import Iterable, Sequence

import attrs
from weald.tools._contract import ToolError

__all__ = [
    "UTF8_BOM",
    "TextFile",
    "binary_reason",
    "format_line",
    "format_lines",
    "line_hash",
    "parse_anchor",
    "strip_echoed_tags",
    "to_display",
]

UTF8_BOM = b"\xef\xbb\xbf"

# Every possible tag value, so the hot loop indexes instead of formatting.
_HEX = tuple(f"{i:02x}" for i in range(256))

# Lone surrogates from ``surrogateescape`` (one per undecodable byte).
_ESCAPED_RE = re.compile("[\udc80-\udcff]")

# A tag a model echoes back at the start of a line: ``12:3f|``.
_TAG_RE = re.compile(r"(\d+):([0-9a-f]{2})\|")

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
        content: the line; leading and trailing whitespace do not count.

    Returns:
        The low byte of CRC-32 of the stripped line's UTF-8 bytes, e.g. ``"3f"``.
        Undecodable bytes (lone surrogates) hash as their ``surrogatepass`` encoding.
    """
    return _HEX[zlib.crc32(content.strip().encode("utf-8", "surrogatepass")) & 0xFF]


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
        f"{n}:{hex_[crc(line.strip().encode('utf-8', 'surrogatepass')) & 0xFF]}|{line}"
        for n, line in enumerate(lines, first)
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


def strip_echoed_tags(text: str, *, near: tuple[int, int] | None = None) -> str:
    """Remove ``N:hh|`` prefixes a model copied from read_file output into its text.

    Legitimate content can look like a tag (``10:30|standup`` in a table), so
    prefixes are stripped only on evidence that they are echoes:

    - every non-empty line carries one, and either at least two tags number
      consecutive lines, or some tag's hash matches its line, or some tag's
      number lies in ``near``; or
    - the first non-empty line carries one, the tagged lines number
      consecutively (the model added untagged lines among echoed ones), and
      some tag's hash matches its line or its number lies in ``near``.

    Args:
        text: what the model sent (``new_string`` or ``old_string``).
        near: the line range (inclusive) the edit is about, if known; a tag
            numbered within two lines of it counts as evidence.

    Returns:
        ``text`` with the prefixes removed, or ``text`` unchanged.
    """
    if "|" not in text:
        return text
    lines = text.split("\n")
    tagged: list[tuple[int, re.Match[str]]] = []
    nonempty: list[int] = []
    for i, line in enumerate(lines):
        if line.strip():
            nonempty.append(i)
        m = _TAG_RE.match(line)
        if m is not None:
            tagged.append((i, m))
    if not tagged:
        return text
    numbers = [int(m[1]) for _, m in tagged]
    consecutive = all(b == a + 1 for a, b in itertools.pairwise(numbers))
    verified = any(line_hash(lines[i][m.end() :]) == m[2] for i, m in tagged)
    in_range = near is not None and any(near[0] - 2 <= n <= near[1] + 2 for n in numbers)
    all_tagged = len(tagged) == len(nonempty)  # a tagged line is never empty
    first_tagged = bool(nonempty) and tagged[0][0] == nonempty[0]
    echoed_everywhere = all_tagged and ((consecutive and len(tagged) >= 2) or verified or in_range)
    echoed_among_new_lines = first_tagged and consecutive and (verified or in_range)
    if not (echoed_everywhere or echoed_among_new_lines):
        return text
    for i, m in tagged:
        lines[i] = lines[i][m.end() :]
    return "\n".join(lines)


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
