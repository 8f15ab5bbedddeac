"""The ``weald`` command.

::

    weald serve [--socket PATH | --stdio] [--faults FILE]   run the daemon
                [--http HOST:PORT]                      ... with the observer, a live web view
    weald observe [--no-browser]                            open the running daemon's observer
    weald run "PROMPT" [--agent ID] [--cwd DIR] [--yes]     prompt an agent, streaming its work
              [--record FILE] [--faults FILE]               ... recording its model calls; under faults
    weald acp [--model M]                                   serve an editor over ACP (stdio)
    weald agents | tree | debug-state ID | tasks            look inside a running daemon
    weald compact ID                                        compact an agent's context now
    weald demo                                              a self-contained tour, no API key needed
    weald status | stop | config                            the daemon and its configuration
    weald doctor                                            check this machine (sandbox, rg, node, disk)

Every command takes ``--json`` for scripts. ``weald run`` uses the running
daemon, or starts an embedded one (in this process) when none runs; with
``--faults`` it always runs its agent in an embedded daemon of its own, with
fault injection on and a temporary store, so that a fault run starts from
nothing and touches no other agent.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from weald.runtime.daemon._render import (
    PrintableFormatter,
    SafeConsole,
    printable,
    render_config,
    render_debug_state,
    render_status,
    render_tree,
    safe_text,
)
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

__all__ = ["main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3


def _console(stderr: bool = False) -> Console:
    """The console every command prints with: foreign text in it is shown, never obeyed (`SafeConsole`)."""
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=False)


def _print_error(err: Console, text: str) -> None:
    """Print an error as it is: no rich markup (``[tools]`` is text here) and no wrapping of its lines."""
    err.print(printable(text), style="red", markup=False, soft_wrap=True)


def _load_config(args: argparse.Namespace) -> Any:
    return _load_config_files(args)[0]


def _load_config_files(args: argparse.Namespace) -> tuple[Any, Any]:
    """The configuration of ``--project`` (default: the current directory), and the files it came from."""
    from weald.runtime.daemon._config_load import find_project_files, load_files

    files = find_project_files(_project_dir(args) or Path.cwd())
    return load_files(files).config, files


def _project_dir(args: argparse.Namespace) -> Path | None:
    """``--project``, made absolute against the current directory; None when not given."""
    project = getattr(args, "project", None)
    return Path(project).expanduser().absolute() if project else None


def _socket_path(args: argparse.Namespace, config: Any | None = None) -> Path:
    if getattr(args, "socket", None):
        return Path(args.socket).expanduser()
    if os.environ.get("WEALD_SOCKET"):
        return Path(os.environ["WEALD_SOCKET"])
    config = config or _load_config(args)
    return Path(config.server.socket).expanduser()


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


# -- serve ----------------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM, SIGINT or ``daemon.stop``; exit 0 after a clean shutdown."""
    # First: a fatal crash from here on prints every thread's stack (into the log once it is open).
    faulthandler.enable(file=sys.stderr, all_threads=True)
    from rich.progress import BarColumn, Progress, TextColumn
    from weald.runtime.daemon.tree import Daemon
    from weald.runtime.faults import FaultSpecError

    config, files = _load_config_files(args)
    err = _console(stderr=True)
    _log_warnings_to_stderr()
    try:
        faults = _make_faults(args, config)
    except FaultSpecError as exc:
        # Each problem names the file (and the key); one line each, no traceback.
        for problem in exc.problems:
            _print_error(err, f"weald serve: bad fault file: {problem}")
        return EXIT_USAGE
    if args.http is not None:
        from weald.runtime._checks import ValueProblem
        from weald.runtime.daemon._config_model import check_http_address

        try:
            check_http_address(args.http)
        except ValueProblem as exc:
            _print_error(err, f"weald serve: --http: {exc}")
            return EXIT_USAGE
    socket_path = None if args.stdio and not args.socket else _socket_path(args, config)
    log: Literal["terminal"] | bool = "terminal" if sys.stderr.isatty() else True
    daemon = Daemon(
        config,
        socket_path=socket_path,
        stdio=args.stdio,
        faults=faults,
        http=args.http,
        log=log,
        config_files=files,
    )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
            _print_error(err, f"weald serve: {exc}")
            return EXIT_FAILED
    if daemon.previous_run is not None:
        _print_error(err, f"weald serve: warning: {daemon.previous_run.describe()}")
    if args.json and not args.stdio:
        # One line a script can read: where to connect, whom to signal.
        line = {"socket": str(socket_path), "pid": os.getpid(), "store": str(config.store.path)}
        if daemon.observer_port is not None:
            line["http"] = _observer_address(daemon)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    elif not args.stdio:
        err.print(f"weald daemon serving on {socket_path} (pid {os.getpid()}); store {config.store.path}")
        if daemon.observer_port is not None:
            err.print(f"observer on http://{_observer_address(daemon)}/ (weald observe opens it)")
    while not stop.wait(0.2):
        if daemon.stop_requested:
            break
    if not args.stdio and not args.json:
        err.print("weald daemon stopping: aborting running turns, saving, stopping the tree")
    daemon.shutdown()
    return EXIT_OK


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


