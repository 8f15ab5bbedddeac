"""The task tracker's records in the store: scopes, views, and validated batches.

Tasks live in the store's ``tasks`` namespace. A scope (one project, or one
session) owns the keys ``<scope>/<id>``, one `TaskRecord` each, and
``<scope>:next``, the next id to hand out. Scope ids are fixed-length
hashes (`scope_for_project`, `scope_for_session`), so no scope's prefix is
another's and different projects never see each other's tasks.

Ids are short decimal strings, ``"1"``, ``"2"``..., assigned per scope and
never reused after a delete, so an id the model remembers never comes to
mean another task. Every change goes through `apply_operations`: a batch is
parsed and checked as a whole (unknown ids, bad fields, missing parents,
cycles in ``parent_id`` or ``blocked_by``) against the scope's tasks as they
will be after it, then written together with the id counter, or rejected
with nothing written. Reading, checking and writing happen in one store
transaction holding the scope's transaction-level lock (`Store.transaction`:
``pg_advisory_xact_lock`` in PostgreSQL, the file's write lock in sqlite), so
concurrent batches never hand out the same id nor lose an update, whether
they come from one daemon or from several sharing a database.

Statuses follow dependencies unless a call says otherwise: a task given
``blocked_by`` without a ``status`` is ``blocked`` while any blocker is not
done, and ``open`` once all are; a blocked task whose blockers are all done
(or deleted) by a batch moves to ``open`` and is reported as unblocked.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import msgspec
from weald.runtime import Store, StoreTransaction
from weald.tools._contract import ToolContext, ToolError

__all__ = [
    "MARKERS",
    "NAMESPACE",
    "STATUSES",
    "VIEWS",
    "BatchOutcome",
    "Status",
    "TaskBoard",
    "TaskError",
    "TaskRecord",
    "View",
    "apply_operation",
    "apply_operations",
    "list_tasks",
    "runtime_store",
    "scope_for_project",
    "scope_for_session",
]

NAMESPACE: Final = "tasks"
"""The store namespace that holds every scope's tasks."""

Status = Literal["open", "in_progress", "blocked", "done"]
View = Literal["tree", "all", "open", "in_progress", "blocked", "done", "ready"]

STATUSES: Final[tuple[Status, ...]] = ("open", "in_progress", "blocked", "done")
VIEWS: Final[tuple[View, ...]] = ("tree", "all", "open", "in_progress", "blocked", "done", "ready")

MARKERS: Final[Mapping[Status, str]] = {"open": "[ ]", "in_progress": "[~]", "blocked": "[!]", "done": "[x]"}
"""How each status is drawn in a task line."""

MAX_OPERATIONS: Final = 100
MAX_TITLE: Final = 200
MAX_NOTES: Final = 4000
MAX_BLOCKERS: Final = 50
MAX_REF: Final = 40

# Fields each kind of operation may carry (besides "op").
_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "insert": ("ref", "title", "status", "notes", "parent_id", "blocked_by"),
    "update": ("id", "title", "status", "notes", "parent_id", "blocked_by"),
    "delete": ("id",),
}
_KINDS: Final[Mapping[str, Literal["insert", "update", "delete"]]] = {
    "insert": "insert",
    "update": "update",
    "delete": "delete",
}
_STATUS_BY_NAME: Final[Mapping[str, Status]] = {s: s for s in STATUSES}
_VIEW_BY_NAME: Final[Mapping[str, View]] = {v: v for v in VIEWS}
_DIGITS = re.compile(r"[0-9]+")


class TaskRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One task, as stored and as returned to programs.

    Attributes:
        id: short decimal id, unique in its scope (``"1"``, ``"2"``...).
        title: one line saying what to do.
        status: ``open``, ``in_progress``, ``blocked`` or ``done``.
        notes: free text (details, findings, links).
        parent_id: the id of the task this one is part of, or None.
        blocked_by: ids of the tasks that must be done before this one.
        created: when the task was inserted (Unix seconds).
        updated: when the task last changed (Unix seconds).
    """

    id: str
    title: str
    status: Status = "open"
    notes: str = ""
    parent_id: str | None = None
    blocked_by: tuple[str, ...] = ()
    created: float = 0.0
    updated: float = 0.0


class TaskError(ToolError):
    """A task operation was refused; nothing was written.

    Attributes:
        problems: one line per problem found, each naming the field (and the
            batch operation) at fault and what was expected.
    """

    def __init__(self, message: str, *, problems: Iterable[str] = (), hints: Iterable[str] = ()) -> None:
        super().__init__(message, hints=hints)
        self.problems = tuple(problems)


@attrs.frozen
class BatchOutcome:
    """What a batch changed.

    Attributes:
        inserted: the new tasks, in the order of their operations.
        updated: tasks an update changed, as they are now.
        deleted: the deleted tasks, as they were.
        unblocked: tasks that moved from ``blocked`` to ``open`` because
            their blockers are now done or gone.
        pruned: ids of tasks whose ``blocked_by`` lost a deleted task.
        previous: every changed or deleted task as it was before the batch, by id.
        refs: the id each batch ``ref`` was given.
    """

    inserted: tuple[TaskRecord, ...] = ()
    updated: tuple[TaskRecord, ...] = ()
    deleted: tuple[TaskRecord, ...] = ()
    unblocked: tuple[TaskRecord, ...] = ()
    pruned: tuple[str, ...] = ()
    previous: Mapping[str, TaskRecord] = attrs.field(factory=dict)
    refs: Mapping[str, str] = attrs.field(factory=dict)


# -- scopes ------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def scope_for_project(path: str | os.PathLike[str]) -> str:
    """The scope id of a project directory: a short hash of its resolved path.

    Args:
        path: the project directory (resolved here, so ``.`` and a symlink
            to the same directory share one scope).
    """
    return "p" + _digest(str(Path(path).expanduser().resolve()))


def scope_for_session(session_id: str) -> str:
    """The scope id of an agent session's own tasks.

    Raises:
        ValueError: ``session_id`` is empty.
    """
    if not session_id:
        msg = "a session scope needs a non-empty session id"
        raise ValueError(msg)
    return "s" + _digest(session_id)


def _task_key(scope: str, task_id: str) -> str:
    return f"{scope}/{task_id}"


def _counter_key(scope: str) -> str:
    return f"{scope}:next"


def runtime_store(ctx: ToolContext, tool_name: str) -> Store:
    """The runtime's store from a tool context.

    Raises:
        ToolError: the call runs outside an agent session, with no runtime.
    """
    runtime = getattr(ctx.session, "runtime", None)
    store = getattr(runtime, "store", None)
    if store is None:
        raise ToolError(
            f"{tool_name} needs the weald runtime's store, and this call has none (it runs outside an "
            "agent session). Run it from an agent in the weald daemon; the other tools still work here.",
        )
    if not isinstance(store, Store):
        raise ToolError(f"{tool_name}: the runtime's store is a {type(store).__name__}, not a weald Store")
    return store


# -- reading --------------------------------------------------------------------------------


def _id_order(task_id: str) -> tuple[int, str]:
    # Decimal ids sort by number; anything else (written by hand) after them.
    return (int(task_id), "") if _DIGITS.fullmatch(task_id) else (1 << 62, task_id)


def _load(store: Store | StoreTransaction, scope: str) -> dict[str, TaskRecord]:
    rows = store.items(NAMESPACE, prefix=scope + "/", type=TaskRecord)
    tasks = {record.id: record for _, record in rows}
    return {task_id: tasks[task_id] for task_id in sorted(tasks, key=_id_order)}


def _check_view(view: str) -> View:
    found = _VIEW_BY_NAME.get(view)
    if found is None:
        raise TaskError(f"view: expected one of {', '.join(VIEWS)}, got {view!r}")
    return found


@attrs.frozen
class TaskBoard:
    """Every task of one scope, read at one moment; filters them into views and draws them.

    Attributes:
        scope: the scope id.
        tasks: the tasks by id, in id order.
    """

    scope: str
    tasks: Mapping[str, TaskRecord]

    @classmethod
    def load(cls, store: Store, scope: str) -> TaskBoard:
        """Read a scope's tasks from ``store``."""
        return cls(scope=scope, tasks=_load(store, scope))

    def is_ready(self, task: TaskRecord) -> bool:
        """True if ``task`` is open and every task blocking it is done."""
        return task.status == "open" and not self.waiting_on(task)

    def waiting_on(self, task: TaskRecord) -> list[str]:
        """The ids in ``task.blocked_by`` that are not done yet."""
        return [b for b in task.blocked_by if b in self.tasks and self.tasks[b].status != "done"]

    def view(self, view: str = "all") -> list[TaskRecord]:
        """The tasks a view shows, in display order.

        ``tree`` is every task, each parent followed by its children (depth
        first); the other views are flat, in id order.

        Raises:
            TaskError: ``view`` is not one of `VIEWS`.
        """
        checked = _check_view(view)
        if checked == "tree":
            return [task for task, _ in self._walk_tree()]
        if checked == "all":
            return list(self.tasks.values())
        if checked == "ready":
            return [t for t in self.tasks.values() if self.is_ready(t)]
        return [t for t in self.tasks.values() if t.status == checked]

    def _walk_tree(self) -> list[tuple[TaskRecord, int]]:
        children: dict[str | None, list[TaskRecord]] = {}
        for task in self.tasks.values():
            parent = task.parent_id if task.parent_id in self.tasks else None
            children.setdefault(parent, []).append(task)
        out: list[tuple[TaskRecord, int]] = []
        seen: set[str] = set()
        # Explicit stack: trees may be deep, and a damaged record must not loop forever.
        stack = [(task, 0) for task in reversed(children.get(None, []))]
        while stack:
            task, depth = stack.pop()
            if task.id in seen:
                continue
            seen.add(task.id)
            out.append((task, depth))
            stack.extend((child, depth + 1) for child in reversed(children.get(task.id, [])))
        # Tasks on a parent cycle (never written by apply_operations) still show, at the top level.
        out.extend((task, 0) for task in self.tasks.values() if task.id not in seen)
        return out

    def line(self, task: TaskRecord, *, depth: int = 0, show_parent: bool = True) -> str:
        """One task drawn compactly: ``[ ] 3 Write tests (under 1; blocked by 2) - notes``."""
        details = []
        if show_parent and task.parent_id is not None:
            details.append(f"under {task.parent_id}")
        waiting = self.waiting_on(task)
        if waiting and task.status != "done":
            details.append("blocked by " + ", ".join(waiting))
        text = f"{'  ' * depth}{MARKERS[task.status]} {task.id} {task.title}"
        if details:
            text += f" ({'; '.join(details)})"
        if task.notes:
            note = " ".join(task.notes.split())
            text += " - " + (note if len(note) <= 80 else note[:77] + "...")
        return text

    def lines(self, view: str = "tree") -> list[str]:
        """The tasks of ``view``, one line each (indented by depth in ``tree``)."""
        if _check_view(view) == "tree":
            return [self.line(task, depth=depth, show_parent=False) for task, depth in self._walk_tree()]
        return [self.line(task) for task in self.view(view)]


