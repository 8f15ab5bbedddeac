"""The memory tools and the store's index of the notes (tools/memory.py, tools/_memstore.py), on a real Store."""

from __future__ import annotations

import sqlite3
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from weald.runtime import Store, StoreClosedError, _store_sqlite, query_terms
from weald.tools import SessionServices, Tool, ToolContext, ToolResult, invoke
from weald.tools._memstore import (
    GLOBAL_SCOPE,
    NAMESPACE,
    MemoryNote,
    fts_query,
    search_notes,
    set_note,
)
from weald.tools._taskstore import scope_for_project
from weald.tools.memory import memory_get, memory_search, memory_set

Call = Callable[..., ToolResult]


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
        fields.setdefault(
            "session",
            SessionServices(output_dir=tmp_path / "out", runtime=types.SimpleNamespace(store=store)),
        )
        return ToolContext(**fields)

    return make


@pytest.fixture
def call(make_ctx: Callable[..., ToolContext]) -> Call:
    """``call(tool, ctx=None, **arguments)`` through `invoke`, so the schema is checked."""
    default = make_ctx()

    def call_(tool: Tool, /, *, ctx: ToolContext | None = None, **arguments: Any) -> ToolResult:
        return trio.run(invoke, tool, ctx or default, arguments)

    return call_


def ok(result: ToolResult) -> ToolResult:
    assert result.ok, result.output
    return result


def keys_found(call: Call, query: str, **extra: Any) -> list[str]:
    return [hit["key"] for hit in ok(call(memory_search, query=query, **extra)).data["hits"]]


NOTES = {
    "build-steps": ("Build with make; the release build needs NODE_ENV=production.", ["build"]),
    "deploy": ("Deploying: run make deploy, then watch the deploy logs. Deploy only from main.", ["ops"]),
    "testing": ("Run the tests with pytest -x; the slow tests are marked slow.", ["dev"]),
    "style": ("Docstrings are Google style; ruff checks them.", []),
    "db": ("The database runs in WAL mode; deploy migrations before the app.", ["ops", "db"]),
    "café": ("Le café est à côté de la gare; naïve résumé.", ["fr"]),
}


@pytest.fixture
def notes(call: Call) -> Call:
    for key, (text, tags) in NOTES.items():
        ok(call(memory_set, key=key, text=text, tags=tags))
    return call


def test_the_memory_tools_are_runtime_tools_allowed_by_default() -> None:
    for tool in (memory_set, memory_get, memory_search):
        assert tool.permission == "allow"
        assert tool.kind == "runtime"
        assert not tool.is_async


def test_a_note_is_saved_and_read_back_with_its_tags(call: Call) -> None:
    saved = ok(call(memory_set, key="build-steps", text="make all\nthen make check", tags=["build", "ci", "build"]))
    assert saved.output == "Saved note 'build-steps' in the project scope (24 characters) [build, ci]."
    got = ok(call(memory_get, key="build-steps"))
    assert got.output.startswith("build-steps [build, ci] (saved ")
    assert got.output.endswith("project scope)\n\nmake all\nthen make check")
    assert got.data["tags"] == ["build", "ci"]


def test_setting_a_key_again_replaces_the_note_and_keeps_its_creation_time(
    call: Call, store: Store, proj: Path
) -> None:
    ok(call(memory_set, key="k", text="first"))
    created = store.get(NAMESPACE, f"{scope_for_project(proj)}/k", type=MemoryNote).created
    replaced = ok(call(memory_set, key="k", text="second"))
    assert replaced.output.startswith("Replaced note 'k'")
    note = store.get(NAMESPACE, f"{scope_for_project(proj)}/k", type=MemoryNote)
    assert note.text == "second"
    assert note.created == created
    assert note.updated >= created
    assert keys_found(call, "first") == []
    assert keys_found(call, "second") == ["k"]


def test_a_missing_key_lists_the_closest_keys_and_suggests_search(notes: Call) -> None:
    result = notes(memory_get, key="deplo")
    assert not result.ok
    assert result.output.startswith("no note 'deplo' in the project scope. Existing keys: 'deploy',")
    assert "memory_search" in result.output


def test_a_missing_key_in_an_empty_scope_says_how_to_save_one(call: Call) -> None:
    result = call(memory_get, key="anything", scope="global")
    assert not result.ok
    assert "the global scope has no notes yet" in result.output
    assert "memory_set" in result.output


def test_bad_keys_and_tags_are_refused_with_what_was_expected(call: Call) -> None:
    assert "key: expected a one-line name" in call(memory_set, key="two\nlines", text="x").output
    assert (
        "tags[1]: expected a short label without commas"
        in call(memory_set, key="k", text="x", tags=["a", "b,c"]).output
    )
    assert "text: " in call(memory_set, key="k", text="").output


def test_the_more_relevant_note_ranks_first(notes: Call) -> None:
    hits = ok(notes(memory_search, query="deploy")).data["hits"]
    # "deploy" is the key of one note and three times in its text; once in "db".
    assert [h["key"] for h in hits] == ["deploy", "db"]
    assert hits[0]["score"] > hits[1]["score"] > 0
    assert "**deploy**" in hits[0]["preview"].lower()


