"""``weald agent ...``: list, stop, abort, read, compact and inspect the daemon's agents; answer their requests.

The commands a person uses most also have short names (``weald agents``,
``weald abort``, ``weald history``, ``weald prompt``), the same commands.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text
from weald.runtime.daemon._cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    connect,
    console,
    print_json,
)
from weald.runtime.daemon._cli_run import render_message
from weald.runtime.daemon._render import Column, StreamedTable, fitted_table, printable, render_debug_state
from weald.runtime.daemon.client import RPCCallError

__all__ = [
    "cmd_abort",
    "cmd_agent_stop",
    "cmd_agents",
    "cmd_answer",
    "cmd_compact",
    "cmd_debug_state",
    "cmd_history",
    "cmd_permissions",
]


def agent_state(row: dict[str, Any]) -> str:
    """One word for where an agent is: stopped, hibernated, idle, running (a turn), restarting..."""
    if row.get("status") == "stopped":
        return "stopped"
    state = str(row.get("state") or row.get("status") or "")
    if state == "running" and row.get("turn_id"):
        return f"running turn (step {row.get('step') or 0})"
    return state


_PAGE = 1000
"""The agents one ``agent.list`` request asks for: a page printed while the next is fetched."""

_COLUMNS = [
    Column("agent", priority=0, no_wrap=True, style="bold"),
    Column("state", priority=1, no_wrap=True),
    Column("for", priority=2, ellipsis=True, min_width=12, header="first prompt"),
    Column("working dir", priority=3, fold=True, min_width=16),
    Column("model", priority=4, fold=True),
    Column("context", priority=5, no_wrap=True),
    Column("restarts", priority=6, no_wrap=True, justify="right"),
]


def cmd_agents(args: argparse.Namespace) -> int:
    """List the agents the daemon knows: id, state, what each is for, model, context, working directory.

    Ids are never cut: weald prompt, abort, history, agent stop and
    debug-state take them. A narrow terminal drops the less useful columns first.
    The agents come a page at a time, in id order; a list longer than a page
    is printed as plain lines while the next page is fetched. --limit N shows
    the first N.
    """
    out = console()
    with connect(args) as client:
        listing = _Pages(client, args)
        pages = iter(listing)
        first, more = next(pages)
        if args.json:
            agents = list(first)
            if more:
                with _progress() as progress:
                    task = progress.add_task("listing agents", total=None, completed=len(agents))
                    for rows, _ in pages:
                        agents += rows
                        progress.update(task, completed=len(agents))
            print_json(agents)
            return EXIT_OK
        if not first:
            hint = "" if args.all else " (weald agents --all lists stopped ones too)"
            out.print(f'no agents{hint}; weald run --keep "..." starts one that stays', markup=False)
            return EXIT_OK
        if not more:
            out.print(fitted_table(_COLUMNS, [_table_row(a) for a in first], out.width))
            if args.long:
                for a in first:
                    out.print(Text(printable(a["agent_id"]), style="bold"))
                    out.print(Text(printable(_long_lines(a))), soft_wrap=True)
            shown = len(first)
        else:
            shown = _stream(out, first, pages, args)
    if listing.cut:
        console(stderr=True).print(
            f"(the first {shown:,} agents; more follow: a larger --limit, or none, shows them)", markup=False
        )
    return EXIT_OK


class _Pages:
    """The agents a page at a time (``agent.list`` with ``limit`` and ``after``), each page with whether more follow.

    ``--limit`` ends it after that many (``cut`` then says whether agents
    were left out); ``--all`` includes stopped agents, ``--long`` asks for
    each one's spill bytes too.
    """

    def __init__(self, client: Any, args: argparse.Namespace) -> None:
        self._client = client
        self._args = args
        self.cut = False

    def __iter__(self) -> Iterator[tuple[list[dict[str, Any]], bool]]:
        wanted: int | None = self._args.limit
        after: str | None = None
        got = 0
        while True:
            limit = _PAGE if wanted is None else min(_PAGE, wanted - got)
            params: dict[str, Any] = {"limit": limit, "stopped": self._args.all}
            if after is not None:
                params["after"] = after
            if self._args.long:
                params["long"] = True
            page = self._client.call("agent.list", params, timeout=60)
            rows: list[dict[str, Any]] = page["rows"]
            got += len(rows)
            after = page["next_after"]
            more = after is not None and (wanted is None or got < wanted)
            self.cut = after is not None and not more
            yield rows, more
            if not more:
                return


def _stream(
    out: Any, first: list[dict[str, Any]], pages: Iterator[tuple[list[dict[str, Any]], bool]], args: argparse.Namespace
) -> int:
    """A list longer than a page as plain lines, each page printed as it comes; how many were."""
    table = StreamedTable(_COLUMNS, [_table_row(a) for a in first], out.width)
    write = out.file.write
    write(table.header() + "\n")
    shown = 0
    rows = first
    while True:
        for a in rows:
            write(table.line(_table_row(a)) + "\n")
            if args.long:
                write(printable(_long_lines(a)) + "\n")
        shown += len(rows)
        out.file.flush()
        try:
            rows, _ = next(pages)
        except StopIteration:
            break
    return shown


def _progress() -> Progress:
    """A count of the agents listed so far, on stderr (a terminal only), gone when done."""
    err = console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def _table_row(a: dict[str, Any]) -> dict[str, str]:
    context = a.get("context") or {}
    return {
        "agent": a["agent_id"],
        "state": agent_state(a),
        "for": a.get("title") or "",
        "model": _short_model(a.get("model") or ""),
        "context": f"{context['tokens']:,}/{context['input_budget']:,}" if context else "",
        "restarts": str(a.get("restarts", "")),
        "working dir": a.get("working_dir") or "",
    }


def _long_lines(a: dict[str, Any]) -> str:
    """What --long adds under an agent: its configuration files and its spilled output."""
    lines = f"  configuration: {_describe_config(a.get('config') or {})}"
    if "spill_bytes" in a:
        lines += f"\n  spilled output: {int(a['spill_bytes']):,} bytes"
    return lines


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


def cmd_agent_stop(args: argparse.Namespace) -> int:
    """Stop agents for good: their running turn is aborted and they are not restored; their history stays.

    --all-idle stops every agent that is not running a turn.
    """
    if bool(args.agent_ids) == bool(args.all_idle):
        raise CommandError("weald agent stop: give agent ids, or --all-idle (not both)", EXIT_USAGE)
    out = console()
    results: list[dict[str, Any]] = []
    failed = False
    with connect(args) as client:
        ids = list(args.agent_ids)
        # Each one's own row (not the whole list: a daemon may have 100,000), or every stored one a page at a time.
        unknown = [i for i in ids if not client.call("agent.list", {"agent_id": i}, timeout=60)["rows"]]
        if unknown:
            raise CommandError(
                f"weald agent stop: no agent {', '.join(map(repr, unknown))} (weald agents --all lists them)"
            )
        if args.all_idle:
            listing = argparse.Namespace(limit=None, all=False, long=False)
            ids = [a["agent_id"] for rows, _ in _Pages(client, listing) for a in rows if not a.get("turn_id")]
        for agent_id in ids:
            try:
                stopped = client.call("agent.stop", {"agent_id": agent_id}, timeout=60)["stopped"]
            except RPCCallError as exc:
                results.append({"agent_id": agent_id, "stopped": False, "error": exc.message})
                failed = True
                continue
            results.append({"agent_id": agent_id, "stopped": stopped})
    if args.json:
        print_json(results)
    else:
        if not results:
            out.print("no idle agents to stop")
        for entry in results:
            if entry.get("error"):
                console(stderr=True).print(f"{entry['agent_id']}: {entry['error']}", style="red", markup=False)
            elif entry["stopped"]:
                out.print(f"stopped {entry['agent_id']}", markup=False)
            else:
                out.print(f"{entry['agent_id']} was not running; it is marked stopped", markup=False)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_abort(args: argparse.Namespace) -> int:
    """Abort an agent's running turn (and the prompts waiting for one); the agent stays, with its history."""
    with connect(args) as client:
        aborted = client.call("agent.abort", {"agent_id": args.agent_id}, timeout=60)["aborted"]
    if args.json:
        print_json({"agent_id": args.agent_id, "aborted": aborted})
    elif aborted:
        console().print(f"aborted the running turn of {args.agent_id}", markup=False)
    else:
        console().print(f"{args.agent_id} had no turn running; nothing to abort", markup=False)
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    """Show an agent's conversation (stopped agents' too), drawn as weald run streamed it.

    --limit N shows the last N messages; --before SEQ pages further back.
    """
    params: dict[str, Any] = {"agent_id": args.agent_id, "limit": args.limit}
    if args.before is not None:
        params["before"] = args.before
    with connect(args) as client:
        page = client.call("agent.history", params, timeout=60)
    if args.json:
        print_json(page)
        return EXIT_OK
    out, err = console(), console(stderr=True)
    if not page["messages"]:
        out.print(f"{args.agent_id} has no messages yet", markup=False)
    for message in page["messages"]:
        render_message(message, out, err)
    if page.get("next_before") is not None:
        err.print(
            f"[dim](earlier messages: weald history {escape(args.agent_id)} --before {page['next_before']})[/dim]"
        )
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    """Compact an agent's context now: its model summarizes the older part of the conversation.

    Between turns it runs at once; during a turn, before the agent's next
    model call. Exits 1 if the compaction failed.
    """
    with connect(args) as client:
        result = client.call("agent.compact", {"agent_id": args.agent_id}, timeout=args.timeout)
    if args.json:
        print_json(result)
    elif result["compacted"]:
        console().print(
            f"{printable(args.agent_id)}: compacted {result['replaced']} messages: "
            f"{result['tokens_before']:,} -> {result['tokens_after']:,} estimated tokens",
            markup=False,
        )
    else:
        console().print(f"{printable(args.agent_id)}: not compacted: {printable(result['detail'])}", markup=False)
    failed = not result["compacted"] and not str(result.get("detail") or "").startswith("nothing to compact")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_debug_state(args: argparse.Namespace) -> int:
    """Show an agent's debug state (or the daemon's, without an id)."""
    with connect(args) as client:
        params = {"agent_id": args.agent_id, "events": args.events, "messages": args.messages}
        state = client.call("debug_state", {k: v for k, v in params.items() if v is not None}, timeout=30)
    if args.json:
        print_json(state)
    else:
        console().print(render_debug_state(state))
    return EXIT_OK