def list_tasks(store: Store, scope_key: str, view: str = "all") -> list[TaskRecord]:
    """The tasks of a scope that ``view`` shows (for the daemon's ``tasks.list`` and the CLI).

    Args:
        store: the runtime's store.
        scope_key: from `scope_for_project` or `scope_for_session`.
        view: one of `VIEWS`; ``tree`` orders parents before their children.

    Raises:
        TaskError: ``view`` is not one of `VIEWS`.
    """
    return TaskBoard.load(store, scope_key).view(view)


# -- parsing operations ---------------------------------------------------------------------


@attrs.frozen
class _Op:
    kind: Literal["insert", "update", "delete"]
    where: str
    fields: Mapping[str, Any]


def _name(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _as_id(value: Any, where: str, field: str, problems: list[str]) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int):
        problems.append(f"{_name(where, field)}: expected a task id such as '3' (or a batch ref), got {value!r}")
        return None
    text = str(value).strip()
    if not text:
        problems.append(f"{_name(where, field)}: expected a task id such as '3', got an empty string")
        return None
    return text


def _parse_field(name: str, value: Any, where: str, problems: list[str]) -> tuple[bool, Any]:
    """Normalize one field; returns (ok, value)."""
    label = _name(where, name)
    if name == "title":
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{label}: expected a non-empty one-line string, got {value!r}")
            return False, None
        title = " ".join(value.split())
        if len(title) > MAX_TITLE:
            problems.append(f"{label}: expected at most {MAX_TITLE} characters, got {len(title)}; put details in notes")
            return False, None
        return True, title
    if name == "status":
        status = _STATUS_BY_NAME.get(value) if isinstance(value, str) else None
        if status is None:
            problems.append(f"{label}: expected one of {', '.join(STATUSES)}, got {value!r}")
            return False, None
        return True, status
    if name == "notes":
        if not isinstance(value, str) or len(value) > MAX_NOTES:
            problems.append(f"{label}: expected a string of at most {MAX_NOTES} characters")
            return False, None
        return True, value.strip()
    if name == "parent_id":
        if value is None or value == "":
            return True, None
        parent = _as_id(value, where, name, problems)
        return parent is not None, parent
    if name == "blocked_by":
        if not isinstance(value, list | tuple):
            problems.append(f"{label}: expected a list of task ids, got {value!r}")
            return False, None
        if len(value) > MAX_BLOCKERS:
            problems.append(f"{label}: expected at most {MAX_BLOCKERS} ids, got {len(value)}")
            return False, None
        ids: list[str] = []
        good = True
        for i, item in enumerate(value):
            parsed = _as_id(item, where, f"{name}[{i}]", problems)
            good = good and parsed is not None
            if parsed is not None and parsed not in ids:
                ids.append(parsed)
        return good, tuple(ids)
    if name == "ref":
        if not isinstance(value, str) or not value.strip() or len(value.strip()) > MAX_REF:
            problems.append(f"{label}: expected a short name (1-{MAX_REF} characters) such as 'tests', got {value!r}")
            return False, None
        ref = value.strip()
        if _DIGITS.fullmatch(ref):
            problems.append(f"{label}: {ref!r} looks like a task id; use a name such as 'tests' for a ref")
            return False, None
        return True, ref
    # "id"
    task_id = _as_id(value, where, name, problems)
    return task_id is not None, task_id


