"""Running a daemon as an ordinary user: root can read any /proc entry, an ordinary user cannot.

`ordinary_user` creates a system user for the tests (``useradd``) when the
tests run as root, or uses the current user when they do not. `as_user`
is the command prefix that runs a program as that user. The interpreter
running the tests may sit under a directory the user cannot enter (pyenv
under ``/root``, mode 0700): then the prefix first makes, in a mount
namespace of the daemon's own (``unshare --mount``), a view of that
directory holding only the interpreter's tree, so the user can run it and
sees nothing else of root's home.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

USER_NAME = "weald-sec-test"


@attrs.frozen
class User:
    """Who the daemon runs as, and the command prefix that makes it so."""

    name: str
    uid: int
    gid: int
    prefix: tuple[str, ...]

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """Act as this user (real and effective ids) inside the block: a daemon serves its own user only.

        The daemon and the client check each other's credentials when a
        client connects, so a connection opened inside the block stays the
        user's after it. The saved ids stay root's, to come back.
        """
        if os.geteuid() != 0 or self.uid == 0:
            yield
            return
        os.setresgid(self.gid, self.gid, 0)
        os.setresuid(self.uid, self.uid, 0)
        try:
            yield
        finally:
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)

    def give(self, path: Path) -> None:
        """Hand ``path`` (and everything below it) to this user."""
        if os.geteuid() != 0:
            return
        for directory, dirs, files in os.walk(path):
            for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
                os.lchown(name, self.uid, self.gid)


def _need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        pytest.fail(f"running a daemon as an ordinary user needs {program} (util-linux); install it", pytrace=False)
    return found


def _blocked_ancestor(path: Path) -> tuple[Path, Path] | None:
    """The first directory above ``path`` that others may not enter, and its child on the way to ``path``."""
    parts = path.parts
    for depth in range(1, len(parts) - 1):
        directory = Path(*parts[:depth])
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return directory, Path(*parts[: depth + 1])
    return None


def ordinary_user(view_root: Path) -> User:
    """The user to run daemons as: ``weald-sec-test`` (created if missing) when root, else this user.

    Args:
        view_root: where to put the view of a directory the user cannot enter (when root).
    """
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.getuid())
        return User(me.pw_name, me.pw_uid, me.pw_gid, ())
    try:
        entry = pwd.getpwnam(USER_NAME)
    except KeyError:
        done = subprocess.run(
            [_need("useradd"), "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER_NAME],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0 and "already exists" not in done.stderr:
            pytest.fail(f"useradd {USER_NAME} failed (exit {done.returncode}): {done.stderr}", pytrace=False)
        entry = pwd.getpwnam(USER_NAME)
    setpriv = _need("setpriv")
    become = (setpriv, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--")
    blocked = _blocked_ancestor(Path(os.path.realpath(sys.executable)))
    if blocked is None:
        return User(USER_NAME, entry.pw_uid, entry.pw_gid, become)
    directory, child = blocked
    view = Path(tempfile.mkdtemp(prefix="view-", dir=view_root))
    view.chmod(0o711)
    inside = view / child.name
    script = (
        f'mkdir -p "{inside}" && mount --bind "{child}" "{inside}" && mount --rbind "{view}" "{directory}" && exec "$@"'
    )
    prefix = (_need("unshare"), "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", *become)
    return User(USER_NAME, entry.pw_uid, entry.pw_gid, prefix)