def test_notes_matching_more_of_the_words_rank_higher(notes: Call) -> None:
    assert keys_found(notes, "slow pytest tests")[0] == "testing"
    assert keys_found(notes, "production release build")[0] == "build-steps"


def test_search_output_shows_rank_key_tags_score_and_preview(notes: Call) -> None:
    result = ok(notes(memory_search, query="ruff docstrings"))
    lines = result.output.splitlines()
    assert lines[0] == "1 note in the project scope match 'ruff docstrings', best first:"
    assert lines[1].startswith("1. style (score ")
    assert "**Docstrings** are Google style; **ruff** checks them." in lines[1]


def test_tags_are_searched(notes: Call) -> None:
    assert sorted(keys_found(notes, "ops")) == ["db", "deploy"]


def test_the_limit_caps_the_hits(notes: Call) -> None:
    assert len(keys_found(notes, "the", limit=2)) == 2
    assert "limit: " in notes(memory_search, query="x", limit=500).output


def test_a_word_ending_in_a_star_matches_as_a_prefix(notes: Call) -> None:
    assert "deploy" in keys_found(notes, "deplo*")
    assert keys_found(notes, "deplo") == []


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"deploy',
        'deploy"',
        "deploy AND",
        "AND",
        "OR OR",
        "NOT deploy",
        "NEAR(deploy logs)",
        "deploy NEAR/2 logs",
        "*",
        "deploy*",
        "*deploy",
        "key:deploy",
        "^deploy",
        "(deploy",
        "deploy -logs",
        "{key text}: deploy",
        "'; DROP TABLE notes; --",
        "café",
        "naïve résumé",
        "日本語のテキスト",
        "emoji 🚀 deploy",
    ],
)
def test_fts_syntax_in_a_query_never_reaches_sqlite(notes: Call, query: str) -> None:
    result = notes(memory_search, query=query)
    assert "sqlite" not in result.output.lower()
    assert "fts5" not in result.output.lower()
    assert "syntax" not in result.output.lower()
    if any(ch.isalnum() for ch in query):
        assert result.ok, result.output
    else:
        assert result.output.startswith(f"query {query!r} has no words to search for")


def test_operator_words_are_searched_as_plain_words(call: Call) -> None:
    ok(call(memory_set, key="logic", text="Use AND and OR with NEAR care"))
    ok(call(memory_set, key="other", text="nothing relevant"))
    assert keys_found(call, "NEAR") == ["logic"]
    assert keys_found(call, "AND OR") == ["logic"]


def test_unicode_words_match_without_their_accents(notes: Call) -> None:
    assert keys_found(notes, "cafe") == ["café"]
    assert keys_found(notes, "café") == ["café"]
    assert keys_found(notes, "NAIVE") == ["café"]


def test_fts_query_quotes_every_word() -> None:
    assert fts_query('deploy "the" AND app*') == '"deploy" OR "the" OR "AND" OR "app"*'
    assert fts_query('"(*)":') == ""
    assert fts_query("Deploy deploy DEPLOY") == '"Deploy"'
    assert fts_query("e\u0301t\u00e9") == '"\u00e9t\u00e9"'
    assert fts_query(" ".join(f"w{i}" for i in range(100))).count(" OR ") == 31
    assert len(query_terms(" ".join(f"w{i}" for i in range(100)))) == 32


def test_project_and_global_scopes_keep_their_notes_apart(
    call: Call, make_ctx: Callable[..., ToolContext], tmp_path: Path
) -> None:
    ok(call(memory_set, key="shared", text="project alpha note"))
    ok(call(memory_set, key="shared", text="global beta note", scope="global"))
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other = make_ctx(working_dir=other_dir)
    assert "alpha" in ok(call(memory_get, key="shared")).output
    assert "beta" in ok(call(memory_get, key="shared", scope="global")).output
    assert "beta" in ok(call(memory_get, ctx=other, key="shared", scope="global")).output
    assert not call(memory_get, ctx=other, key="shared").ok
    assert keys_found(call, "beta") == []
    assert keys_found(call, "beta", scope="global") == ["shared"]
    assert keys_found(call, "alpha", ctx=other) == []
    empty = ok(call(memory_search, ctx=other, query="alpha"))
    assert "No notes in the project scope match 'alpha' (0 notes in all)" in empty.output
    assert "scope 'global'" in empty.output


def test_without_a_runtime_the_tools_say_they_need_one(make_ctx: Callable[..., ToolContext]) -> None:
    ctx = make_ctx(session=None)
    for tool, arguments in ((memory_set, {"key": "k", "text": "t"}), (memory_get, {"key": "k"})):
        result = trio.run(invoke, tool, ctx, arguments)
        assert not result.ok
        assert f"{tool.name} needs the weald runtime's store" in result.output


