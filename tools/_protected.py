"""The files that decide what an agent may do, which no agent may write, by any route.

An agent must not rewrite the rules that judge it, nor plant code that runs
outside its sandbox the next time the user works. What counts:

- the project's weald configuration: ``weald.toml`` and ``.weald/`` (its
  skills), whether or not they exist yet (a planted ``weald.toml`` would
  judge the next session started there);
- every other file weald's configuration reads (``[mcp] import`` files, the
  faults file): `ToolConfig.protected_paths`, set by the runtime;
- git's ways to run code on the host: the repository's ``config`` and
  ``hooks/`` (``core.fsmonitor``, a ``pre-commit`` hook: the user's next plain
  ``git status`` or ``git commit`` runs them unsandboxed), the directory
  ``core.hooksPath`` names, every file git's configuration includes
  (``include.path``, ``includeIf``), and a worktree's ``.git`` file (which
  says where the repository is).

`protected_paths` lists them for one project; the OS sandbox
(`weald.tools._bwrap`) mounts them read-only and puts a read-only
*placeholder* where one is missing (`Placeholders`); the file tools refuse
to write them (`refuse_protected`), also under a blanket ``allow``.

A placeholder is an empty file of mode 0400 for a missing file (``weald.toml``,
``.weald``, git's ``config``), an empty directory of mode 0500 for a missing
directory, at the first missing component of the path; weald's own
configuration readers pass over a ``weald.toml`` that is one
(`weald.runtime.is_placeholder`), and a ``.weald`` that is a file is no
project directory. It exists on the host only while a sandboxed command that
mounts it runs: each sandbox holds a lock on it (bubblewrap's
``--lock-file``), and the last command to end removes it once no lock is
left, whichever process ran it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import attrs
from weald.runtime import PLACEHOLDER_DIR_MODE, PLACEHOLDER_FILE_MODE, is_placeholder
from weald.tools._errors import ToolError

__all__ = [
    "CONFIG_NAMES",
    "Placeholders",
    "Protected",
    "Shape",
    "git_protected_paths",
    "protected_paths",
    "protected_reason",
    "refuse_protected",
]

CONFIG_NAMES = ("weald.toml", ".weald")
"""The project's own configuration: the file and the directory (skills), by name."""

Shape = Literal["dir", "file"]
"""What a placeholder is: an empty directory or an empty file."""

_PROJECT_WHY = "the project's weald configuration, which decides what agents may do"
_SKILLS_WHY = "the project's weald directory (its skills and settings), which decides what agents may do"
_GIT_CONFIG_WHY = "git's configuration, whose settings (core.fsmonitor, aliases...) run programs on the host"
_GIT_HOOKS_WHY = "git's hooks, which run on the host at the user's next commit"
_GIT_INCLUDED_WHY = "a file git's configuration includes, whose settings (core.fsmonitor...) run programs on the host"
_GIT_LINK_WHY = "the worktree's link to its git repository"
_CONFIGURED_WHY = "a file weald's configuration reads"


@attrs.frozen
class Protected:
    """One path no agent may write.

    Attributes:
        path: the absolute path (within the project, or a configured file).
        why: what it is, for messages (``"git's hooks, which run..."``).
        placeholder: the shape to put in its place while it is missing
            (None: a missing one is not protected, as it is harmless).
    """

    path: Path
    why: str
    placeholder: Shape | None = None


