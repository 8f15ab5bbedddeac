"""Finding ``old_string`` in a file: exact first, then a cascade of tolerant matchers.

Models copy text with small slips: indentation off by a level, trailing
spaces lost, tabs for spaces, a line wrapped differently. After an exact
search fails, `locate` tries matchers that forgive more and more, in order:

1. ``indentation``: whole lines, equal once the block's common indentation
   and trailing whitespace are set aside;
2. ``trimmed``: whole lines, equal once each line is stripped;
3. ``whitespace``: the same words with any run of whitespace between them.

The first matcher that finds anything decides. A tolerant matcher that finds
more than one place never picks one: the caller refuses and says where they
are. (The idea of a cascade comes from OpenCode's edit tool; this code is ours.)

After a line matcher, new_string is re-indented the way old_string was off:
each matched pair of lines maps old_string's indentation to the file's, and a
new_string line indented like some old_string line gets that line's file
indentation; any other line starting with old_string's common indentation
gets the file's common indentation in its place.
"""

from __future__ import annotations

import difflib
import heapq
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Literal

import attrs
from weald.tools._hashline import to_display

__all__ = ["STRATEGY_NOTES", "Located", "Match", "adapt_replacement", "closest_region", "locate"]

Strategy = Literal["exact", "indentation", "trimmed", "whitespace"]

STRATEGY_NOTES: dict[str, str] = {
    "exact": "",
    "indentation": (
        "old_string did not match exactly; it matched after setting aside indentation and trailing "
        "whitespace, and new_string was re-indented to the file's indentation. Check the result below."
    ),
    "trimmed": (
        "old_string did not match exactly; it matched after stripping the whitespace around every line, "
        "and new_string was re-indented to the file's indentation. Check the result below."
    ),
    "whitespace": (
        "old_string did not match exactly; it matched after treating every run of whitespace (spaces, "
        "tabs, line breaks) as equal. Check the result below."
    ),
}

# Similarity a region must reach to be offered as "the closest candidate".
_CLOSE_ENOUGH = 0.5
# How many blocks, best by shared words, are compared character by character.
_CANDIDATE_BLOCKS = 16
_WORD_RE = re.compile(r"\w+")


@attrs.frozen
class Match:
    """One place ``old_string`` matched.

    Attributes:
        start: offset of the match in the file's text (LF line endings).
        end: offset just past it.
        levels: pairs ``(old_indent, file_indent)``: a new_string line whose
            indentation is ``old_indent`` gets ``file_indent`` instead.
        base: ``(old_prefix, file_prefix)``: any other new_string line starting
            with ``old_prefix`` gets ``file_prefix`` instead; None leaves
            new_string as is.
        trim: leading and trailing whitespace of old_string that lies outside the
            match; removed from new_string's ends so it is not doubled.
    """

    start: int
    end: int
    levels: tuple[tuple[str, str], ...] = ()
    base: tuple[str, str] | None = None
    trim: tuple[str, str] = ("", "")


@attrs.frozen
class Located:
    """Where ``old_string`` was found, and by which matcher.

    Attributes:
        strategy: the matcher that found it.
        matches: every place it matched, in order (overlapping places included,
            for the tolerant matchers: they make the match ambiguous).
    """

    strategy: Strategy
    matches: tuple[Match, ...]


def locate(text: str, old: str, *, check_abort: Callable[[], None] | None = None) -> Located | None:
    """Find ``old`` in ``text``: exactly, or else by the first tolerant matcher that finds it.

    A U+FFFD in ``old`` matches a byte of the file that is not valid UTF-8
    (read_file shows those as U+FFFD).

    Args:
        text: the file's text (LF line endings; undecodable bytes as lone surrogates).
        old: what the model asked to replace (LF line endings).
        check_abort: called between matchers; raises to stop.

    Returns:
        The matches, or None if no matcher found ``old``.
    """
    haystack = to_display(text) if "\ufffd" in old else text
    exact = _exact(haystack, old)
    if exact:
        return Located("exact", exact)
    if not old.strip():
        return None  # whitespace-only text would match loosely almost anywhere
    lines, starts = _line_table(haystack)
    stripped = [line.strip() for line in lines]
    matchers: list[tuple[Strategy, Callable[[], tuple[Match, ...]]]] = [
        ("indentation", lambda: _indentation(lines, starts, stripped, old, len(haystack))),
        ("trimmed", lambda: _trimmed(lines, starts, stripped, old, len(haystack))),
        ("whitespace", lambda: _whitespace(haystack, old)),
    ]
    for strategy, find in matchers:
        if check_abort is not None:
            check_abort()
        found = find()
        if found:
            return Located(strategy, found)
    return None


