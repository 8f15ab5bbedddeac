"""The edit_file tool: change part of a text file, by line anchor or by text.

Two ways in one tool:

- **by anchor**: ``start="12:3f"`` (and ``through``) name lines by the tags
  read_file shows; ``operation`` replaces them, or inserts after or before
  the start line; without ``new_string`` a replace deletes them. The session's
  ledger (`weald.tools._ledger`) decides which line an anchor names: one the
  model saw before its own earlier edits is followed to where that line is
  now; one that could name two lines, or a line since replaced, is refused
  with the current lines and their tags, so the model can retry at once.
- **by text**: ``old_string`` -> ``new_string``, exact match first, then the
  tolerant cascade of `weald.tools._fuzzy` (never an ambiguous match);
  ``replace_all`` changes every occurrence.

Either way the file must have been read in this session and be unchanged
since; BOM, line endings, a missing final newline and bytes that are not
valid UTF-8 survive byte for byte outside the edited text; the write is
atomic and keeps the file's mode. A read-only file (no write permission bit
for anyone) is refused, though a rename as root would replace it.
"""

from __future__ import annotations

import difflib
import itertools
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._editor import editor_files, write_buffer
from weald.tools._fuzzy import (
    STRATEGY_NOTES,
    Located,
    adapt_replacement,
    block_anchor,
    closest_region,
    locate,
    scope_problem,
    unescapes_new,
)
from weald.tools._hashline import (
    Hunk,
    TextFile,
    echoed_from,
    format_lines,
    line_hash,
    parse_anchor,
    strip_echoed_tags,
    tag_prefixed,
    to_display,
)
from weald.tools._ledger import AnchorFate, FileHistory, session_ledger
from weald.tools._sandbox import path_subject, refuse_protected_path, refuse_read_only, write_atomic
from weald.tools.read_file import read_text

__all__ = ["edit_file"]

OPERATIONS = ("replace", "insert_after", "insert_before")
# Most tagged lines the result shows; the diff shows the rest.
_MAX_SHOWN_LINES = 80
_DIFF_CONTEXT = 3

_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "The file to edit: relative to the working directory, or absolute inside it.",
        },
        "start": {
            "type": "string",
            "description": (
                "Edit by anchor: the tag 'N:hh' of the first line to change, exactly as read_file shows it "
                "before the bar (for the line '12:3f|    return x' pass '12:3f'). Do not combine with old_string."
            ),
        },
        "through": {
            "type": "string",
            "description": (
                "Edit by anchor, operation 'replace' only: the tag 'N:hh' of the last line to replace "
                "(inclusive). Omit it to replace the start line alone."
            ),
        },
        "operation": {
            "type": "string",
            "enum": list(OPERATIONS),
            "default": "replace",
            "description": (
                "Edit by anchor: 'replace' (default) puts new_string's lines in place of lines start..through, "
                "or deletes them when new_string is omitted; 'insert_after' / 'insert_before' add new_string's "
                "lines after / before the start line and change nothing else."
            ),
        },
        "old_string": {
            "type": "string",
            "description": (
                "Edit by text: the text to replace, copied exactly from the file (without the 'N:hh|' "
                "prefixes). It must match exactly one place unless replace_all is true: include a few "
                "surrounding lines to make it unique. Do not combine with start."
            ),
        },
        "new_string": {
            "type": "string",
            "description": (
                "The new text, without 'N:hh|' prefixes. Edit by text: replaces old_string ('' deletes it). "
                "Edit by anchor: the new lines ('\\n' for one blank line); omit it with operation 'replace' "
                "to delete the lines."
            ),
        },
        "replace_all": {
            "type": "boolean",
            "default": False,
            "description": "Edit by text: replace every occurrence of old_string instead of requiring exactly one.",
        },
    },
    "required": ["path"],
    "additionalProperties": False,
    "dependentRequired": {"through": ["start"]},
}

