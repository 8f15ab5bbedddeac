"""``weald doctor``: what this machine lets weald do, checked by doing it.

Each check runs the real thing where it can (bubblewrap runs a command in
the sandbox shell uses, ripgrep and node print their versions, the state
directory's free space and filesystem are read) and says ``ok``, ``warn``
(weald works, with less) or ``fail`` (something configured cannot work),
with what to do about it. Every check is bounded (10 s per program run).
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Literal

import attrs
from weald.runtime.daemon.config import Config
from weald.tools import SANDBOX_ENABLE_HINT, find_executable, sandbox_status

__all__ = ["Check", "run_checks"]

Status = Literal["ok", "warn", "fail"]

_RUN_TIMEOUT = 10.0
_LOW_SPACE = 1 << 30  # below this, warn
_NO_SPACE = 100 << 20  # below this, fail
# Filesystems where SQLite's locking or durability cannot be trusted, or that vanish at reboot.
_NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "9p", "afs")
_VOLATILE_FILESYSTEMS = ("tmpfs", "ramfs")


@attrs.frozen
class Check:
    """One thing checked.

    Attributes:
        name: what was checked (``shell sandbox``, ``ripgrep``...).
        status: ``ok``, ``warn`` (works, with less) or ``fail`` (cannot work as configured).
        detail: what was found.
        fix: what to do, when it is not ok.
    """

    name: str
    status: Status
    detail: str
    fix: str | None = None


def run_checks(config: Config, config_error: str | None = None) -> list[Check]:
    """Every check, in order; blocks (a few programs run, each for at most 10 s).

    Args:
        config: the configuration in effect here (defaults when it could not be read).
        config_error: why the configuration could not be read, if it could not.
    """
    checks: list[Check] = []
    if config_error is not None:
        checks.append(Check("configuration", "fail", config_error, "fix weald.toml (`weald config` shows the problem)"))
    steps: list[Callable[[Config], Check]] = [
        _sandbox,
        _user_namespaces,
        _ripgrep,
        _node,
        _npx,
        _mcp_commands,
        _state_directory,
        _state_permissions,
        _previous_run,
        _telemetry,
        _tools,
        _python,
    ]
    checks.extend(step(config) for step in steps)
    return checks


def _run(argv: list[str]) -> tuple[int, str]:
    """Exit code and first line of output of a short program run; -1 and the error if it did not run."""
    try:
        done = subprocess.run(  # noqa: S603 - the doctor's own probes
            argv, capture_output=True, text=True, timeout=_RUN_TIMEOUT, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    text = (done.stdout or done.stderr).strip()
    return done.returncode, text.splitlines()[0] if text else ""


def _sandbox(config: Config) -> Check:
    mode = str(config.tools.options.get("shell", {}).get("sandbox", "auto"))
    status = sandbox_status(refresh=True)
    if status.available:
        detail = (
            f"{status.version or 'bwrap'} at {status.bwrap} ran a test command in the sandbox shell uses "
            "(read-only root, its own PID and network namespaces, no capabilities)"
        )
        if mode == "off":
            return Check(
                "shell sandbox",
                "warn",
                f"{detail}, but weald.toml turns it off",
                'remove [tools.shell] sandbox = "off"',
            )
        return Check("shell sandbox", "ok", f"{detail}; mode {mode}")
    if mode == "off":
        return Check("shell sandbox", "warn", f"off in weald.toml; and {status.reason}", SANDBOX_ENABLE_HINT)
    level: Status = "fail" if mode == "required" else "warn"
    consequence = (
        "shell refuses every command (sandbox = required)"
        if mode == "required"
        else "shell runs commands without it (process groups only)"
    )
    return Check("shell sandbox", level, f"{status.reason}: {consequence}", SANDBOX_ENABLE_HINT)


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _user_namespaces(_config: Config) -> Check:
    if sys.platform != "linux":
        return Check("user namespaces", "warn", f"not Linux ({sys.platform}): no bubblewrap sandbox")
    limit = _read_int("/proc/sys/user/max_user_namespaces")
    clone = _read_int("/proc/sys/kernel/unprivileged_userns_clone")
    apparmor = _read_int("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    settings = [f"user.max_user_namespaces = {limit}"]
    if clone is not None:
        settings.append(f"kernel.unprivileged_userns_clone = {clone}")
    if apparmor is not None:
        settings.append(f"kernel.apparmor_restrict_unprivileged_userns = {apparmor}")
    detail = ", ".join(settings)
    if limit == 0:
        return Check(
            "user namespaces", "warn", f"{detail}: none may be created", "sysctl user.max_user_namespaces=15000"
        )
    if clone == 0 and os.geteuid() != 0:
        return Check(
            "user namespaces",
            "warn",
            f"{detail}: only root may create them",
            "sysctl kernel.unprivileged_userns_clone=1",
        )
    if apparmor == 1 and os.geteuid() != 0:
        return Check(
            "user namespaces",
            "warn",
            f"{detail}: AppArmor restricts them",
            "sysctl kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for bwrap",
        )
    return Check("user namespaces", "ok", detail)


def _ripgrep(_config: Config) -> Check:
    rg = find_executable("rg")
    if rg is None:
        return Check(
            "ripgrep",
            "fail",
            "rg is not installed: the grep and glob tools cannot run",
            "pip install ripgrep (the wheel ships rg), or the system package",
        )
    code, line = _run([rg, "--version"])
    if code != 0:
        return Check("ripgrep", "fail", f"{rg} does not run: {line}", "reinstall ripgrep")
    return Check("ripgrep", "ok", f"{line} at {rg}")


def _stdio_commands(config: Config) -> dict[str, str]:
    return {name: s.command for name, s in config.mcp.servers.items() if s.enabled and s.command}


def _node(config: Config) -> Check:
    return _program(config, "node", "node", "Node.js runs most MCP servers (npx @modelcontextprotocol/...)")


def _npx(config: Config) -> Check:
    return _program(config, "npx", "npx", "npx starts MCP servers published on npm")


def _program(config: Config, name: str, program: str, why: str) -> Check:
    path = shutil.which(program)
    needed = [server for server, command in _stdio_commands(config).items() if Path(command).name == program]
    if path is None:
        level: Status = "fail" if needed else "warn"
        users = f"; configured servers need it: {', '.join(sorted(needed))}" if needed else ""
        return Check(name, level, f"{program} is not on PATH{users}", f"install Node.js 20+ ({why})")
    code, line = _run([path, "--version"])
    if code != 0:
        return Check(name, "fail" if needed else "warn", f"{path} does not run: {line}", "reinstall Node.js")
    return Check(name, "ok", f"{line} at {path}")


def _mcp_commands(config: Config) -> Check:
    commands = _stdio_commands(config)
    if not commands:
        return Check("MCP server commands", "ok", "no stdio MCP server is configured")
    missing = []
    for server, command in sorted(commands.items()):
        found = shutil.which(command) if os.sep not in command else (command if os.access(command, os.X_OK) else None)
        if found is None:
            missing.append(f"{server} ({command})")
    if missing:
        return Check(
            "MCP server commands",
            "fail",
            f"not found or not executable: {', '.join(missing)}",
            "install them, or fix command in [mcp.servers.NAME]",
        )
    return Check("MCP server commands", "ok", f"all {len(commands)} found: {', '.join(sorted(commands))}")


def _mount_of(path: Path) -> tuple[str, str]:
    """The mount point holding ``path`` and its filesystem type, from /proc/self/mountinfo."""
    best = ("/", "?")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    text = str(path)
    for line in lines:
        # "id parent major:minor root mountpoint options ... - fstype source options"
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        inside = text == point or text.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, right.split()[0])
    return best


def _previous_run(config: Config) -> Check:
    """Whether the daemon's last run on this state directory ended without stopping (a crash, a kill)."""
    from weald.runtime.daemon._runlog import last_crash

    crash = last_crash(Path(config.store.path).expanduser().parent)
    if crash is None:
        return Check("previous run", "ok", "the daemon's last run stopped cleanly (or none has run here)")
    fix = f"read the end of {crash.log}; run the daemon under a supervisor that restarts it (docs/deployment.md)"
    return Check("previous run", "warn", crash.describe(), fix)


