"""The OS sandbox for shell commands: the bubblewrap command line, and whether bubblewrap works here.

A sandboxed command runs as ``bwrap --args FD -- bash -c COMMAND``, its
options read from a memory file (`options_file`) rather than its command
line, where the sandbox's ``/proc/1/cmdline`` and the host's ``ps`` would
show every hidden path. What it sees:

- the whole filesystem, read-only (``--ro-bind / /``), with a fresh ``/dev``
  and a fresh ``/proc`` that shows only its own processes;
- writable: the project directory, a private ``/tmp``, and the paths
  ``[tools.shell] writable`` names;
- not at all (an empty directory or an empty file in their place): the
  daemon's state directory, socket and config files (*private*: nothing
  shows them again), ``$XDG_RUNTIME_DIR`` (agent and bus sockets), the
  container runtimes' sockets and the usual homes of credentials
  (`default_hidden_paths`: ``~/.ssh``, ``~/.aws``, ``~/.config/gcloud``,
  ``~/.netrc``, ``~/.claude.json``, ``~/.weald``...), plus what
  ``[tools.shell] hidden`` adds; ``[tools.shell] readable`` shows a hidden
  path again, read-only. Hidden wins over every mount that would show a path
  again, wherever it lives: under the host's ``/tmp`` too, when the project
  lives there;
- read-only even inside the project, whether they exist or not: the files
  that decide what an agent may do (`weald.tools._protected`: ``weald.toml``,
  ``.weald``, git's config and hooks, the files the configuration reads). A
  missing one gets a read-only placeholder while the command runs, so it
  cannot be planted; the directories on the way to one are bound onto
  themselves, so none can be renamed away from under its mount. A protected
  path that is a symbolic link is bound where it leads; the link itself,
  which no mount can cover, is remembered (`weald.runtime.ProtectedLinks`)
  and put back once the command ends if the command replaced it;
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

What the sandbox cannot hide: ``/proc/self/mountinfo`` lists every mount
point, so the paths (never the contents) of the hidden paths that exist,
of the project, of the writable and readable paths and of the protected
files are visible there, as they are to ``ls``; and its line for ``/tmp``
names the host directory behind it (the session's, in the state
directory, whose path the session's saved outputs show anyway).

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
from weald.runtime import ProtectedLinks, is_placeholder
from weald.tools._protected import Placeholders, Protected, Shape, protected_paths

__all__ = [
    "SANDBOX_ENABLE_HINT",
    "SANDBOX_MODES",
    "SandboxMode",
    "SandboxPolicy",
    "SandboxStatus",
    "bwrap_argv",
    "bwrap_options",
    "cached_sandbox_status",
    "default_hidden_paths",
    "expand_paths",
    "options_file",
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
    ".psql_history",
    ".mysql_history",
    ".weald",
    # Coding agents' and their desktop apps' logins and configs (MCP servers with keys in env).
    ".claude.json",
    ".claude/.credentials.json",
    ".config/Claude/claude_desktop_config.json",
    "Library/Application Support/Claude/claude_desktop_config.json",
    ".codex",
    ".config/opencode",
    ".local/share/opencode/auth.json",
    ".config/github-copilot",
    # Tokens and passwords of common tools.
    ".cache/huggingface/token",
    ".huggingface/token",
    ".config/rclone/rclone.conf",
    ".pip/pip.conf",
    ".config/pip/pip.conf",
    ".env",
    ".s3cfg",
    ".boto",
    ".config/containers/auth.json",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".config/composer/auth.json",
    ".composer/auth.json",
    ".databrickscfg",
    ".oci",
    ".config/doctl",
)

# Sockets that hand out root (container runtimes) or the user's session.
_SYSTEM_SECRETS = ("/var/run/docker.sock", "/run/docker.sock", "/run/podman", "/run/containerd")

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
        hidden: paths the command may not see (`default_hidden_paths` and
            ``[tools.shell] hidden``); ``readable`` may show one again.
        private: paths the command may never see, whatever ``readable`` or
            ``writable`` say at that very path (the daemon's state directory,
            socket and config); a readable path inside one is still shown.
        protected: more files no command may write (`ToolConfig.protected_paths`),
            besides the project's own (`weald.tools._protected.protected_paths`).
        network: whether it may use the network.
        tmp: a host directory to mount as ``/tmp``; None for a fresh, empty one.
    """

    project: Path | None
    workdir: Path
    writable: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    private: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = ()
    network: bool = False
    tmp: Path | None = None


