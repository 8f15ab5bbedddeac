"""Protected paths that are symbolic links: remembered while a sandboxed command runs, put back when it ends.

The OS sandbox binds a protected path (``weald.toml``, an imported
``.mcp.json``, git's ``hooks``...) read-only where its link leads; the link
itself is an entry of a writable directory, which no mount can cover, so a
command can remove it and put its own file there: an ``.mcp.json`` naming a
server that runs on the host, a ``.git/hooks`` directory with a
``pre-commit``. So each sandboxed command remembers the links on the way to
its protected paths (`ProtectedLinks.watch`: an ``lstat`` and a
``readlink`` each); while any command holding one runs, the daemon's
configuration readers refuse a file reached through a link that is no
longer the one remembered (`replaced_link`); and when the command ends
(`ProtectedLinks.release`) each replaced or removed link is put back
atomically (made beside it, then swapped in with
``renameat2(RENAME_EXCHANGE)``), the command's replacement kept beside it as
``NAME.weald-replaced-XXXXXXXX`` for the user to look at.

What it leaves: a background job's links are put back when the job ends,
not after each command; the user's git on the host, run while a command
that replaced ``.git/hooks`` still runs, would use the replacement; a
change the user makes to such a link while a command runs is undone; and a
daemon killed while a command runs puts nothing back (the next command
remembers the link as it then is).

Threads: everything here blocks (files) and runs in worker threads; the
table of remembered links is guarded by a lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import secrets
import shlex
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

import attrs
from weald.runtime._errors import LinkInPathError
from weald.runtime._files import open_directory_nofollow

__all__ = ["LinkIdentity", "ProtectedLinks", "RestoredLink", "link_identity", "replaced_link"]

_LINK_HOPS = 8  # links followed from one protected path (a link to a link...)
_REPLACED_SUFFIX = ".weald-replaced-"


@attrs.frozen
class LinkIdentity:
    """A symbolic link as it was: its entry (device, inode) and where it leads (its text, as ``readlink`` gives it)."""

    path: Path
    device: int
    inode: int
    target: str


@attrs.frozen
class RestoredLink:
    """A protected link a command replaced or removed, and what was done about it.

    Attributes:
        path: the link's path.
        target: where it led (and leads again, when ``error`` is None).
        moved_to: where the command's replacement was moved; None when the
            link had been removed (nothing to move).
        error: why the link could not be put back (None: it was).
    """

    path: Path
    target: str
    moved_to: Path | None
    error: str | None = None

    def describe(self) -> str:
        """One line for the model and the logs."""
        if self.error is not None:
            return (
                f"{self.path} was replaced from inside the sandbox and could not be put back ({self.error}); "
                f"weald reads nothing through it until the user makes it the link to {self.target} again."
            )
        what = f"moved what the command put there to {self.moved_to}" if self.moved_to is not None else "it was gone"
        return (
            f"{self.path} was replaced from inside the sandbox; weald put the link back (to {self.target}) and "
            f"{what}. It is protected: it decides what agents may do. If it must change, tell the user."
        )


class _Watched:
    """A remembered link: what it was, how many running commands hold it, and whether putting it back failed."""

    __slots__ = ("identity", "root", "stuck", "users")

    def __init__(self, identity: LinkIdentity, root: str) -> None:
        self.identity = identity
        self.root = root  # the writable path it lies in: where putting it back starts its walk
        self.users = 0
        self.stuck = False


_links_lock = threading.Lock()
# The links running commands hold, by path. Guarded by _links_lock. An entry
# lives while a command holds it, or while its link could not be put back.
_links: dict[Path, _Watched] = {}


def link_identity(path: Path) -> LinkIdentity | None:
    """The identity of ``path`` if it is a symbolic link (blocking); None otherwise, or when it is missing."""
    try:
        info = os.lstat(path)
        if not stat.S_ISLNK(info.st_mode):
            return None
        return LinkIdentity(path, info.st_dev, info.st_ino, os.readlink(path))
    except OSError:
        return None


def _still(entry: _Watched) -> bool:
    now = link_identity(entry.identity.path)
    return now is not None and now == entry.identity


def replaced_link(path: Path) -> str | None:
    """Why ``path`` may not be read now: a link on its way was replaced from inside a sandbox; None: it may (blocking).

    Only links that a running command holds (or that could not be put
    back) are looked at: with no command running, this is one dictionary
    test. The text is one line naming the link.
    """
    if not _links:
        return None
    candidate = Path(os.path.abspath(path))
    with _links_lock:
        watched = [entry for entry in (_links.get(p) for p in (candidate, *candidate.parents)) if entry is not None]
        for entry in watched:
            if _still(entry):
                if entry.stuck and entry.users == 0:  # the user made it the link again
                    del _links[entry.identity.path]
                continue
            link = entry.identity
            return (
                f"{link.path} was replaced from inside the sandbox (it was a link to {link.target}): nothing is read "
                "through it; weald puts the link back when the command ends and keeps what the command wrote beside "
                f"it as {link.path.name}{_REPLACED_SUFFIX}*, for you to review (and move into place if you want it); "
                f"if putting it back failed, restore it with: ln -sfn {shlex.quote(link.target)} "
                f"{shlex.quote(str(link.path))}"
            )
    return None


def _exchange(first: str, second: str, dir_fd: int) -> None:
    """Swap two entries of the directory ``dir_fd`` atomically (``renameat2(RENAME_EXCHANGE)``).

    Raises:
        OSError: the kernel or file system cannot (ENOSYS, EINVAL), or the swap failed.
    """
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    rename_exchange = 2
    if renameat2(dir_fd, os.fsencode(first), dir_fd, os.fsencode(second), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), second)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _restore(identity: LinkIdentity, root: str) -> tuple[RestoredLink, LinkIdentity | None]:
    """Put the link back: made beside it, then swapped in (the replacement lands where the new link was made).

    The link's directory is reached from ``root`` (the writable path it lies
    in) without following a link on the way, and every step is relative to
    it: a command that swapped a directory on the way for a link to
    somewhere else makes this fail, never write there.
    """
    path = identity.path
    name = path.name
    beside = f"{name[:200]}{_REPLACED_SUFFIX}{secrets.token_hex(4)}"
    parts = path.parent.relative_to(root).parts
    try:
        dir_fd = open_directory_nofollow(root, parts)
    except LinkInPathError as exc:
        why = f"{exc.path} on the way to it is now a link or a file"
        return RestoredLink(path, identity.target, None, why), None
    except OSError as exc:
        return RestoredLink(path, identity.target, None, exc.strerror or str(exc)), None
    try:
        os.symlink(identity.target, beside, dir_fd=dir_fd)
        moved_to: Path | None = path.with_name(beside)
        try:
            try:
                os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                os.rename(beside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                moved_to = None
            else:
                try:
                    _exchange(beside, name, dir_fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSYS, errno.EINVAL):
                        raise
                    # No atomic swap on this file system: the replacement aside, then the link in.
                    aside = f"{name[:200]}{_REPLACED_SUFFIX}{secrets.token_hex(4)}"
                    os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    os.rename(beside, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    moved_to = path.with_name(aside)
        except OSError:
            with contextlib.suppress(OSError):
                if os.readlink(beside, dir_fd=dir_fd) == identity.target:
                    os.unlink(beside, dir_fd=dir_fd)
            raise
        info = os.lstat(name, dir_fd=dir_fd)
        now = LinkIdentity(path, info.st_dev, info.st_ino, os.readlink(name, dir_fd=dir_fd))
    except OSError as exc:
        return RestoredLink(path, identity.target, None, exc.strerror or str(exc)), None
    finally:
        os.close(dir_fd)
    return RestoredLink(path, identity.target, moved_to), now


class ProtectedLinks:
    """The links on the way to one sandboxed command's protected paths: remembered by `watch`, checked by `release`.

    Blocking (files): called in worker threads.
    """

    __slots__ = ("_dirs", "_held", "_released")

    def __init__(self) -> None:
        self._held: list[Path] = []
        self._released = False
        self._dirs: set[str] = set()  # directories (no links) walked already: each protected path shares .git/...

    def __repr__(self) -> str:
        return f"<ProtectedLinks {[str(path) for path in self._held]}>"

    @property
    def paths(self) -> tuple[Path, ...]:
        """The links held."""
        return tuple(self._held)

    def watch(self, path: Path, writable: Sequence[Path]) -> None:
        """Remember every link on the way to ``path`` (at it too) that lies in one of ``writable`` (blocking).

        A link's own entry is in a writable directory, so a command could
        replace it; one outside every writable path cannot be. A link is
        followed (one hop at a time, up to a bound) to the links beyond it.
        Paths are handled as text: this runs for every protected path of
        every command, and `Path` arithmetic cost more than the ``lstat``
        calls themselves.
        """
        roots = [str(root) for root in writable]
        pending = [os.path.normpath(path)]
        hops = 0
        while pending and hops <= _LINK_HOPS:
            current = pending.pop()
            base = _root_of(current, roots)
            if base is None:
                continue
            rest = current[len(base) :].strip("/").split("/") if current != base else []
            spot = base.rstrip("/")
            for index, part in enumerate(rest):
                spot = f"{spot}/{part}"
                if spot in self._dirs:
                    continue
                try:
                    info = os.lstat(spot)
                except OSError:
                    break
                if stat.S_ISLNK(info.st_mode):
                    try:
                        target = os.readlink(spot)
                    except OSError:
                        break
                    self._hold(LinkIdentity(Path(spot), info.st_dev, info.st_ino, target), base)
                    hops += 1
                    beyond = os.path.join(os.path.dirname(spot), target, *rest[index + 1 :])
                    pending.append(os.path.normpath(beyond))
                    break
                if not stat.S_ISDIR(info.st_mode):
                    break
                self._dirs.add(spot)

    def _hold(self, identity: LinkIdentity, root: str) -> None:
        if identity.path in self._held:
            return
        with _links_lock:
            entry = _links.get(identity.path)
            if entry is None:
                entry = _links[identity.path] = _Watched(identity, root)
            elif entry.users == 0 and not entry.stuck:
                entry.identity, entry.root = identity, root
            # Else a running command holds it already: what it remembered stays (it may be the one replacing it).
            entry.users += 1
        self._held.append(identity.path)

    def release(self) -> list[RestoredLink]:
        """Once the command has ended: put back each link it replaced or removed, and let go of them (blocking).

        Idempotent. Returns what was put back (or could not be).
        """
        if self._released:
            return []
        self._released = True
        restored: list[RestoredLink] = []
        for path in self._held:
            with _links_lock:
                entry = _links.get(path)
                if entry is None:
                    continue
                entry.users -= 1
                if not _still(entry):
                    done, now = _restore(entry.identity, entry.root)
                    restored.append(done)
                    if now is not None:
                        entry.identity = now
                        entry.stuck = False
                    else:
                        entry.stuck = True
                if entry.users <= 0 and not entry.stuck:
                    del _links[path]
        return restored


def _root_of(path: str, roots: Sequence[str]) -> str | None:
    """The deepest of ``roots`` that holds ``path`` (or is it), compared as text; None: none does."""
    found = None
    for root in roots:
        if (path == root or path.startswith(root if root.endswith("/") else root + "/")) and (
            found is None or len(root) > len(found)
        ):
            found = root
    return found
