"""The tasks tool and its store layer (tools/tasks.py, tools/_taskstore.py), on a real Store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import types
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from weald.runtime import Store
from weald.tools import SessionServices, ToolContext, ToolResult, invoke
from weald.tools._taskstore import NAMESPACE, STATUSES, TaskBoard, TaskError, apply_operations
from weald.tools.tasks import TaskRecord, list_tasks, scope_for_project, scope_for_session, tasks

Run = Callable[..., ToolResult]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "s.db")
    yield s
    s.close()


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    path = tmp_path / "proj"
    path.mkdir()
    return path


@pytest.fixture
def make_ctx(store: Store, proj: Path, tmp_path: Path) -> Callable[..., ToolContext]:
    def make(**fields: Any) -> ToolContext:
        fields.setdefault("working_dir", proj)
        fields.setdefault("session_id", "session-1")
        fields.setdefault(
            "session",
            SessionServices(output_dir=tmp_path / "out", runtime=types.SimpleNamespace(store=store)),
        )
        return ToolContext(**fields)

    return make


@pytest.fixture
def run(make_ctx: Callable[..., ToolContext]) -> Run:
    """``run(ctx=None, **arguments)``: call the tasks tool through `invoke`, so the schema is checked."""
    default = make_ctx()

    def run_(ctx: ToolContext | None = None, **arguments: Any) -> ToolResult:
        return trio.run(invoke, tasks, ctx or default, arguments)

    return run_


def ok(result: ToolResult) -> ToolResult:
    assert result.ok, result.output
    return result


def listing(run: Run, view: str = "tree", **extra: Any) -> list[str]:
    return ok(run(action="list", view=view, **extra)).output.splitlines()[1:]


def stored(store: Store) -> list[tuple[str, Any]]:
    return store.items(NAMESPACE)


def test_tasks_is_a_runtime_tool_allowed_by_default() -> None:
    assert tasks.name == "tasks"
    assert tasks.permission == "allow"
    assert tasks.kind == "runtime"
    assert not tasks.is_async


def test_inserts_get_sequential_ids_and_list_shows_them(run: Run) -> None:
    first = ok(run(action="insert", title="Design the API"))
    assert first.data["inserted"][0]["id"] == "1"
    assert "[ ] 1 Design the API" in first.output
    ok(run(action="insert", title="Write tests", notes="cover the edge cases", status="in_progress"))
    assert listing(run, "all") == ["[ ] 1 Design the API", "[~] 2 Write tests - cover the edge cases"]
    records = run(action="list", view="all").data["tasks"]
    assert [r["id"] for r in records] == ["1", "2"]
    assert records[0]["created"] > 0
    assert records[0]["created"] == records[0]["updated"]


def test_an_empty_scope_says_how_to_add_a_task(run: Run) -> None:
    result = ok(run(action="list"))
    assert "No tasks in the project scope yet" in result.output
    assert "insert" in result.output


def test_a_task_with_unfinished_blockers_starts_blocked_and_says_what_it_waits_on(run: Run) -> None:
    ok(run(action="insert", title="Design"))
    result = ok(run(action="insert", title="Write tests", blocked_by=["1"]))
    assert "[!] 2 Write tests (blocked by 1)" in result.output
    assert result.data["inserted"][0]["status"] == "blocked"
    ok(run(action="update", id="1", status="done"))
    ok(run(action="insert", title="Ship", blocked_by=["1"]))
    assert listing(run, "all")[2] == "[ ] 3 Ship"


def test_update_changes_fields_and_reports_each_change(run: Run) -> None:
    ok(run(action="insert", title="Draft"))
    ok(run(action="insert", title="Parent"))
    result = ok(run(action="update", id="1", title="Write the draft", status="in_progress", parent_id="2", notes="n"))
    assert "Updated 1: title 'Draft' -> 'Write the draft'; status open -> in_progress; notes; parent none -> 2" in (
        result.output
    )
    record = result.data["updated"][0]
    assert record["updated"] >= record["created"]
    ok(run(action="update", id="1", parent_id=None))
    assert listing(run, "all")[0] == "[~] 1 Write the draft - n"


def test_an_update_that_changes_nothing_says_so(run: Run) -> None:
    ok(run(action="insert", title="Same"))
    assert "Nothing changed." in ok(run(action="update", id="1", title="Same")).output


def test_marking_a_task_done_unblocks_dependants_whose_blockers_are_all_done(run: Run) -> None:
    ok(run(action="insert", title="Schema"))
    ok(run(action="insert", title="Fixtures"))
    ok(run(action="insert", title="Tests", blocked_by=["1", "2"]))
    ok(run(action="insert", title="Docs", blocked_by=["1"]))

    first = ok(run(action="update", id="1", status="done"))
    assert first.data["unblocked"] == ["4"]
    assert "Unblocked (now open):\n  [ ] 4 Docs" in first.output
    assert listing(run, "all")[2] == "[!] 3 Tests (blocked by 2)"

    second = ok(run(action="update", id="2", status="done"))
    assert second.data["unblocked"] == ["3"]
    assert listing(run, "ready") == ["[ ] 3 Tests", "[ ] 4 Docs"]


def test_a_status_given_explicitly_is_kept_even_when_blockers_are_done(run: Run) -> None:
    ok(run(action="insert", title="A"))
    ok(run(action="insert", title="B", blocked_by=["1"], status="blocked"))
    result = ok(run(action="batch", operations=[{"op": "update", "id": "1", "status": "done"}]))
    assert result.data["unblocked"] == ["2"]
    ok(run(action="insert", title="C", status="blocked"))
    ok(run(action="update", id="3", blocked_by=["1"], status="blocked"))
    assert listing(run, "blocked") == ["[!] 3 C"]


def test_delete_removes_a_task_and_frees_its_dependants(run: Run, store: Store, proj: Path) -> None:
    ok(run(action="insert", title="Spike"))
    ok(run(action="insert", title="Build", blocked_by=["1"]))
    result = ok(run(action="delete", id="1"))
    assert "Deleted [ ] 1 Spike" in result.output
    assert "Removed the deleted tasks from the blocked_by of 2." in result.output
    assert result.data["deleted"] == ["1"]
    assert result.data["unblocked"] == ["2"]
    assert listing(run, "all") == ["[ ] 2 Build"]
    assert list_tasks(store, scope_for_project(proj), "all")[0].blocked_by == ()


def test_a_task_with_children_cannot_be_deleted_alone(run: Run) -> None:
    ok(run(action="insert", title="Epic"))
    ok(run(action="insert", title="Story", parent_id="1"))
    refused = run(action="delete", id="1")
    assert not refused.ok
    assert "task 2: its parent 1 is deleted by this call" in refused.output
    assert refused.output.startswith("Nothing was written:")
    assert len(listing(run, "all")) == 2
    both = ok(run(action="batch", operations=[{"op": "delete", "id": "2"}, {"op": "delete", "id": "1"}]))
    assert both.data["deleted"] == ["2", "1"]
    assert listing(run, "all") == []


def test_ids_are_never_reused_after_a_delete(run: Run) -> None:
    ok(run(action="insert", title="One"))
    ok(run(action="insert", title="Two"))
    ok(run(action="delete", id="2"))
    assert ok(run(action="insert", title="Three")).data["inserted"][0]["id"] == "3"


def test_integer_ids_are_accepted_wherever_an_id_is(run: Run) -> None:
    ok(run(action="insert", title="A"))
    ok(run(action="insert", title="B", parent_id=1, blocked_by=[1]))
    ok(run(action="update", id=1, status="done"))
    assert listing(run, "all") == ["[x] 1 A", "[ ] 2 B (under 1)"]


@pytest.fixture
def board(run: Run) -> Run:
    """1 open (parent of 2 and 3); 2 in progress; 3 done; 4 blocked by 2; 5 open, blocked by done 3; 6 blocked."""
    ok(
        run(
            action="batch",
            operations=[
                {"op": "insert", "ref": "root", "title": "Release 1.0"},
                {"op": "insert", "title": "Port the parser", "parent_id": "root", "status": "in_progress"},
                {"op": "insert", "title": "Fix CI", "parent_id": "root", "status": "done"},
                {"op": "insert", "title": "Benchmarks", "blocked_by": ["2"]},
                {"op": "insert", "title": "Changelog", "blocked_by": ["3"]},
                {"op": "insert", "title": "Waiting on legal", "status": "blocked"},
            ],
        )
    )
    return run


@pytest.mark.parametrize(
    ("view", "ids"),
    [
        ("all", ["1", "2", "3", "4", "5", "6"]),
        ("open", ["1", "5"]),
        ("in_progress", ["2"]),
        ("done", ["3"]),
        ("blocked", ["4", "6"]),
        ("ready", ["1", "5"]),
        ("tree", ["1", "2", "3", "4", "5", "6"]),
    ],
)
def test_each_view_shows_its_tasks(board: Run, view: str, ids: list[str]) -> None:
    result = ok(board(action="list", view=view))
    assert [t["id"] for t in result.data["tasks"]] == ids
    assert result.output.splitlines()[0] == f"{len(ids)} of 6 tasks in the project scope, view {view}:"


def test_the_tree_view_indents_children_under_their_parent_with_status_markers(board: Run) -> None:
    assert listing(board, "tree") == [
        "[ ] 1 Release 1.0",
        "  [~] 2 Port the parser",
        "  [x] 3 Fix CI",
        "[!] 4 Benchmarks (blocked by 2)",
        "[ ] 5 Changelog",
        "[!] 6 Waiting on legal",
    ]
    assert listing(board, "all")[1] == "[~] 2 Port the parser (under 1)"
    assert board(action="list").output == ok(board(action="list", view="tree")).output


def test_an_empty_view_points_at_the_others(board: Run) -> None:
    ok(board(action="update", id="6", status="open"))
    ok(board(action="update", id="4", status="in_progress"))
    result = ok(board(action="list", view="blocked"))
    assert "No tasks in view 'blocked' (6 in the project scope)" in result.output


def test_a_batch_can_insert_tasks_that_depend_on_each_other_by_ref(run: Run) -> None:
    ok(run(action="insert", title="Existing"))
    result = ok(
        run(
            action="batch",
            operations=[
                {"op": "insert", "ref": "tests", "title": "Write tests", "blocked_by": ["impl"]},
                {"op": "insert", "ref": "impl", "title": "Implement", "parent_id": 1},
                {"op": "update", "id": "impl", "status": "in_progress"},
                {"op": "update", "id": "1", "notes": "umbrella"},
            ],
        )
    )
    assert result.data["refs"] == {"tests": "2", "impl": "3"}
    assert result.output.startswith("Refs: tests = 2, impl = 3\nAdded 2 tasks:")
    assert listing(run, "tree") == [
        "[ ] 1 Existing - umbrella",
        "  [~] 3 Implement",
        "[!] 2 Write tests (blocked by 3)",
    ]


def test_a_batch_with_an_unknown_id_is_rejected_and_writes_nothing(run: Run, store: Store) -> None:
    ok(run(action="insert", title="Only"))
    before = stored(store)
    result = run(
        action="batch",
        operations=[
            {"op": "insert", "title": "New", "blocked_by": ["9"]},
            {"op": "update", "id": "7", "status": "done"},
            {"op": "delete", "id": "1"},
        ],
    )
    assert not result.ok
    lines = result.output.splitlines()
    assert lines[0] == "The batch was rejected and nothing was written:"
    assert "- operations[0].blocked_by[0]: no task '9' in this scope; list the tasks to see their ids" in lines
    assert "- operations[1].id: no task '7' in this scope; list the tasks to see their ids" in lines
    assert lines[-1] == "Fix these and send the whole batch again."
    assert result.data["problems"]
    assert stored(store) == before
    # The rejected insert did not use up an id.
    assert ok(run(action="insert", title="Next")).data["inserted"][0]["id"] == "2"


def test_a_blocked_by_cycle_is_named_and_rejected(run: Run, store: Store) -> None:
    before = stored(store)
    result = run(
        action="batch",
        operations=[
            {"op": "insert", "ref": "a", "title": "A", "blocked_by": ["b"]},
            {"op": "insert", "ref": "b", "title": "B", "blocked_by": ["a"]},
        ],
    )
    assert not result.ok
    assert "blocked_by cycle: a -> b -> a" in result.output
    assert stored(store) == before


def test_a_cycle_through_existing_tasks_is_named_by_id(run: Run, store: Store) -> None:
    ok(run(action="insert", title="One"))
    ok(run(action="insert", title="Two", parent_id="1"))
    ok(run(action="insert", title="Three", blocked_by=["1"]))
    before = stored(store)
    parent = run(action="update", id="1", parent_id="2")
    assert "parent_id cycle: 1 -> 2 -> 1" in parent.output
    blocked = run(action="update", id="1", blocked_by=["3"])
    assert "blocked_by cycle: 1 -> 3 -> 1" in blocked.output
    itself = run(action="update", id="2", blocked_by=["2"])
    assert "blocked_by cycle: 2 -> 2" in itself.output
    assert stored(store) == before


def test_bad_fields_are_named_with_what_was_expected(store: Store) -> None:
    scope = scope_for_project("/nowhere")
    with pytest.raises(TaskError) as caught:
        apply_operations(
            store,
            scope,
            [
                {"op": "insert", "title": "  ", "status": "finished"},
                {"op": "insert", "title": "x", "parent_id": "4", "ref": "12"},
                {"op": "update", "id": "1"},
                {"op": "move", "id": "1"},
                {"op": "delete", "id": "1", "title": "x"},
                {"op": "insert"},
            ],
        )
    assert caught.value.problems == (
        "operations[0].title: expected a non-empty one-line string, got '  '",
        "operations[0].status: expected one of open, in_progress, blocked, done, got 'finished'",
        "operations[1].ref: '12' looks like a task id; use a name such as 'tests' for a ref",
        "operations[2]: nothing to change; give title, status, notes, parent_id or blocked_by",
        "operations[3].op: expected one of insert, update, delete, got 'move'",
        "operations[4]: delete does not take title; it takes id",
        "operations[5].title: required to insert a task",
    )
    with pytest.raises(TaskError) as parent:
        apply_operations(store, scope, [{"op": "insert", "title": "x", "parent_id": "4"}])
    assert parent.value.problems == (
        "operations[0].parent_id: no task '4' in this scope; list the tasks to see their ids",
    )
    assert stored(store) == []


def test_the_schema_names_bad_arguments_before_the_tool_runs(run: Run) -> None:
    result = run(action="insert", title="x", status="finished")
    assert not result.ok
    assert "status: expected one of 'open', 'in_progress', 'blocked', 'done', got 'finished'" in result.output
    nested = run(action="batch", operations=[{"op": "insert", "title": "x", "colour": "red"}])
    assert "operations.0: unknown argument(s)" in nested.output
    assert "'colour' was unexpected" in nested.output


def test_arguments_that_do_not_fit_the_action_are_refused(run: Run) -> None:
    listed = run(action="list", title="x")
    assert not listed.ok
    assert listed.output == "action 'list' does not take title; it takes view (and scope)."
    missing = run(action="update", status="done")
    assert "id: required to update a task" in missing.output
    assert missing.output.startswith("Nothing was written:")
    assert "title: required to insert a task" in run(action="insert").output


def test_without_a_runtime_the_tool_says_it_needs_one(make_ctx: Callable[..., ToolContext], tmp_path: Path) -> None:
    for session in (None, SessionServices(output_dir=tmp_path / "out")):
        result = trio.run(invoke, tasks, make_ctx(session=session), {"action": "list"})
        assert not result.ok
        assert "needs the weald runtime's store" in result.output
        assert "outside an agent session" in result.output


def test_projects_do_not_see_each_others_tasks(
    run: Run, make_ctx: Callable[..., ToolContext], tmp_path: Path, proj: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ok(run(action="insert", title="In proj"))
    ok(run(ctx=make_ctx(working_dir=other), action="insert", title="In other"))
    assert listing(run, "all") == ["[ ] 1 In proj"]
    assert [t["title"] for t in run(ctx=make_ctx(working_dir=other), action="list").data["tasks"]] == ["In other"]
    # The same directory by another spelling is the same project.
    alias = tmp_path / "alias"
    alias.symlink_to(proj)
    assert [t["title"] for t in run(ctx=make_ctx(working_dir=alias), action="list").data["tasks"]] == ["In proj"]


def test_session_scope_keeps_a_sessions_tasks_apart(run: Run, make_ctx: Callable[..., ToolContext]) -> None:
    ok(run(action="insert", title="Project task"))
    mine = ok(run(action="insert", title="Scratch", scope="session"))
    assert mine.data["inserted"][0]["id"] == "1"
    assert "1 task in the session scope" in mine.output
    assert listing(run, "all", scope="session") == ["[ ] 1 Scratch"]
    assert listing(run, "all") == ["[ ] 1 Project task"]
    other_session = make_ctx(session_id="session-2")
    assert run(ctx=other_session, action="list", scope="session").data["tasks"] == []
    anonymous = run(ctx=make_ctx(session_id=""), action="list", scope="session")
    assert not anonymous.ok
    assert "needs a session id" in anonymous.output


def test_concurrent_inserts_from_threads_get_unique_ids(run: Run) -> None:
    def insert_many(worker: int) -> list[str]:
        return [ok(run(action="insert", title=f"w{worker} t{i}")).data["inserted"][0]["id"] for i in range(8)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = [i for batch in pool.map(insert_many, range(8)) for i in batch]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 65)]
    assert len(listing(run, "all")) == 64


_WRITER = textwrap.dedent(
    """
    import sys, types
    import trio
    from weald.runtime import Store
    from weald.tools import SessionServices, ToolContext, invoke
    from weald.tools.tasks import tasks

    store = Store(sys.argv[1])
    ctx = ToolContext(
        working_dir=sys.argv[2],
        session=SessionServices(output_dir=sys.argv[2], runtime=types.SimpleNamespace(store=store)),
    )
    for i in range(100000):
        result = trio.run(invoke, tasks, ctx, {"action": "insert", "title": f"task {i}"})
        assert result.ok, result.output
        print(result.data["inserted"][0]["id"], flush=True)
    """
)


def test_every_acknowledged_insert_survives_a_kill_9(tmp_path: Path, proj: Path) -> None:
    db = tmp_path / "crash.db"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db), str(proj)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    acked: list[str] = []
    try:
        while len(acked) < 40:
            line = writer.stdout.readline()
            assert line, f"the writer died early with code {writer.poll()}"
            acked.append(line.strip())
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    # Acknowledgements already in the pipe when the kill landed count too.
    acked += writer.stdout.read().split()
    writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL

    reopened = Store(db)
    try:
        present = [t.id for t in list_tasks(reopened, scope_for_project(proj), "all")]
    finally:
        reopened.close()
    assert set(acked) <= set(present)
    assert present == [str(i) for i in range(1, len(present) + 1)]


def test_list_tasks_and_the_scope_functions_serve_programs(run: Run, store: Store, proj: Path) -> None:
    ok(run(action="insert", title="A"))
    ok(run(action="insert", title="B", parent_id="1"))
    ok(run(action="insert", title="C"))
    scope = scope_for_project(proj)
    assert scope == scope_for_project(proj / "." / "sub" / "..")
    assert scope != scope_for_session("session-1")
    records = list_tasks(store, scope, view="tree")
    assert all(isinstance(r, TaskRecord) for r in records)
    assert [r.id for r in records] == ["1", "2", "3"]
    assert [r.id for r in list_tasks(store, scope)] == ["1", "2", "3"]
    assert list_tasks(store, scope_for_session("session-1")) == []
    assert TaskBoard.load(store, scope).lines("tree")[1] == "  [ ] 2 B"
    with pytest.raises(TaskError, match="view: expected one of tree, all, open"):
        list_tasks(store, scope, "someday")
    with pytest.raises(ValueError, match="non-empty session id"):
        scope_for_session("")


# -- any sequence of batches keeps the stored tasks consistent ------------------------------------

_ids = st.sampled_from(["1", "2", "3", "4", "5", "r"])
_links = {
    "status": st.sampled_from(STATUSES),
    "parent_id": st.one_of(st.none(), _ids),
    "blocked_by": st.lists(_ids, max_size=3),
}
_operation = st.one_of(
    st.fixed_dictionaries({"op": st.just("insert"), "title": st.just("t")}, optional={"ref": st.just("r"), **_links}),
    st.fixed_dictionaries({"op": st.just("update"), "id": _ids}, optional=_links),
    st.fixed_dictionaries({"op": st.just("delete"), "id": _ids}),
)


def _acyclic(edges: dict[str, list[str]]) -> bool:
    """No node reaches itself (a plain reachability check, independent of the code under test)."""

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(edges.get(start, []))
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, []))
        return seen

    return not any(node in reachable(node) for node in edges)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_operation, min_size=1, max_size=4), min_size=1, max_size=6))
def test_any_sequence_of_batches_keeps_the_tasks_consistent(store: Store, batches: list[list[dict[str, Any]]]) -> None:
    scope = scope_for_session(uuid.uuid4().hex)  # a fresh scope per example in the shared store
    seeded = apply_operations(store, scope, [{"op": "insert", "title": "seed"}] * 3)
    issued = {t.id for t in seeded.inserted}
    for batch in batches:
        before = store.items(NAMESPACE, prefix=scope)
        try:
            outcome = apply_operations(store, scope, batch)
        except TaskError as exc:
            problems = exc.problems
        else:
            problems = ()
        if problems:
            assert store.items(NAMESPACE, prefix=scope) == before
            event("rejected")
            continue
        event("accepted")
        if outcome.unblocked:
            event("unblocked")
        new_ids = {t.id for t in outcome.inserted} | set(outcome.refs.values())
        assert not new_ids & issued, "an id was handed out twice"
        issued |= new_ids
        tasks_now = {t.id: t for t in list_tasks(store, scope)}
        for task in tasks_now.values():
            assert task.parent_id is None or task.parent_id in tasks_now
            assert set(task.blocked_by) <= tasks_now.keys()
            assert task.id not in task.blocked_by
        assert _acyclic({t.id: list(t.blocked_by) for t in tasks_now.values()})
        assert _acyclic({t.id: [t.parent_id] for t in tasks_now.values() if t.parent_id})
        for task in outcome.unblocked:
            assert tasks_now[task.id].status == "open"