# -- requests waiting for a person ------------------------------------------------------------------------------


def cmd_permissions(args: argparse.Namespace) -> int:
    """List the permission requests and questions waiting for an answer (weald answer ID ... answers one)."""
    params = {"agent_id": args.agent} if args.agent else {}
    with connect(args) as client:
        permissions = client.call("permission.list", params, timeout=30)
        questions = client.call("ask_user.list", params, timeout=30)
    if args.json:
        print_json({"permissions": permissions, "questions": questions})
        return EXIT_OK
    out = console()
    if not permissions and not questions:
        out.print("nothing is waiting for an answer")
        return EXIT_OK
    for p in permissions:
        what = _one_line(p.get("subject") or p.get("arguments"))
        out.print(
            f"[bold]{escape(p['request_id'])}[/bold] {escape(p.get('agent_id') or '')} wants to run "
            f"[bold]{escape(str(p.get('tool')))}[/bold]: {escape(what)}",
            soft_wrap=True,
        )
        out.print(f"  weald answer {escape(p['request_id'])} allow|deny|always", style="dim", soft_wrap=True)
    for q in questions:
        choices = f" [{', '.join(str(c) for c in q['choices'])}]" if q.get("choices") else ""
        out.print(
            f"[bold]{escape(q['question_id'])}[/bold] {escape(q.get('agent_id') or '')} asks: "
            f"{escape(_one_line(q.get('question')) + choices)}",
            soft_wrap=True,
        )
        out.print(
            f'  weald answer {escape(q["question_id"])} "ANSWER" (or the number of a choice)',
            style="dim",
            soft_wrap=True,
        )
    return EXIT_OK


