"""The ``tasks`` tool: a task tracker kept in the runtime's store (the role DETS plays in OTP).

One tool with an ``action``: ``insert``, ``update`` and ``delete`` change one
task, ``batch`` applies several changes atomically (with refs, so a batch can
insert a task and make others depend on it), ``list`` shows a view. Tasks
belong to the project directory by default, or to the session with
``scope: "session"``. Every change is committed to the store before the tool
answers, so an acknowledged change survives a crash of the daemon.

The record type and the reading functions are re-exported here for the
daemon's ``tasks.list`` RPC and the ``weald tasks`` command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._taskstore import (
    MARKERS,
    STATUSES,
    VIEWS,
    BatchOutcome,
    TaskBoard,
    TaskError,
    TaskRecord,
    apply_operation,
    apply_operations,
    list_tasks,
    runtime_store,
    scope_for_project,
    scope_for_session,
)

__all__ = [
    "BatchOutcome",
    "TaskBoard",
    "TaskError",
    "TaskRecord",
    "apply_operations",
    "list_tasks",
    "scope_for_project",
    "scope_for_session",
    "tasks",
]

_ID: Final[Mapping[str, Any]] = {"type": ["string", "integer"]}

_TASK_FIELDS: Final[Mapping[str, Any]] = {
    "title": {"type": "string", "minLength": 1, "description": "One line saying what to do."},
    "status": {"enum": list(STATUSES), "description": "open (default), in_progress, blocked or done."},
    "notes": {"type": "string", "description": "Details, findings, links."},
    "parent_id": {
        "type": ["string", "integer", "null"],
        "description": "The task this one is part of (null clears it).",
    },
    "blocked_by": {
        "type": "array",
        "items": _ID,
        "description": "Ids of tasks that must be done first (replaces the list on update).",
    },
}

_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "action": {
            "enum": ["list", "insert", "update", "delete", "batch"],
            "description": "What to do.",
        },
        "view": {
            "enum": list(VIEWS),
            "description": (
                "For list: tree (default: every task, children indented under parents), all, open, "
                "in_progress, blocked, done, or ready (open with every blocker done)."
            ),
        },
        "id": {**_ID, "description": "For update and delete: the task's id."},
        **_TASK_FIELDS,
        "operations": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "description": (
                "For batch: operations applied in order, all or none. Each has op (insert, update, delete) "
                "and the fields of that action; an insert may give a ref (a name such as 'tests') that "
                "later ids in the batch (id, parent_id, blocked_by) can use before the task has an id."
            ),
            "items": {
                "type": "object",
                "properties": {
                    "op": {"enum": ["insert", "update", "delete"]},
                    "ref": {"type": "string", "minLength": 1},
                    "id": _ID,
                    **_TASK_FIELDS,
                },
                "required": ["op"],
                "additionalProperties": False,
            },
        },
        "scope": {
            "enum": ["project", "session"],
            "description": "Whose tasks: the project's (default, shared by every session in it) or this session's.",
        },
    },
    "required": ["action"],
    "additionalProperties": False,
}

_DESCRIPTION: Final = (
    "Track the tasks of the work in hand; they persist across sessions and restarts. "
    "action=insert (title; optional status, notes, parent_id, blocked_by), update (id and the fields to change), "
    "delete (id), list (view), batch (operations: several inserts/updates/deletes, validated together and "
    "applied all or none; an insert's ref names it for later operations). Ids are assigned: '1', '2'... "
    "A task with unfinished blocked_by starts blocked; marking the blockers done reopens it. "
    "Lines read '[ ] 3 Write tests (under 1; blocked by 2)': [ ] open, [~] in_progress, [!] blocked, [x] done."
)

# Which arguments each action takes, besides action and scope.
_ACTION_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "list": ("view",),
    "insert": ("title", "status", "notes", "parent_id", "blocked_by"),
    "update": ("id", "title", "status", "notes", "parent_id", "blocked_by"),
    "delete": ("id",),
    "batch": ("operations",),
}


def _scope(ctx: ToolContext, scope: str) -> tuple[str, str]:
    if scope == "session":
        if not ctx.session_id:
            raise ToolError("scope 'session' needs a session id, and this call has none; use scope 'project'")
        return scope_for_session(ctx.session_id), "session"
    return scope_for_project(ctx.working_dir), "project"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _records(records: tuple[TaskRecord, ...] | list[TaskRecord]) -> list[Any]:
    return [msgspec.to_builtins(r) for r in records]


def _describe_change(old: TaskRecord, new: TaskRecord) -> list[str]:
    changes = []
    if old.title != new.title:
        changes.append(f"title {old.title!r} -> {new.title!r}")
    if old.status != new.status:
        changes.append(f"status {old.status} -> {new.status}")
    if old.notes != new.notes:
        changes.append("notes")
    if old.parent_id != new.parent_id:
        changes.append(f"parent {old.parent_id or 'none'} -> {new.parent_id or 'none'}")
    if old.blocked_by != new.blocked_by:
        changes.append(f"blocked_by [{', '.join(old.blocked_by)}] -> [{', '.join(new.blocked_by)}]")
    return changes


def _report(outcome: BatchOutcome, board: TaskBoard, where: str) -> str:
    lines: list[str] = []
    if outcome.refs:
        lines.append("Refs: " + ", ".join(f"{ref} = {task_id}" for ref, task_id in outcome.refs.items()))
    if outcome.inserted:
        lines.append(f"Added {_count(len(outcome.inserted), 'task')}:")
        lines.extend("  " + board.line(board.tasks.get(t.id, t)) for t in outcome.inserted)
    for task in outcome.updated:
        change = "; ".join(_describe_change(outcome.previous[task.id], task)) or "no change"
        lines.append(f"Updated {task.id}: {change}")
        lines.append("  " + board.line(board.tasks.get(task.id, task)))
    lines.extend(f"Deleted {MARKERS[task.status]} {task.id} {task.title}" for task in outcome.deleted)
    if outcome.pruned:
        lines.append(f"Removed the deleted tasks from the blocked_by of {', '.join(outcome.pruned)}.")
    if outcome.unblocked:
        lines.append("Unblocked (now open):")
        lines.extend("  " + board.line(board.tasks.get(t.id, t)) for t in outcome.unblocked)
    if not lines:
        lines.append("Nothing changed.")
    ready = sum(1 for t in board.tasks.values() if board.is_ready(t))
    lines.append(f"{_count(len(board.tasks), 'task')} in the {where} scope, {ready} ready.")
    return "\n".join(lines)


def _list(board: TaskBoard, view: str, where: str) -> ToolResult:
    shown = board.view(view)
    data = {"scope": where, "view": view, "tasks": _records(shown)}
    if not shown:
        if not board.tasks:
            text = f"No tasks in the {where} scope yet. Add one with action=insert (or several with batch)."
        else:
            text = f"No tasks in view {view!r} ({len(board.tasks)} in the {where} scope). Try view 'tree' or 'all'."
        return ToolResult.success(text, data=data)
    header = f"{len(shown)} of {_count(len(board.tasks), 'task')} in the {where} scope, view {view}:"
    return ToolResult.success("\n".join([header, *board.lines(view)]), data=data)


@tool(
    name="tasks",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="allow",
    kind="runtime",
)
def tasks(ctx: ToolContext, action: str, scope: str = "project", **fields: Any) -> ToolResult:
    """Insert, update, delete, batch-change or list the tasks of the project (or session).

    Runs in a worker thread: the store's blocking methods are used.
    """
    allowed = _ACTION_FIELDS[action]
    extra = sorted(set(fields) - set(allowed))
    if extra:
        raise ToolError(
            f"action {action!r} does not take {', '.join(extra)}; it takes {', '.join(allowed)} (and scope).",
        )
    store = runtime_store(ctx, "tasks")
    scope_key, where = _scope(ctx, scope)
    if action == "list":
        return _list(TaskBoard.load(store, scope_key), fields.get("view", "tree"), where)
    try:
        if action == "batch":
            outcome = apply_operations(store, scope_key, fields["operations"])
        else:
            outcome = apply_operation(store, scope_key, {"op": action, **fields})
    except TaskError as exc:
        return ToolResult.error(str(exc), data={"problems": list(exc.problems)})
    board = TaskBoard.load(store, scope_key)
    data = {
        "scope": where,
        "inserted": _records(outcome.inserted),
        "updated": _records(outcome.updated),
        "deleted": [t.id for t in outcome.deleted],
        "unblocked": [t.id for t in outcome.unblocked],
        "refs": dict(outcome.refs),
    }
    return ToolResult.success(_report(outcome, board, where), data=data)