def _warn_sandbox(daemon: Any, err: Console) -> None:
    """Say loudly, on stderr, that shell commands run without the OS sandbox (or are refused)."""
    report = daemon.sandbox
    if report is not None and report.warning:
        err.print(f"[bold red]WARNING:[/bold red] {escape(printable(report.warning))}", soft_wrap=True)


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
        return FaultInjector.from_file(Path(path))
    return FaultInjector()


# -- connecting ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _connect(args: argparse.Namespace, *, embedded: bool = False, faults: Any = None) -> Iterator[Client]:
    """Connect to the running daemon, or (if ``embedded``) start one in this process.

    With ``faults`` (a fault injector), always start one, with a temporary store.
    """
    config, files = _load_config_files(args)
    if faults is not None:
        with _embedded_client(config, files, faults=faults) as client:
            yield client
        return
    path = _socket_path(args, config)
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
    with _embedded_daemon(config, files, faults=faults) as socket_path:
        client = Client.connect(socket_path)
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
        socket_path = Path(tmp) / "weald.sock"
        if faults is not None:
            # A fault run starts from an empty store: the same run again finds the same state.
            config = attrs.evolve(config, store=attrs.evolve(config.store, path=Path(tmp) / "store.db"))
        daemon = Daemon(config, socket_path=socket_path, faults=faults, config_files=files)
        daemon.start(restore=False)
        _warn_sandbox(daemon, _console(stderr=True))
        try:
            yield socket_path
        finally:
            daemon.shutdown()