def adapt_replacement(match: Match, new: str) -> str:
    """``new`` fitted to how ``match`` matched: re-indented, or its ends trimmed."""
    lead, trail = match.trim
    if lead and new.startswith(lead):
        new = new[len(lead) :]
    if trail and new.endswith(trail):
        new = new[: len(new) - len(trail)]
    if match.base is None:
        return new
    levels = dict(match.levels)
    old_prefix, file_prefix = match.base
    if old_prefix == file_prefix and all(k == v for k, v in levels.items()):
        return new
    out = []
    for line in new.split("\n"):
        lead = _leading(line)
        if not line.strip():
            out.append(line)
        elif lead in levels:
            out.append(levels[lead] + line[len(lead) :])
        elif line.startswith(old_prefix):
            out.append(file_prefix + line[len(old_prefix) :])
        else:
            out.append(line)  # indented less than old_string was: leave as written
    return "\n".join(out)


def _levels(old_lines: list[str], file_lines: list[str]) -> tuple[tuple[str, str], ...]:
    """How each indentation in old_string maps to the file's, over matched lines.

    An old indentation seen with two different file indentations is left out:
    the mapping must not guess.
    """
    seen: dict[str, str] = {}
    conflicting: set[str] = set()
    for old, found in zip(old_lines, file_lines, strict=True):
        if not old.strip():
            continue
        key, value = _leading(old), _leading(found)
        if seen.setdefault(key, value) != value:
            conflicting.add(key)
    return tuple((k, v) for k, v in seen.items() if k not in conflicting)


def _exact(text: str, old: str) -> tuple[Match, ...]:
    found = []
    i = text.find(old)
    while i >= 0:
        found.append(Match(i, i + len(old)))
        i = text.find(old, i + len(old))
    return tuple(found)


def _line_table(text: str) -> tuple[list[str], list[int]]:
    """The text's lines (a final newline adds no empty line) and each line's start offset."""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    starts = []
    pos = 0
    for line in lines:
        starts.append(pos)
        pos += len(line) + 1
    return lines, starts


def _old_block(old: str) -> tuple[list[str], bool]:
    """old_string as whole lines, and whether it ends with a newline (which the match then includes)."""
    with_newline = old.endswith("\n")
    return (old[:-1] if with_newline else old).split("\n"), with_newline


def _common_prefix(texts: list[str]) -> str:
    """The longest string every one of ``texts`` starts with (character by character)."""
    if not texts:
        return ""
    first, last = min(texts), max(texts)
    size = 0
    while size < len(first) and first[size] == last[size]:
        size += 1
    return first[:size]


