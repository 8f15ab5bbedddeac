"""What every ``weald`` command shares: consoles, exit codes, the socket, connecting, messages in CLI terms.

`weald.runtime.daemon.cli` (the parser and the daemon's own commands) and the
command modules beside it (``_cli_run``, ``_cli_agents``, ``_cli_mcp``) import
from here; nothing here imports them, so imports point one way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from weald.runtime.daemon._render import SafeConsole, error_line, printable
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

__all__ = [
    "EXIT_ABORTED",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "cli_terms",
    "connect",
    "console",
    "load_config",
    "load_config_files",
    "print_error",
    "print_json",
    "project_dir",
    "socket_path",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class CommandError(Exception):
    """A command cannot do what was asked; its message says why, in CLI terms.

    Args:
        message: one line for the person at the terminal.
        code: the exit status (default: 1).
    """

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def console(stderr: bool = False) -> Console:
    """The console every command prints with: foreign text in it is shown, never obeyed (`SafeConsole`).

    No highlighting of numbers and paths, no wrapping of long lines.
    """
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=False)


def print_error(err: Console, text: str) -> None:
    """Print an error as it is: no rich markup (``[tools]`` is text here) and no wrapping of its lines."""
    err.print(printable(text), style="red", markup=False, soft_wrap=True)


def print_json(value: Any) -> None:
    """One JSON document on stdout, for scripts."""
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def load_config(args: argparse.Namespace) -> Any:
    """The configuration for ``--project`` (default: the current directory)."""
    return load_config_files(args)[0]


def load_config_files(args: argparse.Namespace) -> tuple[Any, Any]:
    """The configuration of ``--project`` (default: the current directory), and the files it came from.

    A *nested* project file (one inside another project, which an agent
    working there may have written: see ``weald trust``) gives this command
    none of the daemon-wide settings (``[server]``, ``[store]``, ``[faults]``...):
    they come from the user file alone, so a planted ``sub/weald.toml``
    cannot point ``weald`` at another socket or store. The daemon applies
    the file to sessions only once it is trusted.
    """
    from weald.runtime.daemon._config_load import find_project_files, load_files

    files = find_project_files(project_dir(args) or Path.cwd())
    config = load_files(files).config
    if files.project is not None and files.root is not None:
        enclosing = _enclosing_project(files)
        if enclosing is not None:
            base = load_files(attrs.evolve(files, project=None)).config  # the user file alone
            config = _without_daemon_wide(config, base, files, enclosing)
    return config, files


def _enclosing_project(files: Any) -> str | None:
    """The project that makes ``files``' project file nested, by its markers; None: it is not nested."""
    from weald.runtime.daemon._trust import enclosing_project_blocking

    user = str(files.user) if files.user is not None else None
    return enclosing_project_blocking(str(files.root), str(Path.home()), (), user)


def _without_daemon_wide(config: Any, base: Any, files: Any, enclosing: str) -> Any:
    """``config`` with every daemon-wide section of ``base`` (the user file's); says so when that changed one."""
    from weald.runtime.daemon.config import DAEMON_WIDE

    kept = {section: getattr(base, section) for section in sorted(DAEMON_WIDE) if hasattr(config, section)}
    changed = [section for section, value in kept.items() if getattr(config, section) != value]
    if changed:
        sections = ", ".join(f"[{section}]" for section in changed)
        print(
            printable(
                f"weald: warning: {files.project} lies inside the project {enclosing}, so its {sections} "
                "are not used by this command (an agent working there may have written it); the user file's are"
            ),
            file=sys.stderr,
        )
    return attrs.evolve(config, **kept)


def project_dir(args: argparse.Namespace) -> Path | None:
    """``--project``, made absolute against the current directory; None when not given."""
    project = getattr(args, "project", None)
    return Path(project).expanduser().absolute() if project else None


def socket_path(args: argparse.Namespace, config: Any | None = None) -> Path:
    """The daemon's socket: ``--socket``, else ``$WEALD_SOCKET``, else ``[server] socket``."""
    if getattr(args, "socket", None):
        return Path(args.socket).expanduser().absolute()
    if os.environ.get("WEALD_SOCKET"):
        return Path(os.environ["WEALD_SOCKET"]).expanduser().absolute()
    config = config or load_config(args)
    return Path(config.server.socket).expanduser()


