"""Trust for nested project configuration: a ``weald.toml`` (or ``.weald/``) inside another project.

The sandbox keeps a project's own ``weald.toml`` read-only, but it cannot
forbid the name in every directory: a sandboxed command can create
``sub/weald.toml``, which would judge a session started later in ``sub``.
So a project file is *nested* when an ancestor of its directory (up to where
the project search stops: below the home directory, below a directory anyone
may write to, below ``/``) holds ``.git``, ``weald.toml`` or ``.weald``, or
is the working directory or project of a session this daemon knows (any
state). A nested file is applied only once the user trusted it: its real path
and SHA-256 are kept in the store's ``trusted_configs`` namespace (the store
is hidden from every sandbox, so no agent writes a trust record). A trusted
file whose bytes change is untrusted again.

`TrustBook` holds, in memory, the trust records and the set of the
directories of the daemon's sessions (filled when the records are read at
start, and by every start): the loop thread changes them, worker threads
(`Projects.look_blocking`) only look things up.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from typing import Any

import msgspec
from weald.runtime.daemon._config_load import CONFIG_FILE_NAME, PROJECT_DIR_NAME, ProjectFiles
from weald.runtime.daemon._config_model import ConfigError, ConfigProblem

__all__ = [
    "TRUST_NAMESPACE",
    "TrustBook",
    "TrustRecord",
    "UntrustedConfigError",
    "config_digest_blocking",
    "enclosing_project_blocking",
]

TRUST_NAMESPACE = "trusted_configs"
"""The store's namespace of trust records, keyed by the file's real path."""

_MAX_TREE_FILES = 10_000  # a .weald/ directory holding more is not digested (nor trusted)


class TrustRecord(msgspec.Struct, kw_only=True):
    """A nested configuration file (or ``.weald/`` directory) the user trusted, as the store keeps it."""

    path: str
    sha256: str
    size: int
    project: str | None = None  # the enclosing project when it was trusted
    trusted_at: float = 0.0


class UntrustedConfigError(ConfigError):
    """A nested project configuration that is not trusted (or changed since it was).

    Attributes:
        file: The file's real path.
        sha256: Its digest now.
        size: Its size in bytes.
        project: The enclosing project (or session directory) that makes it nested.
        changed: Whether it was trusted with other contents.
    """

    def __init__(self, file: str, sha256: str, size: int, project: str, *, changed: bool) -> None:
        self.file = file
        self.sha256 = sha256
        self.size = size
        self.project = project
        self.changed = changed
        if changed:
            why = f"changed since you trusted it (it lies inside the project {project}, where an agent may write)"
        else:
            why = f"it lies inside the project {project} and may have been written by an agent working there"
        message = f"{why}; review it, then trust it with: weald trust {file} (or weald run --trust)"
        super().__init__([ConfigProblem(file, "", f"untrusted nested project configuration: {message}")])

    def one_line(self, directory: str) -> str:
        """The error ``agent.start`` answers for ``directory``."""
        return f"the project configuration of {directory} is not trusted: {self.problems[0]}"

    def data(self) -> dict[str, Any]:
        """The error's data for clients (``weald run --trust`` shows the file and trusts this digest)."""
        return {
            "file": self.file,
            "sha256": self.sha256,
            "size": self.size,
            "project": self.project,
            "changed": self.changed,
        }


def config_digest_blocking(path: str) -> tuple[str, int]:
    """The SHA-256 (hex) and size of a configuration file, or of a ``.weald/`` directory's whole tree.

    A directory's digest covers every entry under it (names, kinds, file
    bytes, link targets; links are not followed), so a skill added later
    changes it.

    Raises:
        OSError: it cannot be read (or a directory holds too many files).
    """
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb", opener=_nofollow) as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size
    digest = hashlib.sha256(b"weald-tree-1\0")
    size = 0
    count = 0
    for top, dirs, files in os.walk(path, followlinks=False):
        dirs.sort()
        relative = os.path.relpath(top, path)
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(top, d))]):
            count += 1
            if count > _MAX_TREE_FILES:
                raise OSError(f"{path} holds more than {_MAX_TREE_FILES} files")
            full = os.path.join(top, name)
            entry = os.path.join(relative, name).encode("utf-8", "surrogateescape")
            if os.path.islink(full):
                digest.update(b"L" + entry + b"\0" + os.readlink(full).encode("utf-8", "surrogateescape") + b"\0")
                continue
            inner, inner_size = config_digest_blocking(full)
            digest.update(b"F" + entry + b"\0" + inner.encode() + b"\0")
            size += inner_size
        for name in dirs:
            digest.update(b"D" + os.path.join(relative, name).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest(), size


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


_MARKERS = (".git", CONFIG_FILE_NAME, PROJECT_DIR_NAME)


def enclosing_project_blocking(
    root: str, home: str, session_dirs: Iterable[str] | set[str], user_file: str | None = None
) -> str | None:
    """The nearest directory strictly above ``root`` that makes a project file there nested; None: none.

    One holding ``.git``, ``weald.toml`` or ``.weald``, or one that is a
    session's directory (``session_dirs``); the walk stops where the
    project search does (below ``home``, below a directory anyone may
    write to, below ``/``). The user file (``user_file``, which
    ``$WEALD_CONFIG`` may put anywhere) makes no project.
    """
    known = session_dirs if isinstance(session_dirs, set) else set(session_dirs)
    directory = os.path.dirname(root)
    if directory == root:
        return None
    while True:
        parent = os.path.dirname(directory)
        if directory in (home, parent):
            return None
        try:
            if os.stat(directory).st_mode & stat.S_IWOTH:
                return None
        except OSError:
            return None
        if directory in known:
            return directory
        for name in _MARKERS:
            marker = f"{directory}/{name}" if directory != "/" else f"/{name}"
            if os.path.lexists(marker) and not (user_file is not None and _same_file(marker, user_file)):
                return directory
        directory = parent


def _same_file(one: str, other: str) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


class TrustBook:
    """The trust records and the session directories, as the daemon knows them (see the module docstring)."""

    def __init__(self) -> None:
        self.records: dict[str, TrustRecord] = {}
        self.session_dirs: set[str] = set()

    def note_dirs(self, *directories: str | None) -> None:
        """Directories of sessions (started, or read from the store)."""
        for directory in directories:
            if directory is not None:
                self.session_dirs.add(directory)

    def check_blocking(self, files: ProjectFiles, digest: str | None, home: str) -> UntrustedConfigError | None:
        """Whether the project configuration ``files`` found may be applied (a worker thread).

        Args:
            files: What `find_project_files` found.
            digest: ``sha256:HEX`` of the project file as it was read (None: none read).
            home: The user's home directory.

        Returns:
            None when it is not nested, or trusted with these contents; else the error to raise.
        """
        if files.root is None:
            return None
        root = str(files.root)
        user = None if files.user is None else str(files.user)
        project = enclosing_project_blocking(root, home, self.session_dirs, user)
        if project is None:
            return None
        target = str(files.project) if files.project is not None else f"{root}/{PROJECT_DIR_NAME}"
        try:
            real = os.path.realpath(target)
            if files.project is not None and digest is not None:
                sha256 = digest.removeprefix("sha256:")
                size = os.stat(real).st_size
            else:
                sha256, size = config_digest_blocking(real)
        except OSError:
            return UntrustedConfigError(target, "", 0, project, changed=False)
        record = self.records.get(real)
        if record is not None and record.sha256 == sha256:
            return None
        return UntrustedConfigError(real, sha256, size, project, changed=record is not None)
