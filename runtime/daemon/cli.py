"""The ``weald`` command: the parser, ``main`` (one line for every error, never a traceback), the daemon's commands.

``weald --help`` lists the commands by what they are for (`COMMAND_GROUPS`);
each has ``--help`` and ``--json``. The commands that work on agents live in
``_cli_run`` (run, prompt), ``_cli_agents`` (agent ..., abort, history,
permissions, answer) and ``_cli_inspect`` (tree, tasks, events, fault ...);
``_cli_mcp`` has ``weald mcp``. What they share (the socket, connecting, an
embedded daemon, messages in CLI terms) is in ``_cli_common``; imports point
from here to them, never back.

``weald run`` uses the running daemon, or starts an embedded one (in this
process) when none runs; with ``--faults`` it always runs its agent in an
embedded daemon of its own, with fault injection on and a temporary store,
so that a fault run starts from nothing and touches no other agent. Each
session runs under its own project's configuration: a command tells the
daemon the project of the current directory (or ``--project DIR``);
``weald config show`` prints a project's, ``weald reload`` has the daemon
read the files again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

import attrs
from rich.markup import escape
from rich.table import Table
from weald.runtime.daemon._cli_common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    connect,
    console,
    describe_failure,
    load_config,
    load_config_files,
    print_error,
    print_json,
    project_dir,
    socket_path,
)
from weald.runtime.daemon._render import PrintableFormatter, printable, render_config, render_status
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

__all__ = ["COMMAND_GROUPS", "build_parser", "main"]

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


# -- serve ----------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM, SIGINT or ``daemon.stop``; exit 0 after a clean shutdown."""
    # First: a fatal crash from here on prints every thread's stack (into the log once it is open).
    faulthandler.enable(file=sys.stderr, all_threads=True)
    from rich.progress import BarColumn, Progress, TextColumn
    from weald.runtime.daemon.tree import Daemon
    from weald.runtime.faults import FaultSpecError

    config, files = load_config_files(args)
    err = console(stderr=True)
    _log_warnings_to_stderr()
    try:
        config = _store_options(args, config)
    except ValueError as exc:
        print_error(err, f"weald serve: {exc}")
        return EXIT_USAGE
    try:
        faults = _make_faults(args, config)
    except FaultSpecError as exc:
        # Each problem names the file (and the key); one line each, no traceback.
        for problem in exc.problems:
            print_error(err, f"weald serve: bad fault file: {problem}")
        return EXIT_USAGE
    if args.http is not None:
        from weald.runtime._checks import ValueProblem
        from weald.runtime.daemon._config_model import check_http_address

        try:
            check_http_address(args.http)
        except ValueProblem as exc:
            print_error(err, f"weald serve: --http: {exc}")
            return EXIT_USAGE
    path = None if args.stdio and not args.socket else socket_path(args, config)
    if args.ray is not None:
        from weald.runtime.daemon._cli_cluster import serve_ray

        return serve_ray(args, config, path)
    if args.front:
        from weald.runtime.daemon._cli_cluster import serve_front

        return serve_front(args, config, path)
    from weald.runtime.daemon._cluster import ClusterError, check_node_config

    try:
        check_node_config(config)
    except ClusterError as exc:
        print_error(err, f"weald serve: {exc}")
        return EXIT_USAGE
    log: Literal["terminal"] | bool = "terminal" if sys.stderr.isatty() else True
    daemon = Daemon(
        config,
        socket_path=path,
        stdio=args.stdio,
        faults=faults,
        http=args.http,
        log=log,
        config_files=files,
    )
    stop = threading.Event()
    reload = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    def on_hangup(_signum: int, _frame: object) -> None:
        reload.set()  # `weald reload`'s work, done below on this thread (not in the handler)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    with Progress(
        TextColumn("restoring sessions"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=err,
        transient=True,
        disable=args.stdio or not err.is_terminal,
    ) as progress:
        task = progress.add_task("restore", total=None)

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        try:
            daemon.start(restore=not args.no_restore, progress=on_progress)
        except Exception as exc:
            store_error = _store_cause(exc)
            if store_error is not None:
                # The store cannot be opened (a bad URL, a refused login, a missing database, another
                # schema version): one line naming why, the password masked, as for a bad option.
                print_error(err, f"weald serve: {' '.join(str(store_error).split())}")
                return EXIT_USAGE
            print_error(err, f"weald serve: {describe_failure(exc)}")
            return EXIT_FAILED
    if daemon.previous_run is not None:
        print_error(err, f"weald serve: warning: {daemon.previous_run.describe()}")
    if args.json and not args.stdio:
        # One line a script can read: where to connect, whom to signal.
        line = {"socket": str(path), "pid": os.getpid(), "store": _store_shown(config)}
        if daemon.node is not None:
            line["node"] = {"node_id": daemon.node.node_id, "epoch": daemon.node.epoch}
        if daemon.cluster_port is not None:
            line["listen"] = daemon.cluster_port.address
        if daemon.observer_port is not None:
            line["http"] = _observer_address(daemon)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    elif not args.stdio:
        node = f"; node {daemon.node.node_id} epoch {daemon.node.epoch}" if daemon.node is not None else ""
        if daemon.cluster_port is not None:
            node += f", fronts on {daemon.cluster_port.address}"
        err.print(
            f"weald daemon serving on {path} (pid {os.getpid()}); store {_store_shown(config)}{node}",
            markup=False,
            soft_wrap=True,
        )
        if daemon.observer_port is not None:
            err.print(f"observer on http://{_observer_address(daemon)}/ (weald observe opens it)")
    while True:
        stopped = stop.wait(0.2)
        if reload.is_set() and not stopped:
            reload.clear()
            _reload_on_hangup(daemon, err)
            continue
        if stopped or daemon.stop_requested:
            break
    if not args.stdio and not args.json:
        err.print("weald daemon stopping: aborting running turns, saving, stopping the tree")
    daemon.shutdown()
    return EXIT_OK


