"""Files named by a request or written where another may meddle: bounded reads, walks that follow no link.

A path in a request or a config file may name a FIFO nobody writes (a read
waits forever), a device (``/dev/zero`` never ends), or a file of many
gigabytes. `read_regular_file` opens without waiting (``O_NONBLOCK``),
refuses anything but a regular file, and reads at most ``max_bytes``; each
refusal is an `UnreadableFileError` naming the file and what it is.

A file in a directory someone else can change (an agent's project) may be
reached through a directory swapped for a symlink after its path was
checked. `open_directory_nofollow` walks to a directory one component at a
time, each opened with ``O_NOFOLLOW`` relative to the descriptor of the one
before, so such a link is refused (`LinkInPathError`), never followed; the
file tools (``weald.tools._sandbox``), `read_regular_file` with
``follow_symlinks=False`` and `replace_file` build on it.

What weald keeps for itself (the state directory, the store, spilled
outputs, logs) holds histories and tokens: `make_private_dirs` makes its
directories owner-only (0700) whatever the umask, and its files are created
0600.

Everything here blocks: call it from a worker thread (``trio.to_thread``),
never on the trio loop thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence

from weald.runtime._errors import LinkInPathError, UnreadableFileError

__all__ = [
    "PLACEHOLDER_DIR_MODE",
    "PLACEHOLDER_FILE_MODE",
    "check_regular_file",
    "is_placeholder",
    "make_private_dirs",
    "open_directory_nofollow",
    "read_regular_file",
    "replace_file",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_CHUNK = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check(info: os.stat_result, name: str, max_bytes: int, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        msg = f"{what} {name} is {_kind(info.st_mode)}, not a regular file; give the path of a file"
        raise UnreadableFileError(msg)
    if info.st_size > max_bytes:
        msg = f"{what} {name} is larger than {max_bytes:,} bytes, the most accepted ({info.st_size:,} bytes)"
        raise UnreadableFileError(msg)


def check_regular_file(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> None:
    """Check, without opening it, that `read_regular_file` would accept ``path`` as it is now.

    Raises:
        UnreadableFileError: it does not exist, is not a regular file, or is too large.
    """
    name = os.path.abspath(os.fspath(path))  # a message names the file where it was looked for
    try:
        info = os.stat(name)
    except OSError as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror or exc}"
        msg = f"{what} {name} {reason}"
        raise UnreadableFileError(msg) from exc
    _check(info, name, max_bytes, what)


def open_directory_nofollow(
    root: str | os.PathLike[str], parts: Sequence[str], *, create: bool = False, mode: int = 0o777
) -> int:
    """Open the directory ``root/parts[0]/.../parts[-1]`` without following a symlink on the way (blocking).

    ``root`` is opened as it is (it is trusted: a configured directory, or
    ``/``); each component below it is opened relative to the descriptor of
    the one before with ``O_NOFOLLOW | O_DIRECTORY``.

    Args:
        root: where the walk starts.
        parts: the components below ``root`` (no ``..``, no separators).
        create: make missing directories (``mode`` less the umask).
        mode: the permission bits of directories made.

    Returns:
        A descriptor of the directory (close-on-exec); the caller closes it.

    Raises:
        FileNotFoundError: a component does not exist (and ``create`` is False).
        LinkInPathError: a component is a symlink, or not a directory.
        OSError: the walk failed otherwise (permission denied...).
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = os.fspath(root)
        for part in parts:
            walked = os.path.join(walked, part)
            try:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made by someone else: the open below checks it
                    os.mkdir(part, mode, dir_fd=fd)
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise LinkInPathError(walked, is_link=_is_link(fd, part)) from exc
                    raise
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise LinkInPathError(walked, is_link=_is_link(fd, part)) from exc
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return True  # gone again: it changed under the walk, as a swapped link does


def _open_parent(path: str) -> tuple[int, str]:
    """A descriptor of ``path``'s directory, reached from ``/`` without following links, and its last name."""
    parent, name = os.path.split(os.path.abspath(path))
    parts = [part for part in parent.split(os.sep) if part]
    return open_directory_nofollow("/", parts), name


