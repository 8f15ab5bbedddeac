"""Looking inside a running daemon: ``weald tree``, ``tasks``, ``events`` (live) and ``fault inject | list | clear``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.tree import Tree
from weald.runtime.daemon._cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    connect,
    console,
    print_json,
)
from weald.runtime.daemon._render import Column, event_summary, fitted_table, render_tree
from weald.runtime.daemon.client import DaemonUnavailableError

__all__ = ["cmd_events", "cmd_fault_clear", "cmd_fault_inject", "cmd_fault_list", "cmd_tasks", "cmd_tree"]


def cmd_tree(args: argparse.Namespace) -> int:
    """Draw the live supervision tree (--path for a subtree, --depth for fewer levels)."""
    params: dict[str, Any] = {"path": args.path}
    if args.depth is not None:
        params["depth"] = args.depth
    with connect(args) as client:
        root = client.call("tree", params, timeout=60)
    if args.json:
        print_json(root)
        return EXIT_OK
    console().print(render_tree(root))
    return EXIT_OK


# -- tasks --------------------------------------------------------------------------------------------------

VIEWS = ("all", "open", "ready", "in_progress", "blocked", "done", "tree")


def cmd_tasks(args: argparse.Namespace) -> int:
    """List the task tracker's tasks for a project (or an agent's session); --view tree draws them nested."""
    params: dict[str, Any] = {"view": "all" if args.view == "tree" else args.view, "scope": args.scope}
    if args.agent:
        params["agent_id"] = args.agent
    else:
        project = (Path.cwd() / (args.cwd or ".")).resolve()
        if not project.is_dir():
            raise CommandError(f"weald tasks: --cwd {project}: no such directory", EXIT_USAGE)
        params["working_dir"] = str(project)
    with connect(args) as client:
        result = client.call("tasks.list", params, timeout=30)
    tasks = result["tasks"]
    if args.json:
        print_json({**result, "view": args.view})
        return EXIT_OK
    out = console()
    where = f"agent {args.agent}'s session" if args.scope == "session" else params.get("working_dir") or args.agent
    if not tasks:
        which = "" if args.view in ("all", "tree") else " " + args.view
        out.print(f"no tasks{which} for {where}", markup=False, soft_wrap=True)
        return EXIT_OK
    if args.view == "tree":
        out.print(_task_tree(tasks, str(where)))
        return EXIT_OK
    rows = [
        {
            "id": t["id"],
            "status": t["status"],
            "title": t["title"],
            "blocked by": ", ".join(t.get("blocked_by") or []),
            "parent": t.get("parent_id") or "",
        }
        for t in tasks
    ]
    columns = [
        Column("id", priority=0, no_wrap=True, style="bold"),
        Column("status", priority=0, no_wrap=True),
        Column("title", priority=0, fold=True, min_width=16),
        Column("blocked by", priority=1, fold=True),
        Column("parent", priority=2, no_wrap=True),
    ]
    out.print(fitted_table(columns, rows, out.width))
    return EXIT_OK


def _task_tree(tasks: list[dict[str, Any]], where: str) -> Tree:
    by_id = {t["id"]: t for t in tasks}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for task in tasks:
        parent = task.get("parent_id")
        children.setdefault(parent if parent in by_id else None, []).append(task)
    colours = {"done": "green", "in_progress": "cyan", "blocked": "red"}

    def label(task: dict[str, Any]) -> str:
        colour = colours.get(task["status"], "white")
        blocked = task.get("blocked_by") or []
        after = f" [dim](blocked by {escape(', '.join(blocked))})[/dim]" if blocked else ""
        return f"[bold]{escape(task['id'])}[/bold] [{colour}]{task['status']}[/{colour}] {escape(task['title'])}{after}"

    root = Tree(f"tasks of {escape(where)}")

    def add(branch: Tree, parent: str | None, seen: set[str]) -> None:
        for task in children.get(parent, []):
            if task["id"] in seen:
                continue
            seen.add(task["id"])
            add(branch.add(label(task)), task["id"], seen)

    add(root, None, set())
    return root


# -- events -------------------------------------------------------------------------------------------------


def cmd_events(args: argparse.Namespace) -> int:
    """Follow the daemon's events live, as tail -f follows a file, until Ctrl-C (or --count events).

    --topic T (repeatable, * wildcards: agent.*) chooses topics; --agent ID one
    agent's; --path P the events of the actors under a tree path. --json prints
    one JSON object a line.
    """
    params: dict[str, Any] = {"topics": args.topic or ["*"]}
    if args.agent:
        params["agent_id"] = args.agent
    path = args.path.rstrip("/") if args.path else None
    out = console()
    seen = 0
    with connect(args) as client:
        client.call("events.subscribe", params, timeout=30)
        if not args.json:
            console(stderr=True).print("[dim]following events (Ctrl-C stops)[/dim]")
        while args.count is None or seen < args.count:
            note = client.next_notification(timeout=0.5)
            if note is None:
                if client.broken:
                    raise DaemonUnavailableError("the daemon closed the connection (it stopped)")
                continue
            method, payload = note
            if method != "event":
                continue
            event = payload["event"]
            source = str(event.get("source") or "")
            if path and not (source == path or source.startswith(path + "/")):
                continue
            seen += 1
            if args.json:
                print(json.dumps(event, default=str), flush=True)
            else:
                when = time.strftime("%H:%M:%S", time.localtime(event.get("time") or time.time()))
                out.print(
                    f"[dim]{when}[/dim] [cyan]{escape(event.get('topic', ''))}[/cyan] {escape(source)} "
                    f"[dim]{escape(event_summary(event, limit=120))}[/dim]",
                    soft_wrap=True,
                )
    return EXIT_OK


# -- faults ---------------------------------------------------------------------------------------------------


def _fault_from_words(words: list[str]) -> dict[str, Any]:
    """A fault from ``KEY=VALUE`` words (values read as JSON when they parse: count=1) or one JSON object."""
    if len(words) == 1 and words[0].lstrip().startswith("{"):
        try:
            given = json.loads(words[0])
        except json.JSONDecodeError as exc:
            raise CommandError(f"weald fault inject: the fault is not valid JSON: {exc}", EXIT_USAGE) from exc
        if not isinstance(given, dict):
            raise CommandError("weald fault inject: the fault must be a JSON object", EXIT_USAGE)
        return dict(given)
    fault: dict[str, Any] = {}
    for word in words:
        key, found, value = word.partition("=")
        if not found or not key:
            raise CommandError(
                f"weald fault inject: {word!r}: expected KEY=VALUE (target=tool kind=crash tool=read_file)",
                EXIT_USAGE,
            )
        try:
            fault[key] = json.loads(value)
        except json.JSONDecodeError:
            fault[key] = value
    return fault


def cmd_fault_inject(args: argparse.Namespace) -> int:
    """Inject a fault into the running daemon (started with --faults or [faults] enabled).

    The fault is KEY=VALUE words, as in a fault file's [[faults]] table
    (target=tool kind=crash tool=read_file count=1), or one JSON object.
    See docs/faults.md for every key.
    """
    fault = _fault_from_words(args.fault)
    with connect(args) as client:
        fault_id = client.call("fault.inject", {"fault": fault}, timeout=30)["id"]
    if args.json:
        print_json({"id": fault_id, "fault": fault})
    else:
        console().print(f"injected fault {fault_id} (weald fault clear {fault_id} removes it)", markup=False)
    return EXIT_OK


def cmd_fault_list(args: argparse.Namespace) -> int:
    """List the daemon's faults: what each targets, how often it fired."""
    with connect(args) as client:
        listed = client.call("fault.list", timeout=30)
    if args.json:
        print_json(listed)
        return EXIT_OK
    out = console()
    faults = listed.get("faults") or []
    if not faults:
        out.print("no faults (weald fault inject target=... kind=... adds one)")
        return EXIT_OK
    rows = []
    for f in faults:
        spec = f.get("spec") or {}
        what = {k: v for k, v in spec.items() if k != "id" and v is not None} if isinstance(spec, dict) else spec
        rows.append(
            {
                "id": str(f.get("id", "")),
                "fires": str(f.get("fires", 0)),
                "fault": " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in what.items())
                if isinstance(what, dict)
                else str(what),
                "state": "used up" if f.get("exhausted") else "armed",
            }
        )
    columns = [
        Column("id", priority=0, no_wrap=True, style="bold"),
        Column("fires", priority=0, no_wrap=True, justify="right"),
        Column("state", priority=2, no_wrap=True),
        Column("fault", priority=0, fold=True, min_width=20),
    ]
    out.print(fitted_table(columns, rows, out.width))
    return EXIT_OK


def cmd_fault_clear(args: argparse.Namespace) -> int:
    """Remove one fault (by id), or every fault."""
    params = {"id": args.fault_id} if args.fault_id else {}
    with connect(args) as client:
        cleared = client.call("fault.clear", params, timeout=30)["cleared"]
    if args.json:
        print_json({"cleared": cleared})
    else:
        console().print(f"cleared {cleared} fault{'s' if cleared != 1 else ''}", markup=False)
    return EXIT_OK if cleared or not args.fault_id else EXIT_FAILED