def _store_options(args: argparse.Namespace, config: Any) -> Any:
    """``config`` with ``--store`` and ``--node-id`` applied (checked as ``[store] url`` and ``node_id`` are).

    Raises:
        ValueError: a bad value; the message names the option.
    """
    from weald.runtime._checks import ValueProblem
    from weald.runtime.daemon._config_model import check_node_id, check_store_url

    changes: dict[str, Any] = {}
    try:
        if getattr(args, "store", None):
            target = args.store
            if target.startswith("sqlite:"):
                changes.update(url=None, path=Path(target.removeprefix("sqlite:")).expanduser().resolve())
            else:
                changes["url"] = check_store_url(target)
        if getattr(args, "node_id", None):
            changes["node_id"] = check_node_id(args.node_id)
    except ValueProblem as exc:
        option = "--node-id" if "node" in str(exc) else "--store"
        raise ValueError(f"{option}: {exc}") from None
    if changes:
        config = attrs.evolve(config, store=attrs.evolve(config.store, **changes))
    if getattr(args, "listen", None):
        from weald.runtime.daemon._config_model import check_listen_address

        try:
            listen = check_listen_address(args.listen)
        except ValueProblem as exc:
            raise ValueError(f"--listen: {exc}") from None
        config = attrs.evolve(config, cluster=attrs.evolve(config.cluster, listen=listen))
    return config


def _store_shown(config: Any) -> str:
    """The store as messages show it: its file, or its URL with the password masked."""
    from weald.runtime import mask_url

    return mask_url(config.store.url) if config.store.url else str(config.store.path)


def _store_cause(exc: BaseException) -> BaseException | None:
    """The `StoreError` behind a failed start (the store actor's, chained), if that is why it failed."""
    from weald.runtime import StoreError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, StoreError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _reload_on_hangup(daemon: Any, err: Any) -> None:
    """SIGHUP: read the configuration files again, as ``weald reload`` does; say what happened on stderr."""
    try:
        report = daemon.system.loop.run(daemon.reload)
    except Exception as exc:
        print_error(err, f"weald serve: reload failed: {describe_failure(exc)}")
        return
    for line in _reload_lines(report):
        err.print(printable(f"weald serve: reload: {line}"), markup=False, soft_wrap=True)


def _reload_lines(report: dict[str, Any]) -> list[str]:
    """What a reload did, one line per file set (and one per problem)."""
    own = report["daemon"]
    files = ", ".join(f["path"] for f in own.get("files") or []) or "no file"
    lines = []
    if own["status"] == "refused":
        lines.append("the daemon's configuration was REFUSED (the running one stays):")
        lines += [f"  {problem}" for problem in own["problems"]]
    else:
        lines.append(f"the daemon's configuration ({files}): {own['status']}")
        mcp = own.get("mcp") or {}
        done = [f"{what} {', '.join(names)}" for what, names in mcp.items() if names]
        if done:
            lines.append(f"  MCP servers: {'; '.join(done)}")
        if own.get("restart_needed"):
            lines.append(f"  takes effect at the next start of the daemon: {', '.join(own['restart_needed'])}")
    for project in report["projects"]:
        where = project["project"]
        if project["status"] == "refused":
            lines.append(f"project {where}: REFUSED (its sessions keep the configuration they run under):")
            lines += [f"  {problem}" for problem in project["problems"]]
        elif project["status"] == "changed":
            lines.append(f"project {where}: changed (applies at each of its sessions' next turn)")
        else:
            lines.append(f"project {where}: unchanged")
    return lines


def _observer_address(daemon: Any) -> str:
    """Where the observer listens, ``HOST:PORT`` (no token: that is for ``weald observe``)."""
    from weald.runtime.daemon.http import split_address

    host, _ = split_address(daemon.http)
    return f"[{host}]:{daemon.observer_port}" if ":" in host else f"{host}:{daemon.observer_port}"