def _leading(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _span(
    *,
    text_len: int,
    lines: list[str],
    starts: list[int],
    first: int,
    count: int,
    with_newline: bool,
) -> tuple[int, int] | None:
    last = first + count - 1
    end = starts[last] + len(lines[last]) + (1 if with_newline else 0)
    if end > text_len:
        return None  # old_string ends with a newline the file's last line lacks
    return starts[first], end


def _candidates(stripped: list[str], key: str, offset: int, count: int) -> list[int]:
    """First-line indices of blocks of ``count`` lines whose line ``offset`` strips to ``key``."""
    last_first = len(stripped) - count
    return [i - offset for i, s in enumerate(stripped) if s == key and 0 <= i - offset <= last_first]


def _indentation(
    lines: list[str],
    starts: list[int],
    stripped: list[str],
    old: str,
    text_len: int,
) -> tuple[Match, ...]:
    old_lines, with_newline = _old_block(old)
    nonblank = [line for line in old_lines if line.strip()]
    old_prefix = _common_prefix([_leading(line) for line in nonblank])
    relative = [line[len(old_prefix) :].rstrip() if line.strip() else "" for line in old_lines]
    j = next(i for i, line in enumerate(old_lines) if line.strip())
    found = []
    for i in _candidates(stripped, old_lines[j].strip(), j, len(old_lines)):
        anchor = lines[i + j].rstrip()
        file_prefix = anchor[: len(anchor) - len(relative[j])]
        if not anchor.endswith(relative[j]) or file_prefix.strip():
            continue
        if all(
            (not stripped[i + m]) if not rel else lines[i + m].rstrip() == file_prefix + rel
            for m, rel in enumerate(relative)
        ):
            span = _span(
                text_len=text_len, lines=lines, starts=starts, first=i, count=len(old_lines), with_newline=with_newline
            )
            if span is not None:
                levels = _levels(old_lines, lines[i : i + len(old_lines)])
                found.append(Match(span[0], span[1], levels=levels, base=(old_prefix, file_prefix)))
    return tuple(found)


def _trimmed(
    lines: list[str],
    starts: list[int],
    stripped: list[str],
    old: str,
    text_len: int,
) -> tuple[Match, ...]:
    old_lines, with_newline = _old_block(old)
    keys = [line.strip() for line in old_lines]
    j = next(i for i, key in enumerate(keys) if key)
    found = []
    for i in _candidates(stripped, keys[j], j, len(keys)):
        if stripped[i : i + len(keys)] == keys:
            span = _span(
                text_len=text_len, lines=lines, starts=starts, first=i, count=len(keys), with_newline=with_newline
            )
            if span is not None:
                levels = _levels(old_lines, lines[i : i + len(keys)])
                base = (_leading(old_lines[j]), _leading(lines[i + j]))
                found.append(Match(span[0], span[1], levels=levels, base=base))
    return tuple(found)


def _whitespace(text: str, old: str) -> tuple[Match, ...]:
    words = old.split()
    # Words hold no whitespace, so each \s+ has one way to match: no backtracking blow-up.
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    trim = (_leading(old), old[len(old.rstrip()) :])
    return tuple(Match(m.start(), m.end(), trim=trim) for m in pattern.finditer(text))


def closest_region(
    lines: Sequence[str],
    old: str,
    *,
    check_abort: Callable[[], None] | None = None,
) -> tuple[int, int, float] | None:
    """The block of lines most like ``old``, for a "did you mean" when nothing matched.

    Scores every block of as many lines as old_string by how many of
    old_string's words its lines share (cheap, so a 100,000-line file takes a
    fraction of a second), then compares the best few blocks to old_string
    character by character.

    Returns:
        ``(first, stop, similarity)`` as 0-based line indices (``stop``
        exclusive) and a ratio in [0, 1]; None if nothing is at least half similar.
    """
    keys = [line.strip() for line in old.strip("\n").split("\n")]
    words = set(_WORD_RE.findall(old))
    if not lines or not words:
        return None
    count = min(len(keys), len(lines))
    findall = _WORD_RE.findall
    shared = [0] * len(lines)
    for i, line in enumerate(lines):
        if check_abort is not None and i % 10_000 == 0:
            check_abort()
        shared[i] = len(words.intersection(findall(line)))
    totals = list(itertools.accumulate(shared, initial=0))
    windows = ((totals[first + count] - totals[first], first) for first in range(len(lines) - count + 1))
    best: tuple[int, int, float] | None = None
    target = "\n".join(keys)
    for score, first in heapq.nlargest(_CANDIDATE_BLOCKS, windows):
        if score == 0:
            break
        block = "\n".join(line.strip() for line in lines[first : first + count])
        matcher = difflib.SequenceMatcher(None, block, target, autojunk=False)
        floor = best[2] if best is not None else _CLOSE_ENOUGH
        if matcher.real_quick_ratio() < floor or matcher.quick_ratio() < floor:
            continue
        ratio = matcher.ratio()
        if ratio >= _CLOSE_ENOUGH and (best is None or ratio > best[2]):
            best = (first, first + count, ratio)
    return best
