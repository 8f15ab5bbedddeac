"""``weald run`` and ``weald prompt``: send a prompt to an agent and stream what it does.

A run without ``--agent`` starts a new agent for itself and stops it when
the run ends, unless ``--keep`` or ``--name NAME`` asks to keep it; the
daemon also stops it if the run ends without saying so (the agent is
started ``ephemeral``: stopped when its connection closes, never restored).

Ctrl-C during a turn aborts that turn (``agent.abort``), waits briefly for
the agent's answer and exits 130 with one line; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape
from weald.runtime.daemon._cli_common import (
    EXIT_ABORTED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    cli_terms,
    connect,
    console,
    print_error,
    print_json,
    project_dir,
)
from weald.runtime.daemon._render import printable, safe_text
from weald.runtime.daemon.client import Client, DaemonUnavailableError, RPCCallError

#: agent.start's error code for a nested project file that is not trusted (the server's ``UNTRUSTED_CONFIG``).
UNTRUSTED_CONFIG = -32005

__all__ = ["cmd_prompt", "cmd_run", "render_message", "resolve_model_path"]

#: How long a Ctrl-C waits for the aborted turn's answer before the command exits anyway.
ABORT_WAIT = 5.0
#: What a tool call's permission request (or question) waits for: its ``▶ tool`` line, at most this long.
_PROMPT_HOLD = 2.0


class _Interrupt:
    """Ctrl-C while a turn runs: the first asks for an abort, a second exits at once.

    Installed for the turn only; outside it Ctrl-C raises KeyboardInterrupt as
    usual (``main`` turns that into one line and exit 130).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _on_sigint(self, _signum: int, _frame: FrameType | None) -> None:
        if self.requested:
            sys.stderr.write("\ninterrupted again: exiting now\n")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        self.requested = True

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Interrupt]:
        if _on_main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            if self._previous is not None:
                signal.signal(signal.SIGINT, self._previous)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def resolve_model_path(model: str | None, base: Path) -> str | None:
    """``scripted:FILE`` with FILE made absolute against ``base`` (the user's directory), others as given."""
    if model is None or not model.startswith("scripted:"):
        return model
    path = model.removeprefix("scripted:")
    if not path:
        return model
    return "scripted:" + str((base / Path(path).expanduser()).absolute())


def cmd_prompt(args: argparse.Namespace) -> int:
    """Send a prompt to an agent that is running, and stream what it does (as ``weald run --agent ID``).

    This is how a conversation goes on: each prompt is a new turn of the same
    agent, which keeps its history. ``weald run --keep`` or ``--name NAME``
    starts an agent that stays for this; ``weald agents`` lists them.
    """
    args.agent = args.agent_id
    for option in ("record", "faults", "model", "tools", "cwd", "name"):
        setattr(args, option, None)
    args.keep = False
    return cmd_run(args)