def _real(path: Path) -> Path | None:
    """The path with its links resolved, or None when it does not exist."""
    try:
        # Most of the hidden paths do not exist: one stat says so, before resolving every component.
        os.stat(path)
        real = Path(os.path.realpath(path))
        os.lstat(real)
    except OSError:
        return None
    return real


def _within(path: Path, base: Path) -> bool:
    # By text: comparing Path objects part by part cost more than all the rest of the options.
    text, prefix = str(path), str(base)
    return text == prefix or text.startswith(prefix if prefix.endswith("/") else prefix + "/")


def _deepest(path: Path, bases: Iterable[Path]) -> Path | None:
    """The deepest of ``bases`` containing ``path``, or None."""
    found = [base for base in bases if _within(path, base)]
    return max(found, key=lambda base: len(base.parts)) if found else None


# At equal depth, mounts apply in this order (the later one wins): the
# project and writable paths, paths shown again, the directories on the way
# to a protected path (bound onto themselves so that none can be renamed
# away from under its mount), protected paths read-only, then what is
# private. A hidden path the configuration shows again at that very path is
# not hidden at all.
_TMP, _HIDE, _BIND, _SHOW, _PIN, _PROTECT, _PRIVATE = range(7)

Mount = tuple[str, Path, Path]


def _hiding(real: Path) -> Mount | None:
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return ("--tmpfs", real, real)
    # Files and sockets alike: an empty, unwritable file in their place.
    return ("--ro-bind", Path("/dev/null"), real)


def _protect(
    item: Protected, writable: list[Path], hidden: list[Path], placeholders: Placeholders | None
) -> tuple[Path, bool] | None:
    """Where to mount ``item`` read-only (its real path, or a placeholder's) and whether that is a placeholder.

    None when it needs no mount: it lies outside every writable path (so
    read-only already) or inside a hidden one, or it is missing and has no
    placeholder (or none can be made). A missing one gets its placeholder at
    its first missing component (or at one that is a placeholder already,
    left by another sandbox).
    """
    if item.placeholder is not None and placeholders is not None:
        inside = _deepest(item.path, writable)
        if inside is not None and _deepest(item.path, hidden) is None:
            spot = inside
            for part in item.path.relative_to(inside).parts:
                spot = spot / part
                shape: Shape = item.placeholder if spot == item.path else "dir"
                if not os.path.lexists(spot) or is_placeholder(spot, shape):
                    if placeholders.hold(spot, shape):
                        return spot, True
                    break  # something else appeared there meanwhile: protect what it is
                if spot != item.path and (os.path.islink(spot) or not os.path.isdir(spot)):
                    break  # through a link (protected where it leads, below) or a file (nothing to protect)
    real = _real(item.path)
    if real is None or _deepest(real, writable) is None or _deepest(real, hidden) is not None:
        return None
    return real, False


