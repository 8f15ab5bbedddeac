r"""Finding ``old_string`` in a file: exact first, then a cascade of tolerant matchers.

Models copy text with small slips: indentation off by a level, trailing
spaces lost, tabs for spaces, a line wrapped differently, a blank line too
many at the start, ASCII quotes for typographic ones, ``\n`` written as two
characters. After an exact search fails, `locate` tries matchers that forgive
more and more, in order:

1. ``indentation``: whole lines, equal once the block's common indentation
   and trailing whitespace are set aside;
2. ``trimmed``: whole lines, equal once each line is stripped;
3. ``whitespace``: whole lines holding the same words, with any run of
   whitespace (line breaks included) between them;
4. ``punctuation``: whole lines, equal once stripped and once typographic
   dashes, quotes and spaces are read as their ASCII forms (as Codex's
   apply-patch does);
5. ``escapes``: old_string with its backslash escapes (``\n``, ``\t``,
   ``\"`` ...) read as the characters they stand for, through the cascade
   above (as OpenCode does).

Only the exact search may match inside a line; every tolerant matcher
matches whole lines. Blank lines at the start or end of old_string that the
file does not have there are set aside (Aider's issue 25), and the same
blank lines are taken off new_string. The first matcher that finds anything
decides. A tolerant matcher that finds more than one place never picks one:
the caller refuses and says where they are, unless replace_all asks for
every place. (The idea of a cascade comes from OpenCode's edit tool; this
code is ours.)

After a line matcher, new_string is fitted to the file's indentation: if it
already sits at the indentation of the matched lines (old_string was quoted
at another), it is kept as written; otherwise each matched pair of lines maps
old_string's indentation to the file's, a new_string line indented like some
old_string line gets that line's file indentation, and any other line
starting with old_string's common indentation gets the file's in its place.
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

__all__ = [
    "STRATEGY_NOTES",
    "BlockAnchor",
    "Located",
    "Match",
    "adapt_replacement",
    "block_anchor",
    "closest_region",
    "locate",
    "scope_problem",
    "unescapes_new",
]

Strategy = Literal["exact", "indentation", "trimmed", "whitespace", "punctuation", "escapes"]

STRATEGY_NOTES: dict[str, str] = {
    "exact": "",
    "indentation": (
        "old_string did not match exactly; it matched after setting aside indentation and trailing "
        "whitespace, and new_string was fitted to the file's indentation. Check the result below."
    ),
    "trimmed": (
        "old_string did not match exactly; it matched after stripping the whitespace around every line, "
        "and new_string was fitted to the file's indentation. Check the result below."
    ),
    "whitespace": (
        "old_string did not match exactly; it matched whole lines after treating every run of whitespace "
        "(spaces, tabs, line breaks) as equal, and new_string replaced those lines. Check the result below."
    ),
    "punctuation": (
        "old_string did not match exactly; it matched after reading typographic dashes, quotes and spaces "
        "(such as \u2013, \u2011, \u201c \u201d, \u2019, non-breaking spaces) as their ASCII forms. new_string "
        "was written as given. Check the result below."
    ),
    "escapes": (
        "old_string did not match as written; it matched after reading its backslash escapes (\\n, \\t, "
        '\\", \\\\ ...) as the characters they stand for. Check the result below.'
    ),
}

# Similarity a region must reach to be offered as "the closest candidate".
_CLOSE_ENOUGH = 0.5
# How many blocks, best by shared words, are compared character by character.
_CANDIDATE_BLOCKS = 16
_WORD_RE = re.compile(r"\w+")

# Typographic punctuation read as ASCII by the ``punctuation`` matcher (Codex's table).
_FOLD = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "),
    },
)

# A backslash escape a model may have written where it meant the character (OpenCode's set).
_ESCAPE_RE = re.compile(r"\\(n|t|r|'|\"|`|\\|\n|\$)")
_UNESCAPED = {"n": "\n", "t": "\t", "r": "\r", "\n": "\n"}

# The scope guard: a whitespace-tolerant match may be at most this much larger than old_string.
_SCOPE_FACTOR = 2
_SCOPE_SLACK = 64


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
        file_indent: the common indentation of the matched lines; a new_string
            already indented so is kept as written.
        drop: blank lines at the start and end of old_string that the match
            set aside; as many are taken off new_string's ends.
        escapes: the escapes (``n``, ``t``, ``"`` ...) old_string was read
            with; a new_string using only those is read the same way.
    """

    start: int
    end: int
    levels: tuple[tuple[str, str], ...] = ()
    base: tuple[str, str] | None = None
    file_indent: str | None = None
    drop: tuple[int, int] = (0, 0)
    escapes: frozenset[str] = frozenset()


