"""How the CLI and the demo draw what the daemon answers: rich renderables from plain JSON-RPC data.

Both ``weald`` commands and ``weald demo`` draw through here, so neither imports the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

__all__ = [
    "events_table",
    "flatten",
    "format_value",
    "key_value_table",
    "render_config",
    "render_debug_state",
    "render_status",
    "render_tree",
]


def render_tree(root: dict[str, Any]) -> Tree:
    """The tree as rich draws it: path, kind, status, restarts, mailbox, escalations, faults."""

    def label(node: dict[str, Any]) -> str:
        name = node["path"].rsplit("/", 1)[-1] or "/"
        colour = {"running": "green", "restarting": "yellow", "stopped": "red"}.get(node["status"], "white")
        parts = [f"[bold]{name}[/bold]", f"[dim]{node['kind']}[/dim]", f"[{colour}]{node['status']}[/{colour}]"]
        if node.get("restarts"):
            parts.append(f"[yellow]restarts={node['restarts']}[/yellow]")
        if node.get("mailbox"):
            parts.append(f"mailbox={node['mailbox']}")
        if node.get("escalations"):
            parts.append(f"[red]escalations={node['escalations']}[/red]")
        if node.get("faults"):
            parts.append(f"[red]faults={node['faults']}[/red]")
        server = node.get("mcp")
        if server is not None:
            parts.append(_mcp_label(server))
        if node.get("children_hidden"):
            parts.append(f"[dim](+{node['children_hidden']} below)[/dim]")
        if node.get("sandbox"):
            colour = "green" if node["sandbox"].startswith("bwrap") else "yellow"
            parts.append(f"[{colour}]shell sandbox: {escape(node['sandbox'])}[/{colour}]")
        return " ".join(parts)

    def add(branch: Tree, node: dict[str, Any]) -> None:
        for child in node["children"]:
            add(branch.add(label(child)), child)

    tree = Tree(label(root))
    add(tree, root)
    return tree


def _mcp_label(server: Mapping[str, Any]) -> str:
    """An MCP server's connection in the tree: its state, tools, next retry, last error and log line."""
    status = server["status"]
    colour = {"running": "green", "connecting": "cyan", "authorizing": "cyan", "stopped": "red"}.get(status, "yellow")
    parts = [f"[{colour}]mcp {status}[/{colour}]"]
    if status == "running":
        parts.append(f"tools={server['tools']}")
    if server.get("retry_in") is not None:
        parts.append(f"attempt {server['attempt']}, retry in {server['retry_in']:g} s")
    if server.get("last_error") and status != "running":
        error = str(server["last_error"]).strip().splitlines()[0][:120]
        parts.append(f"[dim]{escape(error)}[/dim]")
    logs = server.get("recent_logs") or []
    if logs:
        data = str(logs[-1].get("data", "")).strip()
        line = data.splitlines()[0][:100] if data else ""
        parts.append(f"[dim]log {logs[-1].get('level', '')}: {escape(line)}[/dim]")
    return " ".join(parts)


# -- values -------------------------------------------------------------------------------------------


def format_value(value: Any, *, limit: int = 200) -> str:
    """A value as a person reads it: JSON spelling (true, null, "x" only inside lists), cut at ``limit``."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:g}"
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def flatten(value: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested tables as dotted keys (``turns.running``); lists and scalars are leaves."""
    rows: list[tuple[str, Any]] = []
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, Mapping) and item:
            rows.extend(flatten(item, name))
        else:
            rows.append((name, item))
    return rows


