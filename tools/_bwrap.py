"""The OS sandbox for shell commands: the bubblewrap command line, and whether bubblewrap works here.

A sandboxed command runs as ``bwrap [options] -- bash -c COMMAND``. What it sees:

- the whole filesystem, read-only (``--ro-bind / /``), with a fresh ``/dev``
  and a fresh ``/proc`` that shows only its own processes;
- writable: the project directory, a private ``/tmp``, and the paths
  ``[tools.shell] writable`` names;
- not at all (an empty directory or an empty file in their place): the
  daemon's state directory, socket and config files, ``$XDG_RUNTIME_DIR``
  (agent and bus sockets), the container runtimes' sockets and the usual
  homes of credentials (`default_hidden_paths`: ``~/.ssh``, ``~/.aws``,
  ``~/.config/gcloud``, ``~/.netrc``, ``~/.weald``...), plus what
  ``[tools.shell] hidden`` adds; ``[tools.shell] readable`` shows a hidden
  path again, read-only;
- read-only even inside the project: its ``weald.toml`` and ``.weald``
  (so a command cannot rewrite the rules that judge it);
- its own PID namespace (``--unshare-pid``): the daemon and every other
  process of the machine are invisible, and when ``bwrap`` dies
  (``--die-with-parent``: when the daemon dies) the kernel kills every
  process inside, ``setsid``, ``env -i`` and double forks included;
- no network (``--unshare-net``: a loopback interface only) unless
  ``[tools.shell] network`` allows it;
- no capabilities, also when the daemon runs as root (``--unshare-user``,
  ``--cap-drop ALL``), so it cannot undo a mount; a new session
  (``--new-session``), so it cannot push input into the daemon's terminal.

Mounts are applied shallowest path first, so a path inside a hidden
directory can be shown again (the project inside a hidden state directory,
a skills folder inside ``~/.weald``) and one inside a writable directory
hidden (the state directory inside the project).

`sandbox_status` runs bubblewrap once with these options to learn whether it
works on this machine (it is missing, or user namespaces are off, in many
containers); the answer is cached for the life of the process.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import attrs

__all__ = [
    "SANDBOX_ENABLE_HINT",
    "SANDBOX_MODES",
    "SandboxMode",
    "SandboxPolicy",
    "SandboxStatus",
    "bwrap_argv",
    "cached_sandbox_status",
    "default_hidden_paths",
    "expand_paths",
    "probe_sandbox",
    "sandbox_status",
]

logger = logging.getLogger("weald.tools")

SandboxMode = Literal["auto", "required", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("auto", "required", "off")

SANDBOX_ENABLE_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
    "Arch: pacman -S bubblewrap) and allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 where that setting exists; on Ubuntu 24.04+ also "
    "sysctl kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for bwrap); "
    "in a container, run it with user namespaces allowed (e.g. docker --security-opt seccomp=unconfined). "
    "Check with `weald doctor`"
)
"""How to make the sandbox work, for messages."""

# Where credentials usually live, relative to the home directory.
_HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".my.cnf",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".password-store",
    ".vault-token",
    ".terraform.d",
    ".terraformrc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".weald",
)

# Sockets that hand out root (container runtimes) or the user's session.
_SYSTEM_SECRETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman", "/run/containerd")

# Read-only even inside a writable project: the rules that judge its commands.
_PROTECTED_IN_PROJECT = ("weald.toml", ".weald")

_PROBE_TIMEOUT = 15.0


def default_hidden_paths(home: Path | None = None, environ: dict[str, str] | None = None) -> tuple[Path, ...]:
    """The paths hidden from every sandboxed command unless configuration shows them again.

    The usual homes of credentials under ``home`` (``~/.ssh``, ``~/.aws``,
    ``~/.config/gcloud``, ``~/.netrc``, ``~/.weald``...), ``$XDG_RUNTIME_DIR``
    (the ssh and gpg agents', the session bus's and weald's own sockets)
    and the container runtimes' sockets.
    """
    env = os.environ if environ is None else environ
    base = Path.home() if home is None else home
    paths = [base / name for name in _HOME_SECRETS]
    runtime_dir = env.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        paths.append(Path(runtime_dir))
    paths.extend(Path(p) for p in _SYSTEM_SECRETS)
    return tuple(paths)


@attrs.frozen
class SandboxPolicy:
    """What one sandboxed command may see and do.

    Attributes:
        project: the project directory, writable (None: none).
        workdir: where the command starts (in the project, or in a readable path).
        writable: more writable paths (``[tools.shell] writable``).
        readable: paths shown read-only even when a hidden path contains them
            (``[tools.shell] readable``, the session's skills and saved outputs).
        hidden: paths the command may not see.
        network: whether it may use the network.
        tmp: a host directory to mount as ``/tmp``; None for a fresh, empty one.
    """

    project: Path | None
    workdir: Path
    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    network: bool = False
    tmp: Path | None = None


def _real(path: Path) -> Path | None:
    """The path with its links resolved, or None when it does not exist."""
    try:
        real = Path(os.path.realpath(path))
        os.lstat(real)
    except OSError:
        return None
    return real


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _mounts(policy: SandboxPolicy) -> list[tuple[str, Path, Path]]:
    """``(option, source, destination)`` for each mount after the read-only root, shallowest first."""
    shown = {p for p in (_real(path) for path in policy.readable) if p is not None}
    project = _real(policy.project) if policy.project is not None else None
    writable = [p for p in (project, *(_real(path) for path in policy.writable)) if p is not None]
    mounts: list[tuple[str, Path, Path]] = []
    tmp = Path("/tmp")  # noqa: S108 - the sandbox's own /tmp, a fresh tmpfs
    if policy.tmp is not None and (tmp_dir := _real(policy.tmp)) is not None:
        mounts.append(("--bind", tmp_dir, tmp))
    else:
        mounts.append(("--tmpfs", tmp, tmp))
    hidden = {real for real in (_real(path) for path in policy.hidden) if real is not None}
    for real in sorted(hidden):
        # A path the configuration shows again (or makes writable) stays; one
        # that does not exist has nothing to hide; one in /tmp is already gone.
        if real in shown or real in writable or _within(real, tmp):
            continue
        try:
            mode = os.stat(real).st_mode
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            mounts.append(("--tmpfs", real, real))
        else:
            # Files and sockets alike: an empty, unwritable file in their place.
            mounts.append(("--ro-bind", Path("/dev/null"), real))
    mounts.extend(("--bind", path, path) for path in writable)
    mounts.extend(("--ro-bind", path, path) for path in sorted(shown))
    if project is not None:
        for name in _PROTECTED_IN_PROJECT:
            protected = _real(project / name)
            if protected is not None and _within(protected, project):
                mounts.append(("--ro-bind", protected, protected))
    # Stable: at equal depth, the order above (hide, then bind, then show).
    mounts.sort(key=lambda mount: len(mount[2].parts))
    return mounts


def bwrap_argv(bwrap: str, policy: SandboxPolicy, command: Sequence[str]) -> list[str]:
    """The full command line that runs ``command`` under ``policy``.

    Args:
        bwrap: the ``bwrap`` program.
        policy: what the command may see and do.
        command: the program and its arguments (``bash -c ...``).
    """
    argv = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--cap-drop",
        "ALL",
    ]
    if not policy.network:
        argv.append("--unshare-net")
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for option, source, destination in _mounts(policy):
        if option == "--tmpfs":
            argv += [option, str(destination)]
        else:
            argv += [option, str(source), str(destination)]
    argv += ["--chdir", str(policy.workdir), "--", *command]
    return argv


# -- does it work here? -----------------------------------------------------------------------------


@attrs.frozen
class SandboxStatus:
    """Whether bubblewrap can sandbox commands on this machine.

    Attributes:
        available: True when a test command ran in the sandbox.
        bwrap: the ``bwrap`` program found, or None.
        version: its version (``bubblewrap 0.8.0``), when it ran.
        reason: why the sandbox is not available (None when it is).
    """

    available: bool
    bwrap: str | None
    version: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        """One line for people: what works, or why not."""
        if self.available:
            return f"bubblewrap sandbox available ({self.version or 'bwrap'} at {self.bwrap})"
        return f"bubblewrap sandbox unavailable: {self.reason}"


def probe_sandbox(bwrap: str | None = None) -> SandboxStatus:
    """Run a command in the sandbox, with the options shell uses, to learn whether it works; blocks.

    Args:
        bwrap: the program to try; None looks for ``bwrap`` on ``PATH``.
    """
    program = bwrap or shutil.which("bwrap")
    if program is None:
        return SandboxStatus(available=False, bwrap=None, reason="bubblewrap (bwrap) is not installed")
    true = shutil.which("true") or "/bin/true"
    argv = bwrap_argv(program, SandboxPolicy(project=None, workdir=Path("/")), [true])
    try:
        done = subprocess.run(  # noqa: S603 - our own fixed command line
            argv, capture_output=True, timeout=_PROBE_TIMEOUT, check=False, stdin=subprocess.DEVNULL
        )
        version = subprocess.run(  # noqa: S603 - our own fixed command line
            [program, "--version"], capture_output=True, timeout=_PROBE_TIMEOUT, check=False, text=True
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(available=False, bwrap=program, reason=f"{program} could not run: {exc}")
    if done.returncode != 0:
        error = done.stderr.decode("utf-8", "replace").strip().splitlines()
        detail = error[-1] if error else f"exit code {done.returncode}"
        return SandboxStatus(
            available=False,
            bwrap=program,
            version=version or None,
            reason=f"{program} is installed but cannot create the sandbox ({detail})",
        )
    return SandboxStatus(available=True, bwrap=program, version=version or None)


_status_lock = threading.Lock()
_status: SandboxStatus | None = None


def sandbox_status(*, refresh: bool = False) -> SandboxStatus:
    """`probe_sandbox`, once per process (blocks the first time, for a few milliseconds).

    Args:
        refresh: probe again (after installing bubblewrap, say).
    """
    global _status
    with _status_lock:
        if _status is None or refresh:
            _status = probe_sandbox()
        return _status


def cached_sandbox_status() -> SandboxStatus | None:
    """The answer of `sandbox_status` if it was asked already, without probing."""
    return _status


def expand_paths(
    paths: Iterable[str | Path], *, base: Path | None = None, home: Path | None = None
) -> tuple[Path, ...]:
    """Configured paths as absolute paths: ``~`` is the home directory, a relative path is relative to ``base``."""
    home_dir = Path.home() if home is None else home
    out = []
    for path in paths:
        text = str(path)
        if text == "~" or text.startswith("~/"):
            out.append(home_dir / text[2:])
        elif base is not None and not Path(text).is_absolute():
            out.append(base / text)
        else:
            out.append(Path(text))
    return tuple(out)
