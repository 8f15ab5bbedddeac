"""Output limits: what reaches the model from any tool, and where the rest goes.

The tool runner passes every result through `limit_output`. Output within
the limits is untouched. Longer output keeps its head (or, for tools whose
end matters, like a build log, its tail) cut on a line boundary, so that
what the model reads, the notice and the hints included, is within both the
line and the byte limit; the full output is saved to a spill file the model
can read or search, and the notice says how much was cut and where it is.
The spill file is bounded by the session's `SpillBudget`: when it could
hold only the start of the output, or nothing, the notice says so and why.

Saving writes a file: call `limit_output` from a worker thread, not the trio loop.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import attrs
from weald.runtime import make_private_dirs
from weald.tools._contract import ToolResult
from weald.tools._spill import SpillBudget

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_LINES", "limit_output", "within_limits"]

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


@attrs.frozen
class _Saved:
    """Where a cut output was saved: the file (None if nothing could be), how much of it, and why not all."""

    path: Path | None
    size: int
    why: str | None

    def sentence(self, what: str, read: str) -> str:
        """Tell the model where ``what`` (the full output, sized) is, and how to ``read`` it."""
        if self.path is None:
            return f"The full output ({what}) was not saved: {self.why}."
        if self.why is None:
            return f"The full output ({what}) is saved at {self.path}: {read}."
        return f"The output ({what}) is saved at {self.path} up to byte {self.size} only, as {self.why}: {read}."


def _save(save_dir: Path, call_id: str, text: str, spill: SpillBudget) -> _Saved:
    name = _UNSAFE_NAME.sub("_", call_id).lstrip(".") or "output"
    path = save_dir / f"{name[:200]}.txt"
    try:
        data = text.encode("utf-8", "surrogateescape")  # undecodable bytes go back to what they were
    except UnicodeEncodeError:
        data = _utf8(text)
    granted, why = spill.grant(len(data), 0)
    if granted == 0:
        return _Saved(None, 0, why)
    try:
        make_private_dirs(save_dir)
        # Owner-only whatever the umask: a command's output may hold anything.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data[:granted])
    except OSError as exc:
        spill.give_back(granted, file=True)
        return _Saved(None, 0, f"writing {path} failed ({exc.strerror or exc})")
    return _Saved(path, granted, why)


def _head_notice(n: int, partial: bool, total_lines: int, size: str, saved: _Saved) -> str:
    what = f"the first {n} of {total_lines} lines" if not partial else "only the start of line 1, which is too long"
    read = f"read on with read_file(path={str(saved.path)!r}, offset={n + 1}) or search it with grep"
    return f"[output cut: showing {what}. {saved.sentence(size, read)}]"


def _tail_notice(n: int, partial: bool, total_lines: int, size: str, saved: _Saved) -> str:
    what = (
        f"the last {n} of {total_lines} lines; the first {total_lines - n} were cut"
        if not partial
        else f"only the end of line {total_lines}, which is too long"
    )
    read = f"read it with read_file(path={str(saved.path)!r}) or search it with grep"
    return f"[output cut: showing {what}. {saved.sentence(size, read)}]"


def within_limits(
    result: ToolResult, *, max_lines: int = DEFAULT_MAX_LINES, max_bytes: int = DEFAULT_MAX_BYTES
) -> bool:
    """Whether `limit_output` would leave ``result`` as it is (cheap; writes nothing)."""
    seen = result.text()  # the output and its hints, as the model reads them
    return len(seen) <= max_bytes and _count_lines(seen) <= max_lines and len(_utf8(seen)) <= max_bytes


def limit_output(
    result: ToolResult,
    *,
    keep: Literal["head", "tail"],
    max_lines: int = DEFAULT_MAX_LINES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    save_dir: Path,
    call_id: str,
    spill: SpillBudget | None = None,
) -> ToolResult:
    """Cut a result's output to the limits, saving the full output to a spill file.

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
        spill: the session's bounds on saved output; None: the default
            bounds, with nothing else counted against them.

    Returns:
        ``result`` itself when within the limits; else a copy with the output
        cut, a notice line added (after the head, or before the tail) and
        ``full_output_path`` set when a file holds (the start of) the output.
    """
    if within_limits(result, max_lines=max_lines, max_bytes=max_bytes):
        return result
    text = result.output
    seen = result.text()
    if result.hints:  # hints are never cut: they take their share of the limits first
        # A cut output ends with the notice (head) or with the text's own end
        # (tail); after a final newline the hints' separator makes a blank line.
        blank = keep == "tail" and text.endswith("\n")
        max_lines -= len(result.hints) + blank
        max_bytes -= len(_utf8(seen)) - len(_utf8(text))
    total_lines = _count_lines(text)
    saved = _save(save_dir, call_id, text, spill if spill is not None else SpillBudget(save_dir))
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
    return attrs.evolve(result, output=output, full_output_path=str(saved.path) if saved.path else None)