@attrs.frozen
class Located:
    """Where ``old_string`` was found, and by which matcher.

    Attributes:
        strategy: the matcher that found it.
        matches: every place it matched, in order.
    """

    strategy: Strategy
    matches: tuple[Match, ...]

    @property
    def overlapping(self) -> bool:
        """Some matches share text (only tolerant matchers report such)."""
        return any(b.start < a.end for a, b in itertools.pairwise(self.matches))


@attrs.frozen
class _Lines:
    """A file's lines as the line matchers see them."""

    text: str
    lines: list[str]
    starts: list[int]
    stripped: list[str]

    @classmethod
    def of(cls, text: str) -> _Lines:
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        starts = []
        pos = 0
        for line in lines:
            starts.append(pos)
            pos += len(line) + 1
        return cls(text, lines, starts, [line.strip() for line in lines])

    def span(self, first: int, count: int, with_newline: bool) -> tuple[int, int] | None:
        """Offsets of lines ``first``..``first + count - 1``, with the newline after them if asked."""
        last = first + count - 1
        end = self.starts[last] + len(self.lines[last]) + (1 if with_newline else 0)
        if end > len(self.text):
            return None  # old_string ends with a newline the file's last line lacks
        return self.starts[first], end


@attrs.frozen
class _Old:
    """old_string as whole lines: its lines, whether a newline ends it, and blank lines set aside."""

    lines: list[str]
    with_newline: bool
    drop: tuple[int, int] = (0, 0)


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
    found = _locate(text, old, check_abort)
    if found is not None or "\\" not in old:
        return found
    unescaped = _ESCAPE_RE.sub(lambda m: _UNESCAPED.get(m[1], m[1]), old)
    if unescaped == old:
        return None
    inner = _locate(text, unescaped, check_abort)
    if inner is None:
        return None
    kinds = frozenset(m[1] for m in _ESCAPE_RE.finditer(old))
    matches = tuple(
        attrs.evolve(m, escapes=frozenset() if "\\" in text[m.start : m.end] else kinds) for m in inner.matches
    )
    return Located("escapes", matches)


def _locate(text: str, old: str, check_abort: Callable[[], None] | None) -> Located | None:
    haystack = to_display(text) if "\ufffd" in old else text
    exact = _exact(haystack, old)
    if exact:
        return Located("exact", exact)
    if not old.strip():
        return None  # whitespace-only text would match loosely almost anywhere
    table = _Lines.of(haystack)
    variants = _variants(old)
    matchers: list[tuple[Strategy, Callable[[_Lines, _Old], tuple[Match, ...]]]] = [
        ("indentation", _indentation),
        ("trimmed", _trimmed),
        ("whitespace", _whitespace),
    ]
    if not (haystack.isascii() and old.isascii()):
        matchers.append(("punctuation", _punctuation))
    for strategy, find in matchers:
        if check_abort is not None:
            check_abort()
        for variant in variants:
            found = find(table, variant)
            if found:
                return Located(strategy, found)
    return None


def _variants(old: str) -> list[_Old]:
    """old_string as whole lines; then, if it starts or ends with blank lines, without them."""
    with_newline = old.endswith("\n")
    lines = (old[:-1] if with_newline else old).split("\n")
    variants = [_Old(lines, with_newline)]
    blank = [not line.strip() for line in lines]
    lead = blank.index(False)
    trail = blank[::-1].index(False)
    if lead or trail:
        variants.append(_Old(lines[lead : len(lines) - trail], with_newline or trail > 0, (lead, trail)))
    return variants


