r"""How the CLI and the demo draw what the daemon answers: rich renderables from plain JSON-RPC data.

Both ``weald`` commands and ``weald demo`` draw through here, so neither imports the other.

Text that came from a model, a tool or a server never reaches the terminal
raw: `printable` shows every character that steers a terminal as an escape
(``\x1b``, ``\u202e``), every view built here passes foreign text through
it, and `SafeConsole`, the console every command prints with, passes
everything it draws through it once more, so that a view that forgets cannot
let an escape through.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

__all__ = [
    "Column",
    "PrintableFormatter",
    "SafeConsole",
    "StreamedTable",
    "error_line",
    "event_summary",
    "events_table",
    "fitted_table",
    "flatten",
    "format_value",
    "key_value_table",
    "printable",
    "render_config",
    "render_debug_state",
    "render_status",
    "render_tree",
    "safe_text",
]


# -- foreign text ---------------------------------------------------------------------------------------

# What a terminal acts on rather than shows: C0 controls but tab and newline
# (ESC starts CSI, OSC 0 titles, OSC 52 clipboard writes, clear-screen; CR
# overwrites a line), DEL, the C1 controls (U+009B is a one-byte CSI), the
# bidirectional overrides and isolates (they reorder what follows: "Trojan
# Source"), the line and paragraph separators, and lone surrogates (which no
# terminal encoding can write: printing one raised UnicodeEncodeError).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u206f\ud800-\udfff]"
)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    r"""``value`` as text a terminal shows as it is: every character that would steer it written as an escape.

    ``"ok\x1b[2K"`` (with an ESC) becomes ``"ok\\x1b[2K"`` (a backslash, then ``x1b``): the
    terminal shows the escape instead of acting on it. Newlines and tabs stay.
    Every place the CLI prints text that came from a model, a tool, a server
    or a file passes it through here (`SafeConsole` does it once more).
    """
    shown = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escaped, shown) if _UNSAFE.search(shown) else shown


def safe_text(value: object, style: str = "") -> Text:
    """Foreign text as a rich `Text`: `printable`, and never read as markup (``[link=...]`` stays text)."""
    return Text(printable(value), style=style)


class SafeConsole(Console):
    """A rich console that draws every character that would steer the terminal as an escape.

    Rich writes its own colours and cursor moves from styles and control
    segments, never from the text of a segment; the text is what a renderable
    was given. Escaping it here catches foreign text a view forgot to pass
    through `printable`.
    """

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        """Render as rich does, with each text segment passed through `printable`."""
        for segment in super().render(renderable, options):
            if segment.control or not _UNSAFE.search(segment.text):
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style, segment.control)


class PrintableFormatter(logging.Formatter):
    """A log formatter whose lines are `printable` (``weald serve`` logs what servers and tools say)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record formatted as usual, then made printable."""
        return printable(super().format(record))


def render_tree(root: dict[str, Any]) -> Tree:
    """The tree as rich draws it: path, kind, status, restarts, mailbox, escalations, faults."""

    def label(node: dict[str, Any]) -> str:
        name = escape(printable(node["path"].rsplit("/", 1)[-1] or "/"))
        colour = {"running": "green", "restarting": "yellow", "stopped": "red"}.get(node["status"], "white")
        kind, status = escape(printable(node["kind"])), escape(printable(node["status"]))
        parts = [f"[bold]{name}[/bold]", f"[dim]{kind}[/dim]", f"[{colour}]{status}[/{colour}]"]
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
            parts.append(f"[{colour}]shell sandbox: {escape(printable(node['sandbox']))}[/{colour}]")
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
    parts = [f"[{colour}]mcp {escape(printable(status))}[/{colour}]"]
    if status == "running":
        parts.append(f"tools={server['tools']}")
    if server.get("retry_in") is not None:
        parts.append(f"attempt {server['attempt']}, retry in {server['retry_in']:g} s")
    if server.get("last_error") and status != "running":
        error = str(server["last_error"]).strip().splitlines()[0][:120]
        parts.append(f"[dim]{escape(printable(error))}[/dim]")
    logs = server.get("recent_logs") or []
    if logs:
        data = str(logs[-1].get("data", "")).strip()
        line = data.splitlines()[0][:100] if data else ""
        level = printable(logs[-1].get("level", ""))
        parts.append(f"[dim]log {escape(level)}: {escape(printable(line))}[/dim]")
    return " ".join(parts)


# -- tables that fit the terminal ---------------------------------------------------------------------------


@attrs.frozen
class Column:
    """A column of a `fitted_table`.

    Attributes:
        key: the rows' key for it.
        priority: 0 is never dropped; a narrow terminal drops the highest numbers first.
        no_wrap: its values are never wrapped or cut (ids: a command needs them whole).
        fold: long values wrap onto more lines (paths, values); never cut.
        ellipsis: long values are cut with "…" (only for what no command needs, such as a title).
        min_width: the narrowest it may get.
        header: its heading (default: ``key``).
    """

    key: str
    priority: int = 1
    no_wrap: bool = False
    fold: bool = False
    ellipsis: bool = False
    min_width: int | None = None
    header: str | None = None
    style: str | None = None
    justify: Literal["left", "right"] = "left"


def fitted_table(columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int) -> Table:
    """A table of ``rows`` that fits ``width`` columns without cutting an id or a value a command needs.

    As ``kubectl get`` and ``docker ps`` do, the least important columns are
    dropped first (highest ``priority``) until what is left fits; within it,
    values that may be long wrap (``fold``), and only titles are cut.
    """
    return _table(_fitting_columns(columns, rows, width), rows)


def _fitting_columns(columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int) -> list[Column]:
    """``columns`` less the least important (highest ``priority``) until their narrowest fits ``width``."""
    shown = list(columns)
    while True:
        needed = sum(_narrowest(column, rows) for column in shown) + 2 * (len(shown) - 1)
        droppable = [c for c in shown if c.priority > 0]
        if needed <= width or not droppable:
            return shown
        shown.remove(max(droppable, key=lambda c: (c.priority, shown.index(c))))


class StreamedTable:
    """A table printed as plain lines, a page of rows at a time: for a listing too long to draw at once.

    rich draws about 3,000 rows a second (100,000 agents: half a minute);
    these lines cost a few microseconds each, and the first page shows while
    the next ones are fetched. The columns are chosen from the first page
    as `fitted_table` chooses them, each as wide as its widest value there
    (a ``fold`` or ``ellipsis`` one at most what the terminal leaves it). A
    later value wider than its column is written whole (an id is never cut),
    but for an ``ellipsis`` column's, cut with "…". Every value goes through
    `printable`.
    """

    def __init__(self, columns: Sequence[Column], rows: Sequence[Mapping[str, str]], width: int) -> None:
        shown = _fitting_columns(columns, rows, width)
        widths = {column.key: _narrowest(column, rows) for column in shown}
        spare = max(0, width - sum(widths.values()) - 2 * (len(shown) - 1))
        for column in shown:
            if not column.no_wrap:
                widest = max([len(column.header or column.key), *(cell_len(str(r.get(column.key, ""))) for r in rows)])
                grow = min(spare, max(0, widest - widths[column.key]))
                widths[column.key] += grow
                spare -= grow
        self.columns = shown
        self.widths = widths

    def header(self) -> str:
        """The heading line and the rule under it."""
        titles = self._line({c.key: c.header or c.key for c in self.columns}, cut=False)
        return titles + "\n" + "  ".join("─" * self.widths[c.key] for c in self.columns).rstrip()

    def line(self, row: Mapping[str, str]) -> str:
        """One row as a line (no newline)."""
        return self._line(row, cut=True)

    def _line(self, row: Mapping[str, str], *, cut: bool) -> str:
        cells = []
        for column in self.columns:
            text = printable(str(row.get(column.key, ""))).replace("\n", "⏎ ")
            width = self.widths[column.key]
            used = cell_len(text)
            if cut and column.ellipsis and used > width:
                text = text[: max(0, width - 1)] + "…"
                used = cell_len(text)
            pad = " " * max(0, width - used)
            cells.append(pad + text if column.justify == "right" else text + pad)
        return "  ".join(cells).rstrip()


def _narrowest(column: Column, rows: Sequence[Mapping[str, str]]) -> int:
    """The fewest characters ``column`` can have: all of its widest value when it is never wrapped."""
    header = len(column.header or column.key)
    if column.no_wrap:
        return max([header, *(cell_len(str(row.get(column.key, ""))) for row in rows)])
    return max(header, column.min_width or 8)


def _table(columns: Sequence[Column], rows: Sequence[Mapping[str, str]]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in columns:
        table.add_column(
            column.header or column.key,
            no_wrap=column.no_wrap or column.ellipsis,
            overflow="ellipsis" if column.ellipsis else "fold",
            min_width=_narrowest(column, rows) if column.no_wrap else column.min_width,
            style=column.style,
            justify=column.justify,
            ratio=1 if (column.fold or column.ellipsis) else None,
        )
    for row in rows:
        table.add_row(*(safe_text(row.get(column.key, "")) for column in columns))
    return table


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
    text = printable(text.replace("\n", "⏎ "))
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
        table.add_row(safe_text(key), Text(format_value(item, limit=limit)))
    return table


def _when(stamp: float | None) -> str:
    if not stamp:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(stamp)) + f".{int(stamp % 1 * 1000):03d}"


_REPR = re.compile(r"""^([A-Za-z_][\w.]*)\((['"])(.*)\2\)$""", re.DOTALL)


def error_line(error: object, limit: int = 200) -> str:
    """An error as a person reads it, on one line: ``InjectedFault("x")`` becomes ``InjectedFault: x``.

    Cut at a word, never in the middle of one, with "…" when cut.
    """
    text = str(error).strip()
    match = _REPR.match(text)
    if match:
        text = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(3)}"
    text = printable(" ".join(text.split()))
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


def event_summary(event: Mapping[str, Any], *, limit: int = 60) -> str:
    """An event's data in a line, without what its source already says (the session and agent ids)."""
    data = event.get("data") or {}
    if not isinstance(data, Mapping):
        return format_value(data, limit=limit)
    source = str(event.get("source") or "")
    parts = source.split("/")
    known = {parts[2]} if len(parts) > 2 and parts[1] == "sessions" else set()
    shown = []
    for key, value in data.items():
        if key in ("session_id", "agent_id") and value in known:
            continue
        if key == "agent_path" and value == source:
            continue
        shown.append(f"{printable(key)}={format_value(value, limit=limit)}")
    return ", ".join(shown)


def events_table(events: Sequence[Mapping[str, Any]], *, title: str = "recent events") -> Table:
    """Events one line each: time, topic, source path and a short form of the data (ids the source names left out)."""
    table = Table(title=f"{title} ({len(events)})", title_justify="left", box=box.SIMPLE, pad_edge=False)
    table.add_column("time", style="dim", no_wrap=True, min_width=12)
    table.add_column("topic", style="cyan", no_wrap=True)
    table.add_column("source", overflow="fold", min_width=10)
    table.add_column("data", overflow="fold", ratio=1, min_width=20)
    for event in events:
        table.add_row(
            _when(event.get("time")),
            safe_text(event.get("topic", "")),
            safe_text(event.get("source", "")),
            Text(event_summary(event)),
        )
    return table


# -- commands' views -------------------------------------------------------------------------------------


def render_status(status: Mapping[str, Any]) -> RenderableType:
    """``weald status``: the daemon's pid, socket, store, uptime, agents, connections and turns."""
    shown = dict(status)
    if isinstance(shown.get("uptime"), int | float):
        shown["uptime"] = _duration(float(shown["uptime"]))
    table = Table(show_header=False, box=box.SIMPLE, pad_edge=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key, item in flatten(shown):
        table.add_row(safe_text(key), Text(_NONE_MEANS.get(key, "none") if item is None else format_value(item)))
    return Panel(table, title="[green]weald daemon running[/green]", title_align="left", expand=False)


#: What a missing value of ``weald status`` means, in words (never a bare ``null``).
_NONE_MEANS = {
    "socket": "none (serving on stdio)",
    "store_write_failure": "none (writes reach the store)",
    "spill_bytes": "not measured yet (or the store could not be read)",
    "turns.limit": "no limit (limits.max_concurrent_turns)",
    "sandbox": "not checked",
}


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
        parts.append(Text.assemble(("tools: ", "bold"), printable(", ".join(map(str, state["tools"])))))
    messages = state.get("messages") or []
    if messages:
        table = Table(title=f"last {len(messages)} messages", title_justify="left", box=box.SIMPLE, pad_edge=False)
        table.add_column("role", style="bold", no_wrap=True, min_width=9)
        table.add_column("content", overflow="ellipsis", no_wrap=True, ratio=1)
        table.add_column("tool calls", overflow="ellipsis", no_wrap=True, min_width=10, max_width=30)
        for message in messages:
            calls = message.get("tool_calls") or []
            table.add_row(
                safe_text(message.get("role", "")),
                Text(format_value(message.get("content") or "", limit=100)),
                safe_text(", ".join(str(c) for c in calls)),
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
                safe_text(node.get("path", "")),
                safe_text(node.get("kind", "")),
                safe_text(format_value(node.get("alive"))),
                safe_text(node.get("mailbox", "")),
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
            table.add_row(safe_text(topic), str(count))
        parts.append(table)
    if state.get("recent_events"):
        parts.append(events_table(state["recent_events"]))
    for key, value in state.items():
        if key not in ("daemon", "system", "events", "recent_events"):
            parts.append(key_value_table({key: value}))
    return Group(*parts)


def render_config(
    files: Sequence[str],
    config: Mapping[str, Any],
    *,
    origins: Mapping[str, str] | None = None,
    daemon_wide: Sequence[str] = (),
) -> RenderableType:
    """``weald config show``: the files read, then every key with its value (defaults included) and its origin."""
    head = (
        Text.assemble(("read from: ", "bold"), printable(", ".join(files)))
        if files
        else Text("no weald.toml found: every key has its default", style="dim")
    )
    table = Table(box=box.SIMPLE, pad_edge=False, show_header=True)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    if origins is not None:
        table.add_column("from", overflow="fold")
    for key, value in flatten(config):
        shown = (
            json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, bool) else str(value).lower()
        )
        if origins is None:
            table.add_row(safe_text(key), safe_text(shown))  # folded onto more lines when long, never cut
            continue
        origin = origins.get(key, "default")
        if key.split(".", 1)[0] in daemon_wide:
            origin += " (daemon-wide)"
        table.add_row(safe_text(key), safe_text(shown), safe_text(origin))
    if daemon_wide and origins is not None:
        note = Text(
            "daemon-wide: a running daemon uses its own (from the directory weald serve ran in), not a project's",
            style="dim",
        )
        return Group(head, table, note)
    return Group(head, table)