def _log_warnings_to_stderr() -> None:
    """The daemon's warnings (running out of file descriptors, say) go to its stderr, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(PrintableFormatter("weald serve: %(levelname)s: %(message)s"))
    logging.getLogger("weald").addHandler(handler)


def _make_faults(args: argparse.Namespace, config: Any) -> Any:
    """The fault injector ``--faults FILE`` or ``[faults]`` asks for, or None.

    Raises:
        FaultSpecError: The fault file is missing, unreadable or invalid.
    """
    path = getattr(args, "faults", None) or (config.faults.file if config.faults.enabled else None)
    if not path and not config.faults.enabled:
        return None
    from weald.runtime.faults import FaultInjector

    if path:
        return FaultInjector.from_file(Path(path).expanduser().absolute())  # errors name where it was looked for
    return FaultInjector()


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether a daemon runs, and how it is (exit 1 when none runs)."""
    try:
        with connect(args) as client:
            status = client.call("daemon.status", timeout=10)
    except DaemonUnavailableError as exc:
        if args.json:
            print_json({"running": False, "error": describe_failure(exc)})
        else:
            console(stderr=True).print(describe_failure(exc), markup=False, soft_wrap=True)
        return EXIT_FAILED
    if args.json:
        print_json({"running": True, **status})
    else:
        console().print(render_status(status))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the running daemon cleanly: running turns are aborted (their history kept), then it saves and exits.

    Waits until it has stopped (at most --timeout seconds). The agents it
    hosted come back when a daemon starts again.
    """
    with connect(args) as client:
        pid = client.call("daemon.status", timeout=10)["pid"]
        client.call("daemon.stop", timeout=10)
    path = socket_path(args)
    err = console(stderr=True)
    stopped = False
    deadline = time.monotonic() + args.timeout
    with err.status(f"stopping the weald daemon (pid {pid})", spinner="dots") if err.is_terminal else _nothing():
        while time.monotonic() < deadline:
            try:
                Client.connect(path, timeout=1).close()
            except DaemonUnavailableError:
                stopped = True
                break
            time.sleep(0.1)
    if args.json:
        print_json({"stopping": True, "stopped": stopped, "pid": pid})
    elif stopped:
        console().print(f"stopped the weald daemon (pid {pid})")
    else:
        print_error(err, f"weald stop: the daemon (pid {pid}) is still stopping after {args.timeout:g} s")
    return EXIT_OK if stopped else EXIT_FAILED


@contextlib.contextmanager
def _nothing() -> Any:
    yield


def cmd_gc(args: argparse.Namespace) -> int:
    """Apply every project's [history] retention now, and show what it removed and the store's size.

    The daemon also does this on its own every [store] gc_interval seconds.
    Only what no restore needs goes: messages older than each agent's
    context, never a compaction's summary. Exits 1 if a project's
    configuration could not be read (its sessions were left as they are).
    """
    err = console(stderr=True)
    with connect(args) as client:
        waiting = err.status("applying [history] retention", spinner="dots") if err.is_terminal else _nothing()
        with waiting:
            report = client.call("history.gc", timeout=args.timeout)
    if args.json:
        print_json(report)
    else:
        out = console()
        out.print(
            f"removed {report['messages']:,} messages and {report['turns']:,} turn records "
            f"({_bytes(report['bytes'])}) from {report['agents']:,} agent histories "
            f"of {report['sessions']:,} sessions in {report['seconds']:.1f} s; "
            f"the store holds {_bytes(report['store_bytes'])}"
            + (" (stopped early: the daemon is stopping)" if report.get("interrupted") else ""),
            markup=False,
        )
        if not report["sessions"]:
            out.print('no project sets [history] retention: every history is kept ("all")', markup=False)
        for problem in report.get("problems") or ():
            print_error(err, problem)
    return EXIT_FAILED if report.get("problems") else EXIT_OK


def _bytes(count: int) -> str:
    """``count`` bytes, in the largest unit that keeps it at 1 or more (KiB, MiB, GiB)."""
    size = float(count)
    for unit in ("bytes", "KiB", "MiB"):
        if size < 1024:
            return f"{size:,.0f} {unit}" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GiB"


def cmd_reload(args: argparse.Namespace) -> int:
    """Have the running daemon read its configuration files again and apply what changed.

    The daemon's own files (its MCP servers are started, stopped or
    restarted to match) and every project's a session runs in (a changed
    project applies at each of its sessions' next turn). A file with errors
    is refused whole, every problem shown: the configuration running stays,
    and the command exits 2. SIGHUP to ``weald serve`` does the same.
    """
    with connect(args) as client:
        report = client.call("config.reload", timeout=120)
    refused = report["daemon"]["status"] == "refused" or any(p["status"] == "refused" for p in report["projects"])
    if args.json:
        print_json(report)
    else:
        out = console()
        for line in _reload_lines(report):
            out.print(printable(line), markup=False, soft_wrap=True)
    return EXIT_USAGE if refused else EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """Show the configuration of a session started here (or in --project DIR), and where each value came from.

    The files read (the user file, then the project's ``weald.toml``, each
    with its digest), then every key with its value (defaults included) and
    its origin: ``default``, ``user: FILE``, ``project: FILE``, ``import:
    FILE`` (an MCP server of an ``[mcp] import`` file) or ``parameter``
    (``--model``, ``--tools``: what ``agent.start`` would be given). The
    daemon-wide sections are marked: a running daemon uses its own.
    """
    from weald.runtime.daemon._config_load import find_project_files, load_files, value_origins
    from weald.runtime.daemon._tool_modules import by_origin, load_tools
    from weald.runtime.daemon.config import DAEMON_WIDE, config_to_dict
    from weald.tools import default_registry

    files = find_project_files(project_dir(args) or Path.cwd())
    loaded = load_files(files)
    plain = config_to_dict(loaded.config)
    # Where each tool would come from: [tools] modules (imported here, as the daemon would), entry points, built-in.
    import_dirs = [files.root or files.start, *(path.parent for path in (files.user, files.project) if path)]
    tool_origins = load_tools(default_registry.copy(), loaded.config.tools.modules, import_dirs=import_dirs)
    origins = value_origins(loaded, plain)
    store = plain.get("store")
    if isinstance(store, dict) and store.get("url"):
        from weald.runtime import mask_url

        store["url"] = mask_url(store["url"])  # the database's password is never shown
    models = plain.setdefault("models", {})
    tools = plain.setdefault("tools", {})
    if args.model and isinstance(models, dict):
        models["default"] = args.model
        origins["models.default"] = "parameter"
    if args.tools and isinstance(tools, dict):
        tools["enabled"] = args.tools.split(",")
        origins["tools.enabled"] = "parameter"
    daemon_wide = sorted(DAEMON_WIDE)
    if args.json:
        print_json(
            {
                "project": None if files.root is None else str(files.root),
                "files": [file.path for file in loaded.files],
                "sources": [attrs.asdict(file) for file in loaded.files],
                "ignored": list(files.ignored),
                "config": plain,
                "origins": origins,
                "daemon_wide": daemon_wide,
                "tools": {entry.name: entry.origin for entry in tool_origins},
            }
        )
    else:
        out = console()
        where = f"project {files.root}" if files.root is not None else f"no project at or above {files.start}"
        out.print(printable(f"a session started in {files.start}: {where}"), markup=False)
        for marker in files.ignored:
            out.print(printable(f"passed over (not yours, or anyone may write to it): {marker}"), markup=False)
        out.print(
            render_config(
                [f"{file.path} ({file.layer}, {file.digest[:19]})" for file in loaded.files],
                plain,
                origins=origins,
                daemon_wide=daemon_wide,
            )
        )
        out.print("tools, by where they came from:", style="bold")
        for origin, names in by_origin(tool_origins).items():
            out.print(f"  {origin}: {', '.join(names)}", markup=False)
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check what this machine lets weald do: the shell sandbox, ripgrep, node for MCP servers, the state disk."""
    from weald.runtime.daemon._doctor import run_checks
    from weald.runtime.daemon.config import Config, ConfigError

    try:
        config, error = load_config(args), None
    except ConfigError as exc:
        config, error = Config(), str(exc)
    checks = run_checks(config, error)
    failed = any(check.status == "fail" for check in checks)
    if args.json:
        print_json({"ok": not failed, "checks": [attrs.asdict(check) for check in checks]})
        return EXIT_FAILED if failed else EXIT_OK
    marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]FAIL[/bold red]"}
    table = Table("check", "", "what was found", box=None, padding=(0, 1))
    for check in checks:
        table.add_row(check.name, marks[check.status], escape(check.detail))
    out = console()
    out.print(table)
    for check in checks:
        if check.fix:
            out.print(f"[bold]{escape(check.name)}[/bold]: {escape(check.fix)}", soft_wrap=True)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_observe(args: argparse.Namespace) -> int:
    """Open the running daemon's observer (a live web view) in a browser, or print its address.

    The address carries the daemon's token, which only the daemon's owner-only
    socket gives out: keep it to yourself. The browser is not given it on its
    command line (every user of the machine can read that, in
    ``/proc/PID/cmdline``): it opens a redirect file only this user can read,
    as Jupyter does (`_redirect_file`). The daemon serves the observer when
    started with ``weald serve --http 127.0.0.1:8765`` (or ``[server] http``).
    """
    with connect(args) as client:
        url = client.call("observer.url", timeout=10)["url"]
    if args.json:
        print_json({"url": url})
        return EXIT_OK
    opened = False
    if not args.no_browser and _has_browser():
        import webbrowser

        try:
            redirect = _redirect_file(url)
        except OSError as exc:
            print_error(console(stderr=True), f"weald observe: no private file for the browser to open: {exc}")
        else:
            with contextlib.suppress(webbrowser.Error):
                opened = webbrowser.open(redirect.as_uri())
    if opened:
        where = url.split("?", 1)[0]
        console(stderr=True).print(f"opened the observer in a browser: {where}", markup=False, soft_wrap=True)
    else:
        sys.stdout.write(url + "\n")
    return EXIT_OK