def _mounts(
    policy: SandboxPolicy, placeholders: Placeholders | None = None, links: ProtectedLinks | None = None
) -> tuple[list[Mount], list[Path]]:
    """Each mount after the read-only root, shallowest first, and the placeholders to lock."""
    shown = {p for p in (_real(path) for path in policy.readable) if p is not None}
    project = _real(policy.project) if policy.project is not None else None
    writable = [p for p in (project, *(_real(path) for path in policy.writable)) if p is not None]
    ranked: list[tuple[int, Mount]] = []
    tmp = Path("/tmp")  # noqa: S108 - the sandbox's own /tmp, a fresh tmpfs
    if policy.tmp is not None and (tmp_dir := _real(policy.tmp)) is not None:
        ranked.append((_TMP, ("--bind", tmp_dir, tmp)))
    else:
        ranked.append((_TMP, ("--tmpfs", tmp, tmp)))
    visible = [*writable, *shown]

    def needed(real: Path) -> bool:
        # One under /tmp is gone with the host's /tmp, unless a mount shows it again.
        return not _within(real, tmp) or _deepest(real, visible) is not None

    hidden_dirs: list[Path] = []
    private = {real for real in (_real(path) for path in policy.private) if real is not None}
    for real in sorted(private):
        if needed(real) and (mount := _hiding(real)) is not None:
            ranked.append((_PRIVATE, mount))
            hidden_dirs.append(real)
    hidden = {real for real in (_real(path) for path in policy.hidden) if real is not None} - private
    for real in sorted(hidden):
        # A path the configuration shows again (or makes writable) stays.
        if real in shown or real in writable or not needed(real):
            continue
        if (mount := _hiding(real)) is not None:
            ranked.append((_HIDE, mount))
            hidden_dirs.append(real)
    ranked.extend((_BIND, ("--bind", path, path)) for path in writable)
    ranked.extend((_SHOW, ("--ro-bind", path, path)) for path in sorted(shown))
    locks: list[Path] = []
    if project is not None:
        items = protected_paths(project, policy.protected)
        pinned: set[Path] = set()
        for item in items:
            if links is not None:
                links.watch(item.path, writable)
            found = _protect(item, writable, hidden_dirs, placeholders)
            if found is None:
                continue
            target, is_placeholder = found
            ranked.append((_PROTECT, ("--ro-bind", target, target)))
            if is_placeholder:
                locks.append(target)
            inside = _deepest(target, writable)
            assert inside is not None
            between = target.parent
            while between != inside and _within(between, inside) and between not in pinned:
                pinned.add(between)
                ranked.append((_PIN, ("--bind", between, between)))
                between = between.parent
    # Stable: at equal depth, in rank order.
    ranked.sort(key=lambda entry: (len(entry[1][2].parts), entry[0]))
    mounts = list(dict.fromkeys(mount for _, mount in ranked))
    return mounts, locks


def bwrap_options(
    policy: SandboxPolicy, placeholders: Placeholders | None = None, links: ProtectedLinks | None = None
) -> list[str]:
    """The options bubblewrap gets for ``policy``: everything before ``--`` and the command.

    Args:
        policy: what the command may see and do.
        placeholders: where to make placeholders for missing protected paths
            (`weald.tools._protected.Placeholders`; the caller releases them
            once the command has ended); None makes none, and a missing
            protected path is then not protected.
        links: where to remember the links on the way to the protected paths
            (`weald.runtime.ProtectedLinks`: a bind mount protects where a link
            leads, never the link; the caller releases them once the command
            has ended, which puts back a link it replaced); None remembers none.
    """
    options = [
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--cap-drop",
        "ALL",
    ]
    if not policy.network:
        options.append("--unshare-net")
    options += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    mounts, locks = _mounts(policy, placeholders, links)
    for option, source, destination in mounts:
        if option == "--tmpfs":
            options += [option, str(destination)]
        else:
            options += [option, str(source), str(destination)]
    # bubblewrap's init holds a lock on each placeholder while the sandbox
    # lives, so that no other process removes one still mounted.
    for path in locks:
        options += ["--lock-file", str(path)]
    options += ["--chdir", str(policy.workdir)]
    return options


def bwrap_argv(
    bwrap: str, policy: SandboxPolicy, command: Sequence[str], placeholders: Placeholders | None = None
) -> list[str]:
    """The full command line that runs ``command`` under ``policy``, options in it (see `options_file`).

    Args:
        bwrap: the ``bwrap`` program.
        policy: what the command may see and do.
        command: the program and its arguments (``bash -c ...``).
        placeholders: see `bwrap_options`.
    """
    return [bwrap, *bwrap_options(policy, placeholders), "--", *command]


def options_file(options: Sequence[str]) -> int:
    """A memory file holding ``options`` for ``bwrap --args FD``; returns its descriptor (the caller closes it).

    On the command line they would show in the sandbox's ``/proc/1/cmdline``
    (bubblewrap's init) and in the host's ``ps``, naming every hidden path.
    bubblewrap reads the file and closes it before the command runs.
    """
    data = b"".join(os.fsencode(option) + b"\0" for option in options)
    fd = os.memfd_create("weald-bwrap-options", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
