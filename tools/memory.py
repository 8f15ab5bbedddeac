"""The memory tools: ``memory_set``, ``memory_get`` and ``memory_search``.

Persistent notes by key (text and optional tags) in the runtime's store,
for what an agent learns and wants to find again in a later session: how
the project is built, decisions taken, pitfalls met. Notes belong to the
project directory by default, or with ``scope: "global"`` to every project.
``memory_search`` ranks notes by full-text relevance, through the index the
store keeps of them (FTS5 and BM25 in sqlite, ``tsvector`` in PostgreSQL);
see `weald.tools._memstore`.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping
from typing import Any, Final

from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._memstore import (
    GLOBAL_SCOPE,
    MemoryNote,
    SearchHit,
    fts_query,
    get_note,
    list_keys,
    search_notes,
    set_note,
)
from weald.tools._taskstore import runtime_store, scope_for_project

__all__ = ["MemoryNote", "SearchHit", "memory_get", "memory_search", "memory_set", "search_notes"]

MAX_KEY: Final = 200
MAX_TEXT: Final = 50_000
MAX_TAGS: Final = 20
MAX_TAG: Final = 40
MAX_LIMIT: Final = 50

_SCOPE: Final[Mapping[str, Any]] = {
    "enum": ["project", "global"],
    "description": "Whose notes: this project's (default) or the global ones, shared by every project.",
}
_KEY: Final[Mapping[str, Any]] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY,
    "description": "The note's name, e.g. 'build-steps' or 'decision/storage-format'.",
}


def _scope(ctx: ToolContext, scope: str) -> tuple[str, str]:
    if scope == "global":
        return GLOBAL_SCOPE, "global"
    return scope_for_project(ctx.working_dir), "project"


def _clean_key(key: str) -> str:
    cleaned = key.strip()
    if not cleaned or any(ch in cleaned for ch in "\r\n\t\0"):
        raise ToolError(f"key: expected a one-line name such as 'build-steps', got {key!r}")
    return cleaned


def _clean_tags(tags: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for i, tag in enumerate(tags):
        cleaned = " ".join(tag.split())
        if not cleaned or "," in cleaned:
            raise ToolError(f"tags[{i}]: expected a short label without commas, such as 'build', got {tag!r}")
        if cleaned not in out:
            out.append(cleaned)
    return tuple(out)


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(stamp))


def _tag_text(tags: tuple[str, ...]) -> str:
    return f" [{', '.join(tags)}]" if tags else ""


@tool(
    name="memory_set",
    description=(
        "Save a note under a key so you (or a later session) can find it again: how to build or test the "
        "project, decisions and their reasons, pitfalls. Replaces the note already under that key. Notes "
        "belong to the project unless scope is 'global'. Find notes with memory_search; read one with memory_get."
    ),
    parameters={
        "type": "object",
        "properties": {
            "key": _KEY,
            "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT, "description": "The note."},
            "tags": {
                "type": "array",
                "maxItems": MAX_TAGS,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG},
                "description": "Optional short labels, searched with the text.",
            },
            "scope": _SCOPE,
        },
        "required": ["key", "text"],
        "additionalProperties": False,
    },
    permission="allow",
    kind="runtime",
)
def memory_set(
    ctx: ToolContext,
    key: str,
    text: str,
    tags: list[str] | None = None,
    scope: str = "project",
) -> ToolResult:
    """Save a note; committed to the store before the result is returned."""
    store = runtime_store(ctx, "memory_set")
    scope_key, where = _scope(ctx, scope)
    name = _clean_key(key)
    note, old = set_note(store, scope_key, name, text, _clean_tags(tags or []))
    verb = "Replaced" if old is not None else "Saved"
    return ToolResult.success(
        f"{verb} note {name!r} in the {where} scope ({len(note.text)} characters){_tag_text(note.tags)}.",
        data={"key": name, "scope": where, "replaced": old is not None},
    )


@tool(
    name="memory_get",
    description="Read the note saved under a key (in the project's notes, or the global ones with scope 'global').",
    parameters={
        "type": "object",
        "properties": {"key": _KEY, "scope": _SCOPE},
        "required": ["key"],
        "additionalProperties": False,
    },
    permission="allow",
    kind="runtime",
)
def memory_get(ctx: ToolContext, key: str, scope: str = "project") -> ToolResult:
    """Return one note's text, with its tags and when it was last saved."""
    store = runtime_store(ctx, "memory_get")
    scope_key, where = _scope(ctx, scope)
    name = _clean_key(key)
    note = get_note(store, scope_key, name)
    if note is None:
        keys = list_keys(store, scope_key)
        if not keys:
            other = "global" if where == "project" else "project"
            raise ToolError(
                f"no note {name!r}: the {where} scope has no notes yet. "
                f"Save one with memory_set, or try scope {other!r}.",
            )
        close = difflib.get_close_matches(name, keys, n=5, cutoff=0.5)
        shown = close + [k for k in keys if k not in close][: 8 - len(close)]
        more = f" (and {len(keys) - len(shown)} more)" if len(keys) > len(shown) else ""
        raise ToolError(
            f"no note {name!r} in the {where} scope. Existing keys: {', '.join(repr(k) for k in shown)}{more}. "
            "Use memory_search to find a note by its words.",
        )
    header = f"{note.key}{_tag_text(note.tags)} (saved {_when(note.updated)}, {where} scope)"
    return ToolResult.success(
        f"{header}\n\n{note.text}",
        data={"key": note.key, "text": note.text, "tags": list(note.tags), "updated": note.updated, "scope": where},
    )


def _hit_line(rank: int, hit: SearchHit) -> str:
    return f"{rank}. {hit.key}{_tag_text(hit.tags)} (score {hit.score:.3g}): {hit.preview}"


@tool(
    name="memory_search",
    description=(
        "Search the saved notes by their words (full-text, best match first; a word ending in * matches as a "
        "prefix). Returns keys, scores and a short preview; read a whole note with memory_get."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "Words to look for."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_LIMIT,
                "default": 10,
                "description": f"How many notes to return, at most {MAX_LIMIT} (default 10).",
            },
            "scope": _SCOPE,
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    permission="allow",
    kind="runtime",
)
def memory_search(ctx: ToolContext, query: str, limit: int = 10, scope: str = "project") -> ToolResult:
    """Rank the scope's notes against ``query`` by full-text relevance."""
    store = runtime_store(ctx, "memory_search")
    scope_key, where = _scope(ctx, scope)
    if not fts_query(query):
        raise ToolError(f"query {query!r} has no words to search for; give words that the note would contain")
    hits = search_notes(store, scope_key, query, limit)
    data = {
        "scope": where,
        "hits": [{"key": h.key, "score": h.score, "preview": h.preview, "tags": list(h.tags)} for h in hits],
    }
    if not hits:
        total = len(list_keys(store, scope_key))
        other = "global" if where == "project" else "project"
        return ToolResult.success(
            f"No notes in the {where} scope match {query!r} ({total} notes in all). "
            f"Try other or fewer words, a prefix such as 'deploy*', or scope {other!r}.",
            data=data,
        )
    header = f"{len(hits)} note{'s' if len(hits) != 1 else ''} in the {where} scope match {query!r}, best first:"
    return ToolResult.success("\n".join([header, *(_hit_line(i, h) for i, h in enumerate(hits, 1))]), data=data)