_DESCRIPTION = (
    "Edit a text file that you have read with read_file in this session. Two ways:\n"
    "1. By anchor (best for whole lines): start='N:hh' as read_file shows it, optionally through='M:hh' for "
    "a range, operation 'replace' (default), 'insert_after' or 'insert_before', and new_string with the new "
    "lines. A replace without new_string deletes the lines.\n"
    "2. By text: old_string, copied exactly and matching one place, and new_string; replace_all=true "
    "changes every occurrence. Small slips in old_string (indentation, whitespace, typographic quotes, "
    "escaped newlines) are forgiven when the match is unambiguous and covers whole lines.\n"
    "Never include the 'N:hh|' prefixes in old_string or new_string. The file's line endings, BOM and final "
    "newline are kept. If the file changed since you read it the edit is refused: read it again. The result "
    "shows the changed lines with fresh N:hh tags (use those for the next edit) and a diff."
)


@attrs.frozen
class _Plan:
    """The edits to make, in `TextFile.text` coordinates, and how to describe them.

    Attributes:
        edits: ``(start, end, replacement)`` spans, as `TextFile.replace` takes them.
        hunks: which lines the edits change (`TextFile.line_hunks`), for the ledger.
        summary: what was done, for the result's first line.
        notes: what the result should say besides.
    """

    edits: tuple[tuple[int, int, str], ...]
    hunks: tuple[Hunk, ...]
    summary: str
    notes: tuple[str, ...] = ()


class _Shown:
    """Lines of the current version a message shows, tagged; recorded in the ledger if the edit is refused.

    A refusal's tags are the ones the model retries with, so the ledger must
    know it was shown them (see `weald.tools._ledger`).
    """

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.ranges: list[tuple[int, int]] = []

    def tagged(self, first: int, last: int) -> str:
        """Lines ``first``..``last`` (1-based, clamped to the file) as ``N:hh|content``."""
        first, last = max(first, 1), min(last, len(self.lines))
        if last < first:
            return ""
        self.ranges.append((first, last))
        return "\n".join(format_lines(self.lines[first - 1 : last], first))

    def region(self, first: int, last: int) -> str:
        """Lines ``first``..``last`` tagged; past 30 lines, only the first and last ten."""
        if last - first < 30:
            return self.tagged(first, last)
        return self.tagged(first, first + 9) + "\n...\n" + self.tagged(last - 9, last)

    def anchor(self, number: int) -> str:
        """The anchor ``N:hh`` of line ``number``, as a message shows it."""
        self.ranges.append((number, number))
        return f"{number}:{line_hash(self.lines[number - 1])}"

    def around(self, centers: Sequence[int], radius: int = 2) -> tuple[int, int, str]:
        """The lines within ``radius`` of each of ``centers``, gaps marked ``...``; the first and last shown."""
        spans: list[list[int]] = []
        for center in sorted(set(centers)):
            lo, hi = max(center - radius, 1), min(center + radius, len(self.lines))
            if spans and lo <= spans[-1][1] + 1:
                spans[-1][1] = max(spans[-1][1], hi)
            else:
                spans.append([lo, hi])
        shown = "\n...\n".join(self.tagged(lo, hi) for lo, hi in spans)
        return spans[0][0], spans[-1][1], shown

    def record(self, ctx: ToolContext, real: Path, sha256: bytes | None) -> None:
        ledger = session_ledger(ctx)
        if ledger is None or sha256 is None:
            return
        for first, last in self.ranges:
            ledger.record_shown(real, sha256, first, self.lines[first - 1 : last])


