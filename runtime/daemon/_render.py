"""How the CLI and the demo draw what the daemon answers: rich renderables from plain JSON-RPC data.

Both ``weald`` commands and ``weald demo`` draw through here, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

from rich.tree import Tree

__all__ = ["render_tree"]


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
        if node.get("children_hidden"):
            parts.append(f"[dim](+{node['children_hidden']} below)[/dim]")
        return " ".join(parts)

    def add(branch: Tree, node: dict[str, Any]) -> None:
        for child in node["children"]:
            add(branch.add(label(child)), child)

    tree = Tree(label(root))
    add(tree, root)
    return tree