def _git_config_values(path: Path, section: str, key: str) -> list[str]:
    """The values of ``section.key`` in one git config file (its includes are not followed here: `_git_configs`).

    ``section`` is lowercase; ``"includeif"`` matches every ``[includeIf "..."]``
    (whatever its condition: a protected file may as well be one git would
    read on another day).
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:  # a small file the user wrote
            text = handle.read(1 << 20)
    except OSError:
        return []
    values: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = line[1 : line.find("]")].strip().lower() if "]" in line else ""
            line = line[line.find("]") + 1 :].strip() if "]" in line else ""
            if not line:
                continue
        name, _, value = line.partition("=")
        if (current != section and current.split(" ", 1)[0] != section) or name.strip().lower() != key:
            continue
        value = value.strip()
        for mark in ("#", ";"):  # a comment after an unquoted value
            if mark in value and not value.startswith('"'):
                value = value[: value.index(mark)].strip()
        values.append(value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value)
    return values


_GIT_INCLUDE_DEPTH = 10  # git's own limit on nested includes


def _git_configs(roots: Iterable[Path], home: Path) -> list[Path]:
    """``roots`` and every file they include (``include.path``, ``includeIf.*.path``), nested, each once.

    A relative include is relative to the directory of the file naming it;
    ``~/`` is ``home``. Missing files are listed too (an agent could create
    one, and git would read it).
    """
    seen: dict[Path, None] = {}
    level = [Path(os.path.normpath(root)) for root in roots]
    for _ in range(_GIT_INCLUDE_DEPTH + 1):
        following: list[Path] = []
        for config in level:
            if config in seen:
                continue
            seen[config] = None
            for section in ("include", "includeif"):
                for value in _git_config_values(config, section, "path"):
                    if not value:
                        continue
                    named = home / value[2:] if value.startswith("~/") else config.parent / value
                    following.append(Path(os.path.normpath(named)))
        level = following
    return list(seen)


def _git_dirs(project: Path) -> tuple[Path, Path, bool] | None:
    """``(gitdir, commondir, linked)`` of the repository whose worktree root is ``project``, or None."""
    dotgit = project / ".git"
    try:
        info = os.lstat(dotgit)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):
        gitdir, linked = dotgit, False
    elif stat.S_ISREG(info.st_mode):
        try:
            first = dotgit.read_text(encoding="utf-8", errors="replace").splitlines()[0]
        except (OSError, IndexError):
            return None
        if not first.startswith("gitdir:"):
            return None
        gitdir, linked = project / first.removeprefix("gitdir:").strip(), True
    else:
        return None
    common = gitdir
    with contextlib.suppress(OSError, IndexError):
        common = gitdir / (gitdir / "commondir").read_text(encoding="utf-8").splitlines()[0].strip()
    return Path(os.path.normpath(gitdir)), Path(os.path.normpath(common)), linked


def git_protected_paths(project: Path, home: Path | None = None) -> list[Protected]:
    """The paths through which git runs code, for a project that is a git worktree root (none when it is not).

    The repository's ``config`` and ``hooks/`` (a worktree's own
    ``config.worktree`` too), every file those and the user's git
    configuration include (``include.path``, ``includeIf.*.path``, nested;
    a missing one inside the project gets a placeholder), the directory
    ``core.hooksPath`` names (in any of those files; relative: to the
    project), and a worktree's ``.git`` file. A repository that does not
    exist yet (one the agent creates with ``git init``) is the agent's own.
    """
    found = _git_dirs(project)
    if found is None:
        return []
    gitdir, common, linked = found
    out = [
        Protected(common / "config", _GIT_CONFIG_WHY, "file"),
        Protected(common / "hooks", _GIT_HOOKS_WHY, "dir"),
        Protected(gitdir / "config.worktree", _GIT_CONFIG_WHY),
    ]
    if linked:
        out.append(Protected(project / ".git", _GIT_LINK_WHY))
    user = Path.home() if home is None else home
    roots = [common / "config", gitdir / "config.worktree", user / ".gitconfig", user / ".config" / "git" / "config"]
    configs = _git_configs(roots, user)
    for config in configs[len(roots) :]:  # the included files, wherever they are
        inside = _inside(config, project) or _inside(config, common)
        out.append(Protected(config, _GIT_INCLUDED_WHY, "file" if inside else None))
    for config in configs:
        for value in _git_config_values(config, "core", "hookspath"):
            if not value:
                continue
            hooks = user / value[2:] if value.startswith("~/") else project / value
            out.append(Protected(Path(os.path.normpath(hooks)), _GIT_HOOKS_WHY, "dir"))
    return out


def protected_paths(project: Path, configured: Iterable[str | Path] = (), home: Path | None = None) -> list[Protected]:
    """Every path no agent working in ``project`` may write.

    Args:
        project: the project directory (its real path).
        configured: more files weald's configuration reads (`ToolConfig.protected_paths`).
        home: the user's home, for ``~`` in git's ``core.hooksPath``.
    """
    out = [
        Protected(project / "weald.toml", _PROJECT_WHY, "file"),
        Protected(project / ".weald", _SKILLS_WHY, "file"),
    ]
    out.extend(git_protected_paths(project, home))
    out.extend(Protected(Path(os.path.abspath(path)), _CONFIGURED_WHY) for path in configured)
    return out


def _inside(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def protected_reason(real: Path, relative: Sequence[str], protected: Iterable[Protected]) -> str | None:
    """Why writing ``real`` is refused, or None when it may be written.

    Args:
        real: the resolved path to be written.
        relative: its components below the sandbox root holding it: a
            ``weald.toml``, ``.weald`` or ``.git`` among them is refused at any
            depth (a planted ``weald.toml`` judges sessions started beside it;
            ``.git`` holds a repository's configuration and hooks).
        protected: the protected paths of the project (`protected_paths`).
    """
    if relative and relative[-1] == "weald.toml":
        return _PROJECT_WHY
    for part in relative[:-1] if relative else ():
        if part == ".weald":
            return _SKILLS_WHY
    for part in relative:
        if part == ".git":
            return "inside a git repository's own directory (.git), whose configuration and hooks run on the host"
    for item in protected:
        target = Path(os.path.realpath(item.path))
        if _inside(real, target) or _inside(real, item.path):
            return item.why
    return None


def refuse_protected(shown: str, real: Path, relative: Sequence[str], protected: Iterable[Protected]) -> None:
    """Raise `ToolError` if ``real`` is a protected path (see `protected_reason`).

    Args:
        shown: the path as the model should read it.
        real: the resolved path.
        relative: its components below its sandbox root.
        protected: the project's protected paths.
    """
    why = protected_reason(real, relative, protected)
    if why is None:
        return
    raise ToolError(
        f"{shown} is protected: it is {why}. No agent may write it, whatever the permissions allow, and "
        "nothing was written. If it must change, tell the user what to change and why; they edit it themselves.",
    )


# -- placeholders ---------------------------------------------------------------------------------

# struct flock on Linux: l_type, l_whence, (pad), l_start, l_len, l_pid, (pad).
_FLOCK = "@hhqqi4x"

_lock = threading.Lock()
# Placeholders this process's sandboxes use, with how many are between
# "made or found" and "ended". Guarded by _lock.
_users: dict[Path, int] = {}


def _locked_by_a_sandbox(path: Path) -> bool:
    """True if some process (a running sandbox's bubblewrap) holds a lock on ``path``; True when unsure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
    except OSError:
        return True
    finally:
        os.close(fd)
    kind: int = struct.unpack(_FLOCK, answer)[0]
    return kind != fcntl.F_UNLCK


def _make(path: Path, shape: Shape) -> bool:
    """Make an empty placeholder at ``path``; False if something else is there, or nothing can be made.

    Where this process cannot make one (a directory it may not write),
    the sandboxed command, which runs as the same user, cannot either.
    """
    try:
        if shape == "dir":
            os.mkdir(path, PLACEHOLDER_DIR_MODE)
        else:
            os.close(
                os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PLACEHOLDER_FILE_MODE
                )
            )
    except FileExistsError:
        return is_placeholder(path, shape)
    except OSError:
        return False
    # The mode is exact whatever the umask: it is what marks a placeholder.
    try:
        os.chmod(path, PLACEHOLDER_DIR_MODE if shape == "dir" else PLACEHOLDER_FILE_MODE, follow_symlinks=False)
    except OSError:
        return False
    return True


class Placeholders:
    """The placeholders one sandboxed command mounts; made by `hold`, given back by `release` (blocking).

    Each is counted while this process has a command using it, and bubblewrap
    locks it (``--lock-file``) while the sandbox lives; `release` removes
    the ones nobody uses any more.
    """

    __slots__ = ("_held", "_released")

    def __init__(self) -> None:
        self._held: list[tuple[Path, Shape]] = []
        self._released = False

    def __repr__(self) -> str:
        return f"<Placeholders {[str(path) for path, _ in self._held]}>"

    @property
    def paths(self) -> tuple[Path, ...]:
        """The placeholders held."""
        return tuple(path for path, _ in self._held)

    def hold(self, path: Path, shape: Shape) -> bool:
        """Make (or take over) a placeholder at ``path``; False if something else is there (blocking)."""
        with _lock:
            if not _make(path, shape):
                return False
            _users[path] = _users.get(path, 0) + 1
        self._held.append((path, shape))
        return True

    def release(self) -> None:
        """Give the placeholders back once the command has ended; remove those no sandbox uses (blocking).

        Idempotent. A placeholder another process's sandbox still locks, or
        that someone filled meanwhile, stays.
        """
        if self._released:
            return
        self._released = True
        for path, shape in reversed(self._held):
            with _lock:
                left = _users.get(path, 1) - 1
                if left > 0:
                    _users[path] = left
                    continue
                _users.pop(path, None)
                if is_placeholder(path, shape) and not _locked_by_a_sandbox(path):
                    with contextlib.suppress(OSError):  # gone already, or filled: then it is not ours to remove
                        if shape == "dir":
                            os.rmdir(path)
                        else:
                            os.unlink(path)