@tool(
    name="edit_file",
    description=_DESCRIPTION,
    parameters=_PARAMETERS,
    permission="ask",
    timeout=10.0,
    truncate="head",
    subject=path_subject,
    kind="write",
)
def edit_file(
    ctx: ToolContext,
    path: str,
    *,
    start: str | None = None,
    through: str | None = None,
    operation: str = "replace",
    old_string: str | None = None,
    new_string: str | None = None,
    replace_all: bool = False,
) -> ToolResult:
    """Edit a file by anchor or by text; see the module docstring.

    Returns:
        The changed lines with fresh tags and a unified diff; ``data`` holds
        ``path``, ``diff``, ``lines_added`` and ``lines_removed``.

    Raises:
        ToolError: bad argument combinations, an unread, changed or read-only
            file, a stale anchor, text that matches nowhere or ambiguously.
    """
    anchored = _check_arguments(
        start=start,
        through=through,
        operation=operation,
        old_string=old_string,
        new_string=new_string,
        replace_all=replace_all,
    )
    resolved = ctx.resolve_path(path)
    refuse_protected_path(ctx, resolved)
    editor = editor_files(ctx, resolved)  # None (the disk) unless the project chose the editor's buffers
    real, shown, data, st = read_text(ctx, path, purpose="edit_file edits", editor=editor)
    refuse_read_only(ctx, real, st)
    ledger = session_ledger(ctx)
    sha256: bytes | None = None
    history: FileHistory | None = None
    if ledger is not None:
        where = "in the editor" if editor is not None else "on disk"
        sha256 = ledger.check_fresh(real, data=data, st=st, name=shown, where=where).digest
        history = ledger.history(real, sha256)
    doc = TextFile.decode(data)
    display = _Shown(doc.lines())
    try:
        if anchored:
            assert start is not None
            plan = _plan_anchored(
                doc,
                shown,
                display,
                history,
                start=start,
                through=through,
                operation=operation,
                new_string=new_string,
            )
        else:
            assert old_string is not None
            assert new_string is not None
            plan = _plan_text(
                ctx,
                doc,
                shown,
                display,
                old_string=old_string,
                new_string=new_string,
                replace_all=replace_all,
            )
    except ToolError:
        display.record(ctx, real, sha256)
        raise
    new_data = doc.encode(doc.replace(plan.edits))
    if new_data == data:
        raise ToolError(f"the edit would leave {shown} exactly as it is, so nothing was written. Check new_string.")
    ctx.abort.raise_if_set()
    if editor is not None:
        new_stat = write_buffer(ctx, editor, real, new_data)
    else:
        new_stat = write_atomic(ctx, str(real), new_data, expect=st).stat
    result, views = _report(shown, display.lines, TextFile.decode(new_data), plan)
    if ledger is not None:
        ledger.record_change(real, new_data, new_stat, base=sha256, hunks=plan.hunks, views=views)
    if editor is not None:
        output = result.output.replace(f"Edited {shown}:", f"Edited {shown} in the editor:", 1)
        result = attrs.evolve(result, output=output, data={**result.data, "editor": True})
    return result


def _check_arguments(
    *,
    start: str | None,
    through: str | None,
    operation: str,
    old_string: str | None,
    new_string: str | None,
    replace_all: bool,
) -> bool:
    """Check the mode's arguments fit together; returns True for an anchored edit."""
    if start is not None and old_string is not None:
        raise ToolError(
            "give either start (edit by anchor) or old_string (edit by text), not both. "
            "Use start='N:hh' to change whole lines, or old_string to replace a piece of text.",
        )
    if start is None and old_string is None:
        raise ToolError(
            "say what to change: either start='N:hh' (a line tag from read_file) with new_string, "
            "or old_string (text copied from the file) with new_string.",
        )
    if start is not None:
        if replace_all:
            raise ToolError("replace_all works with old_string only; an anchored edit changes the lines named.")
        if through is not None and operation != "replace":
            raise ToolError(
                f"through applies to operation 'replace' only; {operation} inserts at the start line. "
                "Remove through, or use operation 'replace'.",
            )
        if operation != "replace" and not new_string:
            raise ToolError(f"operation {operation} needs new_string: the lines to insert.")
        return True
    if operation != "replace":
        raise ToolError(
            f"operation {operation} applies to edits by anchor (start='N:hh'); with old_string the text is "
            "replaced. To insert, use start with operation insert_after, or include the neighbouring text "
            "in old_string and new_string.",
        )
    if new_string is None:
        raise ToolError("new_string is required with old_string: the text to put in its place ('' deletes it).")
    if old_string == "":
        raise ToolError(
            "old_string is empty, so it names no place in the file. To add lines use start='N:hh' with "
            "operation insert_after; to give a file new content use write_file.",
        )
    if old_string == new_string:
        raise ToolError("old_string and new_string are the same, so there is nothing to change.")
    return False


