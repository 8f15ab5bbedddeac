"""Output limits: what reaches the model from any tool, and where the rest goes.

The tool runner passes every result through `limit_output`. Output within
the limits is untouched. Longer output keeps its head (or, for tools whose
end matters, like a build log, its tail) cut on a line boundary, so that
what the model reads, the notice and the hints included, is within both the
line and the byte limit; the full output is saved to a file the model can
read or search, and the notice says how much was cut and where it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import attrs
from weald.tools._contract import ToolResult

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_LINES", "limit_output"]

DEFAULT_MAX_LINES = 2000
DEFAULT_MAX_BYTES = 50 * 1024

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def _utf8(text: str) -> bytes:
    # surrogatepass: tool output may carry undecodable bytes as lone surrogates.
    return text.encode("utf-8", "surrogatepass")


def _cut_utf8(data: bytes, size: int, *, from_end: bool) -> bytes:
    """At most ``size`` bytes from one end of ``data``, never splitting a UTF-8 character."""
    if len(data) <= size:
        return data
    if not from_end:
        end = size
        while end > 0 and (data[end] & 0xC0) == 0x80:  # data[end] continues a character begun before
            end -= 1
        return data[:end]
    start = len(data) - size
    while start < len(data) and (data[start] & 0xC0) == 0x80:
        start += 1
    return data[start:]


def _count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def _keep_head(text: str, max_lines: int, max_bytes: int) -> tuple[str, int, bool]:
    """The longest head within both limits, ending on a line boundary.

    Returns:
        The head, how many whole lines it holds, and whether it instead holds
        only the start of the first line (one line longer than ``max_bytes``).
    """
    kept: list[bytes] = []
    used = 0
    lines = text.split("\n")
    for i, line in enumerate(lines[:max_lines]):
        piece = _utf8(line if i == len(lines) - 1 else line + "\n")
        if used + len(piece) > max_bytes:
            if not kept:  # one line longer than the whole budget: cut inside it, on a character boundary
                return _cut_utf8(piece, max_bytes, from_end=False).decode("utf-8", "surrogatepass"), 0, True
            break
        kept.append(piece)
        used += len(piece)
    return b"".join(kept).decode("utf-8", "surrogatepass"), len(kept), False


def _keep_tail(text: str, max_lines: int, max_bytes: int) -> tuple[str, int, bool]:
    """The longest tail within both limits, starting on a line boundary.

    Returns:
        The tail, how many whole lines it holds, and whether it instead holds
        only the end of the last line (one line longer than ``max_bytes``).
    """
    ending = "\n" if text.endswith("\n") else ""
    body = text[: len(text) - len(ending)]
    kept: list[bytes] = []
    used = len(ending)
    lines = body.split("\n")
    for i, line in enumerate(reversed(lines[-max_lines:])):
        piece = _utf8(line if i == 0 else line + "\n")
        if used + len(piece) > max_bytes:
            if not kept:
                tail = _cut_utf8(piece, max_bytes - used, from_end=True)
                return tail.decode("utf-8", "surrogatepass") + ending, 0, True
            break
        kept.append(piece)
        used += len(piece)
    kept.reverse()
    return b"".join(kept).decode("utf-8", "surrogatepass") + ending, len(kept), False


def _save(save_dir: Path, call_id: str, text: str) -> Path:
    save_dir.mkdir(parents=True, exist_ok=True)
    name = _UNSAFE_NAME.sub("_", call_id).lstrip(".") or "output"
    path = save_dir / f"{name[:200]}.txt"
    try:
        data = text.encode("utf-8", "surrogateescape")  # undecodable bytes go back to what they were
    except UnicodeEncodeError:
        data = _utf8(text)
    path.write_bytes(data)
    return path


def _head_notice(n: int, partial: bool, total_lines: int, size: str, saved: Path) -> str:
    what = f"the first {n} of {total_lines} lines" if not partial else "only the start of line 1, which is too long"
    return (
        f"[output cut: showing {what}. The full output ({size}) is saved at {saved}: "
        f"read on with read_file(path={str(saved)!r}, offset={n + 1}) or search it with grep.]"
    )


def _tail_notice(n: int, partial: bool, total_lines: int, size: str, saved: Path) -> str:
    what = (
        f"the last {n} of {total_lines} lines; the first {total_lines - n} were cut"
        if not partial
        else f"only the end of line {total_lines}, which is too long"
    )
    return (
        f"[output cut: showing {what}. The full output ({size}) is saved at {saved}: "
        f"read it with read_file(path={str(saved)!r}) or search it with grep.]"
    )


def limit_output(
    result: ToolResult,
    *,
    keep: Literal["head", "tail"],
    max_lines: int = DEFAULT_MAX_LINES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    save_dir: Path,
    call_id: str,
) -> ToolResult:
    """Cut a result's output to the limits, saving the full output to a file.

    The limits hold for everything the model sees (`ToolResult.text`), the
    notice and the result's hints included: a cut result reads as at most
    ``max_lines`` lines and ``max_bytes`` bytes. When the limits are too
    small for even the notice, the output is the notice alone, cut to fit.

    Args:
        result: the tool's result (ok or error; ``output`` is cut, ``hints`` are kept).
        keep: which end of the output the model sees.
        max_lines: most lines the model sees.
        max_bytes: most bytes (UTF-8) the model sees.
        save_dir: where the full output goes (created if missing).
        call_id: names the file: ``save_dir/<call_id>.txt`` (unsafe characters replaced).

    Returns:
        ``result`` itself when within the limits; else a copy with the output
        cut, a notice line added (after the head, or before the tail) and
        ``full_output_path`` set.
    """
    text = result.output
    seen = result.text()  # the output and its hints, as the model reads them
    if len(seen) <= max_bytes and _count_lines(seen) <= max_lines and len(_utf8(seen)) <= max_bytes:
        return result
    if result.hints:  # hints are never cut: they take their share of the limits first
        # A cut output ends with the notice (head) or with the text's own end
        # (tail); after a final newline the hints' separator makes a blank line.
        blank = keep == "tail" and text.endswith("\n")
        max_lines -= len(result.hints) + blank
        max_bytes -= len(_utf8(seen)) - len(_utf8(text))
    total_lines = _count_lines(text)
    saved = _save(save_dir, call_id, text)
    size = f"{total_lines} lines, {len(_utf8(text))} bytes"
    notice_for = _head_notice if keep == "head" else _tail_notice
    # The notice takes one line and, with its newline, at most `reserve`
    # bytes: measured with n = 0, plus room for the (at most three) numbers
    # that depend on n to be as wide as the largest, total_lines + 1.
    widest = len(str(total_lines + 1))
    reserve = max(len(_utf8(notice_for(0, p, total_lines, size, saved))) for p in (False, True)) + 3 * widest + 1
    lines_left, bytes_left = max_lines - 1, max_bytes - reserve
    if lines_left <= 0 or bytes_left <= 0:
        notice = _utf8(notice_for(0, False, total_lines, size, saved))
        output = _cut_utf8(notice, max(max_bytes, 0), from_end=False).decode("utf-8", "surrogatepass")
    elif keep == "head":
        shown, n, partial = _keep_head(text, lines_left, bytes_left)
        output = shown if shown.endswith("\n") or not shown else shown + "\n"
        output += notice_for(n, partial, total_lines, size, saved)
    else:
        shown, n, partial = _keep_tail(text, lines_left, bytes_left)
        output = notice_for(n, partial, total_lines, size, saved) + "\n" + shown
    return attrs.evolve(result, output=output, full_output_path=str(saved))