# -- connecting ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(args: argparse.Namespace, *, embedded: bool = False, faults: Any = None) -> Iterator[Client]:
    """Connect to the running daemon, or (if ``embedded``) start one in this process.

    With ``faults`` (a fault injector), always start one, with a temporary store.

    Raises:
        DaemonUnavailableError: no daemon answers (and ``embedded`` is False).
    """
    from weald.runtime.daemon.config import ConfigError

    try:
        config, files = load_config_files(args)
    except ConfigError:
        # With the socket named (--socket, $WEALD_SOCKET), a broken file here need not keep a
        # command from the running daemon (weald reload then shows the daemon's own view of it).
        if faults is not None or embedded or not (getattr(args, "socket", None) or os.environ.get("WEALD_SOCKET")):
            raise
        config = files = None
    if faults is not None:
        with _embedded_client(config, files, faults=faults) as client:
            yield client
        return
    path = socket_path(args, config)
    try:
        client = Client.connect(path)
    except DaemonUnavailableError:
        if not embedded:
            raise
        with _embedded_client(config, files) as client:
            yield client
        return
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _embedded_client(config: Any, files: Any, *, faults: Any = None) -> Iterator[Client]:
    """A client of a daemon started in this process for the command (see `_embedded_daemon`)."""
    with _embedded_daemon(config, files, faults=faults) as path:
        client = Client.connect(path)
        client.embedded = True
        try:
            yield client
        finally:
            client.close()


@contextlib.contextmanager
def _embedded_daemon(config: Any, files: Any, *, faults: Any = None) -> Iterator[Path]:
    import attrs
    from weald.runtime.daemon.tree import Daemon

    with tempfile.TemporaryDirectory(prefix="weald-embedded-") as tmp:
        path = Path(tmp) / "weald.sock"
        if faults is not None:
            # A fault run starts from an empty store: the same run again finds the same state.
            config = attrs.evolve(config, store=attrs.evolve(config.store, path=Path(tmp) / "store.db", url=None))
        daemon = Daemon(config, socket_path=path, faults=faults, config_files=files)
        daemon.start(restore=False)
        warn_sandbox(daemon, console(stderr=True))
        try:
            yield path
        finally:
            daemon.shutdown()


def warn_sandbox(daemon: Any, err: Console) -> None:
    """Say loudly, on stderr, that shell commands run without the OS sandbox (or are refused)."""
    report = daemon.sandbox
    if report is not None and report.warning:
        err.print(f"[bold red]WARNING:[/bold red] {escape(printable(report.warning))}", soft_wrap=True)


# -- messages in CLI terms -----------------------------------------------------------------------------------

#: The daemon's error messages name its protocol methods (a client of the socket calls them);
#: the person at a terminal gets the ``weald`` command that does the same.
_METHOD_COMMANDS = {
    "agent.list": "weald agents",
    "agent.start": "weald run",
    "agent.stop": "weald agent stop",
    "agent.abort": "weald abort",
    "agent.history": "weald history",
    "agent.prompt": "weald prompt",
    "agent.compact": "weald compact",
    "mcp.servers": "weald mcp list",
    "tree": "weald tree",
    "debug_state": "weald debug-state",
    "tasks.list": "weald tasks",
    "fault.list": "weald fault list",
    "fault.inject": "weald fault inject",
    "fault.clear": "weald fault clear",
    "permission.list": "weald permissions",
    "permission.respond": "weald answer",
    "ask_user.respond": "weald answer",
    "events.subscribe": "weald events",
    "daemon.status": "weald status",
    "daemon.stop": "weald stop",
}
_METHOD = re.compile(
    r"(?<![\w./-])(" + "|".join(re.escape(m) for m in sorted(_METHOD_COMMANDS, key=len, reverse=True)) + r")(?![\w-])"
)
#: Protocol phrasings a person would not type, with the CLI's words.
_PHRASES = (("(agent.stop, then agent.start)", "(weald agent stop ID, then weald run)"),)
#: "invalid params for agent.start: X" says X of the command's own options: the method's name goes.
_INVALID_PARAMS = re.compile(r"^invalid params for [\w.]+(?: \([^)]*\))?: ")


def cli_terms(message: str) -> str:
    """A daemon's error message in the words of the ``weald`` command (protocol method names become commands)."""
    message = _INVALID_PARAMS.sub("", message)
    for old, new in _PHRASES:
        message = message.replace(old, new)
    return _METHOD.sub(lambda m: _METHOD_COMMANDS[m.group(1)], message)


def describe_failure(exc: BaseException) -> str:
    """One line saying what went wrong, for any error a command can meet (never a Python repr)."""
    from weald.runtime import StartError

    while isinstance(exc, StartError) and exc.__cause__ is not None:
        exc = exc.__cause__  # "X failed to start: Error('...')": the cause says it better
    if isinstance(exc, RPCCallError):
        return cli_terms(exc.message)
    if isinstance(exc, DaemonUnavailableError):
        return cli_terms(str(exc))
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}:{where}".rstrip(":")
    text = str(exc).strip()
    return error_line(text.splitlines()[0], 1000) if text else type(exc).__name__