def cmd_run(args: argparse.Namespace) -> int:
    """Send a prompt to an agent and stream what it does; the exit code says how the turn ended.

    Without --agent, a new agent is started for the run and stopped when it
    ends; --keep keeps it (and --name NAME keeps it under a readable id) so
    that weald prompt ID "..." (or weald run --agent ID "...") goes on with it.
    Exit codes: 0 the turn succeeded, 1 it failed, 3 it was aborted, 130
    interrupted by Ctrl-C (the turn is aborted; the agent keeps its history).

    ``--record FILE`` records the new agent's model calls into FILE, which
    ``--model scripted:FILE`` replays. ``--faults FILE`` runs the agent in a
    daemon of its own with those faults (and a temporary store). Paths are
    relative to the current directory.
    """
    out = console()
    err = console(stderr=True)
    command = f"weald {args.command}"
    if not args.prompt.strip():
        raise CommandError(f"{command}: the prompt is empty: say what the agent should do", EXIT_USAGE)
    if args.agent is not None:
        for option in ("record", "faults", "name", "keep", "model", "tools", "cwd"):
            if getattr(args, option, None):
                does = "starts" if option in ("record", "faults") else "applies to"
                raise CommandError(
                    f"{command}: --{option} {does} a new agent; it cannot be used with --agent", EXIT_USAGE
                )
    faults = None
    if args.faults:
        from weald.runtime.faults import FaultInjector, FaultSpecError

        try:
            faults = FaultInjector.from_file(Path(args.faults).absolute())
        except FaultSpecError as exc:
            for problem in exc.problems:
                print_error(err, f"{command}: bad fault file: {problem}")
            return EXIT_USAGE
    interrupt = _Interrupt()
    agent_id = args.agent
    result: dict[str, Any] | None = None
    ephemeral = False
    try:
        with connect(args, embedded=True, faults=faults) as client:
            if agent_id is None:
                ephemeral = not (args.keep or args.name)
                agent_id = _start_agent(client, args, ephemeral=ephemeral)
            try:
                client.call("events.subscribe", {"agent_id": agent_id, "topics": ["agent.*", "tool.*"]}, timeout=30)
                with interrupt.installed():
                    pending = client.request("agent.prompt", {"agent_id": agent_id, "text": args.prompt})
                    result = _follow(client, pending, args, (out, err), interrupt=interrupt, agent_id=agent_id)
            finally:
                if ephemeral or (client.embedded and args.agent is None):
                    # A run's own agent goes with it; an embedded daemon's new agent is not left for the next
                    # daemon to restore.
                    with contextlib.suppress(DaemonUnavailableError, RPCCallError):
                        client.call("agent.stop", {"agent_id": agent_id}, timeout=30)
    except RPCCallError as exc:
        print_error(err, f"{command}: {cli_terms(exc.message)}")
        return EXIT_FAILED
    assert result is not None
    kept = not ephemeral and not (args.agent is None and faults is not None)
    if result.get("interrupted_by_user"):
        if kept:
            line = (
                f"aborted: the turn was stopped; the agent keeps its history (weald run --agent {agent_id} to continue)"
            )
        else:
            line = (
                f"aborted: the turn was stopped, and agent {agent_id} with this run "
                "(weald run --keep keeps the agent to continue it)"
            )
        if args.json:
            print_json({"agent_id": agent_id, **result})
        print_error(err, line)
        return EXIT_INTERRUPTED
    if args.json:
        print_json({"agent_id": agent_id, "kept": kept, **result})
    elif not args.quiet:
        usage = result.get("usage") or {}
        err.print(
            f"[dim]agent {agent_id} · {_plural(result['steps'], 'step')} · "
            f"{usage.get('input_tokens', 0):,} in / {usage.get('output_tokens', 0):,} out tokens"
            f"{'' if kept else ' · stopped (--keep keeps it)'}[/dim]"
        )
    if result.get("aborted"):
        return EXIT_ABORTED
    return EXIT_OK if result.get("ok") else EXIT_FAILED


def _start_agent(client: Client, args: argparse.Namespace, *, ephemeral: bool) -> str:
    here = Path.cwd()
    params: dict[str, Any] = {"working_dir": str((here / (args.cwd or ".")).resolve())}
    if args.cwd and not Path(params["working_dir"]).is_dir():
        raise CommandError(f"weald {args.command}: --cwd {params['working_dir']}: no such directory", EXIT_USAGE)
    model = resolve_model_path(args.model, here)
    if model:
        params["model"] = model
    if args.tools:
        params["tools"] = args.tools.split(",")
    if args.record:
        params["record"] = str((here / args.record).absolute())
    if args.name:
        params["agent_id"] = args.name
    project = project_dir(args)
    if project is not None:
        # The daemon runs where it was started: it is told which project's rules apply.
        params["project"] = str(project)
    if ephemeral:
        params["ephemeral"] = True
    title = " ".join(args.prompt.split())
    params["title"] = title if len(title) <= 200 else title[:199] + "…"
    try:
        started: dict[str, Any] = client.call("agent.start", params, timeout=60)
    except RPCCallError as exc:
        if exc.code != UNTRUSTED_CONFIG or not getattr(args, "trust", False) or not isinstance(exc.data, dict):
            raise
        # --trust: the file is shown, then trusted as it was shown (the daemon checks the digest), then started.
        from weald.runtime.daemon._cli_trust import show_file

        err = console(stderr=True)
        real, digest, _, _ = show_file(Path(str(exc.data["file"])), err, why=cli_terms(exc.message))
        client.call("config.trust", {"path": real, "sha256": digest}, timeout=120)
        err.print(f"trusted: {printable(real)} (--trust)", markup=False, soft_wrap=True)
        started = client.call("agent.start", params, timeout=60)
    return str(started["agent_id"])


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class _Stream:
    """What the terminal shows of a turn as it goes: streamed text, tool lines, prompts in their place."""

    def __init__(self, client: Client, args: argparse.Namespace, consoles: tuple[Console, Console]) -> None:
        self.client = client
        self.args = args
        self.out, self.err = consoles
        self.streaming = False  # a line of streamed text is open on the terminal
        self.in_message = False  # the model's message is still streaming (its end not seen yet)
        self.printed: list[str] = []
        # A permission request or question can overtake the events before it (they travel apart):
        # the last text deltas of the message, or the ``▶ tool`` line of the call asking. It is held
        # until they are shown, so a prompt never lands inside a streamed word or before its tool.
        self.held: list[tuple[float, tuple[str, Any]]] = []
        self.started: dict[str, int] = {}  # tool -> tool.started events seen
        self.asked: dict[str, int] = {}  # tool -> permission requests shown

    def end_line(self) -> None:
        if self.streaming:
            self.out.print()
        self.streaming = False

    def ready(self, note: tuple[str, Any]) -> bool:
        method, params = note
        if self.in_message:
            return False
        if method == "permission.request":
            tool = str(params.get("tool"))
            return self.started.get(tool, 0) > self.asked.get(tool, 0)
        return True

    def release(self, *, force: bool = False) -> None:
        """Answer the held prompts whose turn has come (or that waited long enough)."""
        now = time.monotonic()
        while self.held:
            since, note = self.held[0]
            if not force and not self.ready(note) and now - since < _PROMPT_HOLD:
                return
            self.held.pop(0)
            self.end_line()
            if note[0] == "permission.request":
                tool = str(note[1].get("tool"))
                self.asked[tool] = self.asked.get(tool, 0) + 1
            _answer(self.client, note[0], note[1], self.args, self.err)

    def prompt_arrived(self, note: tuple[str, Any]) -> None:
        self.held.append((time.monotonic(), note))
        self.release()

    def event(self, event: dict[str, Any]) -> None:
        topic = event["topic"]
        if topic == "agent.message_delta":
            self.in_message = True
            if not self.args.json and not self.args.quiet:
                self.printed.append(event["data"]["text"])
        elif topic == "agent.message_end":
            self.in_message = False
        elif topic == "tool.started":
            tool = str(event["data"].get("tool"))
            self.started[tool] = self.started.get(tool, 0) + 1
        if not self.args.json and not self.args.quiet:
            self.streaming = render_event(event, self.out, self.err, self.streaming)
        self.release()


