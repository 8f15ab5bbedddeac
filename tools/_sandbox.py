"""The file sandbox: files opened and written inside the working directory and the allowed directories.

Which paths lie inside (the *roots*) is `weald.tools._paths`
(`resolve_in_sandbox`, re-exported here); this module opens and writes them.

Checking a path and then opening it leaves a window in which a directory on
the way can be swapped for a symlink. So `open_read` and `write_atomic` do
not open the checked path by name: they walk from the root one component at
a time with ``O_NOFOLLOW`` relative to the directory opened before
(``dir_fd``), open the file relative to its parent's descriptor, and confirm
through ``/proc/self/fd`` that what they opened lies inside the sandbox. A
symlink that appears after the check makes the call fail; it is never followed.

A regular file with more than one hard link may be the same inode as a file
outside the sandbox, which no path check can see; it is refused unless
``[tools.files] allow_hardlinks = true``.

A file with no write permission bit for anyone is refused for writing
(`refuse_read_only`): writes go through rename, and this process may run as
root, so the mode alone would stop neither.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import attrs
from weald.runtime import LinkInPathError, open_directory_nofollow
from weald.tools._contract import ToolContext
from weald.tools._errors import ToolError
from weald.tools._paths import (
    describe_roots,
    display_path,
    missing_error,
    resolve_in_sandbox,
    root_of,
    sandbox_roots,
)
from weald.tools._protected import protected_paths, refuse_protected

__all__ = [
    "WriteOutcome",
    "display_path",
    "open_directory",
    "open_read",
    "resolve_in_sandbox",
    "sandbox_roots",
    "write_atomic",
]

# O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# New files get 0o644 less the umask: the kernel applies the umask at creation.
_NEW_FILE_MODE = 0o644


@attrs.frozen
class WriteOutcome:
    """What `write_atomic` did.

    Attributes:
        path: the resolved path written.
        created: True if the file did not exist before.
        stat: the new file's status (size, mtime) as written.
    """

    path: Path
    created: bool
    stat: os.stat_result = attrs.field(eq=False)


def _split(ctx: ToolContext, real: Path) -> tuple[Path, tuple[str, ...]]:
    """The root holding ``real`` and the components below it."""
    roots = sandbox_roots(ctx)
    root = root_of(real, roots)
    if root is None:  # resolve_in_sandbox returned it, so only a changed config gets here
        raise ToolError(f"{real} is outside the sandbox. Use a path under {describe_roots(roots)}.")
    return root, real.relative_to(root).parts


def _swapped(ctx: ToolContext, real: Path, what: str) -> ToolError:
    return ToolError(
        f"{display_path(ctx, real)} changed while it was being opened: {what} is now a symlink or "
        "otherwise not what was checked. It was not followed. Check the path (e.g. with glob) and try again.",
    )


def _fd_target(fd: int) -> str | None:
    """The path the kernel has for an open descriptor, or None where /proc is unavailable."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _verify_inside(ctx: ToolContext, fd: int, real: Path) -> None:
    """Belt and braces after the ``O_NOFOLLOW`` walk: the opened object lies in the sandbox."""
    target = _fd_target(fd)
    if target is None:
        return
    if root_of(Path(target.removesuffix(" (deleted)")), sandbox_roots(ctx)) is None:
        raise ToolError(
            f"{display_path(ctx, real)} was opened but lies at {target}, outside the sandbox; "
            "a symlink or mount changed under it. It was not read or written.",
        )