def read_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int, what: str = "file", follow_symlinks: bool = True
) -> bytes:
    """Read the whole of a regular file of at most ``max_bytes`` bytes (blocking: not on the loop).

    Args:
        path: the file.
        max_bytes: the largest file accepted.
        what: how messages name the file (``"script"``, ``"config file"``).
        follow_symlinks: False: refuse a symlink anywhere on the path (the
            file or a directory on the way) instead of following it, as for a
            file in a directory an agent may change.

    Raises:
        UnreadableFileError: it cannot be opened or read, is not a regular
            file (a FIFO, a device, a directory...), is larger than
            ``max_bytes``, or (``follow_symlinks=False``) a link is on its path.
    """
    name = os.path.abspath(os.fspath(path))  # a message names the file where it was looked for
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        if follow_symlinks:
            fd = os.open(name, flags)
        else:
            dir_fd, leaf = _open_parent(name)
            try:
                fd = os.open(leaf, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except LinkInPathError as exc:
        msg = f"cannot read {what} {name}: {exc}"
        raise UnreadableFileError(msg) from exc
    except OSError as exc:
        reason = "it is a symbolic link, which was not followed" if exc.errno == errno.ELOOP else exc.strerror
        msg = f"cannot read {what} {name}: {reason or exc}"
        raise UnreadableFileError(msg) from exc
    try:
        _check(os.fstat(fd), name, max_bytes, what)
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(_CHUNK, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # it grew while we read
                msg = f"{what} {name} is larger than {max_bytes:,} bytes, the most accepted"
                raise UnreadableFileError(msg)
        return b"".join(chunks)
    except OSError as exc:
        msg = f"cannot read {what} {name}: {exc.strerror or exc}"
        raise UnreadableFileError(msg) from exc
    finally:
        os.close(fd)


def replace_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace the file at ``path`` with ``data`` atomically, following no symlink on the way (blocking).

    The data goes to a new temporary file beside the target (created
    ``O_EXCL | O_NOFOLLOW`` with ``mode``), is flushed to disk, and is
    renamed over the target relative to the directory's descriptor, which
    was reached from ``/`` by `open_directory_nofollow`. A directory on the
    path swapped for a symlink is refused; a symlink at the target itself is
    replaced, never written through. Readers see the old file or the new one.

    Args:
        path: the file (absolute, or relative to the current directory).
        data: the whole new content.
        mode: the new file's permission bits (less the umask).

    Raises:
        LinkInPathError: a directory on the path is a symlink or not a directory.
        OSError: the file could not be written (its directory is missing, no space...).
    """
    dir_fd, name = _open_parent(os.fspath(path))
    try:
        temp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):  # the temporary file may be gone; the real error follows
                os.unlink(temp, dir_fd=dir_fd)
            raise
        with contextlib.suppress(OSError):  # some file systems cannot fsync a directory; the data is on disk
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def make_private_dirs(path: str | os.PathLike[str]) -> None:
    """Make the directory ``path`` and its missing parents, each new one owner-only (0700) whatever the umask.

    Directories that exist already are left as they are (``weald doctor``
    warns about a state directory others may read).

    Raises:
        FileExistsError: ``path`` exists and is not a directory.
        OSError: a directory could not be made.
    """
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.lexists(current) and os.path.dirname(current) != current:
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs
        os.chmod(directory, 0o700)  # the umask may have taken the owner's bits too
    if not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", os.fspath(path))


PLACEHOLDER_FILE_MODE = 0o400
"""The mode of an empty file the shell's OS sandbox holds where a protected file is missing."""
PLACEHOLDER_DIR_MODE = 0o500
"""The mode of an empty directory it holds where a protected directory is missing."""


def is_placeholder(path: str | os.PathLike[str], kind: str | None = None) -> bool:
    """True if ``path`` is a placeholder of the shell's OS sandbox (``kind`` ``"file"``, ``"dir"`` or None: either).

    While a sandboxed command runs, a protected path that is missing (a
    project's ``weald.toml``, git's hooks...) holds an empty, read-only
    placeholder so that the command cannot plant one (``weald.tools._protected``):
    an empty file of mode `PLACEHOLDER_FILE_MODE`, or an empty directory of
    mode `PLACEHOLDER_DIR_MODE`. Configuration readers pass over a
    ``weald.toml`` that is one. Blocking (it stats the path).
    """
    try:
        info = os.lstat(path)
    except OSError:
        return False
    mode = stat.S_IMODE(info.st_mode)
    if kind != "dir" and stat.S_ISREG(info.st_mode):
        return mode == PLACEHOLDER_FILE_MODE and info.st_size == 0
    if kind != "file" and stat.S_ISDIR(info.st_mode) and mode == PLACEHOLDER_DIR_MODE:
        try:
            return not os.listdir(path)
        except OSError:
            return False
    return False
