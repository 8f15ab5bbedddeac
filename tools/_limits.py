"""Output limits: what reaches the model from any tool, and where the rest goes.

The tool runner passes every result through `limit_output`. Output within
the limits is untouched. Longer output keeps its head (or, for tools whose
end matters, like a build log, its tail) within both the line and the byte
limit, cut on a line boundary; the full output is saved to a file the model
can read or search, and a notice says how much was cut and where it is.
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

    Args:
        result: the tool's result (ok or error; only ``output`` is measured).
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
    total_lines = _count_lines(text)
    if total_lines <= max_lines and len(text) <= max_bytes and len(_utf8(text)) <= max_bytes:
        return result
    saved = _save(save_dir, call_id, text)
    size = f"{total_lines} lines, {len(_utf8(text))} bytes"
    if keep == "head":
        shown, n, partial = _keep_head(text, max_lines, max_bytes)
        what = f"the first {n} of {total_lines} lines" if not partial else "only the start of line 1, which is too long"
        notice = (
            f"[output cut: showing {what}. The full output ({size}) is saved at {saved}: "
            f"read on with read_file(path={str(saved)!r}, offset={n + 1}) or search it with grep.]"
        )
        output = shown if shown.endswith("\n") or not shown else shown + "\n"
        output += notice
    else:
        shown, n, partial = _keep_tail(text, max_lines, max_bytes)
        what = (
            f"the last {n} of {total_lines} lines; the first {total_lines - n} were cut"
            if not partial
            else f"only the end of line {total_lines}, which is too long"
        )
        notice = (
            f"[output cut: showing {what}. The full output ({size}) is saved at {saved}: "
            f"read it with read_file(path={str(saved)!r}) or search it with grep.]"
        )
        output = notice + "\n" + shown
    return attrs.evolve(result, output=output, full_output_path=str(saved))