def _line_starts(lines: Sequence[str]) -> list[int]:
    """The offset where each line starts in the text the lines came from (lines joined by newlines)."""
    # In C: the running sum of the lengths, plus one newline per line before.
    return list(map(operator.add, itertools.accumulate(map(len, lines), initial=0), range(len(lines))))


def _new_lines(text: str) -> list[str]:
    """new_string as lines for an anchored edit: a trailing newline ends the last line; '' is no lines."""
    text = text.replace("\r\n", "\n")
    if not text:
        return []
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def _resolve(
    history: FileHistory | None,
    display: _Shown,
    shown: str,
    argument: str,
    value: str,
) -> tuple[tuple[int, str], AnchorFate]:
    """Which current line the anchor ``value`` names; refuses with the current lines otherwise.

    Without a ledger (no session) the tag must match the line at that number now.
    """
    lines = display.lines
    number, tag = parse_anchor(value, argument=argument)
    total = len(lines)
    if history is None:
        fate = AnchorFate("current", line=number) if number <= total and line_hash(lines[number - 1]) == tag else None
    else:
        fate = history.resolve(number, tag, lines)
    if fate is not None and fate.accepted:
        return (number, tag), fate
    named = f"{argument}='{number}:{tag}'"
    if fate is None or fate.kind == "mismatch":
        if number > total:
            _, _, context = display.around([total])
            raise ToolError(
                f"{named} is past the end of {shown}, which has {total} lines. Its last lines are:\n{context}\n"
                "Use a tag shown there (tags shown here are current), or read the file again if it changed.",
            )
        actual = line_hash(lines[number - 1])
        lo, hi, context = display.around([number])
        message = (
            f"{named} is stale: line {number} of {shown} now has tag {number}:{actual}, so it is not the line "
            f"you read. Lines {lo}-{hi} now are:\n{context}\n"
        )
        window = range(max(number - 20, 1), min(number + 20, total) + 1)
        moved = [n for n in window if n != number and line_hash(lines[n - 1]) == tag]
        if len(moved) == 1:
            message += f"The line you meant may have moved to line {moved[0]} ({moved[0]}:{tag}). "
        raise ToolError(
            message + f"If line {number} as shown is the one you want, retry with {argument}='{number}:{actual}'; "
            "otherwise read the file again to get current tags.",
        )
    centers = [n for n in (number, fate.near, *fate.candidates) if n is not None and 1 <= n <= total]
    lo, hi, context = display.around(centers or [total])
    now = f"Lines {lo}-{hi} of {shown} now are (these tags are current):\n{context}\n"
    if fate.kind == "gone":
        raise ToolError(
            f"{named} names line {number} as you saw it before your later edits to {shown}, and one of those "
            f"edits replaced or deleted that line, so it is no longer in the file. {now}"
            "Anchor to a line shown here, or read the file again.",
        )
    if fate.kind == "outdated":
        raise ToolError(
            f"{named} names line {number} as you saw it before {shown} was changed outside this session, so "
            f"weald cannot tell where that line is now. {now}Anchor to a line shown here, or read the file again.",
        )
    if fate.kind == "ambiguous":
        where = " or ".join(f"line {n}" for n in fate.candidates)
        if fate.lost:
            where += ", or a line your edits have replaced since"
        raise ToolError(
            f"{named} is ambiguous: you were shown line {number} with this tag both before and after your edits "
            f"to {shown}, and those are not the same line now (it could mean {where}), so the edit was refused "
            f"rather than guess. {now}Retry with the tag of the line you mean as shown here.",
        )
    raise ToolError(  # unconfirmed
        f"{named} matches line {number} of {shown} now, but you were not shown that line since lines around it "
        "moved (an edit inserted, deleted or replaced lines at or above it since you read the file), so it may be "
        f"an old anchor for another line. {now}If line {number} as shown here is the one you mean, retry with "
        f"{named}.",
    )


