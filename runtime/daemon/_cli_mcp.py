"""``weald mcp list | add | remove | import``: the MCP servers of weald.toml, as ``claude mcp`` manages Claude's.

Each command edits one file: ``$WEALD_CONFIG`` when it is set, else the
project's ``weald.toml`` (``--scope project``, the default: the nearest one at
or above the current directory, else a new one here) or the user file
(``--scope user``: ``~/.weald/weald.toml``, ``$WEALD_HOME/weald.toml``). An
edit keeps the rest of the file as it was, and the file is written only if
the result is a valid configuration. When a daemon is running, it is then
asked to read its files again (``config.reload``), and the command says
whether it picked the change up: the server started, restarted or stopped;
or why not (the file is not one of the daemon's own, or it refused them).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from weald.runtime.daemon._cli_common import EXIT_OK, EXIT_USAGE, print_json, socket_path

__all__ = ["add_mcp_commands"]


class CommandError(Exception):
    """A command cannot do what was asked; the message says why (exit status 2)."""


def add_mcp_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``weald mcp ...`` to the ``weald`` parser's subcommands."""
    description = __doc__.replace("``", "").replace("`", "")  # docstring markup is not for --help
    mcp = sub.add_parser(
        "mcp",
        help="list, add, remove and import MCP servers",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mcp.set_defaults(parser=mcp)
    commands = mcp.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND")
    commands.required = True
    scope = argparse.ArgumentParser(add_help=False)
    scope.add_argument(
        "--scope",
        choices=["project", "user"],
        default="project",
        help="the project's weald.toml (default) or the user file (~/.weald/weald.toml); $WEALD_CONFIG overrides both",
    )

    p = commands.add_parser("list", parents=[common], help="the configured servers, and their state if a daemon runs")
    p.set_defaults(parser=p, func=lambda args: _run(_list, args, print_json))

    p = commands.add_parser(
        "add",
        parents=[common, scope],
        help="add a server: NAME -- COMMAND [ARGS...], or NAME URL",
        description="Add a stdio server (weald mcp add NAME -- COMMAND ARGS...) "
        "or an HTTP one (weald mcp add NAME URL).",
    )
    p.add_argument("name")
    p.add_argument("target", nargs="*", help="-- COMMAND ARGS... (stdio), or URL (HTTP)")
    p.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable")
    p.add_argument("-H", "--header", action="append", default=[], metavar="'NAME: VALUE'", help="an HTTP header")
    p.set_defaults(parser=p, func=lambda args: _run(_add, args, print_json))

    p = commands.add_parser("remove", parents=[common, scope], help="remove a server")
    p.add_argument("name")
    p.set_defaults(parser=p, func=lambda args: _run(_remove, args, print_json))

    p = commands.add_parser(
        "import",
        parents=[common, scope],
        help="import Claude Desktop / Claude Code / OpenCode servers",
        description="Translate the MCP servers of a Claude Desktop, Claude Code or OpenCode config file into "
        "weald.toml tables, reporting what cannot be translated.",
    )
    p.add_argument("file", help="claude_desktop_config.json, .mcp.json, ~/.claude.json or opencode.json[c]")
    p.add_argument("--dry-run", action="store_true", help="print the tables instead of writing them")
    p.add_argument("--replace", action="store_true", help="replace servers of the same name")
    p.set_defaults(parser=p, func=lambda args: _run(_import, args, print_json))


def _run(command: Callable[..., int], args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    try:
        return command(args, print_json)
    except CommandError as exc:
        _say(f"weald mcp {args.mcp_command}: {exc}", err=True)
        return EXIT_USAGE


def _say(line: str, *, err: bool = False) -> None:
    """Print one line of a command's report; a server's name, target or log is shown, never obeyed (`printable`)."""
    from weald.runtime.daemon._render import printable

    print(printable(line), file=sys.stderr if err else sys.stdout)


# -- the file ----------------------------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> Path:
    """The file to edit: ``$WEALD_CONFIG``; else the user file, or the project's (found upward, else here)."""
    from weald.runtime.daemon._config_load import find_project_root, weald_home
    from weald.runtime.daemon.config import CONFIG_ENV, CONFIG_FILE_NAME

    explicit = os.environ.get(CONFIG_ENV, "")
    if explicit:
        return Path(explicit).expanduser().absolute()
    if getattr(args, "scope", "project") == "user":
        return weald_home() / CONFIG_FILE_NAME
    start = Path(args.project or Path.cwd()).absolute()
    root, _ = find_project_root(start)
    return (root or start) / CONFIG_FILE_NAME


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _servers_in(text: str, path: Path) -> Mapping[str, Any]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"{path} is not valid TOML ({exc}); fix it first") from exc
    mcp = data.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, dict) else None
    return servers if isinstance(servers, dict) else {}


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` if it is a valid configuration, atomically; else say what is wrong."""
    from weald.runtime.daemon.config import ConfigError, parse_config

    try:
        parse_config(text, source=str(path), base_dir=path.parent)
    except ConfigError as exc:
        raise CommandError(f"the change would make {path} invalid, so it was not written:\n{exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=".weald-", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def _append(text: str, tables: str) -> str:
    if not text.strip():
        return tables
    return text.rstrip("\n") + "\n\n" + tables


# -- commands ---------------------------------------------------------------------------------------------


def _list(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime._secrets import redact_secret_values
    from weald.runtime.daemon._mcp_import import read_foreign_config
    from weald.runtime.daemon.config import find_config_files, load_config

    project = Path(args.project or Path.cwd())
    config = load_config(project)
    notes: list[str] = []
    origins: dict[str, str] = {}
    for file in find_config_files(project):
        for name in _servers_in(_read(file), file):
            origins[name] = "weald.toml"  # a server weald.toml names wins over an imported one
    for path in config.mcp.imports:
        try:
            found = read_foreign_config(path)
        except ValueError:
            continue  # load_config reported it already
        notes.extend(f"{path}: {note}" for note in found.notes)
        for name in found.servers:
            origins.setdefault(name, str(path))
    live = _live_states(args)
    rows = []
    for name, server in config.mcp.servers.items():
        target = server.url if server.url else shlex.join([server.command or "", *server.args])
        state = live.get(name, {})
        rows.append(
            {
                "server": name,
                "transport": "http" if server.url else "stdio",
                "target": redact_secret_values(target or ""),
                "enabled": server.enabled,
                "from": origins.get(name, "weald.toml"),  # (load_config has no other source)
                "status": state.get("status"),
                "last_error": redact_secret_values(str(state["last_error"])) if state.get("last_error") else None,
            }
        )
    if args.json:
        print_json({"servers": rows, "import_notes": notes})
        return EXIT_OK
    if not rows:
        _say("no MCP servers are configured (weald mcp add NAME -- COMMAND, or weald mcp import FILE)")
    for row in rows:
        status = row["status"] or ("disabled" if not row["enabled"] else "no daemon running")
        origin = "" if row["from"] == "weald.toml" else f"  (from {row['from']})"
        _say(f"{row['server']}: {row['target']} [{row['transport']}] - {status}{origin}")
        if row["last_error"] and row["status"] != "running":
            _say(f"    last error: {(str(row['last_error']).splitlines() or [''])[0]}")
    for note in notes:
        _say(f"note: {note}", err=True)
    return EXIT_OK


def _live_states(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each server's live state, if a daemon answers (quickly); empty otherwise."""
    from weald.runtime.daemon.client import Client, DaemonUnavailableError

    try:
        with Client.connect(socket_path(args), timeout=2) as client:
            return {s["server"]: s for s in client.call("mcp.servers", timeout=10)}
    except (DaemonUnavailableError, OSError):
        return {}


def _tell_daemon(args: argparse.Namespace, path: Path, names: list[str]) -> dict[str, Any] | None:
    """Have a running daemon read its files again; what it did about ``names`` of ``path`` (None: none runs)."""
    from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

    try:
        with Client.connect(socket_path(args), timeout=2) as client:
            report = client.call("config.reload", timeout=120)
    except (DaemonUnavailableError, OSError):
        return None
    except RPCCallError as exc:
        return {"picked_up": False, "lines": [f"the running daemon could not reload: {exc.message}"]}
    own = report["daemon"]
    files = [file["path"] for file in own.get("files") or []]
    if own["status"] == "refused":
        lines = ["the running daemon refused its configuration files (its running configuration stays):"]
        return {"picked_up": False, "lines": lines + [f"  {problem}" for problem in own["problems"]]}
    if str(path) not in files:
        where = ", ".join(files) or "no file"
        line = (
            f"the running daemon does not host the MCP servers of {path} (its own files: {where}); "
            "a daemon started for that project does"
        )
        return {"picked_up": False, "lines": [line]}
    done = own.get("mcp") or {}
    lines = []
    for name in names:
        what = next((verb for verb, servers in done.items() if name in servers), None)
        lines.append(f"the running daemon {what} {name!r}" if what else f"the running daemon had {name!r} as it is")
    return {"picked_up": True, "lines": lines, "mcp": done}


def _report_daemon(told: dict[str, Any] | None) -> None:
    if told is not None:
        for line in told["lines"]:
            _say(line)


def _add(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime.daemon._mcp_import import secrets_to_variables, server_tables

    target = list(args.target)
    if not target:
        raise CommandError("give the server: weald mcp add NAME -- COMMAND [ARGS...], or weald mcp add NAME URL")
    table: dict[str, Any] = {}
    if len(target) == 1 and target[0].startswith(("http://", "https://")):
        table["url"] = target[0]
        if args.env:
            raise CommandError("--env applies to stdio servers; an HTTP server takes --header")
        headers = dict(_pair(item, ":", "--header") for item in args.header)
        if headers:
            table["headers"] = headers
    else:
        table["command"] = target[0]
        if target[1:]:
            table["args"] = target[1:]
        if args.header:
            raise CommandError("--header applies to HTTP servers; a stdio server takes --env")
        env = dict(_pair(item, "=", "--env") for item in args.env)
        if env:
            table["env"] = env
    notes: list[str] = []
    converted = secrets_to_variables(args.name, table, notes)
    if converted is None:
        raise CommandError(notes[-1])
    path = _target(args)
    text = _read(path)
    if args.name in _servers_in(text, path):
        raise CommandError(f"{path} already has an MCP server {args.name!r}; weald mcp remove {args.name} first")
    _write(path, _append(text, server_tables({args.name: converted})))
    told = _tell_daemon(args, path, [args.name])
    if args.json:
        print_json({"added": args.name, "file": str(path), "server": converted, "notes": notes, "daemon": told})
    else:
        _say(f"added MCP server {args.name!r} to {path}")
        _report_daemon(told)
    for note in notes:
        _say(f"note: {note}", err=True)
    return EXIT_OK


def _pair(item: str, separator: str, option: str) -> tuple[str, str]:
    key, found, value = item.partition(separator)
    if not found or not key.strip():
        raise CommandError(f"{option} {item!r}: expected KEY{separator}VALUE")
    return key.strip(), value.strip() if separator == ":" else value


def _remove(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime.daemon._mcp_import import remove_server_tables

    path = _target(args)
    text = _read(path)
    result, found = remove_server_tables(text, args.name)
    if not found:
        if args.name in _servers_in(text, path):
            raise CommandError(
                f"{path} defines {args.name!r} in a form weald mcp cannot cut out (an inline table?); edit it by hand"
            )
        raise CommandError(f"{path} has no MCP server {args.name!r} (weald mcp list shows where each comes from)")
    _write(path, result)
    told = _tell_daemon(args, path, [args.name])
    if args.json:
        print_json({"removed": args.name, "file": str(path), "daemon": told})
    else:
        _say(f"removed MCP server {args.name!r} from {path}")
        _report_daemon(told)
    return EXIT_OK


def _import(args: argparse.Namespace, print_json: Callable[[Any], None]) -> int:
    from weald.runtime.daemon._mcp_import import read_foreign_config, remove_server_tables, server_tables

    source = Path(args.file).expanduser()
    try:
        found = read_foreign_config(source)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    path = _target(args)
    text = _read(path)
    existing = _servers_in(text, path)
    skipped = [name for name in found.servers if name in existing and not args.replace]
    servers = {name: table for name, table in found.servers.items() if name not in skipped}
    if args.replace:
        for name in servers:
            text, _ = remove_server_tables(text, name)
    tables = server_tables(servers)
    notes = [
        *found.notes,
        *(f"{name}: {path} has a server of that name; kept it (--replace replaces)" for name in skipped),
    ]
    told = None
    if not args.dry_run and servers:
        _write(path, _append(text, tables))
        told = _tell_daemon(args, path, list(servers))
    if args.json:
        print_json({"file": str(path), "written": not args.dry_run, "servers": servers, "notes": notes, "daemon": told})
        return EXIT_OK
    if args.dry_run:
        if tables:
            _say(tables.rstrip("\n"))
    else:
        names = ", ".join(servers) or "none"
        plural = "s" if len(servers) != 1 else ""
        _say(f"imported {len(servers)} MCP server{plural} ({found.kind}) into {path}: {names}")
        _report_daemon(told)
    for note in notes:
        _say(f"note: {note}", err=True)
    return EXIT_OK