def _open_dir(ctx: ToolContext, root: Path, parts: tuple[str, ...], real: Path, *, create: bool) -> int:
    """Open the directory ``root/parts`` without following symlinks; returns its descriptor.

    The walk is `weald.runtime.open_directory_nofollow`; this adds the
    messages for the model and the check that the directory lies inside.

    Args:
        ctx: the call's context.
        root: the sandbox root (opened normally: it is trusted configuration).
        parts: components below the root.
        real: the full path being worked on, for messages.
        create: make missing directories (mode 0o777 less the umask).

    Raises:
        FileNotFoundError: a directory on the way is missing (and ``create`` is False).
        ToolError: a directory on the way is a symlink or a file.
    """
    try:
        fd = open_directory_nofollow(root, parts, create=create)
    except LinkInPathError as exc:
        walked = Path(exc.path)
        if exc.is_link:
            raise _swapped(ctx, real, f"the directory {display_path(ctx, walked)}") from exc
        raise ToolError(
            f"{display_path(ctx, walked)} is a file, not a directory, so {display_path(ctx, real)} "
            "cannot be inside it. Choose another path.",
        ) from exc
    try:
        _verify_inside(ctx, fd, real)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _allow_hardlinks(ctx: ToolContext) -> bool:
    return bool(ctx.config.option("files", "allow_hardlinks", False))


def _hardlink_error(ctx: ToolContext, real: Path, st: os.stat_result, verb: str) -> ToolError:
    return ToolError(
        f"refusing to {verb} {display_path(ctx, real)}: it has {st.st_nlink} hard links, so it may be the "
        "same file as one outside the sandbox, which no path check can see. Work on another file, or ask "
        "the user to set [tools.files] allow_hardlinks = true if the links are known to be safe.",
    )


def open_read(ctx: ToolContext, path: str) -> tuple[BinaryIO, Path]:
    """Open a regular file in the sandbox for reading, safe against symlink swaps.

    Args:
        ctx: the call's context.
        path: the path as the model gave it.

    Returns:
        The open file (binary, positioned at the start; the caller closes it)
        and its resolved path.

    Raises:
        ToolError: the path leads outside the sandbox, does not exist, is a
            directory or not a regular file, has several hard links, or
            changed into a symlink while being opened.
    """
    real = resolve_in_sandbox(ctx, path, must_exist=True)
    root, parts = _split(ctx, real)
    if not parts:
        raise _directory_error(ctx, path, real)
    try:
        dir_fd = _open_dir(ctx, root, parts[:-1], real, create=False)
    except FileNotFoundError as exc:
        raise missing_error(ctx, path, real) from exc
    try:
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise missing_error(ctx, path, real) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _swapped(ctx, real, "the file") from exc
        raise
    finally:
        os.close(dir_fd)
    try:
        _check_opened(ctx, path, real, fd)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), real
    except BaseException:
        os.close(fd)
        raise


def open_directory(ctx: ToolContext, path: str) -> int:
    """Open a directory in the sandbox without following symlinks on the way; returns its descriptor.

    For walking it with ``os.fwalk(dir_fd=...)`` (the caller closes the descriptor).

    Raises:
        ToolError: the path leads outside the sandbox, does not exist, or is
            not a directory; or a directory on the way became a symlink.
    """
    real = resolve_in_sandbox(ctx, path, must_exist=True)
    root, parts = _split(ctx, real)
    try:
        return _open_dir(ctx, root, parts, real, create=False)
    except FileNotFoundError as exc:
        raise missing_error(ctx, path, real) from exc