# -- run -------------------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    """Send a prompt to an agent and stream what it does; the exit code says how the turn ended.

    ``--record FILE`` records the new agent's model calls into FILE, which
    ``--model scripted:FILE`` replays. ``--faults FILE`` runs the agent in a
    daemon of its own with those faults (and a temporary store).
    """
    out = _console()
    err = _console(stderr=True)
    for option in ("record", "faults"):
        if getattr(args, option) and args.agent is not None:
            _print_error(err, f"weald run: --{option} starts a new agent; it cannot be used with --agent")
            return EXIT_USAGE
    faults = None
    if args.faults:
        from weald.runtime.faults import FaultInjector, FaultSpecError

        try:
            faults = FaultInjector.from_file(Path(args.faults))
        except FaultSpecError as exc:
            for problem in exc.problems:
                _print_error(err, f"weald run: bad fault file: {problem}")
            return EXIT_USAGE
    try:
        with _connect(args, embedded=True, faults=faults) as client:
            agent_id = args.agent
            if agent_id is None:
                params: dict[str, Any] = {"working_dir": str(Path(args.cwd or Path.cwd()).resolve())}
                project = _project_dir(args)
                if project is not None:
                    # The daemon runs where it was started: it is told which project's rules apply.
                    params["project"] = str(project)
                if args.model:
                    params["model"] = args.model
                if args.tools:
                    params["tools"] = args.tools.split(",")
                if args.record:
                    params["record"] = str(Path(args.record).resolve())
                agent_id = client.call("agent.start", params, timeout=60)["agent_id"]
            client.call("events.subscribe", {"agent_id": agent_id, "topics": ["agent.*", "tool.*"]})
            pending = client.request("agent.prompt", {"agent_id": agent_id, "text": args.prompt})
            result = _follow(client, pending, args, (out, err))
            if args.agent is None and client.embedded:
                # An embedded daemon's new agent is not left for the next daemon to restore.
                client.call("agent.stop", {"agent_id": agent_id}, timeout=30)
    except (DaemonUnavailableError, RPCCallError) as exc:
        _print_error(err, f"weald run: {exc}")
        return EXIT_FAILED
    if args.json:
        _print_json({"agent_id": agent_id, **result})
    elif not args.quiet:
        err.print(
            f"[dim]agent {agent_id} · {_plural(result['steps'], 'step')} · "
            f"{result['usage']['input_tokens']} in / {result['usage']['output_tokens']} out tokens[/dim]"
        )
    if result.get("aborted"):
        return EXIT_ABORTED
    return EXIT_OK if result.get("ok") else EXIT_FAILED


def cmd_acp(args: argparse.Namespace) -> int:
    """Serve the Agent Client Protocol on stdin/stdout, for an editor (Zed, JetBrains, Neovim: see docs/acp.md).

    Each ACP session is a session of the running daemon, or of one started in
    this process when none runs (as ``weald run`` does).
    """
    from weald.runtime.daemon._acp import protocol_stdout, serve_stdio

    stdout = protocol_stdout()  # first: nothing else may write on the protocol's stream
    with _connect(args, embedded=True) as client:
        return serve_stdio(client, stdout, model=args.model)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _follow(client: Client, pending: Any, args: argparse.Namespace, consoles: tuple[Console, Console]) -> Any:
    out, err = consoles
    streaming = False  # a line of streamed text is open on the terminal
    in_message = False  # the model's message is still streaming (its end not seen yet)
    printed: list[str] = []
    # A permission request or question can overtake the last text deltas of the
    # message before it (events and requests travel apart): hold it until that
    # message's end is seen, so a prompt never lands inside a streamed word.
    held: list[tuple[str, Any]] = []
    held_until = 0.0
    result: Any = None
    deadline = 0.0
    while True:
        if result is None and pending.done():
            result = pending.get()
            # Events travel apart from the reply: read on until this turn's end is seen.
            deadline = time.monotonic() + 2.0
        if held and (not in_message or time.monotonic() > held_until):
            streaming = _end_line(out, streaming)
            for method, params in held:
                _answer(client, method, params, args, err)
            held.clear()
        note = client.next_notification(timeout=0.05)
        if result is not None and ((note is None and time.monotonic() > deadline) or _is_turn_end(note, result)):
            if note is not None and not args.json:
                _show_event(note[1]["event"], out, err, streaming, quiet=args.quiet)
            text = result.get("text") or ""
            if not args.json and text and text not in "".join(printed):
                if streaming:
                    out.print()
                out.print(printable(text), markup=False)
            elif streaming:
                out.print()
            if not result.get("ok") and not args.json:
                _print_error(err, f"turn ended: {result.get('error')}")
            return result
        if note is None:
            continue
        method, params = note
        if method in ("permission.request", "ask_user.question"):
            if in_message:
                held.append(note)
                held_until = time.monotonic() + 2.0
                continue
            streaming = _end_line(out, streaming)
            _answer(client, method, params, args, err)
        elif method == "event":
            topic = params["event"]["topic"]
            if topic == "agent.message_delta":
                in_message = True
                if not args.json and not args.quiet:
                    printed.append(params["event"]["data"]["text"])
            elif topic == "agent.message_end":
                in_message = False
            if not args.json:
                streaming = _show_event(params["event"], out, err, streaming, quiet=args.quiet)


def _answer(client: Client, method: str, params: dict[str, Any], args: argparse.Namespace, err: Console) -> None:
    if method == "permission.request":
        _answer_permission(client, params, args, err)
    else:
        _answer_question(client, params, args, err)


def _is_turn_end(note: tuple[str, Any] | None, result: Any) -> bool:
    if note is None or note[0] != "event":
        return False
    event = note[1]["event"]
    return bool(event["topic"] == "agent.turn_end" and event["data"].get("turn_id") == result.get("turn_id"))


def _end_line(out: Console, streaming: bool) -> bool:
    if streaming:
        out.print()
    return False


def _show_event(event: dict[str, Any], out: Console, err: Console, streaming: bool, *, quiet: bool) -> bool:
    topic, data = event["topic"], event["data"]
    if quiet:
        return streaming  # only the answer, printed when the turn ends
    if topic == "agent.message_delta":
        out.print(printable(data["text"]), end="", markup=False)
        return True
    if topic == "agent.message_end":
        return _end_line(out, streaming)
    if topic == "tool.started":
        streaming = _end_line(out, streaming)
        args = printable(json.dumps(data.get("arguments", {}), ensure_ascii=False))
        err.print(f"[cyan]▶ {_tool(data)}[/cyan] [dim]{escape(args[:160])}[/dim]")
    elif topic == "tool.finished":
        err.print(f"[green]✓ {_tool(data)}[/green] [dim]{data.get('duration_ms', 0):.0f} ms[/dim]")
    elif topic == "tool.failed":
        error = printable(str(data.get("error", ""))[:200])
        err.print(f"[yellow]✗ {_tool(data)}[/yellow] [dim]{escape(error)}[/dim]")
    elif topic == "agent.recovered":
        streaming = _end_line(out, streaming)
        err.print(f"[magenta]agent restarted by its supervisor (restart {data.get('restarts')})[/magenta]")
    elif topic == "agent.compacted":
        streaming = _end_line(out, streaming)
        err.print(
            f"[dim]context compacted ({data.get('reason')}): "
            f"{data.get('tokens_before', 0):,} -> {data.get('tokens_after', 0):,} tokens[/dim]"
        )
    elif topic == "agent.compaction_failed":
        streaming = _end_line(out, streaming)
        error = printable(str(data.get("error", ""))[:200])
        err.print(f"compacting the context failed: {error}", style="yellow", markup=False)
    elif topic == "agent.replay_diverged":
        streaming = _end_line(out, streaming)
        _print_error(err, f"replay diverged (going on as recorded): {data.get('error')}")
    return streaming


def _tool(data: dict[str, Any]) -> str:
    """A tool's name as markup-safe, printable text (an MCP server names its own tools)."""
    return escape(printable(data.get("tool", "")))