def _check_range(
    history: FileHistory | None,
    display: _Shown,
    shown: str,
    start: tuple[tuple[int, str], AnchorFate],
    through: tuple[tuple[int, str], AnchorFate],
) -> None:
    """Refuse a range whose lines between start and through changed since the version the anchors come from."""
    (_, s_fate), (_, t_fate) = start, through
    first, last = s_fate.line, t_fate.line
    assert first is not None
    assert last is not None
    if history is None or last - first < 1:
        return
    origin = min(s_fate.origin, t_fate.origin)
    if history.intact(origin, first, last, skip_first=s_fate.origin > origin, skip_last=t_fate.origin > origin):
        return
    context = display.region(first, last)
    raise ToolError(
        f"start and through come from an older view of {shown} than some of the lines between them: your "
        f"edits since have inserted, deleted or replaced lines inside that range, so it may not hold what you "
        f"expect. Lines {first}-{last} now are (these tags are current):\n{context}\n"
        "Retry with start and through as shown here, after checking new_string against these lines.",
    )


def _moved_note(argument: str, anchor: tuple[tuple[int, str], AnchorFate]) -> str | None:
    (number, tag), fate = anchor
    if fate.kind != "moved":
        return None
    return (
        f"{argument}='{number}:{tag}' is the tag line {number} had before your earlier edit; that line is now "
        f"line {fate.line}, so the edit was made there. Use the tags shown below from now on."
    )


def _plan_anchored(
    doc: TextFile,
    shown: str,
    display: _Shown,
    history: FileHistory | None,
    *,
    start: str,
    through: str | None,
    operation: str,
    new_string: str | None,
) -> _Plan:
    lines = display.lines
    total = len(lines)
    if total == 0:
        raise ToolError(f"{shown} is empty, so it has no line to anchor to. Give it content with write_file.")
    start_anchor = _resolve(history, display, shown, "start", start)
    anchors = [("start", start_anchor)]
    first = start_anchor[1].line
    assert first is not None
    last = first
    if through is not None:
        through_anchor = _resolve(history, display, shown, "through", through)
        anchors.append(("through", through_anchor))
        through_line = through_anchor[1].line
        assert through_line is not None
        last = through_line
        if last < first:
            raise ToolError(
                f"through (line {last}) comes before start (line {first}). through is the last line of the "
                "range to replace, at or after start.",
            )
        _check_range(history, display, shown, start_anchor, through_anchor)
    notes = [note for argument, anchor in anchors if (note := _moved_note(argument, anchor)) is not None]
    lands_at = first + 1 if operation == "insert_after" else first
    raw_new = new_string or ""
    new_text = strip_echoed_tags(raw_new, first=lands_at)
    if new_text != raw_new:
        notes.append("The 'N:hh|' prefixes copied from read_file output were removed from new_string.")
    elif tag_prefixed(raw_new.replace("\r\n", "\n")):
        notes.append(_KEPT_TAGS)
    new = _new_lines(new_text)
    starts = _line_starts(lines)
    end_of_text = len(doc.text)
    count = len(new)
    if operation == "insert_before":
        at = starts[first - 1]
        edit = (at, at, "".join(line + "\n" for line in new))
        hunk = (first - 1, first - 1, count)
        summary = f"inserted {count} line{_s(count)} before line {first}"
    elif operation == "insert_after":
        if first < total:
            at = starts[first]
            edit = (at, at, "".join(line + "\n" for line in new))
        elif doc.final_newline:
            edit = (end_of_text, end_of_text, "".join(line + "\n" for line in new))
        else:  # after a last line without a newline: end it, and leave the new last line without one
            edit = (end_of_text, end_of_text, "\n" + "\n".join(new))
        hunk = (first, first, count)
        summary = f"inserted {count} line{_s(count)} after line {first}"
    else:
        span = f"line {first}" if first == last else f"lines {first}-{last}"
        if last < total:
            edit = (starts[first - 1], starts[last], "".join(line + "\n" for line in new))
        elif new:
            edit = (starts[first - 1], end_of_text, "\n".join(new) + ("\n" if doc.final_newline else ""))
        elif first > 1 and not doc.final_newline:
            # Deleting the last lines of a file without a final newline: the
            # line before them becomes the last, and keeps having no newline.
            edit = (starts[first - 1] - 1, end_of_text, "")
        else:
            edit = (starts[first - 1], end_of_text, "")
        hunk = (first - 1, last, count)
        summary = f"replaced {span} with {count} line{_s(count)}" if new else f"deleted {span}"
    return _Plan(edits=(edit,), hunks=(hunk,), summary=summary, notes=tuple(notes))