def _check_opened(ctx: ToolContext, path: str, real: Path, fd: int) -> None:
    """Refuse to read anything but a regular file inside the sandbox with one link."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise _directory_error(ctx, path, real)
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(
            f"{path} is not a regular file (it is a device, FIFO or socket); file tools read regular files only.",
        )
    if st.st_nlink > 1 and not _allow_hardlinks(ctx):
        raise _hardlink_error(ctx, real, st, "read")
    _verify_inside(ctx, fd, real)


def _directory_error(ctx: ToolContext, path: str, real: Path) -> ToolError:
    shown = display_path(ctx, real)
    pattern = "*" if shown == "." else f"{shown}/*"
    return ToolError(f"{path} is a directory, not a file. Use glob to list it (e.g. pattern '{pattern}').")


def _temp_name(name: str) -> str:
    # Hidden, unique, and short enough for NAME_MAX (255) whatever the target's length.
    return f".{name[:200]}.{secrets.token_hex(6)}.weald-tmp"


def write_atomic(
    ctx: ToolContext,
    path: str,
    data: bytes,
    *,
    mode: int | None = None,
    expect: os.stat_result | None = None,
    exclusive: bool = False,
) -> WriteOutcome:
    """Write ``data`` to a file in the sandbox atomically, safe against symlink swaps.

    The data goes to a new temporary file in the target's directory (created
    ``O_EXCL``), is fsynced, then renamed over the target relative to the
    directory's descriptor; readers see the old file or the new one, never a
    mix. Missing parent directories are created (inside the sandbox, never
    through a symlink). An existing file keeps its permission bits (and its
    owner, where the process may set it); a new file gets 0o644 less the umask.

    Args:
        ctx: the call's context.
        path: the path as the model gave it.
        data: the complete new content.
        mode: permission bits to set instead of the rules above.
        expect: the status of the file when it was read; if the file on disk
            is no longer that one (inode, size, mtime), nothing is written.
        exclusive: the file is expected not to exist; if it appeared
            meanwhile, nothing is written.

    Returns:
        A `WriteOutcome`.

    Raises:
        ToolError: the path leads outside the sandbox, is a directory, is
            read-only, is protected (`weald.tools._protected`: weald's and
            git's configuration, whatever the permissions), has several hard
            links, changed since ``expect``, or a symlink appeared in its way.
    """
    real = resolve_in_sandbox(ctx, path)
    root, parts = _split(ctx, real)
    if not parts:
        raise _directory_error(ctx, path, real)
    refuse_protected_path(ctx, real)
    dir_fd = _open_dir(ctx, root, parts[:-1], real, create=True)
    try:
        name = parts[-1]
        existing = _lstat_at(dir_fd, name)
        if existing is not None and exclusive:
            raise _changed(ctx, real, "it was created by something else")
        if existing is not None:
            _check_target(ctx, path, real, existing, expect)
        elif expect is not None:
            raise _changed(ctx, real, "it was deleted or moved")
        temp = _temp_name(name)
        fd = os.open(temp, _TEMP_FLAGS, _NEW_FILE_MODE, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if mode is not None:
                    os.fchmod(fd, mode)
                elif existing is not None:
                    os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                    _keep_owner(fd, existing)
                os.fsync(fd)
                written = os.fstat(fd)
            finally:
                os.close(fd)
            # Narrow the window once more: the target must still be the file checked above.
            _check_still(ctx, path, real, _lstat_at(dir_fd, name), existing=existing, expect=expect or existing)
            # rename() replaces a directory entry and never follows a symlink
            # there, so even a swap after this check cannot redirect the write.
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):  # the temp file may already be gone; the real error follows
                os.unlink(temp, dir_fd=dir_fd)
            raise
        # Make the rename durable. Some file systems cannot fsync a directory;
        # the data itself is already on disk, so that is not an error.
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return WriteOutcome(path=real, created=existing is None, stat=written)


def refuse_protected_path(ctx: ToolContext, real: Path) -> None:
    """Refuse to write a path that decides what agents may do (`weald.tools._protected`), whatever the permissions.

    `write_atomic` checks it too; a tool calls it first so that the model
    learns why before anything else is asked of it (a fresh read, say).

    Raises:
        ToolError: ``real`` is the project's weald configuration or skills,
            a ``weald.toml`` or anything in a ``.git`` directory at any depth,
            git's hooks directory, or a file the configuration reads.
    """
    _, parts = _split(ctx, real)
    protected = protected_paths(Path(os.path.realpath(ctx.working_dir)), ctx.config.protected_paths)
    refuse_protected(display_path(ctx, real), real, parts, protected)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_target(
    ctx: ToolContext,
    path: str,
    real: Path,
    st: os.stat_result,
    expect: os.stat_result | None,
) -> None:
    """Refuse to replace anything but the regular file expected."""
    if stat.S_ISLNK(st.st_mode):
        raise _swapped(ctx, real, "the file")
    if stat.S_ISDIR(st.st_mode):
        raise _directory_error(ctx, path, real)
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(
            f"{path} is not a regular file (a device, FIFO or socket); file tools write regular files only.",
        )
    if st.st_nlink > 1 and not _allow_hardlinks(ctx):
        raise _hardlink_error(ctx, real, st, "write")
    refuse_read_only(ctx, real, st)
    if expect is not None and (st.st_ino, st.st_size, st.st_mtime_ns) != (
        expect.st_ino,
        expect.st_size,
        expect.st_mtime_ns,
    ):
        raise _changed(ctx, real, "it was modified")


def refuse_read_only(ctx: ToolContext, real: Path, st: os.stat_result) -> None:
    """Refuse to change a file that has no write permission bit for anyone (mode & 0o222 == 0).

    Such a file was made read-only on purpose. Replacing it by rename needs
    only the directory's permission, and root ignores modes anyway, so the
    kernel would not stop the write: this check does.

    Raises:
        ToolError: the file is read-only.
    """
    if stat.S_ISREG(st.st_mode) and not st.st_mode & 0o222:
        shown = display_path(ctx, real)
        raise ToolError(
            f"{shown} is read-only (mode {stat.S_IMODE(st.st_mode):o}: no write permission for anyone), so it was "
            "not changed. Leave it as it is, or ask the user whether it should be made writable.",
        )


def _check_still(
    ctx: ToolContext,
    path: str,
    real: Path,
    now: os.stat_result | None,
    *,
    existing: os.stat_result | None,
    expect: os.stat_result | None,
) -> None:
    """Refuse if the target is not what was checked before the temporary file was written."""
    if now is None:
        if existing is not None:
            raise _changed(ctx, real, "it was deleted or moved")
        return
    if existing is None:
        raise _changed(ctx, real, "it was created by something else")
    _check_target(ctx, path, real, now, expect)


def _changed(ctx: ToolContext, real: Path, how: str) -> ToolError:
    return ToolError(
        f"{display_path(ctx, real)} changed on disk while this call was working on it ({how}); nothing was "
        "written. Read it again with read_file and redo the change.",
    )


def _keep_owner(fd: int, existing: os.stat_result) -> None:
    """Give the new file the old one's owner and group where allowed.

    An unprivileged process cannot give a file away: the file then belongs to
    this process, as after any editor's save-by-rename; that is not an error.
    """
    if (existing.st_uid, existing.st_gid) == (os.geteuid(), os.getegid()):
        return
    with contextlib.suppress(PermissionError):
        os.fchown(fd, existing.st_uid, existing.st_gid)


def path_subject(arguments: Mapping[str, Any]) -> str | None:
    """The subject permission patterns match for a file tool: its ``path`` argument."""
    path = arguments.get("path")
    return path if isinstance(path, str) else None


@contextlib.contextmanager
def pinned_directory(ctx: ToolContext, real: Path) -> Iterator[tuple[Path, int]]:
    """Hold open a checked directory of the sandbox, reached without following symlinks.

    ``real`` is a path `resolve_in_sandbox` returned. The directory is opened
    by walking from its sandbox root with ``O_NOFOLLOW``, so a directory
    swapped for a symlink after the check is refused (`ToolError`), never
    followed.

    Yields:
        ``(pinned, fd)``: ``pinned`` is ``/proc/self/fd/<fd>``, which names
        that very directory in this process, and in a child started with
        ``pass_fds=(fd,)`` (as its ``cwd``, or as a path operand).
    """
    root, parts = _split(ctx, real)
    fd = _open_dir(ctx, root, parts, real, create=False)
    try:
        yield Path(f"/proc/self/fd/{fd}"), fd
    finally:
        os.close(fd)


def hardlinked(ctx: ToolContext, st: os.stat_result) -> bool:
    """True if a regular file has other names, and the sandbox does not allow hard links."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and not _allow_hardlinks(ctx)