def _what(request: dict[str, Any]) -> tuple[str, str]:
    """What a permission request would run, markup-safe and printable: (on the line, below it).

    A command of one line is shown on the prompt's line. One of several lines
    is shown below it, every line behind a ``│`` gutter, so that no line of
    the command can pass for a line of weald's own (``allow?`` included).
    """
    subject = request.get("subject")
    shown = printable(subject if subject else json.dumps(request.get("arguments", {}), ensure_ascii=False)[:200])
    lines = shown.split("\n")
    if len(lines) == 1:
        return escape(shown) + " ", ""
    return "", "".join(f"\n  [dim]│[/dim] {escape(line)}" for line in lines)


def _answer_permission(client: Client, request: dict[str, Any], args: argparse.Namespace, err: Console) -> None:
    inline, below = _what(request)
    tool = _tool(request)
    params: dict[str, Any] = {"request_id": request["request_id"]}
    if args.yes:
        decision = "allow"
        err.print(f"[yellow]allowing {tool}:[/yellow] {inline}(--yes){below}")
    elif not sys.stdin.isatty():
        decision = "deny"
        # Nobody said no: tell the model so, rather than "denied by the user".
        params["message"] = "no one could be asked: run with a terminal, or allow it in weald.toml"
        err.print(f"[yellow]not running {tool}:[/yellow] {inline}(no terminal to ask; --yes allows it){below}")
    else:
        err.print(f"[bold yellow]{tool}[/bold yellow] wants to run: {inline.rstrip()}{below}")
        if request.get("reason"):
            err.print(f"  (asked because: {printable(request['reason'])})", markup=False)
        answer = input("allow? [y]es / [n]o / [a]lways: ").strip().lower()
        decision = {"y": "allow", "yes": "allow", "a": "allow_always", "always": "allow_always"}.get(answer, "deny")
    with contextlib.suppress(RPCCallError):
        client.call("permission.respond", {**params, "decision": decision}, timeout=10)