def _parse(raw: Mapping[str, Any], where: str, problems: list[str]) -> _Op | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where or 'operation'}: expected an object with 'op', got {raw!r}")
        return None
    op = raw.get("op")
    kind = _KINDS.get(op) if isinstance(op, str) else None
    if kind is None:
        problems.append(f"{_name(where, 'op')}: expected one of insert, update, delete, got {op!r}")
        return None
    allowed = _FIELDS[kind]
    unknown = sorted(k for k in raw if k != "op" and k not in allowed)
    if unknown:
        problems.append(
            f"{where or 'operation'}: {kind} does not take {', '.join(unknown)}; it takes {', '.join(allowed)}",
        )
    fields: dict[str, Any] = {}
    good = not unknown
    for name in allowed:
        if name in raw:
            ok, value = _parse_field(name, raw[name], where, problems)
            good = good and ok
            fields[name] = value
    if kind == "insert" and "title" not in raw:
        problems.append(f"{_name(where, 'title')}: required to insert a task")
        good = False
    if kind != "insert" and "id" not in raw:
        problems.append(f"{_name(where, 'id')}: required to {kind} a task (list tasks to see the ids)")
        good = False
    if kind == "update" and "id" in raw and len(fields) == 1:
        problems.append(f"{where or 'update'}: nothing to change; give title, status, notes, parent_id or blocked_by")
        good = False
    return _Op(kind=kind, where=where, fields=fields) if good else None


# -- applying a batch ---------------------------------------------------------------------------