def _follow(
    client: Client,
    pending: Any,
    args: argparse.Namespace,
    consoles: tuple[Console, Console],
    *,
    interrupt: _Interrupt,
    agent_id: str,
) -> dict[str, Any]:
    out, err = consoles
    stream = _Stream(client, args, consoles)
    result: Any = None
    deadline = 0.0
    abort_deadline: float | None = None
    while True:
        if interrupt.requested and abort_deadline is None:
            stream.end_line()
            err.print("[yellow]stopping the turn (Ctrl-C again exits at once)[/yellow]")
            abort_deadline = time.monotonic() + ABORT_WAIT
            with contextlib.suppress(RPCCallError, DaemonUnavailableError):
                client.request("agent.abort", {"agent_id": agent_id})
        if abort_deadline is not None and (pending.done() or time.monotonic() > abort_deadline):
            stream.end_line()
            answered: dict[str, Any] = {"ok": False, "aborted": True, "steps": 0, "usage": {}, "text": ""}
            if pending.done():
                with contextlib.suppress(RPCCallError, DaemonUnavailableError):
                    answered = dict(pending.get())
            return {**answered, "interrupted_by_user": True}
        if result is None and pending.done():
            result = pending.get()
            # Events travel apart from the reply: read on until this turn's end is seen.
            deadline = time.monotonic() + 2.0
        stream.release()
        note = client.next_notification(timeout=0.05)
        if result is not None and ((note is None and time.monotonic() > deadline) or _is_turn_end(note, result)):
            if note is not None:
                stream.event(note[1]["event"])
            stream.release(force=True)
            text = result.get("text") or ""
            if not args.json and text and text not in "".join(stream.printed):
                stream.end_line()
                out.print(printable(text), markup=False)
            else:
                stream.end_line()
            if not result.get("ok") and not args.json:
                print_error(err, f"turn ended: {cli_terms(str(result.get('error')))}")
            return dict(result)
        if note is None:
            continue
        method, params = note
        if method in ("permission.request", "ask_user.question"):
            stream.prompt_arrived(note)
        elif method == "event":
            stream.event(params["event"])


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