def adapt_replacement(match: Match, new: str) -> str:
    """``new`` fitted to how ``match`` matched: blank lines set aside, escapes read, re-indented."""
    if unescapes_new(match, new):
        new = _ESCAPE_RE.sub(lambda m: _UNESCAPED.get(m[1], m[1]), new)
    lead, trail = match.drop
    if lead or trail:
        new = _drop_blank_lines(new, lead, trail)
    if match.base is None:
        return new
    lines = new.split("\n")
    levels = dict(match.levels)
    old_prefix, file_prefix = match.base
    if old_prefix == file_prefix and all(k == v for k, v in levels.items()):
        return new
    if match.file_indent is not None and old_prefix != match.file_indent:
        written = _common_prefix([_leading(line) for line in lines if line.strip()])
        if written == match.file_indent:
            return new  # already at the file's indentation: old_string alone was quoted elsewhere
    out = []
    for line in lines:
        lead_ws = _leading(line)
        if not line.strip():
            out.append(line)
        elif lead_ws in levels:
            out.append(levels[lead_ws] + line[len(lead_ws) :])
        elif line.startswith(old_prefix):
            out.append(file_prefix + line[len(old_prefix) :])
        else:
            out.append(line)  # indented less than old_string was: leave as written
    return "\n".join(out)


def unescapes_new(match: Match, new: str) -> bool:
    """new_string is read with its escapes too: it uses escapes, and only those old_string was read with."""
    if not match.escapes or "\\" not in new:
        return False
    kinds = {m[1] for m in _ESCAPE_RE.finditer(new)}
    return bool(kinds) and kinds <= match.escapes


def scope_problem(text: str, match: Match, old: str) -> str | None:
    """Why a tolerant ``match`` covers far more than ``old`` (the edit-scope guard), or None.

    A match may not span blank lines old_string does not have (they separate
    blocks), nor be more than twice as long as old_string (plus some
    indentation): either means the edit would reach past what the model quoted.
    """
    region = text[match.start : match.end]
    blank_in_region = sum(1 for line in region.split("\n")[1:-1] if not line.strip())
    blank_in_old = sum(1 for line in old.strip("\n").split("\n") if not line.strip())
    if blank_in_region > blank_in_old:
        return f"it spans {blank_in_region} blank line{'s' if blank_in_region != 1 else ''} old_string does not have"
    if len(region) > _SCOPE_FACTOR * len(old.strip()) + _SCOPE_SLACK:
        return f"it is {len(region)} characters long, old_string {len(old.strip())}"
    return None


def _drop_blank_lines(new: str, lead: int, trail: int) -> str:
    with_newline = new.endswith("\n")
    lines = (new[:-1] if with_newline else new).split("\n")
    while lead and len(lines) > 1 and not lines[0].strip():
        lines.pop(0)
        lead -= 1
    while trail and len(lines) > 1 and not lines[-1].strip():
        lines.pop()
        trail -= 1
    return "\n".join(lines) + ("\n" if with_newline else "")


def _levels(old_lines: Sequence[str], file_lines: Sequence[str]) -> tuple[tuple[str, str], ...]:
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
    """Every place ``old`` occurs, overlapping ones too (two closing braces occur twice in three)."""
    found = []
    i = text.find(old)
    while i >= 0:
        found.append(Match(i, i + len(old)))
        i = text.find(old, i + 1)
    return tuple(found)


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


def _block_indent(lines: Sequence[str]) -> str:
    return _common_prefix([_leading(line) for line in lines if line.strip()])


def _candidates(stripped: list[str], key: str, offset: int, count: int) -> list[int]:
    """First-line indices of blocks of ``count`` lines whose line ``offset`` strips to ``key``."""
    last_first = len(stripped) - count
    return [i - offset for i, s in enumerate(stripped) if s == key and 0 <= i - offset <= last_first]


def _line_match(table: _Lines, old: _Old, first: int, anchor: int) -> Match | None:
    """A match of ``old`` at file lines ``first``.., re-indenting by old line ``anchor``."""
    count = len(old.lines)
    span = table.span(first, count, old.with_newline)
    if span is None:
        return None
    matched = table.lines[first : first + count]
    return Match(
        span[0],
        span[1],
        levels=_levels(old.lines, matched),
        base=(_leading(old.lines[anchor]), _leading(matched[anchor])),
        file_indent=_block_indent(matched),
        drop=old.drop,
    )