def _one_line(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = (text or "").replace("\n", "⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


_DECISIONS = {"allow": "allow", "yes": "allow", "y": "allow", "deny": "deny", "no": "deny", "n": "deny"}
_DECISIONS |= {"always": "allow_always", "allow_always": "allow_always", "a": "allow_always"}


def cmd_answer(args: argparse.Namespace) -> int:
    """Answer a waiting permission request (allow, deny or always) or question (the answer's text).

    weald permissions lists what waits, with the ids.
    """
    with connect(args) as client:
        permissions = {p["request_id"]: p for p in client.call("permission.list", {}, timeout=30)}
        questions = {q["question_id"]: q for q in client.call("ask_user.list", {}, timeout=30)}
        if args.id in permissions:
            decision = _DECISIONS.get(args.answer.strip().lower())
            if decision is None:
                raise CommandError(
                    f"weald answer: {args.id} is a permission request: answer allow, deny or always "
                    f"(not {args.answer!r})",
                    EXIT_USAGE,
                )
            client.call("permission.respond", {"request_id": args.id, "decision": decision}, timeout=30)
            result: dict[str, Any] = {"id": args.id, "kind": "permission", "decision": decision}
        elif args.id in questions:
            answer = args.answer
            choices = questions[args.id].get("choices") or []
            if answer.isdigit() and 1 <= int(answer) <= len(choices):
                answer = choices[int(answer) - 1]
            client.call("ask_user.respond", {"question_id": args.id, "answer": answer}, timeout=30)
            result = {"id": args.id, "kind": "question", "answer": answer}
        else:
            raise CommandError(
                f"weald answer: nothing waits under {args.id!r} (answered, timed out or unknown); "
                "weald permissions lists what waits"
            )
    if args.json:
        print_json(result)
    elif result["kind"] == "permission":
        console().print(f"answered {args.id}: {result['decision']}", markup=False)
    else:
        console().print(f"answered {args.id}: {result['answer']}", markup=False)
    return EXIT_OK