def test_a_note_written_by_any_path_is_searchable_once_committed(store: Store, proj: Path) -> None:
    scope = scope_for_project(proj)
    # Not through set_note: the store indexes what its transaction writes to the namespace, whoever writes it.
    store.put(NAMESPACE, f"{scope}/late", MemoryNote(key="late", text="written by a plain put"))
    store.enqueue_nowait(NAMESPACE, f"{scope}/queued", MemoryNote(key="queued", text="written through the queue"))
    store.flush().get(timeout=10)
    store.put(NAMESPACE, f"{scope}/junk", {"not": "a note"})
    assert [h.key for h in search_notes(store, scope, "plain")] == ["late"]
    assert [h.key for h in search_notes(store, scope, "queue")] == ["queued"]
    store.delete(NAMESPACE, f"{scope}/late")
    assert search_notes(store, scope, "plain") == []
    with store.transaction() as tx:
        tx.write_batch(
            NAMESPACE, {f"{scope}/tx": MemoryNote(key="tx", text="written in a transaction")}, [f"{scope}/queued"]
        )
    assert [h.key for h in search_notes(store, scope, "transaction")] == ["tx"]
    assert search_notes(store, scope, "queue") == []


def test_a_store_from_before_the_index_moved_in_is_indexed_when_opened(tmp_path: Path, proj: Path) -> None:
    scope = scope_for_project(proj)
    path = tmp_path / "old.db"
    Store(path).close()
    # As an older weald left it: the notes in their table, no index tables, a sidecar index file beside it.
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE _weald_memory_fts")
    conn.execute("DROP TABLE _weald_memory_docs")
    conn.execute("DELETE FROM _weald_meta")
    conn.execute('CREATE TABLE IF NOT EXISTS "memory" (key TEXT PRIMARY KEY, value BLOB)')
    note = MemoryNote(key="old", text="a note from an older store")
    conn.execute('INSERT INTO "memory" VALUES (?, ?)', (f"{scope}/old", msgspec.json.encode(note)))
    conn.commit()
    conn.close()
    sidecar = tmp_path / "old.db.memory-index"
    sidecar.write_bytes(b"an index of the old kind")
    reopened = Store(path)
    try:
        assert [h.key for h in search_notes(reopened, scope, "older")] == ["old"]
        assert not sidecar.exists()
    finally:
        reopened.close()


def test_an_index_of_another_version_is_rebuilt_when_the_store_opens(store: Store, proj: Path) -> None:
    scope = scope_for_project(proj)
    set_note(store, scope, "k", "versioned words")
    store.close()
    assert store.path is not None
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE _weald_meta SET value = '0' WHERE key = 'memory_index'")
    conn.execute("DELETE FROM _weald_memory_fts")
    conn.commit()
    conn.close()
    reopened = Store(store.path)
    try:
        assert [h.key for h in search_notes(reopened, scope, "versioned")] == ["k"]
    finally:
        reopened.close()


def test_without_fts5_search_says_why_and_notes_still_save(
    monkeypatch: pytest.MonkeyPatch, call: Call, tmp_path: Path, make_ctx: Callable[..., ToolContext]
) -> None:
    monkeypatch.setattr(_store_sqlite, "_FTS5", False)
    fresh = Store(tmp_path / "nofts.db")
    try:
        ctx = make_ctx(session=SessionServices(output_dir=tmp_path / "o", runtime=types.SimpleNamespace(store=fresh)))
        ok(call(memory_set, ctx=ctx, key="k", text="kept without an index"))
        assert "kept without" in ok(call(memory_get, ctx=ctx, key="k")).output
        result = call(memory_search, ctx=ctx, query="kept")
        assert not result.ok
        assert "needs sqlite's FTS5 extension" in result.output
        assert "memory_set and memory_get still work" in result.output
    finally:
        fresh.close()
    assert _store_sqlite.fts5_available() is False
    monkeypatch.setattr(_store_sqlite, "_FTS5", None)
    assert _store_sqlite.fts5_available() is True


def test_notes_saved_by_one_store_object_are_found_through_another(store: Store, proj: Path) -> None:
    scope = scope_for_project(proj)
    set_note(store, scope, "a", "alpha words", ["x"])
    other = Store(store.path)
    try:
        set_note(other, GLOBAL_SCOPE, "b", "beta words")
        assert [h.key for h in search_notes(other, scope, "alpha")] == ["a"]
        assert search_notes(other, scope, "alpha")[0].tags == ("x",)
    finally:
        other.close()


def test_notes_saved_from_many_threads_are_all_indexed(call: Call) -> None:
    def save(worker: int) -> None:
        for i in range(10):
            ok(call(memory_set, key=f"w{worker}-{i}", text=f"parallel note number {i}"))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(save, range(4)))
    assert len(keys_found(call, "parallel", limit=50)) == 40


def test_searching_a_closed_store_is_refused(store: Store, proj: Path) -> None:
    set_note(store, scope_for_project(proj), "k", "words")
    store.close()
    with pytest.raises(StoreClosedError):
        search_notes(store, scope_for_project(proj), "words")