def _indentation(table: _Lines, old: _Old) -> tuple[Match, ...]:
    old_prefix = _block_indent(old.lines)
    relative = [line[len(old_prefix) :].rstrip() if line.strip() else "" for line in old.lines]
    j = next(i for i, line in enumerate(old.lines) if line.strip())
    found = []
    for i in _candidates(table.stripped, old.lines[j].strip(), j, len(old.lines)):
        anchor = table.lines[i + j].rstrip()
        file_prefix = anchor[: len(anchor) - len(relative[j])]
        if not anchor.endswith(relative[j]) or file_prefix.strip():
            continue
        if all(
            (not table.stripped[i + m]) if not rel else table.lines[i + m].rstrip() == file_prefix + rel
            for m, rel in enumerate(relative)
        ):
            match = _line_match(table, old, i, j)
            if match is not None:
                found.append(attrs.evolve(match, base=(old_prefix, file_prefix)))
    return tuple(found)


def _trimmed(table: _Lines, old: _Old, stripped: list[str] | None = None, fold: bool = False) -> tuple[Match, ...]:
    keys = [line.strip().translate(_FOLD) if fold else line.strip() for line in old.lines]
    haystack = table.stripped if stripped is None else stripped
    j = next(i for i, key in enumerate(keys) if key)
    found = []
    for i in _candidates(haystack, keys[j], j, len(keys)):
        if haystack[i : i + len(keys)] == keys:
            match = _line_match(table, old, i, j)
            if match is not None:
                found.append(match)
    return tuple(found)


def _punctuation(table: _Lines, old: _Old) -> tuple[Match, ...]:
    folded = [line.translate(_FOLD).strip() for line in table.stripped]
    return _trimmed(table, old, folded, fold=True)


def _whitespace(table: _Lines, old: _Old) -> tuple[Match, ...]:
    words = " ".join(old.lines).split()
    # Words hold no whitespace, so each \s+ has one way to match: no backtracking blow-up.
    # The match runs from a line's start to a line's end: never inside a line.
    pattern = re.compile(r"^[ \t]*" + r"\s+".join(re.escape(w) for w in words) + r"[ \t]*$", re.MULTILINE)
    text = table.text
    found = []
    first_old = next(line for line in old.lines if line.strip())
    for m in pattern.finditer(text):
        start, end = m.start(), m.end()
        if old.with_newline:
            if end >= len(text):
                continue  # old_string ends with a newline the file's last line lacks
            end += 1
        block = text[start : m.end()].split("\n")
        same_shape = len(block) == len(old.lines)
        found.append(
            Match(
                start,
                end,
                levels=_levels(old.lines, block) if same_shape else (),
                base=(_leading(first_old), _leading(block[0])),
                file_indent=_block_indent(block),
                drop=old.drop,
            ),
        )
    return tuple(found)


@attrs.frozen
class BlockAnchor:
    """A block whose first and last lines match old_string's while the lines between differ.

    Attributes:
        first: its first line (0-based).
        stop: one past its last line.
    """

    first: int
    stop: int


def block_anchor(lines: Sequence[str], old: str) -> BlockAnchor | None:
    """The one block whose first and last lines are old_string's (stripped), for a "did you mean".

    OpenCode replaces such a block when the middle is similar enough; weald
    does not guess, but names the block so the model can edit it by anchor.
    Needs old_string to have at least three non-blank lines; the block may
    be half to twice as long. Returns None unless exactly one block fits.
    """
    keys = [line.strip() for line in old.strip("\n").split("\n") if line.strip()]
    if len(keys) < 3:
        return None
    size = len(old.strip("\n").split("\n"))
    shortest, longest = max(size // 2, 3), size * 2
    found: list[BlockAnchor] = []
    stripped = [line.strip() for line in lines]
    for i, line in enumerate(stripped):
        if line != keys[0]:
            continue
        for j in range(i + shortest - 1, min(i + longest, len(lines))):
            if stripped[j] == keys[-1]:
                found.append(BlockAnchor(i, j + 1))
                break
        if len(found) > 1:
            return None
    return found[0] if found else None


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
