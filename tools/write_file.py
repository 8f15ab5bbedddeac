"""The write_file tool: create a text file, or replace one the session has read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._editor import editor_files, write_buffer
from weald.tools._hashline import UTF8_BOM, TextFile, strip_echoed_tags, tag_prefixed
from weald.tools._ledger import session_ledger
from weald.tools._sandbox import (
    display_path,
    path_subject,
    refuse_protected_path,
    refuse_read_only,
    resolve_in_sandbox,
    write_atomic,
)
from weald.tools.read_file import read_text

__all__ = ["write_file"]

_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": (
                "The file to write: relative to the working directory, or absolute inside it. "
                "Missing parent directories are created."
            ),
        },
        "content": {
            "type": "string",
            "description": "The complete new content of the file (plain text, without 'N:hh|' prefixes).",
        },
    },
    "required": ["path", "content"],
    "additionalProperties": False,
}

_DESCRIPTION = (
    "Write a whole text file: create it (with any missing parent directories) or replace all of its content. "
    "To replace an existing file you must have read it with read_file in this session, and it must not "
    "have changed since. An existing file keeps its line endings (CRLF or LF), its UTF-8 BOM and its "
    "permissions. To change part of a file, use edit_file instead."
)


@tool(
    name="write_file",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="ask",
    timeout=10.0,
    truncate="head",
    subject=path_subject,
    kind="write",
)
def write_file(ctx: ToolContext, path: str, content: str) -> ToolResult:
    """Create or overwrite a text file atomically.

    Args:
        ctx: the call's context.
        path: the file.
        content: its complete new content (LF line endings are fine for a CRLF file).

    Returns:
        What was done; ``data`` holds ``path``, ``bytes`` written and ``created``.

    Raises:
        ToolError: the path leads outside the sandbox or is a directory, or the
            file exists and is read-only, or this session has not read it or it
            changed since.
    """
    real = resolve_in_sandbox(ctx, path)
    refuse_protected_path(ctx, real)
    shown = display_path(ctx, real)
    editor = editor_files(ctx, real)  # None (the disk) unless the project chose the editor's buffers
    ledger = session_ledger(ctx)
    written = content.replace("\r\n", "\n")
    # Tags go only if every line carries the one read_file would show for it in the new file.
    text = strip_echoed_tags(written, first=1)
    expect: os.stat_result | None = None
    old_size = 0
    old_lines = 0
    base: bytes | None = None
    notes: list[str] = []
    if text != written:
        notes.append("The 'N:hh|' prefixes copied from read_file output were removed from the content.")
    elif tag_prefixed(written):
        notes.append(
            "Some of the content's lines start like 'N:hh|' tags, but not every line carries the tag read_file "
            "would give it, so they were written as given. If they are prefixes copied from read_file, write the "
            "file again without them.",
        )
    if os.path.lexists(real):
        _, _, old_data, expect = read_text(ctx, path, purpose="write_file replaces", editor=editor)
        refuse_read_only(ctx, real, expect)
        if ledger is not None:
            where = "in the editor" if editor is not None else "on disk"
            base = ledger.check_fresh(real, data=old_data, st=expect, name=shown, where=where).digest
        old = TextFile.decode(old_data)
        old_size = len(old_data)
        old_lines = len(old.lines())
        data = _encode_like(old, text)
        kept = [what for what, flag in (("CRLF line endings", old.eol == "\r\n"), ("UTF-8 BOM", old.bom)) if flag]
        if kept:
            notes.append("Kept the file's " + " and ".join(kept) + ".")
        if data == old_data:
            return ToolResult.success(
                f"{shown} already has exactly this content; nothing was written.",
                data={"path": shown, "bytes": 0, "created": False},
            )
    else:
        data = _encode_like(None, text)
    ctx.abort.raise_if_set()
    if editor is not None:
        new_stat, created = write_buffer(ctx, editor, real, data), expect is None
    else:
        outcome = write_atomic(ctx, str(real), data, expect=expect, exclusive=expect is None)
        new_stat, created = outcome.stat, outcome.created
    lines = TextFile.decode(data).lines()
    if ledger is not None:
        # Every line of the old version is replaced: no anchor into it carries over.
        hunks = [(0, old_lines, len(lines))] if base is not None else None
        ledger.record_change(real, data, new_stat, base=base, hunks=hunks)
    size = f"{len(data)} bytes, {len(lines)} line{'' if len(lines) == 1 else 's'}"
    held = " in the editor" if editor is not None else ""
    if created:
        summary = f"Created {shown}{held} ({size})."
    else:
        summary = f"Overwrote {shown}{held} ({size}; it had {old_size} bytes)."
    info: dict[str, Any] = {"path": shown, "bytes": len(data), "created": created}
    if editor is not None:
        info["editor"] = True
    return ToolResult.success("\n".join([summary, *notes]), data=info)


def _encode_like(old: TextFile | None, text: str) -> bytes:
    """``text`` (LF line endings) as bytes with ``old``'s line ending and BOM (plain UTF-8 if None)."""
    if old is not None and old.eol == "\r\n":
        text = text.replace("\n", "\r\n")
    bom = old is not None and old.bom and not text.startswith("\ufeff")
    try:
        body = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"the content contains a character that cannot be written as UTF-8 ({exc.reason}); "
            "remove lone surrogate escapes such as \\ud800 from it.",
        ) from exc
    return UTF8_BOM + body if bom else body