def _find_cycle(start: str, edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle through the graph reachable from ``start``, as a node path, or None."""
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()
    # Iterative DFS: each frame is (node, index of the next edge to follow).
    stack: list[tuple[str, int]] = [(start, 0)]
    while stack:
        node, index = stack.pop()
        if index == 0:
            path.append(node)
            on_path.add(node)
        targets = edges.get(node, ())
        if index < len(targets):
            stack.append((node, index + 1))
            target = targets[index]
            if target in on_path:
                return path[path.index(target) :]
            if target not in done:
                stack.append((target, 0))
            continue
        path.pop()
        on_path.discard(node)
        done.add(node)
    return None


def _cycles(edges: Mapping[str, Sequence[str]], order: Iterable[str]) -> list[list[str]]:
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for node in order:
        cycle = _find_cycle(node, edges)
        if cycle is None or frozenset(cycle) in seen:
            continue
        seen.add(frozenset(cycle))
        found.append(cycle)
    return found


class _Batch:
    """One batch being applied to a working copy of a scope's tasks."""

    def __init__(self, tasks: Mapping[str, TaskRecord], next_id: int, now: float) -> None:
        self.before = dict(tasks)
        self.work = dict(tasks)
        self.next_id = next_id
        self.now = now
        self.problems: list[str] = []
        self.refs: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        self.deleted_by: dict[str, str] = {}
        self.explicit_status: set[str] = set()
        self.follow_blockers: set[str] = set()
        self.pruned: set[str] = set()
        self.inserted: list[str] = []
        self.updated: set[str] = set()

    def label(self, task_id: str) -> str:
        return self.labels.get(task_id, task_id)

    def assign_ids(self, ops: Sequence[_Op]) -> list[str | None]:
        ids: list[str | None] = []
        for op in ops:
            if op.kind != "insert":
                ids.append(None)
                continue
            new_id = str(self.next_id)
            self.next_id += 1
            ref = op.fields.get("ref")
            if ref is not None:
                if ref in self.refs:
                    self.problems.append(f"{_name(op.where, 'ref')}: {ref!r} is used by an earlier insert")
                self.refs[ref] = new_id
                self.labels[new_id] = ref
            ids.append(new_id)
        return ids

    def resolve(self, value: str, where: str, field: str, *, must_exist_now: bool) -> str | None:
        """The id ``value`` names (an id or a batch ref), or None with a problem noted."""
        task_id = self.refs.get(value, value)
        if task_id in self.work:
            return task_id
        if task_id in self.deleted_by:
            self.problems.append(
                f"{_name(where, field)}: task {value} is deleted by {self.deleted_by[task_id] or 'this call'}",
            )
            return None
        if value in self.refs and not must_exist_now:
            return task_id  # inserted by a later operation of this batch
        if value in self.refs:
            self.problems.append(f"{_name(where, field)}: ref {value!r} is inserted by a later operation; reorder them")
            return None
        hint = "" if not self.refs else f" and no batch ref {value!r}"
        self.problems.append(
            f"{_name(where, field)}: no task {value!r} in this scope{hint}; list the tasks to see their ids",
        )
        return None

    def links(self, op: _Op) -> dict[str, Any] | None:
        """The op's fields with parent_id and blocked_by resolved to ids."""
        fields = dict(op.fields)
        fields.pop("ref", None)
        fields.pop("id", None)
        good = True
        if fields.get("parent_id") is not None:
            parent = self.resolve(fields["parent_id"], op.where, "parent_id", must_exist_now=False)
            good = parent is not None
            fields["parent_id"] = parent
        if "blocked_by" in fields:
            resolved = []
            for i, blocker in enumerate(fields["blocked_by"]):
                found = self.resolve(blocker, op.where, f"blocked_by[{i}]", must_exist_now=False)
                good = good and found is not None
                if found is not None and found not in resolved:
                    resolved.append(found)
            fields["blocked_by"] = tuple(resolved)
        return fields if good else None

    def apply(self, op: _Op, new_id: str | None) -> None:
        if op.kind == "insert":
            assert new_id is not None
            fields = self.links(op)
            if fields is None:
                return
            self.work[new_id] = TaskRecord(id=new_id, created=self.now, updated=self.now, **fields)
            self.inserted.append(new_id)
        else:
            task_id = self.resolve(op.fields["id"], op.where, "id", must_exist_now=True)
            if task_id is None:
                return
            if op.kind == "delete":
                self.delete(task_id, op.where)
                return
            fields = self.links(op)
            if fields is None:
                return
            self.work[task_id] = msgspec.structs.replace(self.work[task_id], **fields)
            self.updated.add(task_id)
            new_id = task_id
        if "status" in op.fields:
            self.explicit_status.add(new_id)
        elif "blocked_by" in op.fields:
            self.follow_blockers.add(new_id)

    def delete(self, task_id: str, where: str) -> None:
        del self.work[task_id]
        self.deleted_by[task_id] = where
        for other in list(self.work.values()):
            if task_id in other.blocked_by:
                remaining = tuple(b for b in other.blocked_by if b != task_id)
                self.work[other.id] = msgspec.structs.replace(other, blocked_by=remaining)
                self.pruned.add(other.id)

    def check_graph(self) -> None:
        for task in self.work.values():
            parent = task.parent_id
            if parent is None or parent in self.work:
                continue
            if parent in self.deleted_by:
                self.problems.append(
                    f"task {self.label(task.id)}: its parent {parent} is deleted by "
                    f"{self.deleted_by[parent] or 'this call'}; delete or move (update parent_id) its children first",
                )
            else:
                self.problems.append(f"task {self.label(task.id)}: parent_id {parent!r} names no task")
        for kind, edges in (
            ("parent_id", {t.id: [t.parent_id] for t in self.work.values() if t.parent_id is not None}),
            ("blocked_by", {t.id: list(t.blocked_by) for t in self.work.values()}),
        ):
            for cycle in _cycles(edges, self.work):
                shown = " -> ".join(self.label(n) for n in [*cycle, cycle[0]])
                self.problems.append(f"{kind} cycle: {shown}; a task cannot (indirectly) depend on itself")

    def settle_statuses(self) -> None:
        """Make statuses follow blockers where the batch gave no status."""
        done_now = {
            t.id
            for t in self.work.values()
            if t.status == "done" and (t.id not in self.before or self.before[t.id].status != "done")
        }
        candidates = set(self.follow_blockers) | self.pruned
        candidates |= {t.id for t in self.work.values() if done_now.intersection(t.blocked_by)}
        for task_id in sorted(candidates - self.explicit_status, key=_id_order):
            task = self.work.get(task_id)
            if task is None or task.status not in ("open", "blocked"):
                continue
            waiting = any(self.work[b].status != "done" for b in task.blocked_by if b in self.work)
            if task_id in self.follow_blockers and waiting:
                status: Status = "blocked"
            elif task.status == "blocked" and not waiting:
                status = "open"
            else:
                continue
            self.work[task_id] = msgspec.structs.replace(task, status=status)

    def outcome(self) -> tuple[BatchOutcome, dict[str, TaskRecord], list[str]]:
        """The outcome, the records to write (by id) and the ids to delete."""
        puts: dict[str, TaskRecord] = {}
        updated: list[TaskRecord] = []
        unblocked: list[TaskRecord] = []
        for task_id, task in self.work.items():
            old = self.before.get(task_id)
            if old is None:
                puts[task_id] = task
                continue
            if task == old:
                continue
            task = msgspec.structs.replace(task, updated=self.now)  # noqa: PLW2901 - the stamped version
            self.work[task_id] = task
            puts[task_id] = task
            if task_id in self.updated:
                updated.append(task)
            if old.status == "blocked" and task.status == "open" and task_id not in self.explicit_status:
                unblocked.append(task)
        changed_or_deleted = {i: self.before[i] for i in [*puts, *self.deleted_by] if i in self.before}
        outcome = BatchOutcome(
            # A task inserted and deleted by the same batch is neither.
            inserted=tuple(self.work[i] for i in self.inserted if i in self.work),
            updated=tuple(updated),
            deleted=tuple(self.before[i] for i in self.deleted_by if i in self.before),
            unblocked=tuple(unblocked),
            pruned=tuple(sorted(self.pruned - set(self.deleted_by), key=_id_order)),
            previous=changed_or_deleted,
            refs=dict(self.refs),
        )
        return outcome, puts, [i for i in self.deleted_by if i in self.before]


def _next_id(store: StoreTransaction, scope: str, tasks: Mapping[str, TaskRecord]) -> int:
    stored = store.get(NAMESPACE, _counter_key(scope), 1)
    highest = max((int(i) for i in tasks if _DIGITS.fullmatch(i)), default=0)
    # The counter is written with every insert; the max guards against a damaged counter.
    return max(stored if isinstance(stored, int) else 1, highest + 1)


def _apply(store: Store, scope: str, raw_ops: Sequence[Mapping[str, Any]], wheres: Sequence[str]) -> BatchOutcome:
    problems: list[str] = []
    if not raw_ops:
        raise TaskError("operations: expected at least one operation")
    if len(raw_ops) > MAX_OPERATIONS:
        raise TaskError(
            f"operations: expected at most {MAX_OPERATIONS} operations, got {len(raw_ops)}; split the batch"
        )
    parsed = [_parse(raw, where, problems) for raw, where in zip(raw_ops, wheres, strict=True)]
    ops = [op for op in parsed if op is not None]
    if problems:
        raise _rejected(problems, batch=len(raw_ops) > 1 or bool(wheres[0]))
    with store.transaction(f"tasks:{scope}", settle=(NAMESPACE,)) as tx:
        tasks = _load(tx, scope)
        batch = _Batch(tasks, _next_id(tx, scope, tasks), time.time())
        new_ids = batch.assign_ids(ops)
        for op, new_id in zip(ops, new_ids, strict=True):
            batch.apply(op, new_id)
        if not batch.problems:
            batch.check_graph()
        if batch.problems:
            raise _rejected(batch.problems, batch=len(raw_ops) > 1 or bool(wheres[0]))
        batch.settle_statuses()
        outcome, puts, deletes = batch.outcome()
        records: dict[str, Any] = {_task_key(scope, i): record for i, record in puts.items()}
        if batch.inserted:
            # Even ids of tasks the batch inserted and deleted are never handed out again.
            records[_counter_key(scope)] = batch.next_id
        if records or deletes:
            tx.write_batch(NAMESPACE, records, [_task_key(scope, i) for i in deletes])
    return outcome


def _rejected(problems: Sequence[str], *, batch: bool) -> TaskError:
    shown = list(problems[:12])
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    if batch:
        head = "The batch was rejected and nothing was written:"
        tail = "Fix these and send the whole batch again."
    else:
        head = "Nothing was written:"
        tail = "Fix the arguments and call tasks again."
    text = "\n".join([head, *(f"- {p}" for p in shown), tail])
    return TaskError(text, problems=problems)


def apply_operations(store: Store, scope: str, operations: Sequence[Mapping[str, Any]]) -> BatchOutcome:
    """Validate a batch of task operations and write it in one transaction, or write nothing.

    Each operation is a mapping with ``op`` (``insert``, ``update`` or
    ``delete``) and its fields: ``insert`` takes ``title`` (required),
    ``status``, ``notes``, ``parent_id``, ``blocked_by`` and ``ref`` (a name
    other operations of the batch may use in place of the id it will get);
    ``update`` takes ``id`` and any of those fields but ``ref`` (``blocked_by``
    replaces the list; a null or empty ``parent_id`` clears it); ``delete``
    takes ``id``. Deleting a task removes it from others' ``blocked_by``; a
    task with children cannot be deleted unless they go too (or move).

    Args:
        store: the runtime's store.
        scope: from `scope_for_project` or `scope_for_session`.
        operations: the batch, applied in order.

    Returns:
        What changed.

    Raises:
        TaskError: the batch is invalid; its ``problems`` name each bad field
            as ``operations[i].field`` and what was expected. Nothing was written.
        StoreError: the store failed; nothing was written.
    """
    return _apply(store, scope, list(operations), [f"operations[{i}]" for i in range(len(operations))])


def apply_operation(store: Store, scope: str, operation: Mapping[str, Any]) -> BatchOutcome:
    """Apply one operation, like `apply_operations`; its problems name fields without a batch index."""
    return _apply(store, scope, [operation], [""])
