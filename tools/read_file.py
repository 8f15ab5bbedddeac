"""The read_file tool: a text file's lines, each tagged ``N:hh|`` for anchored edits."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._editor import EditorBridge, editor_files, read_buffer
from weald.tools._hashline import TextFile, binary_reason, format_lines, line_hash, to_display
from weald.tools._ledger import session_ledger
from weald.tools._sandbox import display_path, open_read, resolve_in_sandbox

__all__ = ["read_file", "read_text"]

DEFAULT_LIMIT = 2000
# Lines longer than this are shown cut, with a note; the file is not changed.
MAX_LINE_CHARS = 2000
# Files larger than this are refused (a log that size wants grep or shell, not reading).
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
# Lines formatted at a time, so a page cut short by the byte limit formats little more than it shows.
_CHUNK = 128

_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file to read: relative to the working directory, or absolute inside it.",
        },
        "offset": {
            "type": "integer",
            "minimum": 1,
            "default": 1,
            "description": "The 1-based line number to start at (default 1). Use it to continue a long file.",
        },
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": DEFAULT_LIMIT,
            "default": DEFAULT_LIMIT,
            "description": f"How many lines to show, at most {DEFAULT_LIMIT} (default {DEFAULT_LIMIT}).",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
}

_DESCRIPTION = (
    "Read a text file. Every line is shown as 'N:hh|content': N is the line number, hh a two-character "
    "hash of the whole line (indentation included), then a bar and the line itself. Pass 'N:hh' to "
    "edit_file (start/through) to edit by line; never copy the 'N:hh|' prefix into old_string, new_string "
    "or write_file content. "
    f"Shows at most {DEFAULT_LIMIT} lines or 50 KB per call; when more remains, a hint gives the offset "
    "to continue from. Binary files are refused; use glob to find files and grep to search them."
)


def _subject(arguments: Mapping[str, Any]) -> str | None:
    path = arguments.get("path")
    return path if isinstance(path, str) else None


def _show(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}[... {len(line) - MAX_LINE_CHARS} more characters cut; grep can show them]"


_DISK: Any = object()  # read_text's ``editor`` default: decide here


def read_text(
    ctx: ToolContext,
    path: str,
    *,
    purpose: str = "read_file shows",
    editor: EditorBridge | None = _DISK,
) -> tuple[Path, str, bytes, os.stat_result]:
    """Read a text file through the sandbox: its resolved path, display path, bytes and status.

    Shared by the file tools, so each refuses the same files in the same words.
    Where the session's editor holds the project's files (`weald.tools._editor`),
    the text is its buffer's, and the status a stand-in (`buffer_stat`).

    Args:
        ctx: the call's context.
        path: the path as the model gave it.
        purpose: completes the binary-file message ("... {purpose} UTF-8 text only").
        editor: the editor to read through, None for the disk; by default
            the one `editor_files` gives (a tool that writes afterwards
            decides once and passes it, so it reads and writes the same place).

    Raises:
        ToolError: the file is outside the sandbox, missing, too large or
            binary; `EditorError`: the editor failed.
    """
    limit = int(ctx.config.option("files", "max_read_bytes", DEFAULT_MAX_FILE_BYTES))
    if ctx.config.editor_files:  # off unless the project chose the editor's buffers: one attribute
        real = resolve_in_sandbox(ctx, path)
        bridge = editor_files(ctx, real) if editor is _DISK else editor
        if bridge is not None:
            data, st = read_buffer(ctx, bridge, real, path, purpose=purpose, limit=limit)
            return real, display_path(ctx, real), data, st
    f, real = open_read(ctx, path)
    shown = display_path(ctx, real)
    with f:
        st = os.fstat(f.fileno())
        if st.st_size > limit:
            raise ToolError(
                f"{shown} is {st.st_size} bytes, more than the file tools read ({limit} bytes). "
                "Search it with grep, or look at parts of it with shell (e.g. head, tail, sed -n '100,200p').",
            )
        data = f.read(limit + 1)  # the file may have grown since fstat
    if len(data) > limit:
        raise ToolError(
            f"{shown} grew past {limit} bytes while being read, more than the file tools read. "
            "Search it with grep, or look at parts of it with shell (e.g. head, tail, sed -n '100,200p').",
        )
    reason = binary_reason(data)
    if reason is not None:
        raise ToolError(
            f"{shown} looks like a binary file ({reason}); {purpose} UTF-8 text only. "
            "Inspect it with shell instead (e.g. `file`, `xxd | head`).",
        )
    return real, shown, data, st


@tool(
    name="read_file",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="allow",
    timeout=10.0,
    truncate="head",
    subject=_subject,
    kind="read",
)
def read_file(ctx: ToolContext, path: str, offset: int = 1, limit: int = DEFAULT_LIMIT) -> ToolResult:
    """Show lines ``offset`` to ``offset + limit - 1`` of a text file, tagged ``N:hh|``.

    The output stays within the call's line and byte limits (so the runner
    never cuts it); a hint names the next offset when more remains. The read
    is recorded in the session's ledger.

    Args:
        ctx: the call's context.
        path: the file.
        offset: first line to show (1-based).
        limit: most lines to show.

    Returns:
        The tagged lines; ``data`` holds the path, the shown range and the total line count.

    Raises:
        ToolError: the file cannot be read as text, or ``offset`` is past its end.
    """
    real, shown, data, st = read_text(ctx, path)
    doc = TextFile.decode(data)
    ledger = session_ledger(ctx)
    lines = doc.lines()
    total = len(lines)
    info: dict[str, Any] = {"path": shown, "total_lines": total, "start": offset, "end": offset - 1}
    if total == 0 or offset > total:
        if ledger is not None:
            ledger.record_read(real, data, st)
        if total == 0:
            return ToolResult.success("", data=info, hints=[f"{shown} is empty (0 lines)."])
        raise ToolError(
            f"offset {offset} is past the end of {shown}, which has {total} lines. Use an offset from 1 to {total}.",
        )
    max_lines = min(limit, ctx.config.max_output_lines)
    window = lines[offset - 1 : offset - 1 + max_lines]
    tagged, long_lines = _render(window, offset, escaped=doc.invalid_bytes > 0, max_bytes=ctx.config.max_output_bytes)
    if ledger is not None:
        # The tags shown are the anchors the model will use: the ledger keeps them.
        ledger.record_read(real, data, st, first=offset, shown=window[: len(tagged)])
    end = offset + len(tagged) - 1
    info["end"] = end
    hints: list[str] = []
    if end < total:
        hints.append(
            f"Showing lines {offset}-{end} of {total}. Call read_file with offset={end + 1} to continue.",
        )
    if doc.invalid_bytes:
        hints.append(
            f"The file has {doc.invalid_bytes} bytes that are not valid UTF-8, shown as \ufffd. "
            "Edits keep those bytes unchanged; to match them in old_string, copy the \ufffd as shown.",
        )
    if long_lines:
        hints.append(f"Lines longer than {MAX_LINE_CHARS} characters are shown cut.")
    return ToolResult.success("\n".join(tagged), data=info, hints=hints)


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _render(window: list[str], first: int, *, escaped: bool, max_bytes: int) -> tuple[list[str], bool]:
    """Tag lines from the start of ``window`` while the output (lines joined by newlines) fits ``max_bytes``.

    Works in chunks, so only about the lines that fit are formatted; always
    shows at least one line.

    Returns:
        The tagged lines, and whether any was shown cut for being too long.
    """
    out: list[str] = []
    used = -1  # n lines take n - 1 separators
    cut = False
    for begin in range(0, len(window), _CHUNK):
        part = window[begin : begin + _CHUNK]
        chunk = format_lines(part, first + begin, escaped=escaped)
        if max(map(len, part)) > MAX_LINE_CHARS:
            for i, line in enumerate(part):  # the tag hashes the whole line; only the display is cut
                if len(line) > MAX_LINE_CHARS:
                    chunk[i] = f"{first + begin + i}:{line_hash(line)}|{to_display(_show(line))}"
                    cut = True
        size = _size("\n".join(chunk)) + 1
        if used + size <= max_bytes:
            out.extend(chunk)
            used += size
            continue
        for tagged in chunk:
            used += _size(tagged) + 1
            if used > max_bytes and out:
                break
            out.append(tagged)
        break
    return out, cut