def key_value_table(value: Mapping[str, Any], *, title: str | None = None, limit: int = 200) -> Table:
    """A two-column table of a mapping's (flattened) keys and values."""
    table = Table(title=title, title_justify="left", show_header=False, box=box.SIMPLE, pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, item in flatten(value):
        table.add_row(key, Text(format_value(item, limit=limit)))
    return table


def _when(stamp: float | None) -> str:
    if not stamp:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{int(stamp % 1 * 1000):03d}"


def events_table(events: Sequence[Mapping[str, Any]], *, title: str = "recent events") -> Table:
    """Events one line each: time, topic, source path and a short form of the data."""
    table = Table(title=f"{title} ({len(events)})", title_justify="left", box=box.SIMPLE, pad_edge=False)
    table.add_column("time", style="dim", no_wrap=True, min_width=12)
    table.add_column("topic", style="cyan", no_wrap=True, min_width=22)
    table.add_column("source", overflow="ellipsis", no_wrap=True, min_width=10, max_width=40)
    table.add_column("data", overflow="ellipsis", no_wrap=True, ratio=1)
    for event in events:
        data = event.get("data") or {}
        short = ", ".join(f"{k}={format_value(v, limit=40)}" for k, v in data.items()) if isinstance(data, dict) else ""
        table.add_row(_when(event.get("time")), event.get("topic", ""), event.get("source", ""), Text(short))
    return table


# -- commands' views -------------------------------------------------------------------------------------


def render_status(status: Mapping[str, Any]) -> RenderableType:
    """``weald status``: the daemon's pid, socket, store, uptime, agents, connections and turns."""
    shown = dict(status)
    if isinstance(shown.get("uptime"), int | float):
        shown["uptime"] = _duration(float(shown["uptime"]))
    return Panel(key_value_table(shown), title="[green]weald daemon running[/green]", title_align="left", expand=False)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [f"{days} d"] if days else []
    if days or hours:
        parts.append(f"{hours} h")
    parts.append(f"{minutes} min")
    if not days:
        parts.append(f"{secs} s")
    return " ".join(parts)


def render_debug_state(state: Mapping[str, Any]) -> RenderableType:
    """``weald debug-state``: an agent's (or, without an id, the daemon's) state as tables."""
    if "daemon" in state and "agent" not in state:
        return _render_daemon_state(state)
    parts: list[RenderableType] = []
    summary = {
        key: state[key]
        for key in ("agent", "session_id", "status", "model", "working_dir", "depth", "restarts", "message_count")
        if key in state
    }
    turn = state.get("turn") or {}
    summary["turn"] = f"{turn.get('id')} (step {turn.get('step')})" if turn.get("id") else "none running"
    if state.get("usage"):
        summary["usage"] = state["usage"]
    for key, value in state.items():
        # Keys a newer daemon adds are shown too, as plain rows.
        if key not in summary and key not in ("turn", "queues", "tools", "messages", "recent_events", "tree"):
            summary[key] = value
    parts.append(key_value_table(summary, title="agent"))
    queues = state.get("queues") or {}
    busy = {name: items for name, items in queues.items() if items}
    if busy:
        parts.append(key_value_table(busy, title="queues"))
    else:
        parts.append(Text("queues: nothing pending, no tool call running", style="dim"))
    if state.get("tools"):
        parts.append(Text.assemble(("tools: ", "bold"), ", ".join(state["tools"])))
    messages = state.get("messages") or []
    if messages:
        table = Table(title=f"last {len(messages)} messages", title_justify="left", box=box.SIMPLE, pad_edge=False)
        table.add_column("role", style="bold", no_wrap=True, min_width=9)
        table.add_column("content", overflow="ellipsis", no_wrap=True, ratio=1)
        table.add_column("tool calls", overflow="ellipsis", no_wrap=True, min_width=10, max_width=30)
        for message in messages:
            calls = message.get("tool_calls") or []
            table.add_row(
                message.get("role", ""),
                Text(format_value(message.get("content") or "", limit=100)),
                ", ".join(str(c) for c in calls),
            )
        parts.append(table)
    if state.get("recent_events"):
        parts.append(events_table(state["recent_events"]))
    if state.get("tree"):
        table = Table(title="its actors", title_justify="left", box=box.SIMPLE, pad_edge=False)
        for column in ("path", "kind", "alive", "mailbox"):
            table.add_column(column, no_wrap=True)
        for node in state["tree"]:
            table.add_row(
                node.get("path", ""),
                node.get("kind", ""),
                format_value(node.get("alive")),
                str(node.get("mailbox", "")),
            )
        parts.append(table)
    return Group(*parts)


def _render_daemon_state(state: Mapping[str, Any]) -> RenderableType:
    parts: list[RenderableType] = []
    if state.get("daemon"):
        parts.append(render_status(state["daemon"]))
    if state.get("system"):
        parts.append(key_value_table(state["system"], title="system"))
    events = dict(state.get("events") or {})
    topics = events.pop("topics", None)
    if events:
        parts.append(key_value_table(events, title="event bus"))
    if topics:
        table = Table(title="events by topic", title_justify="left", box=box.SIMPLE, pad_edge=False)
        table.add_column("topic", style="cyan")
        table.add_column("count", justify="right")
        for topic, count in sorted(topics.items(), key=lambda item: -item[1]):
            table.add_row(topic, str(count))
        parts.append(table)
    if state.get("recent_events"):
        parts.append(events_table(state["recent_events"]))
    for key, value in state.items():
        if key not in ("daemon", "system", "events", "recent_events"):
            parts.append(key_value_table({key: value}))
    return Group(*parts)


def render_config(files: Sequence[str], config: Mapping[str, Any]) -> RenderableType:
    """``weald config show``: the files read, then every key with its value (defaults included)."""
    head = (
        Text.assemble(("read from: ", "bold"), ", ".join(files))
        if files
        else Text("no weald.toml found: every key has its default", style="dim")
    )
    table = Table(box=box.SIMPLE, pad_edge=False, show_header=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, value in flatten(config):
        shown = (
            json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, bool) else str(value).lower()
        )
        table.add_row(key, Text(shown))
    return Group(head, table)
