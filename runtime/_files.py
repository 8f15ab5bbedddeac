"""Reading a file named by a request: a regular file only, of bounded size.

A path in a request or a config file may name a FIFO nobody writes (a read
waits forever), a device (``/dev/zero`` never ends), or a file of many
gigabytes. `read_regular_file` opens without waiting (``O_NONBLOCK``),
refuses anything but a regular file, and reads at most ``max_bytes``; each
refusal is an `UnreadableFileError` naming the file and what it is.

It blocks while it reads: call it from a worker thread (``trio.to_thread``),
never on the trio loop thread.
"""

from __future__ import annotations

import os
import stat

from weald.runtime._errors import UnreadableFileError

__all__ = ["check_regular_file", "read_regular_file"]

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
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except OSError as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror or exc}"
        msg = f"{what} {name} {reason}"
        raise UnreadableFileError(msg) from exc
    _check(info, name, max_bytes, what)


def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int, what: str = "file") -> bytes:
    """Read the whole of a regular file of at most ``max_bytes`` bytes (blocking: not on the loop).

    Args:
        path: the file (symlinks are followed, as any open does).
        max_bytes: the largest file accepted.
        what: how messages name the file (``"script"``, ``"config file"``).

    Raises:
        UnreadableFileError: it cannot be opened or read, is not a regular
            file (a FIFO, a device, a directory...), or is larger than ``max_bytes``.
    """
    name = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        msg = f"cannot read {what} {name}: {exc.strerror or exc}"
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