def _redirect_file(url: str) -> Path:
    """A page that sends the browser on to ``url``, in a file and directory only this user can read.

    ``$XDG_RUNTIME_DIR/weald`` (or ``weald-observe-UID`` in the temporary
    directory), made 0700 and checked to be this user's own real directory,
    holds ``observe.html`` (0600), replaced at each ``weald observe``: the
    token in it is no more exposed than the owner-only socket that gave it.

    Raises:
        OSError: The directory is another user's, a link, or open to others.
    """
    import html
    import tempfile

    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "weald" if runtime else Path(tempfile.gettempdir()) / f"weald-observe-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if not os.path.isdir(base) or os.path.islink(base) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OSError(f"{base} is not a directory only this user can use")
    target = json.dumps(url).replace("<", "\\u003c")
    page = (
        "<!doctype html><meta charset=utf-8><title>weald observer</title>"
        f'<meta http-equiv="refresh" content="0;url={html.escape(url, quote=True)}">'
        f"<script>location.replace({target})</script>"
    )
    fd, temporary = tempfile.mkstemp(dir=base, prefix=".observe-", suffix=".html")  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(page)
    path = base / "observe.html"
    os.replace(temporary, path)
    return path


def _has_browser() -> bool:
    """A browser could open here: a display, or $BROWSER (never a text browser taking over this terminal)."""
    if os.environ.get("BROWSER"):
        return True
    if sys.platform == "darwin":
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def cmd_acp(args: argparse.Namespace) -> int:
    """Serve the Agent Client Protocol on stdin/stdout, for an editor (Zed, JetBrains, Neovim: see docs/acp.md).

    Each ACP session is a session of the running daemon, or of one started in
    this process when none runs (as ``weald run`` does).
    """
    from weald.runtime.daemon._acp import protocol_stdout, serve_stdio

    stdout = protocol_stdout()  # first: nothing else may write on the protocol's stream
    with connect(args, embedded=True) as client:
        return serve_stdio(client, stdout, model=args.model)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the self-contained demo."""
    from weald.runtime.daemon.demo import run_demo

    code: int = run_demo(json_output=args.json, keep=args.keep)
    return code


# -- parsing ---------------------------------------------------------------------------------------------------

#: ``weald --help``'s list: the commands by what they are for, with what each does. A command another
#: module adds (``sub.add_parser(NAME, help=...)``) and that is in no group is listed under "more".
COMMAND_GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "agents",
        (
            ("run", 'prompt a new agent, streaming its work: weald run "PROMPT" (--keep keeps the agent)'),
            ("prompt", 'go on with an agent: weald prompt ID "TEXT" (a new turn, same history)'),
            ("agents", "list the agents (weald agent list)"),
            ("abort", "abort an agent's running turn: weald abort ID"),
            ("history", "show an agent's conversation: weald history ID"),
            ("agent", "the rest: agent stop ID... | --all-idle, agent compact ID, ..."),
            ("permissions", "permission requests and questions waiting for an answer"),
            ("answer", "answer one: weald answer ID allow|deny|always, or weald answer ID TEXT"),
        ),
    ),
    (
        "the daemon",
        (
            ("serve", "run the daemon (--http HOST:PORT: with the observer, a live web view)"),
            ("status", "is a daemon running, and how is it?"),
            ("stop", "stop the daemon cleanly"),
            ("gc", "apply [history] retention now and show what it freed"),
            ("observe", "open the running daemon's observer in a browser"),
            ("tree", "draw the live supervision tree"),
            ("events", "follow the daemon's events live (like tail -f)"),
            ("tasks", "list the task tracker's tasks"),
            ("debug-state", "an agent's debug state (or the daemon's)"),
            ("fault", "inject, list and clear faults (a daemon started with --faults)"),
        ),
    ),
    (
        "setting up",
        (
            ("config", "show the configuration weald uses here, and where each value came from"),
            ("reload", "have the running daemon read its configuration files again"),
            ("trust", "review and trust a weald.toml nested inside another project: weald trust PATH"),
            ("doctor", "check this machine for weald"),
            ("mcp", "list, add, remove and import MCP servers"),
            ("acp", "serve an editor (Zed, JetBrains, Neovim) over ACP on stdio"),
            ("demo", "a self-contained tour, no API key needed"),
        ),
    ),
)
#: Names that stay as the same commands under a group (``weald compact`` is ``weald agent compact``).
ALIASES = {"compact": "agent compact"}


def _doc(command: Any) -> str:
    """A command's docstring as help text: ``literal`` markup becomes plain text."""
    return re.sub(r"``([^`]*)``", r"\1", command.__doc__ or "")


