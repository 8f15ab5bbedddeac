"""The edit_file tool: change part of a text file, by line anchor or by text.

Two ways in one tool:

- **by anchor**: ``start="12:3f"`` (and ``through``) name lines by the tags
  read_file shows; ``operation`` replaces them, or inserts after or before
  the start line; without ``new_string`` a replace deletes them. A tag whose
  hash no longer matches is refused with the line's current tag, so the model
  can retry at once.
- **by text**: ``old_string`` -> ``new_string``, exact match first, then the
  tolerant cascade of `weald.tools._fuzzy` (never an ambiguous match);
  ``replace_all`` changes every exact occurrence.

Either way the file must have been read in this session and be unchanged
since; BOM, line endings, a missing final newline and bytes that are not
valid UTF-8 survive byte for byte outside the edited text; the write is
atomic and keeps the file's mode. A read-only file (no write permission bit
for anyone) is refused, though a rename as root would replace it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._fuzzy import STRATEGY_NOTES, adapt_replacement, closest_region, locate
from weald.tools._hashline import TextFile, format_lines, line_hash, parse_anchor, strip_echoed_tags, to_display
from weald.tools._ledger import session_ledger
from weald.tools._sandbox import path_subject, refuse_read_only, write_atomic
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
    "changes every occurrence. Small indentation or whitespace slips in old_string are forgiven when the "
    "match is unambiguous.\n"
    "Never include the 'N:hh|' prefixes in old_string or new_string. The file's line endings, BOM and final "
    "newline are kept. If the file changed since you read it the edit is refused: read it again. The result "
    "shows the changed lines with fresh N:hh tags (use those for the next edit) and a diff."
)


@attrs.frozen
class _Plan:
    """The edits to make, in `TextFile.text` coordinates, and how to describe them."""

    edits: tuple[tuple[int, int, str], ...]
    summary: str
    notes: tuple[str, ...] = ()


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
    real, shown, data, st = read_text(ctx, path, purpose="edit_file edits")
    refuse_read_only(ctx, real, st)
    ledger = session_ledger(ctx)
    if ledger is not None:
        ledger.check_fresh(real, data=data, st=st, name=shown)
    doc = TextFile.decode(data)
    if anchored:
        assert start is not None
        plan = _plan_anchored(doc, shown, start=start, through=through, operation=operation, new_string=new_string)
    else:
        assert old_string is not None
        assert new_string is not None
        plan = _plan_text(ctx, doc, shown, old_string, new_string, replace_all=replace_all)
    new_data = doc.encode(doc.replace(plan.edits))
    if new_data == data:
        raise ToolError(f"the edit would leave {shown} exactly as it is, so nothing was written. Check new_string.")
    ctx.abort.raise_if_set()
    outcome = write_atomic(ctx, str(real), new_data, expect=st)
    if ledger is not None:
        ledger.record(real, new_data, outcome.stat)
    return _report(shown, doc, TextFile.decode(new_data), plan)


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
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    return starts


def _new_lines(text: str) -> list[str]:
    """new_string as lines for an anchored edit: a trailing newline ends the last line; '' is no lines."""
    text = text.replace("\r\n", "\n")
    if not text:
        return []
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def _neighbourhood(lines: Sequence[str], number: int, radius: int = 2) -> tuple[int, int, str]:
    lo = max(number - radius, 1)
    hi = min(number + radius, len(lines))
    return lo, hi, "\n".join(format_lines(lines[lo - 1 : hi], lo))


def _check_anchor(lines: Sequence[str], number: int, expected: str, argument: str, shown: str) -> None:
    """Refuse an anchor that is out of range or whose hash no longer matches its line."""
    total = len(lines)
    if number > total:
        _, _, context = _neighbourhood(lines, total)
        raise ToolError(
            f"{argument}='{number}:{expected}' is past the end of {shown}, which has {total} lines. "
            f"Its last lines are:\n{context}\nUse a tag shown there, or read the file again if it changed.",
        )
    actual = line_hash(lines[number - 1])
    if actual == expected:
        return
    lo, hi, context = _neighbourhood(lines, number)
    message = (
        f"{argument}='{number}:{expected}' is stale: line {number} of {shown} now has tag {number}:{actual}, "
        f"so it is not the line you read. Lines {lo}-{hi} now are:\n{context}\n"
    )
    window = range(max(number - 20, 1), min(number + 20, total) + 1)
    moved = [n for n in window if n != number and line_hash(lines[n - 1]) == expected]
    if len(moved) == 1:
        message += f"The line you meant may have moved to line {moved[0]} ({moved[0]}:{expected}). "
    message += (
        f"If line {number} as shown is the one you want, retry with {argument}='{number}:{actual}'; "
        "otherwise read the file again to get current tags."
    )
    raise ToolError(message)


def _plan_anchored(
    doc: TextFile,
    shown: str,
    *,
    start: str,
    through: str | None,
    operation: str,
    new_string: str | None,
) -> _Plan:
    lines = doc.lines()
    total = len(lines)
    if total == 0:
        raise ToolError(f"{shown} is empty, so it has no line to anchor to. Give it content with write_file.")
    first, first_hash = parse_anchor(start, argument="start")
    _check_anchor(lines, first, first_hash, "start", shown)
    last = first
    if through is not None:
        last, last_hash = parse_anchor(through, argument="through")
        _check_anchor(lines, last, last_hash, "through", shown)
        if last < first:
            raise ToolError(
                f"through (line {last}) comes before start (line {first}). through is the last line of the "
                "range to replace, at or after start.",
            )
    new = _new_lines(strip_echoed_tags(new_string or "", near=(first, last)))
    starts = _line_starts(lines)
    end_of_text = len(doc.text)
    count = len(new)
    if operation == "insert_before":
        at = starts[first - 1]
        edit = (at, at, "".join(line + "\n" for line in new))
        summary = f"inserted {count} line{_s(count)} before line {first}"
    elif operation == "insert_after":
        if first < total:
            at = starts[first]
            edit = (at, at, "".join(line + "\n" for line in new))
        elif doc.final_newline:
            edit = (end_of_text, end_of_text, "".join(line + "\n" for line in new))
        else:  # after a last line without a newline: end it, and leave the new last line without one
            edit = (end_of_text, end_of_text, "\n" + "\n".join(new))
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
        summary = f"replaced {span} with {count} line{_s(count)}" if new else f"deleted {span}"
    return _Plan(edits=(edit,), summary=summary)


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
    old_string: str,
    new_string: str,
    *,
    replace_all: bool,
) -> _Plan:
    text = doc.text
    old = old_string.replace("\r\n", "\n")
    new = new_string.replace("\r\n", "\n")
    notes: list[str] = []
    located = locate(text, old, check_abort=ctx.abort.raise_if_set)
    if located is None or located.strategy != "exact":
        cleaned = strip_echoed_tags(old)
        retry = locate(text, cleaned, check_abort=ctx.abort.raise_if_set) if cleaned != old else None
        if retry is not None:
            located, old = retry, cleaned
            notes.append("The 'N:hh|' prefixes copied into old_string were ignored.")
    if located is None:
        raise _no_match(ctx, doc, shown, old)
    matches = located.matches
    numbers = _line_numbers(text, [m.start for m in matches])
    if len(matches) > 1 and located.strategy == "exact" and not replace_all:
        first_line = doc.lines()[numbers[0] - 1]
        raise ToolError(
            f"old_string occurs {len(matches)} times in {shown} (at lines {_listing(numbers)}). Include more "
            f"surrounding lines in old_string so it matches exactly one place, set replace_all=true to change "
            f"all {len(matches)}, or edit by anchor (e.g. start='{numbers[0]}:{line_hash(first_line)}').",
        )
    if len(matches) > 1 and located.strategy != "exact":
        raise ToolError(
            f"old_string does not occur exactly in {shown}, and it matches {len(matches)} places approximately "
            f"(lines {_listing(numbers)}), so the edit was refused rather than guess. Copy old_string exactly "
            "from read_file output (without the 'N:hh|' prefixes) and include enough lines to make it unique, "
            "or edit by anchor with start='N:hh'.",
        )
    last_line = _line_numbers(text, [matches[-1].end])[0]
    new = strip_echoed_tags(new, near=(numbers[0], last_line))
    if new == old:
        raise ToolError("old_string and new_string are the same, so there is nothing to change.")
    if located.strategy != "exact":
        notes.append(STRATEGY_NOTES[located.strategy])
    edits = tuple((m.start, m.end, adapt_replacement(m, new)) for m in matches)
    if len(matches) == 1:
        summary = f"replaced 1 occurrence at line {numbers[0]}"
    else:
        summary = f"replaced {len(matches)} occurrences (lines {_listing(numbers)})"
    return _Plan(edits=edits, summary=summary, notes=tuple(notes))


def _no_match(ctx: ToolContext, doc: TextFile, shown: str, old: str) -> ToolError:
    lines = doc.lines()
    message = f"old_string was not found in {shown}, not even when ignoring differences in indentation and whitespace."
    close = closest_region(lines, old, check_abort=ctx.abort.raise_if_set)
    if close is None:
        return ToolError(
            message + " Read the file again with read_file: it may not contain what you expect, or have changed.",
        )
    first, stop, ratio = close
    stop = min(stop, first + 30)
    region = "\n".join(format_lines(lines[first:stop], first + 1))
    a, b = first + 1, stop
    tags = f"start='{a}:{line_hash(lines[a - 1])}'"
    if b > a:
        tags += f" through='{b}:{line_hash(lines[b - 1])}'"
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


def _report(shown: str, before: TextFile, after: TextFile, plan: _Plan) -> ToolResult:
    new_lines = after.lines()
    diff = _unified_diff(shown, before.lines(), new_lines)
    body = diff.split("\n")[2:]
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    parts = [f"Edited {shown}: {plan.summary} (+{added} -{removed} lines).", *plan.notes]
    if not new_lines:
        parts.append("The file is now empty.")
    else:
        parts.append(_changed_region(body, new_lines))
    parts.append("Diff:\n" + diff if diff else "The change is in the final newline only; no line differs.")
    data = {"path": shown, "diff": diff, "lines_added": added, "lines_removed": removed}
    return ToolResult.success("\n".join(p for p in parts if p), data=data)


def _changed_region(diff_body: list[str], new_lines: list[str]) -> str:
    """The new side of each hunk, tagged ``N:hh|`` for the next anchored edit."""
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
    budget = _MAX_SHOWN_LINES
    for i, (begin, stop) in enumerate(ranges):
        if budget <= 0:
            shown_lines.append(f"({len(ranges) - i} more changed regions: see the diff or read_file)")
            break
        end = min(stop, begin + budget - 1)
        if shown_lines:
            shown_lines.append("...")
        shown_lines.extend(format_lines(new_lines[begin - 1 : end], begin))
        budget -= end - begin + 1
    if not shown_lines:
        return ""
    return "Changed lines now (tags are current):\n" + "\n".join(shown_lines)