_KEPT_TAGS = (
    "Some of new_string's lines start like 'N:hh|' tags, but not every line carries the tag read_file gives it "
    "at the number it now has, so they were written as given. If they are prefixes copied from read_file, edit "
    "those lines again without them."
)


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _line_numbers(text: str, offsets: Sequence[int]) -> list[int]:
    """1-based line numbers of ascending offsets into ``text``, counted incrementally."""
    numbers = []
    line = 1
    pos = 0
    for offset in offsets:
        line += text.count("\n", pos, offset)
        pos = offset
        numbers.append(line)
    return numbers


def _listing(numbers: Sequence[int], most: int = 12) -> str:
    shown = ", ".join(str(n) for n in numbers[:most])
    return shown + (f" and {len(numbers) - most} more" if len(numbers) > most else "")


def _plan_text(
    ctx: ToolContext,
    doc: TextFile,
    shown: str,
    display: _Shown,
    *,
    old_string: str,
    new_string: str,
    replace_all: bool,
) -> _Plan:
    text = doc.text
    old = old_string.replace("\r\n", "\n")
    new = new_string.replace("\r\n", "\n")
    notes: list[str] = []
    check = ctx.abort.raise_if_set
    located = locate(text, old, check_abort=check)
    if located is None or located.strategy != "exact":
        echoed = _echoed_old(text, display, old, check)
        if echoed is not None:
            located, old = echoed
            notes.append("The 'N:hh|' prefixes copied into old_string were ignored.")
    if located is None:
        raise _no_match(ctx, display, shown, old)
    matches = located.matches
    numbers = _line_numbers(text, [m.start for m in matches])
    exact = located.strategy == "exact"
    if len(matches) > 1 and not replace_all:
        if exact:
            raise ToolError(
                f"old_string occurs {len(matches)} times in {shown} (at lines {_listing(numbers)}). Include more "
                f"surrounding lines in old_string so it matches exactly one place, set replace_all=true to change "
                f"all {len(matches)}, or edit by anchor (e.g. start='{display.anchor(numbers[0])}').",
            )
        raise ToolError(
            f"old_string does not occur exactly in {shown}, and it matches {len(matches)} places approximately "
            f"(lines {_listing(numbers)}), so the edit was refused rather than guess. Copy old_string exactly "
            "from read_file output (without the 'N:hh|' prefixes) and include enough lines to make it unique, "
            "set replace_all=true if every one of those places should change, or edit by anchor with start='N:hh'.",
        )
    if located.overlapping:
        how = "" if exact else " approximately"
        raise ToolError(
            f"old_string matches {shown}{how} at places that overlap (lines {_listing(numbers)}), so replace_all "
            "cannot change each of them. Include more surrounding text to tell them apart, or edit by anchor.",
        )
    if located.strategy == "whitespace":
        for match, number in zip(matches, numbers, strict=True):
            problem = scope_problem(text, match, old)
            if problem is not None:
                last = _line_numbers(text, [max(match.end - 1, match.start)])[0]
                raise ToolError(
                    f"old_string matches lines {number}-{last} of {shown} only when whitespace is ignored, and that "
                    f"match reaches well past what old_string quotes ({problem}), so the edit was refused. Those "
                    f"lines are:\n{display.tagged(number, last)}\nQuote old_string exactly, or edit the lines by "
                    f"anchor (start='{display.anchor(number)}' through='{display.anchor(last)}').",
                )
    at_line_start = all(m.start == 0 or text[m.start - 1] == "\n" for m in matches)
    stripped = strip_echoed_tags(new, first=numbers[0]) if len(matches) == 1 and at_line_start else new
    if stripped != new:
        new = stripped
        notes.append("The 'N:hh|' prefixes copied from read_file output were removed from new_string.")
    elif tag_prefixed(new) and not tag_prefixed(old):
        notes.append(_KEPT_TAGS)
    if new == old:
        raise ToolError("old_string and new_string are the same, so there is nothing to change.")
    if not exact:
        note = STRATEGY_NOTES[located.strategy]
        if located.strategy == "escapes":
            read = unescapes_new(matches[0], new)
            note += " new_string was read the same way." if read else " new_string was written as given."
        notes.append(note)
    edits = tuple((m.start, m.end, adapt_replacement(m, new)) for m in matches)
    if len(matches) == 1:
        summary = f"replaced 1 occurrence at line {numbers[0]}"
    else:
        summary = f"replaced {len(matches)} occurrences (lines {_listing(numbers)})"
    hunks = doc.line_hunks(edits, total=len(display.lines))
    return _Plan(edits=edits, hunks=hunks, summary=summary, notes=tuple(notes))