def _short(value: Any, limit: int) -> str:
    """Foreign text (or a value as JSON) on one line, printable, cut at ``limit``."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = printable(text.replace("\n", "⏎ "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_event(event: dict[str, Any], out: Console, err: Console, streaming: bool) -> bool:
    """Show one event of a turn as ``weald run`` does; returns whether a streamed line is left open."""

    def end() -> bool:
        if streaming:
            out.print()
        return False

    topic, data = event["topic"], event.get("data") or {}
    if topic == "agent.message_delta":
        out.print(printable(data["text"]), end="", markup=False)
        return True
    if topic == "agent.message_end":
        return end()
    if topic == "tool.started":
        streaming = end()
        arguments = escape(_short(data.get("arguments", {}), 160))
        err.print(f"[cyan]▶ {_tool(data)}[/cyan] [dim]{arguments}[/dim]")
    elif topic == "tool.finished":
        err.print(f"[green]✓ {_tool(data)}[/green] [dim]{data.get('duration_ms', 0):.0f} ms[/dim]")
    elif topic == "tool.failed":
        error = escape(_short(data.get("error", ""), 200))
        err.print(f"[yellow]✗ {_tool(data)}[/yellow] [dim]{error}[/dim]")
    elif topic == "agent.recovered":
        streaming = end()
        err.print(f"[magenta]agent restarted by its supervisor (restart {data.get('restarts')})[/magenta]")
    elif topic == "agent.compacted":
        streaming = end()
        err.print(
            f"[dim]context compacted ({escape(str(data.get('reason')))}): "
            f"{data.get('tokens_before', 0):,} -> {data.get('tokens_after', 0):,} tokens[/dim]"
        )
    elif topic == "agent.compaction_failed":
        streaming = end()
        err.print(f"compacting the context failed: {_short(data.get('error', ''), 200)}", style="yellow", markup=False)
    elif topic == "agent.replay_diverged":
        streaming = end()
        print_error(err, f"replay diverged (going on as recorded): {data.get('error')}")
    return streaming


def render_message(message: dict[str, Any], out: Console, err: Console) -> None:
    """Show one stored message (``agent.history``) the way ``weald run`` showed it as it streamed."""
    role = message.get("role")
    if message.get("compaction"):
        err.print(f"[dim]summary of earlier messages: {escape(_short(message.get('content') or '', 200))}[/dim]")
        return
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
    if role == "user":
        out.print(f"[bold]> {escape(printable(text))}[/bold]", soft_wrap=True)
    elif role == "assistant":
        if text:
            out.print(printable(text), markup=False, soft_wrap=True)
        for call in message.get("tool_calls") or []:
            name = call.get("name", "?")
            arguments = call.get("arguments") if call.get("arguments") is not None else call.get("raw_arguments", "")
            err.print(f"[cyan]▶ {escape(str(name))}[/cyan] [dim]{escape(_short(arguments, 160))}[/dim]")
    elif role == "tool":
        failed = bool(message.get("is_error"))
        mark = "[yellow]✗" if failed else "[green]✓"
        name = message.get("name") or message.get("tool_call_id") or "tool"
        err.print(f"{mark} {escape(str(name))}[/] [dim]{escape(_short(text, 160))}[/dim]")
    else:
        out.print(printable(text), markup=False, soft_wrap=True)


# -- permissions and questions --------------------------------------------------------------------------------

NO_ONE_ASKED = "no one could be asked: run with a terminal, or allow it in weald.toml"


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
        params["message"] = NO_ONE_ASKED
        err.print(f"[yellow]not running {tool}:[/yellow] {inline}(no terminal to ask; --yes allows it){below}")
    else:
        err.print(f"[bold yellow]{tool}[/bold yellow] wants to run: {inline.rstrip()}{below}")
        if request.get("reason"):
            err.print(f"  (asked because: {printable(request['reason'])})", markup=False)
        answer = _read_line("allow? [y]es / [n]o / [a]lways: ").strip().lower()
        decision = {"y": "allow", "yes": "allow", "a": "allow_always", "always": "allow_always"}.get(answer, "deny")
    with contextlib.suppress(RPCCallError):
        client.call("permission.respond", {**params, "decision": decision}, timeout=10)


def _answer_question(client: Client, question: dict[str, Any], args: argparse.Namespace, err: Console) -> None:
    err.print(safe_text(question["question"], style="bold"))
    choices = question.get("choices") or []
    for i, choice in enumerate(choices, 1):
        err.print(f"  {i}. {printable(choice)}", markup=False)
    params: dict[str, Any] = {"question_id": question["question_id"]}
    if args.answer is not None:
        params["answer"] = args.answer
    elif sys.stdin.isatty():
        answer = _read_line("> ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(choices):
            answer = choices[int(answer) - 1]
        params["answer"] = answer
    else:
        # As with a permission request: nobody could answer, and the model is told so (never a guess).
        params["decline"] = "no one could be asked: run with a terminal, or give the answer with --answer"
        err.print("[yellow]not answered[/yellow] (no terminal to ask; --answer TEXT answers it)")
    with contextlib.suppress(RPCCallError):
        client.call("ask_user.respond", params, timeout=10)


def _read_line(prompt: str) -> str:
    """A line typed at the terminal; end of input reads as an empty answer."""
    try:
        return input(prompt)
    except EOFError:
        return ""
