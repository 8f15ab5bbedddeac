"""The editor's buffers and terminals: file tools and the shell through an ACP client, when it drives the session.

An editor that runs weald through the Agent Client Protocol (``weald acp``)
may offer its own file access (``fs/read_text_file``, ``fs/write_text_file``:
the text of its buffers, unsaved edits included) and terminals
(``terminal/*``). A project chooses whether its sessions use them
(``[acp] files = "editor"``, ``[acp] terminal = "editor"``, which the runtime
passes as `ToolConfig.editor_files` and `ToolConfig.editor_terminal`); the
runtime hands each call a way to the editor that drives its session, if
one does (``ctx.session.editor``: session id -> an `EditorBridge`, or None).

What goes through the editor is only the last step. Every check a file
tool makes on the disk it makes here too, before anything is asked of the
editor: the path is resolved inside the sandbox, a protected path
(`weald.tools._protected`: weald.toml, .weald/, git's config and hooks) is
refused for writing, a directory, a special file or a file with several
hard links is refused, a read-only file is not written; the session's
read ledger still refuses an edit of a file not read or changed since.
Only files under the working directory go to the editor (the spill files
and skills of the allowed directories are read from the disk), and only
when the editor offers both reading and writing: reading its buffer and
writing the disk would edit from a picture the disk does not have.

A buffer has no inode or modification time: `buffer_stat` stands in for the
file's status, with the content's digest as its modification time, so the
ledger's freshness check and the anchors (``N:hh``) work on the buffer's text
as they do on a file's.

Errors reaching the model are `EditorError` (a `ToolError`): the editor went
away, did not answer in time, or refused.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from weald.tools._contract import ToolContext
from weald.tools._errors import ToolError
from weald.tools._hashline import binary_reason
from weald.tools._ledger import digest
from weald.tools._paths import display_path, missing_error
from weald.tools._protected import protected_paths, refuse_protected

__all__ = [
    "EDITOR_METHODS",
    "EditorBridge",
    "EditorError",
    "buffer_stat",
    "editor_files",
    "editor_terminal",
    "read_buffer",
    "write_buffer",
]

EDITOR_METHODS = frozenset(
    {
        "fs/read_text_file",
        "fs/write_text_file",
        "terminal/create",
        "terminal/output",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    }
)
"""The ACP client methods tools may ask of an editor."""

# The longest a file request to the editor may take (a buffer's text is at hand).
_FILE_REQUEST_TIMEOUT = 30.0


class EditorError(ToolError):
    """A request to the editor failed: it went away, did not answer in time, or refused it.

    Attributes:
        refused: the editor answered, with an error (a file it does not have,
            say); False when it could not be asked or did not answer.
    """

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class EditorBridge(Protocol):
    """The editor driving one session, as tools reach it (the runtime implements it).

    Attributes:
        files: the editor reads and writes files for the session (it offers
            both ``fs/read_text_file`` and ``fs/write_text_file``).
        terminal: it runs commands in its terminals (``terminal/*``).
    """

    @property
    def files(self) -> bool:
        """The editor offers ``fs/read_text_file`` and ``fs/write_text_file``."""
        ...

    @property
    def terminal(self) -> bool:
        """The editor offers ``terminal/*``."""
        ...

    def request(self, method: str, params: Mapping[str, Any], *, timeout: float, call_id: str = "") -> Any:
        """Ask the editor ``method`` (one of `EDITOR_METHODS`; ``sessionId`` is added) and wait for its answer.

        Blocking: for thread tools (never on the trio loop's thread).

        Raises:
            EditorError: the editor is gone, did not answer within ``timeout`` seconds, or answered an error.
        """
        ...

    async def arequest(self, method: str, params: Mapping[str, Any], *, timeout: float, call_id: str = "") -> Any:
        """`request` for async tools, on the trio loop."""
        ...


def _bridge(ctx: ToolContext) -> EditorBridge | None:
    lookup = getattr(ctx.session, "editor", None)
    if lookup is None:
        return None
    bridge: EditorBridge | None = lookup(ctx.session_id)
    return bridge


def editor_files(ctx: ToolContext, real: Path) -> EditorBridge | None:
    """The editor through which ``real`` is read and written, or None: the disk.

    The editor when the project chose it (`ToolConfig.editor_files`), an
    editor that offers reading and writing drives the session, and ``real``
    (a resolved path) lies under the working directory.
    """
    if not ctx.config.editor_files:
        return None
    bridge = _bridge(ctx)
    if bridge is None or not bridge.files:
        return None
    root = Path(os.path.realpath(ctx.working_dir))
    if real != root and not real.is_relative_to(root):
        return None
    return bridge


def editor_terminal(ctx: ToolContext) -> EditorBridge | None:
    """The editor whose terminals run the session's commands, or None: weald's own processes."""
    if not ctx.config.editor_terminal:
        return None
    bridge = _bridge(ctx)
    if bridge is None or not bridge.terminal:
        return None
    return bridge


def buffer_stat(data: bytes, sha256: bytes, disk: os.stat_result | None) -> os.stat_result:
    """A stand-in for the status of a file whose text an editor holds as ``data``.

    Its size is the text's; its modification time is taken from the text's
    digest, so the ledger sees a buffer change exactly when the text
    changes. Mode and links are the disk file's, when there is one (a
    read-only file stays read-only).
    """
    mode = disk.st_mode if disk is not None else stat.S_IFREG | 0o644
    nlink = disk.st_nlink if disk is not None else 1
    mtime_ns = int.from_bytes(sha256[:8], "big")
    fields = (mode, 0, 0, nlink, 0, 0, len(data), 0, 0, 0)
    return os.stat_result(fields, {"st_mtime_ns": mtime_ns})


def _disk_status(ctx: ToolContext, real: Path, path: str, verb: str) -> os.stat_result | None:
    """The disk's status of ``real`` (None when missing), refusing what file tools refuse on disk."""
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return None
    shown = display_path(ctx, real)
    if stat.S_ISDIR(st.st_mode):
        pattern = "*" if shown == "." else f"{shown}/*"
        raise ToolError(f"{path} is a directory, not a file. Use glob to list it (e.g. pattern '{pattern}').")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(
            f"{path} is not a regular file (it is a device, FIFO or socket); file tools {verb} regular files only.",
        )
    if st.st_nlink > 1 and not ctx.config.option("files", "allow_hardlinks", False):
        raise ToolError(
            f"refusing to {verb} {shown}: it has {st.st_nlink} hard links, so it may be the same file as one outside "
            "the sandbox, which no path check can see. Work on another file, or ask the user to set "
            "[tools.files] allow_hardlinks = true if the links are known to be safe.",
        )
    return st


def _timeout(ctx: ToolContext) -> float:
    return min(ctx.timeout, _FILE_REQUEST_TIMEOUT) if ctx.timeout is not None else _FILE_REQUEST_TIMEOUT


def read_buffer(
    ctx: ToolContext, bridge: EditorBridge, real: Path, path: str, *, purpose: str, limit: int
) -> tuple[bytes, os.stat_result]:
    """The text of ``real`` as the editor has it (its buffer, unsaved edits included), as bytes, and a status.

    Args:
        ctx: the call's context.
        bridge: the editor.
        real: the resolved path (inside the working directory).
        path: the path as the model gave it, for messages.
        purpose: completes the binary-file message (as `weald.tools.read_file.read_text`'s).
        limit: the most bytes file tools read.

    Raises:
        ToolError: the file is a directory, special, hard-linked, missing,
            too large or binary; `EditorError`: the editor failed.
    """
    disk = _disk_status(ctx, real, path, "read")
    shown = display_path(ctx, real)
    ctx.abort.raise_if_set()
    try:
        answer = bridge.request("fs/read_text_file", {"path": str(real)}, timeout=_timeout(ctx), call_id=ctx.call_id)
    except EditorError as exc:
        if disk is None and exc.refused:  # no such file on the disk, and the editor has none either
            raise missing_error(ctx, path, real) from None
        raise
    content = answer.get("content") if isinstance(answer, dict) else None
    if not isinstance(content, str):
        raise EditorError(
            f"the editor answered fs/read_text_file for {shown} without the file's text (no 'content' string). "
            'Try again; if it keeps failing, ask the user to set [acp] files = "disk".',
        )
    data = content.encode("utf-8", "surrogatepass")
    if len(data) > limit:
        raise ToolError(
            f"{shown} is {len(data)} bytes in the editor, more than the file tools read ({limit} bytes). "
            "Search it with grep, or look at parts of it with shell (e.g. head, tail, sed -n '100,200p').",
        )
    reason = binary_reason(data)
    if reason is not None:
        raise ToolError(
            f"{shown} looks like a binary file ({reason}); {purpose} UTF-8 text only. "
            "Inspect it with shell instead (e.g. `file`, `xxd | head`).",
        )
    return data, buffer_stat(data, digest(data), disk)


def write_buffer(ctx: ToolContext, bridge: EditorBridge, real: Path, data: bytes) -> os.stat_result:
    """Give the editor ``data`` as the new text of ``real``; returns the stand-in status of the written text.

    The protected paths are refused here once more (the tools refuse them
    first), so nothing reaches the editor for them whatever the caller did.

    Raises:
        ToolError: ``real`` is protected, or ``data`` is not UTF-8 text;
            `EditorError`: the editor failed.
    """
    root = Path(os.path.realpath(ctx.working_dir))
    parts = real.relative_to(root).parts
    refuse_protected(display_path(ctx, real), real, parts, protected_paths(root, ctx.config.protected_paths))
    disk = _disk_status(ctx, real, str(real), "write")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"the new content of {display_path(ctx, real)} is not valid UTF-8 ({exc.reason}), and the editor takes "
            "text only. Remove the characters that cannot be written as UTF-8.",
        ) from exc
    ctx.abort.raise_if_set()
    bridge.request(
        "fs/write_text_file", {"path": str(real), "content": text}, timeout=_timeout(ctx), call_id=ctx.call_id
    )
    return buffer_stat(data, digest(data), disk)