def _echoed_old(
    text: str,
    display: _Shown,
    old: str,
    check: Callable[[], None],
) -> tuple[Located, str] | None:
    """old_string copied with its tags, if every tag is the one its line has at that number in the file.

    Returns the exact match at that line and old_string without the tags; None otherwise.
    """
    first = echoed_from(old)
    if first is None or first > len(display.lines):
        return None
    cleaned = strip_echoed_tags(old)
    located = locate(text, cleaned, check_abort=check)
    if located is None or located.strategy != "exact":
        return None
    offset = _line_starts(display.lines[:first])[-1]
    at = tuple(m for m in located.matches if m.start == offset)
    return (Located("exact", at), cleaned) if at else None


def _no_match(ctx: ToolContext, display: _Shown, shown: str, old: str) -> ToolError:
    lines = display.lines
    message = (
        f"old_string was not found in {shown}, not even when ignoring differences in indentation, whitespace, "
        "typographic punctuation and backslash escapes."
    )
    block = block_anchor(lines, old)
    if block is not None:
        a, b = block.first + 1, block.stop
        region = display.region(a, b)
        return ToolError(
            f"{message} Its first and last lines match lines {a} and {b}, but the lines between differ, so the "
            f"edit was refused rather than guess at them. Lines {a}-{b} are:\n{region}\n"
            f"If that is the block you mean, copy old_string exactly from it (without the 'N:hh|' prefixes), or "
            f"replace it by anchor with start='{display.anchor(a)}' through='{display.anchor(b)}'.",
        )
    close = closest_region(lines, old, check_abort=ctx.abort.raise_if_set)
    if close is None:
        return ToolError(
            message + " Read the file again with read_file: it may not contain what you expect, or have changed.",
        )
    first, stop, ratio = close
    stop = min(stop, first + 30)
    a, b = first + 1, stop
    region = display.tagged(a, b)
    tags = f"start='{display.anchor(a)}'"
    if b > a:
        tags += f" through='{display.anchor(b)}'"
    return ToolError(
        f"{message} The most similar region is lines {a}-{b} ({ratio:.0%} similar):\n{region}\n"
        f"If that is the place, copy old_string exactly from it (without the 'N:hh|' prefixes), or edit it "
        f"by anchor with {tags}.",
    )