class _Parser(argparse.ArgumentParser):
    """The top-level parser: its help lists the commands in `COMMAND_GROUPS`, not argparse's one long list."""

    def format_help(self) -> str:
        sub = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        helps = {action.dest: action.help for action in sub._choices_actions}
        grouped = {name for _, commands in COMMAND_GROUPS for name, _ in commands}
        more = tuple((name, str(text)) for name, text in helps.items() if name not in grouped and text)
        lines = [self.format_usage().rstrip(), "", str(self.description), ""]
        for title, commands in (*COMMAND_GROUPS, *((("more", more),) if more else ())):
            lines.append(f"{title}:")
            lines.extend(f"  {name:<13} {text}" for name, text in commands if name in sub.choices)
            lines.append("")
        lines += [
            "options:",
            "  -h, --help    show this help message and exit",
            "",
            "Every command takes --help and --json (output for scripts). docs: README.md, docs/",
        ]
        return "\n".join(lines) + "\n"


def _at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {least} or more, got {value}")
    return value


def _positive(text: str) -> int:
    return _at_least(text, 1)


def _nonnegative(text: str) -> int:
    return _at_least(text, 0)


def _port(text: str) -> int:
    value = _nonnegative(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port, 0 to 65535, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected more than 0 seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``weald`` command."""
    from weald.runtime.daemon import _cli_agents as agents
    from weald.runtime.daemon import _cli_inspect as inspect
    from weald.runtime.daemon import _cli_run as run

    parser = _Parser(
        prog="weald",
        description="weald: an actor runtime for LLM coding agents, with Erlang/OTP supervision trees.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--socket", help="the daemon's Unix socket (default: $WEALD_SOCKET, else [server] socket in weald.toml)"
    )
    common.add_argument("--project", help="the project directory whose weald.toml to read (default: the current one)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    sub.required = True

    def command(
        parent: Any, name: str, func: Any, help_text: str | None, parents: Sequence[argparse.ArgumentParser] = ()
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(
            name,
            parents=[common, *parents],
            help=help_text,
            description=_doc(func),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func, parser=p)
        return p

    # -- agents
    p = command(sub, "run", run.cmd_run, "prompt an agent")
    p.add_argument("prompt", help="what to ask")
    p.add_argument("--agent", metavar="ID", help="the agent to prompt (default: start a new one)")
    p.add_argument("--keep", action="store_true", help="keep the new agent when the run ends (default: stop it)")
    p.add_argument("--name", metavar="NAME", help="the new agent's id (a readable one); implies --keep")
    p.add_argument("--cwd", help="the new agent's working directory (default: the current one)")
    p.add_argument("--model", help="provider:model (or an alias) for the new agent; scripted:FILE replays a script")
    p.add_argument("--tools", help="tool filter for the new agent, e.g. '*,!shell'")
    _prompt_options(p)
    p.add_argument(
        "--record", metavar="FILE", help="record the new agent's model calls (replay: --model scripted:FILE)"
    )
    p.add_argument(
        "--faults", metavar="FILE", help="run in a daemon of its own, with fault injection and the faults in FILE"
    )
    p.add_argument(
        "--trust",
        action="store_true",
        help="if the project's weald.toml is nested and not trusted, show it and trust it (as weald trust)",
    )

    p = command(sub, "prompt", run.cmd_prompt, "go on with an agent")
    p.add_argument("agent_id", metavar="ID", help="the agent (weald agents lists them)")
    p.add_argument("prompt", metavar="TEXT", help="what to ask")
    _prompt_options(p)

    def agents_list(parent: Any, name: str, help_text: str | None) -> None:
        p = command(parent, name, agents.cmd_agents, help_text)
        p.add_argument("--all", action="store_true", help="stopped agents too")
        p.add_argument(
            "--long",
            action="store_true",
            help="also show the configuration files each agent runs under and the bytes of its spilled output",
        )
        p.add_argument("--limit", type=_positive, metavar="N", help="only the first N agents (in id order)")

    def agent_id(p: argparse.ArgumentParser, what: str = "the agent") -> None:
        p.add_argument("agent_id", metavar="ID", help=what)

    def history(parent: Any, name: str, help_text: str | None) -> None:
        p = command(parent, name, agents.cmd_history, help_text)
        agent_id(p)
        p.add_argument("--limit", type=_nonnegative, default=50, help="the last N messages (default: 50)")
        p.add_argument("--before", type=_nonnegative, metavar="SEQ", help="only messages before SEQ (earlier pages)")

    def compact(parent: Any, name: str, help_text: str | None) -> None:
        p = command(parent, name, agents.cmd_compact, help_text)
        agent_id(p)
        p.add_argument(
            "--timeout", type=_positive_seconds, default=600, help="seconds to wait for the summary (default: 600)"
        )

    def debug_state(parent: Any, name: str, help_text: str | None) -> None:
        p = command(parent, name, agents.cmd_debug_state, help_text)
        p.add_argument("agent_id", metavar="ID", nargs="?", help="the agent (default: the daemon itself)")
        p.add_argument("--events", type=_nonnegative, help="recent events to show")
        p.add_argument("--messages", type=_nonnegative, help="recent messages to show")

    agents_list(sub, "agents", "list agents")
    agent_id(command(sub, "abort", agents.cmd_abort, "abort an agent's turn"))
    history(sub, "history", "an agent's conversation")

    group = sub.add_parser(
        "agent",
        help="work with agents",
        description="Work with the daemon's agents. weald agent COMMAND --help says more.",
    )
    group.set_defaults(parser=group)
    agent_sub = group.add_subparsers(dest="agent_command", metavar="COMMAND")
    agent_sub.required = True
    agents_list(agent_sub, "list", "list agents (also: weald agents)")
    p = command(agent_sub, "stop", agents.cmd_agent_stop, "stop agents for good (their history stays)")
    p.add_argument("agent_ids", metavar="ID", nargs="*", help="the agents to stop")
    p.add_argument("--all-idle", action="store_true", help="every agent not running a turn")
    agent_id(command(agent_sub, "abort", agents.cmd_abort, "abort an agent's running turn (also: weald abort)"))
    history(agent_sub, "history", "an agent's conversation (also: weald history)")
    p = command(agent_sub, "prompt", run.cmd_prompt, "go on with an agent (also: weald prompt)")
    p.add_argument("agent_id", metavar="ID", help="the agent")
    p.add_argument("prompt", metavar="TEXT", help="what to ask")
    _prompt_options(p)
    compact(agent_sub, "compact", "compact an agent's context now (also: weald compact)")
    debug_state(agent_sub, "debug-state", "an agent's debug state (also: weald debug-state)")
    compact(sub, "compact", None)  # the old name, kept

    p = command(sub, "permissions", agents.cmd_permissions, "requests waiting for an answer")
    p.add_argument("--agent", metavar="ID", help="only this agent's")
    p = command(sub, "answer", agents.cmd_answer, "answer a request or question")
    p.add_argument("id", metavar="ID", help="the request or question (weald permissions lists them)")
    p.add_argument("answer", metavar="ANSWER", help="allow, deny or always (a permission); the answer (a question)")

    # -- the daemon
    p = command(sub, "serve", cmd_serve, "run the daemon")
    p.add_argument("--stdio", action="store_true", help="serve JSON-RPC on stdin/stdout")
    p.add_argument("--faults", metavar="FILE", help="enable fault injection, with the faults in FILE (TOML or JSON)")
    p.add_argument("--no-restore", action="store_true", help="do not restart the stored sessions")
    p.add_argument(
        "--store",
        metavar="URL",
        help="where the data lives: postgresql://user:password@host:port/db, or sqlite:PATH (default: [store])",
    )
    p.add_argument("--node-id", metavar="NAME", help="this daemon's name among those sharing the database")
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="serve a cluster's fronts here (a node; [cluster] listen, secret)"
    )
    p.add_argument("--front", action="store_true", help="run a cluster's front on the socket instead of a daemon")
    p.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="a node on every machine of a Ray cluster (auto: the one here), and the front on the socket",
    )
    p.add_argument(
        "--node-config",
        metavar="FILE",
        help="with --ray: the configuration file every node reads, an absolute path (default: each machine's own)",
    )
    p.add_argument(
        "--node-state",
        metavar="DIR",
        default="~/.weald/ray",
        help="with --ray: where each machine keeps its node's directory (default: ~/.weald/ray)",
    )
    p.add_argument(
        "--node-port",
        type=_port,
        default=7400,
        metavar="PORT",
        help="with --ray: the port each node serves fronts on, on its Ray address (default: 7400; 0: any free one)",
    )
    p.add_argument(
        "--keep-nodes", action="store_true", help="with --ray: leave the nodes running when the launcher stops"
    )
    p.add_argument(
        "--http", metavar="HOST:PORT", help="serve the observer, a live web view, here (loopback; port 0: any free)"
    )
    command(sub, "status", cmd_status, "is a daemon running?")
    p = command(sub, "stop", cmd_stop, "stop the daemon")
    p.add_argument("--timeout", type=_positive_seconds, default=60, help="seconds to wait for it (default: 60)")
    p = command(sub, "gc", cmd_gc, "apply [history] retention now")
    p.add_argument(
        "--timeout", type=_positive_seconds, default=3600, help="seconds to wait for the pass (default: 3600)"
    )
    p = command(sub, "observe", cmd_observe, "open the daemon's live web view")
    p.add_argument("--no-browser", action="store_true", help="print the address instead of opening a browser")
    p = command(sub, "tree", inspect.cmd_tree, "draw the supervision tree")
    p.add_argument("--path", default="/", help="the subtree to draw (default: /)")
    p.add_argument("--depth", type=_nonnegative, help="levels to draw (0: the node alone)")
    p = command(sub, "events", inspect.cmd_events, "follow events live")
    p.add_argument("--topic", action="append", metavar="T", help="a topic or pattern (agent.*); repeatable")
    p.add_argument("--agent", metavar="ID", help="only this agent's events")
    p.add_argument("--path", metavar="P", help="only events of actors under this tree path (/sessions/ID)")
    p.add_argument("--count", type=_nonnegative, metavar="N", help="stop after N events")
    p = command(sub, "tasks", inspect.cmd_tasks, "list tasks")
    p.add_argument("--cwd", help="the project (default: the current directory)")
    p.add_argument("--agent", metavar="ID", help="an agent, for its project or (with --scope session) its session")
    p.add_argument("--view", default="all", choices=inspect.VIEWS, help="which tasks, or tree: all of them nested")
    p.add_argument("--scope", default="project", choices=["project", "session"])
    debug_state(sub, "debug-state", "an agent's debug state")
    group = sub.add_parser(
        "fault",
        help="inject, list and clear faults",
        description="The running daemon's faults (it must run with --faults FILE or [faults] enabled = true).",
    )
    group.set_defaults(parser=group)
    fault_sub = group.add_subparsers(dest="fault_command", metavar="COMMAND")
    fault_sub.required = True
    p = command(fault_sub, "inject", inspect.cmd_fault_inject, "inject a fault")
    p.add_argument("fault", nargs="+", metavar="KEY=VALUE", help="the fault: target=tool kind=crash ... or JSON")
    command(fault_sub, "list", inspect.cmd_fault_list, "list the faults and how often each fired")
    p = command(fault_sub, "clear", inspect.cmd_fault_clear, "remove one fault, or all")
    p.add_argument("fault_id", metavar="ID", nargs="?", help="the fault (default: every fault)")

    # -- setting up
    p = command(sub, "config", cmd_config, "show the configuration")
    p.add_argument("action", nargs="?", choices=["show"], default="show", help="show (the default)")
    p.add_argument("--model", help="as agent.start's model: shown as models.default, from 'parameter'")
    p.add_argument("--tools", help="as agent.start's tool filter, e.g. '*,!shell': shown as tools.enabled")
    command(sub, "reload", cmd_reload, "re-read the configuration files now")

    from weald.runtime.daemon._cli_trust import add_trust_command

    add_trust_command(sub, common)
    command(sub, "doctor", cmd_doctor, "check this machine for weald")

    from weald.runtime.daemon._cli_mcp import add_mcp_commands

    add_mcp_commands(sub, common)

    from weald.runtime.daemon._cli_store import add_store_commands

    add_store_commands(sub, common, print_json)

    from weald.runtime.daemon._cli_cluster import add_cluster_commands

    add_cluster_commands(sub, common, print_json)

    p = command(sub, "acp", cmd_acp, "serve an editor over ACP (stdio)")
    p.add_argument("--model", help="provider:model (or an alias) for new sessions (default: the project's)")

    p = command(sub, "demo", cmd_demo, "a self-contained demo (no API key)")
    p.add_argument("--keep", action="store_true", help="keep the demo's temporary project and store")
    return parser


def _prompt_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--yes", action="store_true", help="allow every permission request")
    p.add_argument("--answer", metavar="TEXT", help="answer ask_user questions with TEXT")
    p.add_argument("--quiet", action="store_true", help="print only the answer")


# -- main ----------------------------------------------------------------------------------------------------


def _on_sigint(_signum: int, _frame: object) -> NoReturn:
    """The first Ctrl-C ends the command (KeyboardInterrupt, cleaned up); a second one exits at once."""
    signal.signal(signal.SIGINT, _exit_now)
    raise KeyboardInterrupt


def _exit_now(_signum: int, _frame: object) -> NoReturn:
    os._exit(EXIT_INTERRUPTED)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, innermost last."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``weald`` console script: runs a command, and turns every failure into one line."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command_line: list[str] = []
    if words[:2] == ["mcp", "add"] and "--" in words:
        # argparse's "--" does not reach a sub-subcommand: the server's command line is split off here.
        at = words.index("--")
        words, command_line = words[:at], words[at + 1 :]
    args, extra = parser.parse_known_args(words)
    if extra:
        # The command's own usage, not the top level's.
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if command_line:
        args.target = [*args.target, *command_line]
    parts = (args.command, getattr(args, "agent_command", None), getattr(args, "fault_command", None))
    name = " ".join(part for part in parts if part)
    if args.command != "serve" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
    err = console(stderr=True)
    try:
        result: int = args.func(args)
    except BaseException as exc:
        return _failed(exc, f"weald {name}", err)
    return result


_FILE_ERRORS = (errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC)


def _failed(exc: BaseException, who: str, err: Any) -> int:
    """Say in one line why the command failed; returns its exit status (re-raises SystemExit)."""
    from weald.runtime import WealdError
    from weald.runtime.daemon.config import ConfigError

    chain = _chain(exc)
    if any(isinstance(e, BrokenPipeError) for e in chain):  # rich's own handling of it is a SystemExit(1)
        # The reader went away (weald agents | head -1): nothing more to say, to anyone.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    if isinstance(exc, SystemExit):
        raise exc
    if any(isinstance(e, KeyboardInterrupt) for e in chain):
        print_error(err, f"{who}: interrupted")
        return EXIT_INTERRUPTED
    if isinstance(exc, CommandError):
        print_error(err, str(exc))
        return exc.code
    if isinstance(exc, ConfigError):
        print_error(err, str(exc))
        return EXIT_USAGE
    if isinstance(exc, DaemonUnavailableError | RPCCallError):
        print_error(err, f"{who}: {describe_failure(exc)}")
        return EXIT_FAILED
    if isinstance(exc, WealdError):  # says what went wrong (another daemon has the store...): no traceback
        print_error(err, f"{who}: {describe_failure(exc)}")
        return EXIT_FAILED
    if isinstance(exc, OSError) and exc.errno in _FILE_ERRORS:
        print_error(err, f"{who}: {describe_failure(exc)}")
        return EXIT_FAILED
    if not isinstance(exc, Exception):
        raise exc
    if os.environ.get("WEALD_DEBUG"):
        raise exc
    print_error(err, f"{who}: unexpected error: {describe_failure(exc)} (WEALD_DEBUG=1 shows where)")
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