def _state_directory(config: Config) -> Check:
    state = Path(config.store.path).expanduser().parent
    existing = state
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == state else f"cannot be created ({existing} is not writable)"
        return Check("state directory", "fail", f"{state} {what}", "fix its permissions, or set [store] path")
    point, fstype = _mount_of(existing.resolve())
    free = shutil.disk_usage(existing).free
    detail = f"{state}: {fstype} filesystem at {point}, {free / (1 << 30):.1f} GiB free"
    if free < _NO_SPACE:
        return Check("state directory", "fail", detail, "free space there, or set [store] path elsewhere")
    if fstype in _NETWORK_FILESYSTEMS:
        return Check(
            "state directory",
            "warn",
            f"{detail}: a network filesystem; SQLite's locking is unreliable there",
            "set [store] path to a local disk",
        )
    if fstype in _VOLATILE_FILESYSTEMS:
        return Check(
            "state directory",
            "warn",
            f"{detail}: in memory; the store is lost at reboot",
            "set [store] path to a disk",
        )
    if free < _LOW_SPACE:
        return Check("state directory", "warn", f"{detail}: little space left", "free space there")
    return Check("state directory", "ok", detail)


def _state_paths(config: Config) -> list[Path]:
    """The state directory and the store's, with the store and its WAL and SHM files: what holds histories."""
    store = Path(config.store.path).expanduser()
    directories = [store.parent]
    if config.daemon.state_dir is not None:
        directories.insert(0, Path(config.daemon.state_dir).expanduser())
    files = [store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")]
    return list(dict.fromkeys([*directories, *files]))


def _state_permissions(config: Config) -> Check:
    """Warn when others may read the state directory or the store (histories, tasks, MCP OAuth tokens)."""
    wide = []
    for path in _state_paths(config):
        try:
            info = os.stat(path)
        except OSError:
            continue  # not made yet: weald makes it owner-only
        if info.st_mode & 0o077:
            wide.append((path, stat.S_IMODE(info.st_mode), stat.S_ISDIR(info.st_mode)))
    if not wide:
        return Check("state permissions", "ok", "the state directory and the store are readable by their owner only")
    listed = ", ".join(f"{path} ({mode:o})" for path, mode, _ in wide)
    fix = "; ".join(f"chmod {'700' if is_dir else '600'} {path}" for path, _, is_dir in wide)
    return Check(
        "state permissions",
        "warn",
        f"others may read what holds histories, tasks and tokens: {listed}",
        f"run: {fix} (weald makes new ones owner-only, but leaves existing ones as they are)",
    )


def _telemetry(config: Config) -> Check:
    """Whether OpenTelemetry export is on, where to, whether its packages load, and whether the endpoint answers."""
    from urllib.parse import urlsplit

    from weald.runtime.daemon._telemetry_settings import telemetry_settings

    settings = telemetry_settings(config.telemetry)
    if settings is None:
        return Check("telemetry", "ok", "off (no [telemetry] endpoint, no OTEL_EXPORTER_OTLP_ENDPOINT)")
    where = f"{settings.protocol} to {settings.traces_url} (from {settings.source})"
    if settings.metrics_url not in (settings.traces_url, settings.traces_url.replace("/v1/traces", "/v1/metrics")):
        where += f", metrics to {settings.metrics_url}"
    content = "; message contents captured" if settings.capture_content else ""
    module = "grpc" if settings.protocol == "grpc" else "http"
    try:
        metadata.version("opentelemetry-sdk")
        metadata.version(f"opentelemetry-exporter-otlp-proto-{module}")
    except metadata.PackageNotFoundError as exc:
        return Check("telemetry", "fail", f"on, {where}, but {exc.name} is not installed", "pip install 'weald[otel]'")
    for url in dict.fromkeys((settings.traces_url, settings.metrics_url)):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname or "localhost", port), timeout=3):
                pass
        except OSError as exc:
            detail = f"on, {where}{content}; {parts.hostname}:{port} does not answer ({exc.strerror or exc})"
            fix = "start the collector, or correct [telemetry] endpoint; turns go on meanwhile, their spans dropped"
            return Check("telemetry", "warn", detail, fix)
    return Check("telemetry", "ok", f"on, {where}{content}; the endpoint answers")


def _python(_config: Config) -> Check:
    try:
        version = metadata.version("weald")
    except metadata.PackageNotFoundError:
        version = "not installed"
    return Check(
        "python", "ok", f"weald {version} on Python {platform.python_version()} ({sys.executable}), {platform.system()}"
    )


def _tools(config: Config) -> Check:
    """The tools a daemon started here would have, and where each came from (a module that fails is a fail)."""
    from pathlib import Path

    from weald.runtime.daemon._tool_modules import by_origin, load_tools
    from weald.runtime.daemon.config import ConfigError
    from weald.tools import default_registry

    try:
        origins = load_tools(default_registry.copy(), config.tools.modules, import_dirs=[Path.cwd()])
    except ConfigError as exc:
        problems = "; ".join(str(problem) for problem in exc.problems)
        return Check(
            "tools", "fail", problems, "fix [tools] modules in weald.toml, or the package whose entry point fails"
        )
    groups = by_origin(origins)
    parts = [
        f"{len(names)} {origin}" if origin == "built-in" else f"{origin}: {', '.join(names)}"
        for origin, names in groups.items()
    ]
    return Check("tools", "ok", f"{len(origins)} tools: " + "; ".join(parts))