def _answer_question(client: Client, question: dict[str, Any], args: argparse.Namespace, err: Console) -> None:
    err.print(safe_text(question["question"], style="bold"))
    choices = question.get("choices") or []
    for i, choice in enumerate(choices, 1):
        err.print(f"  {i}. {printable(choice)}", markup=False)
    if args.answer is not None:
        answer = args.answer
    elif sys.stdin.isatty():
        answer = input("> ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(choices):
            answer = choices[int(answer) - 1]
    else:
        answer = choices[0] if choices else ""
        err.print(f"(no terminal: answering {printable(repr(answer))})", style="dim", markup=False)
    with contextlib.suppress(RPCCallError):
        client.call("ask_user.respond", {"question_id": question["question_id"], "answer": answer}, timeout=10)


# -- looking inside -------------------------------------------------------------------------------------------


def cmd_agents(args: argparse.Namespace) -> int:
    """List the agents the daemon knows."""
    with _connect(args) as client:
        agents = client.call("agent.list", timeout=60)
    if args.json:
        _print_json(agents)
        return EXIT_OK
    table = Table("agent", "state", "status", "model", "context", "restarts", "working dir")
    for a in agents:
        context = a.get("context") or {}
        table.add_row(
            safe_text(a["agent_id"]),
            safe_text(a.get("state", "")),
            safe_text(a["status"]),
            safe_text(_short_model(a["model"])),
            f"{context['tokens']:,}/{context['input_budget']:,}" if context else "",
            safe_text(a.get("restarts", "")),
            safe_text(a["working_dir"]),
        )
    out = _console()
    out.print(table)
    if args.long:
        for a in agents:
            out.print(Text(a["agent_id"], style="bold"))
            out.print(Text(f"  configuration: {_describe_config(a.get('config') or {})}"), soft_wrap=True)
    return EXIT_OK


def _describe_config(state: dict[str, Any]) -> str:
    """Which files an agent's configuration comes from, each with its digest, in one line per file."""
    files = state.get("files") or []
    lines = [f"{file['path']} ({file['layer']}, {str(file['digest'])[:19]})" for file in files]
    if not lines:
        lines = ["no file: built-in defaults"]
    if state.get("project"):
        lines.insert(0, f"project {state['project']}")
    for problem in state.get("refused") or []:
        lines.append(f"REFUSED (the configuration above stays): {problem}")
    return "\n    ".join(lines)


def _short_model(model: str) -> str:
    if model.startswith("scripted:") and "/" in model:
        return "scripted:" + Path(model.removeprefix("scripted:")).name
    return model


def cmd_tree(args: argparse.Namespace) -> int:
    """Draw the live supervision tree."""
    with _connect(args) as client:
        root = client.call("tree", {"path": args.path, "depth": args.depth}, timeout=60)
    if args.json:
        _print_json(root)
        return EXIT_OK
    _console().print(render_tree(root))
    return EXIT_OK


def cmd_debug_state(args: argparse.Namespace) -> int:
    """Show an agent's debug state (or the daemon's, without an id)."""
    with _connect(args) as client:
        params = {"agent_id": args.agent_id, "events": args.events, "messages": args.messages}
        state = client.call("debug_state", {k: v for k, v in params.items() if v is not None}, timeout=30)
    if args.json:
        _print_json(state)
    else:
        _console().print(render_debug_state(state))
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    """Compact an agent's context now: its model summarizes the older part of the conversation.

    Between turns it runs at once; during a turn, before the agent's next
    model call. Exits 1 if the compaction failed.
    """
    with _connect(args) as client:
        result = client.call("agent.compact", {"agent_id": args.agent_id}, timeout=args.timeout)
    if args.json:
        _print_json(result)
    elif result["compacted"]:
        _console().print(
            f"{printable(args.agent_id)}: compacted {result['replaced']} messages: "
            f"{result['tokens_before']:,} -> {result['tokens_after']:,} estimated tokens",
            markup=False,
        )
    else:
        _console().print(f"{printable(args.agent_id)}: not compacted: {printable(result['detail'])}", markup=False)
    failed = not result["compacted"] and not str(result.get("detail") or "").startswith("nothing to compact")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_tasks(args: argparse.Namespace) -> int:
    """List the task tracker's tasks for a project (or an agent's session)."""
    params: dict[str, Any] = {"view": args.view, "scope": args.scope}
    if args.agent:
        params["agent_id"] = args.agent
    else:
        params["working_dir"] = str(Path(args.cwd or Path.cwd()).resolve())
    with _connect(args) as client:
        result = client.call("tasks.list", params, timeout=30)
    if args.json:
        _print_json(result)
        return EXIT_OK
    table = Table("id", "status", "title", "blocked by", "parent")
    for t in result["tasks"]:
        table.add_row(
            safe_text(t["id"]),
            safe_text(t["status"]),
            safe_text(t["title"]),
            safe_text(", ".join(t.get("blocked_by") or [])),
            safe_text(t.get("parent_id") or ""),
        )
    _console().print(table)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether a daemon runs, and how it is."""
    try:
        with _connect(args) as client:
            status = client.call("daemon.status", timeout=10)
    except DaemonUnavailableError as exc:
        if args.json:
            _print_json({"running": False, "error": str(exc)})
        else:
            _console(stderr=True).print(printable(exc), markup=False)
        return EXIT_FAILED
    if args.json:
        _print_json({"running": True, **status})
    else:
        _console().print(render_status(status))
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the running daemon to shut down cleanly."""
    with _connect(args) as client:
        client.call("daemon.stop", timeout=10)
    if args.json:
        _print_json({"stopping": True})
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """Show the configuration weald would use here (files merged, defaults filled)."""
    from weald.runtime.daemon.config import config_to_dict, find_config_files

    config = _load_config(args)
    files = [str(p) for p in find_config_files(Path(args.project or Path.cwd()))]
    plain = config_to_dict(config)
    if args.json:
        _print_json({"files": files, "config": plain})
    else:
        _console().print(render_config(files, plain))
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check what this machine lets weald do: the shell sandbox, ripgrep, node for MCP servers, the state disk."""
    from weald.runtime.daemon._doctor import run_checks
    from weald.runtime.daemon.config import Config, ConfigError

    try:
        config, error = _load_config(args), None
    except ConfigError as exc:
        config, error = Config(), str(exc)
    checks = run_checks(config, error)
    failed = any(check.status == "fail" for check in checks)
    if args.json:
        _print_json({"ok": not failed, "checks": [attrs.asdict(check) for check in checks]})
        return EXIT_FAILED if failed else EXIT_OK
    marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]FAIL[/bold red]"}
    table = Table("check", "", "what was found", box=None, padding=(0, 1))
    for check in checks:
        table.add_row(check.name, marks[check.status], escape(check.detail))
    out = _console()
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
    with _connect(args) as client:
        url = client.call("observer.url", timeout=10)["url"]
    if args.json:
        _print_json({"url": url})
        return EXIT_OK
    opened = False
    if not args.no_browser and _has_browser():
        import webbrowser

        try:
            redirect = _redirect_file(url)
        except OSError as exc:
            _print_error(_console(stderr=True), f"weald observe: no private file for the browser to open: {exc}")
        else:
            with contextlib.suppress(webbrowser.Error):
                opened = webbrowser.open(redirect.as_uri())
    if opened:
        where = url.split("?", 1)[0]
        _console(stderr=True).print(f"opened the observer in a browser: {where}", markup=False, soft_wrap=True)
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


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the self-contained demo."""
    from weald.runtime.daemon.demo import run_demo

    code: int = run_demo(json_output=args.json, keep=args.keep)
    return code


# -- parsing ---------------------------------------------------------------------------------------------------


def _doc(command: Any) -> str:
    """A command's docstring as help text: ``literal`` markup becomes plain text."""
    return re.sub(r"``([^`]*)``", r"\1", command.__doc__ or "")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``weald`` command."""
    parser = argparse.ArgumentParser(
        prog="weald",
        description="weald: an actor runtime for LLM coding agents, with Erlang/OTP supervision trees.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--socket", help="the daemon's Unix socket (default: from weald.toml, $XDG_RUNTIME_DIR/weald.sock)"
    )
    common.add_argument("--project", help="the project directory whose weald.toml to read (default: the current one)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("serve", parents=[common], help="run the daemon", description=_doc(cmd_serve))
    p.add_argument("--stdio", action="store_true", help="serve JSON-RPC on stdin/stdout")
    p.add_argument("--faults", help="enable fault injection, with the faults declared in FILE (TOML or JSON)")
    p.add_argument("--no-restore", action="store_true", help="do not restart the stored sessions")
    p.add_argument(
        "--http", metavar="HOST:PORT", help="serve the observer, a live web view, here (loopback; port 0: any free)"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "observe", parents=[common], help="open the daemon's live web view", description=_doc(cmd_observe)
    )
    p.add_argument("--no-browser", action="store_true", help="print the address instead of opening a browser")
    p.set_defaults(func=cmd_observe)

    p = sub.add_parser("run", parents=[common], help="prompt an agent", description=_doc(cmd_run))
    p.add_argument("prompt", help="what to ask")
    p.add_argument("--agent", help="the agent to prompt (default: start a new one)")
    p.add_argument("--cwd", help="the new agent's working directory (default: the current one)")
    p.add_argument("--model", help="provider:model for the new agent")
    p.add_argument("--tools", help="tool filter for the new agent, e.g. '*,!shell'")
    p.add_argument("--yes", action="store_true", help="allow every permission request")
    p.add_argument("--answer", help="answer ask_user questions with this text")
    p.add_argument("--quiet", action="store_true", help="print only the answer")
    p.add_argument("--record", help="record the new agent's model calls into FILE (replay: --model scripted:FILE)")
    p.add_argument("--faults", help="run in a daemon of its own, with fault injection and the faults declared in FILE")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("acp", parents=[common], help="serve an editor over ACP (stdio)", description=_doc(cmd_acp))
    p.add_argument("--model", help="provider:model (or an alias) for new sessions (default: the project's)")
    p.set_defaults(func=cmd_acp)

    p = sub.add_parser("agents", parents=[common], help="list agents", description=_doc(cmd_agents))
    p.add_argument("--long", action="store_true", help="also show the configuration files each agent runs under")
    p.set_defaults(func=cmd_agents)

    p = sub.add_parser("tree", parents=[common], help="draw the supervision tree", description=_doc(cmd_tree))
    p.add_argument("--path", default="/", help="the subtree to draw (default: /)")
    p.add_argument("--depth", type=int, help="levels to draw")
    p.set_defaults(func=cmd_tree)

    p = sub.add_parser(
        "debug-state", parents=[common], help="an agent's debug state", description=_doc(cmd_debug_state)
    )
    p.add_argument("agent_id", nargs="?", help="the agent (default: the daemon itself)")
    p.add_argument("--events", type=int, help="recent events to show")
    p.add_argument("--messages", type=int, help="recent messages to show")
    p.set_defaults(func=cmd_debug_state)

    p = sub.add_parser(
        "compact", parents=[common], help="compact an agent's context now", description=_doc(cmd_compact)
    )
    p.add_argument("agent_id", help="the agent")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the summary (default: 600)")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("tasks", parents=[common], help="list tasks", description=_doc(cmd_tasks))
    p.add_argument("--cwd", help="the project (default: the current directory)")
    p.add_argument("--agent", help="an agent, for its project or (with --scope session) its session")
    p.add_argument("--view", default="all", help="all, open, ready, in_progress, blocked, done, tree")
    p.add_argument("--scope", default="project", choices=["project", "session"])
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("status", parents=[common], help="is a daemon running?", description=_doc(cmd_status))
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("stop", parents=[common], help="stop the daemon", description=_doc(cmd_stop))
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("config", parents=[common], help="show the configuration", description=_doc(cmd_config))
    p.add_argument("action", nargs="?", choices=["show"], default="show", help="show (the default)")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("doctor", parents=[common], help="check this machine for weald", description=_doc(cmd_doctor))
    p.set_defaults(func=cmd_doctor)

    from weald.runtime.daemon._cli_mcp import add_mcp_commands

    add_mcp_commands(sub, common, _print_json)

    p = sub.add_parser("demo", parents=[common], help="a self-contained demo (no API key)", description=_doc(cmd_demo))
    p.add_argument("--keep", action="store_true", help="keep the demo's temporary project and store")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``weald`` console script."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if words[:2] == ["mcp", "add"] and "--" in words:
        # argparse's "--" does not reach a sub-subcommand: the server's command line is split off here.
        at = words.index("--")
        words, command = words[:at], words[at + 1 :]
    args = parser.parse_args(words)
    if command:
        args.target = [*args.target, *command]
    try:
        result: int = args.func(args)
    except DaemonUnavailableError as exc:
        _print_error(_console(stderr=True), f"weald {args.command}: {exc}")
        return EXIT_FAILED
    except RPCCallError as exc:
        _print_error(_console(stderr=True), f"weald {args.command}: {exc.message}")
        return EXIT_FAILED
    except Exception as exc:
        from weald.runtime import WealdError
        from weald.runtime.daemon.config import ConfigError

        if isinstance(exc, ConfigError):
            _print_error(_console(stderr=True), str(exc))
            return EXIT_USAGE
        if isinstance(exc, WealdError):  # says what went wrong (another daemon has the store...): no traceback
            _print_error(_console(stderr=True), f"weald {args.command}: {exc}")
            return EXIT_FAILED
        raise
    return result


if __name__ == "__main__":
    sys.exit(main())