_HUNK_RE = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")


def _unified_diff(shown: str, old: list[str], new: list[str]) -> str:
    """A unified diff of two line lists, computed on the changed middle only (fast on big files)."""
    limit = min(len(old), len(new))
    prefix = 0
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    lo = max(prefix - _DIFF_CONTEXT, 0)
    old_part = old[lo : len(old) - suffix + _DIFF_CONTEXT]
    new_part = new[lo : len(new) - suffix + _DIFF_CONTEXT]
    out = []
    for line in difflib.unified_diff(
        old_part,
        new_part,
        f"a/{shown}",
        f"b/{shown}",
        lineterm="",
        n=_DIFF_CONTEXT,
    ):
        m = _HUNK_RE.match(line)
        if m is None:
            out.append(line)
        else:
            out.append(f"@@ -{int(m[1]) + lo}{m[2] or ''} +{int(m[3]) + lo}{m[4] or ''} @@{line[m.end() :]}")
    return to_display("\n".join(out))


def _report(
    shown: str,
    before: list[str],
    after: TextFile,
    plan: _Plan,
) -> tuple[ToolResult, list[tuple[int, list[str]]]]:
    """The result, and the tagged lines of the new version it shows (for the ledger)."""
    new_lines = after.lines()
    diff = _unified_diff(shown, before, new_lines)
    body = diff.split("\n")[2:]
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    parts = [f"Edited {shown}: {plan.summary} (+{added} -{removed} lines).", *plan.notes]
    views: list[tuple[int, list[str]]] = []
    if not new_lines:
        parts.append("The file is now empty.")
    else:
        region, views = _changed_region(body, new_lines)
        parts.append(region)
    parts.append("Diff:\n" + diff if diff else "The change is in the final newline only; no line differs.")
    data = {"path": shown, "diff": diff, "lines_added": added, "lines_removed": removed}
    return ToolResult.success("\n".join(p for p in parts if p), data=data), views


def _changed_region(diff_body: list[str], new_lines: list[str]) -> tuple[str, list[tuple[int, list[str]]]]:
    """The new side of each hunk, tagged ``N:hh|`` for the next anchored edit, and the lines it shows."""
    ranges: list[tuple[int, int]] = []
    for line in diff_body:
        m = _HUNK_RE.match(line)
        if m is not None:
            begin = int(m[3])
            length = int(m[4][1:]) if m[4] else 1
            if length == 0:  # a pure deletion: show the lines around where it was
                begin, length = max(begin - 1, 1), 3
            stop = min(begin + length - 1, len(new_lines))
            if ranges and begin <= ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], max(stop, ranges[-1][1]))
            else:
                ranges.append((begin, stop))
    shown_lines: list[str] = []
    views: list[tuple[int, list[str]]] = []
    budget = _MAX_SHOWN_LINES
    for i, (begin, stop) in enumerate(ranges):
        if budget <= 0:
            shown_lines.append(f"({len(ranges) - i} more changed regions: see the diff or read_file)")
            break
        end = min(stop, begin + budget - 1)
        if shown_lines:
            shown_lines.append("...")
        views.append((begin, new_lines[begin - 1 : end]))
        shown_lines.extend(format_lines(new_lines[begin - 1 : end], begin))
        budget -= end - begin + 1
    if not shown_lines:
        return "", views
    return "Changed lines now (tags are current):\n" + "\n".join(shown_lines), views
