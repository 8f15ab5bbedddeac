"""The ``grep`` tool: search file contents with ripgrep.

ripgrep runs with ``--json`` in a process group of its own (killed if the
call is cancelled) and its messages are decoded with msgspec. Files are
selected as glob selects them: ``.gitignore`` rules apply (in a git
repository or not), hidden files are included, ``.git`` is not; binary
files are skipped.

Each line found is shown as ``path:N:hh|line``, context lines as
``path-N-hh|line``: ``N:hh`` is the anchor read_file shows for that line, so
an edit can follow a search directly. With ``multiline`` a match may span
lines (its pattern matches a line end); each of its lines is shown as a match.
A line longer than 500 characters is shown cut: its first 500 characters, or,
when the match starts further in, 500 characters from a little before the
match, between ellipses, with the match's column.

Once ``max_results`` matching lines are collected, the rest of ripgrep's
output is no longer decoded, only its closing summary, which gives the
totals for the note saying how many more there were. When that rest is
large (``rg --json`` writes an object per match, slowly) or an ``include``
path filter makes the summary's totals wrong, ripgrep is stopped there and
a second ``rg --count`` pass counts instead.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import trio
from weald.runtime import msgspec_decoder
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._hashline import line_hash, to_display
from weald.tools._names import unescape
from weald.tools._process import RIPGREP_FILTERS, find_ripgrep, open_group_process
from weald.tools._sandbox import display_path, hardlinked, open_read, pinned_directory
from weald.tools.glob import PathPattern, join_display, strip_dot

__all__ = ["grep"]

# Lines longer than this are shown cut (the anchor still hashes the whole line);
# a match further in is shown in a window of this size, starting a little before it.
MAX_LINE_CHARS = 500
_BEFORE_MATCH = 100

_READ_SIZE = 256 * 1024
# How much of ripgrep's stderr is kept.
_STDERR_KEEP = 16 * 1024
# The summary is ripgrep's last line and is much shorter than this.
_SUMMARY_TAIL = 8192
# Past the limit, once this much JSON has been skipped, ripgrep is stopped and
# the rest counted by ``rg --count`` instead, which prints a line per file
# rather than a JSON object per match: a search matching nearly every line
# then costs about what ``rg`` alone does.
_COUNT_INSTEAD = 1024 * 1024

_PARAMETERS = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "minLength": 1,
            "description": (
                "Regular expression to search for (Rust regex syntax: like Perl/Python, without "
                "look-around or backreferences), or literal text with fixed_strings."
            ),
        },
        "path": {
            "type": "string",
            "description": "File or directory to search, relative to the working directory (default '.').",
        },
        "include": {
            "type": "string",
            "description": (
                "Only search files matching this glob: without '/', by file name ('*.py', '*.{ts,tsx}'); "
                "with '/', by path from `path` ('src/**/*.rs')."
            ),
        },
        "context": {
            "type": "integer",
            "minimum": 0,
            "maximum": 20,
            "description": "Lines of context to show before and after each match (default 0).",
        },
        "max_results": {
            "type": "integer",
            "minimum": 1,
            "maximum": 1000,
            "description": "The most matching lines to show (default 100); the rest are counted.",
        },
        "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)."},
        "fixed_strings": {
            "type": "boolean",
            "description": "Treat pattern as literal text, not a regular expression (default false).",
        },
        "multiline": {
            "type": "boolean",
            "description": (
                "Let a match span lines (default false): needed for a pattern with '\\n', e.g. 'def a\\(\\n'. "
                "Every line of a match is shown. '.' still stops at a line end; start the pattern with '(?s)' "
                "to let it cross lines too."
            ),
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}

_DESCRIPTION = (
    "Search file contents with a regular expression (ripgrep). Each matching line is shown as "
    "'path:N:hh|line' (context lines as 'path-N-hh|line'), where 'N:hh' is the line's anchor for "
    "edit_file, as read_file shows it. Skips files ignored by .gitignore, the .git directory and binary "
    "files. Shows at most max_results lines (default 100) and says how many more matched."
)


# -- ripgrep's JSON messages (only the fields used) -------------------------------


class _Data(msgspec.Struct):
    text: str | None = None
    bytes: str | None = None

    def decode(self) -> str:
        if self.text is not None:
            return self.text
        # Not valid UTF-8: decode as read_file does, so the anchors agree.
        return base64.b64decode(self.bytes or "").decode("utf-8", "surrogateescape")


class _Stats(msgspec.Struct):
    matched_lines: int = 0
    searches_with_match: int = 0


class _PathData(msgspec.Struct):
    path: _Data


class _Submatch(msgspec.Struct):
    start: int  # a byte offset into the message's lines


class _LineData(msgspec.Struct):
    path: _Data
    lines: _Data
    line_number: int | None = None
    submatches: list[_Submatch] = []


class _EndData(msgspec.Struct):
    path: _Data
    binary_offset: int | None = None


class _SummaryData(msgspec.Struct):
    stats: _Stats


class _Begin(msgspec.Struct, tag_field="type", tag="begin"):
    data: _PathData


class _Match(msgspec.Struct, tag_field="type", tag="match"):
    data: _LineData


class _Context(msgspec.Struct, tag_field="type", tag="context"):
    data: _LineData


class _End(msgspec.Struct, tag_field="type", tag="end"):
    data: _EndData


class _Summary(msgspec.Struct, tag_field="type", tag="summary"):
    data: _SummaryData


_Message = _Begin | _Match | _Context | _End | _Summary
_DECODER = msgspec_decoder(_Message)
_SUMMARY_DECODER = msgspec_decoder(_Summary)


# -- collecting -----------------------------------------------------------------------


class _File:
    __slots__ = ("binary", "lines", "matches", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        # (is_match, number, text, column of the first match in it, 0-based, or None)
        self.lines: list[tuple[bool, int, str, int | None]] = []
        self.matches = 0
        self.binary = False


class _Collector:
    """Turns ripgrep's message stream into per-file hits, up to ``limit`` matching lines."""

    def __init__(self, limit: int, context: int, path_filter: PathPattern | None) -> None:
        self.limit = limit
        self.context = context
        self.path_filter = path_filter
        self.files: dict[str, _File] = {}
        self.shown = 0
        self.counted = 0
        self.counted_files = 0
        self.skipping = False
        self.skipped_bytes = 0
        self.summary: _Stats | None = None
        self._current: _File | None = None
        self._excluded = False
        self._file_counted = False
        self._last_match = 0
        self._rest = b""
        self._tail = b""

    def feed(self, chunk: bytes | bytearray) -> None:
        if self.skipping:
            self.skipped_bytes += len(chunk)
            self._tail = (self._tail + chunk)[-_SUMMARY_TAIL:]
            return
        data = self._rest + chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        if not cut:
            return
        for message in _DECODER.decode_lines(data[:cut]):
            if isinstance(message, _Summary):
                self.summary = message.data.stats
            elif not self.skipping:
                self._handle(message)
        if self.skipping:
            self._tail = self._rest[-_SUMMARY_TAIL:]
            self._rest = b""

    def finish(self) -> None:
        if self.skipping:
            # The summary came in the chunk that started the skipping (decoded
            # there, nothing left in the tail), or it is the tail's last line.
            last = self._tail.rstrip(b"\n").rpartition(b"\n")[2]
            if last:
                try:
                    self.summary = _SUMMARY_DECODER.decode(last).data.stats
                except msgspec.DecodeError:
                    self.summary = None
        elif self._rest.strip():
            self.feed(b"\n")

    def _handle(self, message: _Begin | _Match | _Context | _End) -> None:
        if isinstance(message, _Begin):
            path = strip_dot(_path_text(message.data.path))
            self._excluded = self.path_filter is not None and not self.path_filter.matches(path)
            self._file_counted = False
            full = self.shown >= self.limit
            self._current = None if self._excluded or full else _File(path)
            if full and not self._excluded:
                # Everything from here on is only counted.
                self.skipping = True
            return
        if self._excluded:
            return
        file = self._current
        if isinstance(message, _End):
            if file is not None and message.data.binary_offset is not None:
                file.binary = True
            return
        number = message.data.line_number or 0
        if isinstance(message, _Match):
            # A multiline match carries all its lines in one message: each is a matching line.
            lines = message.data.lines.decode().splitlines(keepends=True) or [""]
            self.counted += len(lines)
            if not self._file_counted:
                self._file_counted = True
                self.counted_files += 1
            if file is None or self.shown >= self.limit:
                self._current = None
                self.skipping = True
                return
            self.shown += len(lines)
            file.matches += len(lines)
            column = _first_column(message.data, lines[0]) if message.data.submatches else None
            for offset, line in enumerate(lines):
                file.lines.append((True, number + offset, line, column if offset == 0 else None))
            self._last_match = number + len(lines) - 1
            self.files[file.path] = file
            return
        # A context line: once the limit is reached, only the after-context of the last match shown.
        if file is None or (self.shown >= self.limit and number > self._last_match + self.context):
            return
        file.lines.append((False, number, message.data.lines.decode(), None))

    @property
    def needs_count(self) -> bool:
        """True when counting the rest is cheaper done by a separate ``rg --count``.

        With a path filter ripgrep's summary counts files the filter drops;
        without one, reading on only for the summary is fine until the JSON
        past the limit gets large (``rg --json`` writes slowly).
        """
        return self.skipping and (self.path_filter is not None or self.skipped_bytes > _COUNT_INSTEAD)

    def totals(self) -> tuple[int, int]:
        """Matching lines and files with a match, in all (when no count pass ran)."""
        if self.summary is not None and self.path_filter is None:
            return self.summary.matched_lines, self.summary.searches_with_match
        return self.counted, self.counted_files


def _path_text(data: _Data) -> str:
    if data.text is not None:
        return data.text
    return os.fsdecode(base64.b64decode(data.bytes or ""))


# -- formatting -------------------------------------------------------------------------


def _first_column(data: _LineData, first_line: str) -> int | None:
    """The character column (0-based) in ``first_line`` where the message's first submatch starts."""
    start = data.submatches[0].start
    if data.lines.text is not None:
        encoded = first_line.encode("utf-8", "surrogatepass")
        if start > len(encoded):
            return None
        return len(encoded[:start].decode("utf-8", "ignore"))
    raw = base64.b64decode(data.lines.bytes or "")
    return len(raw[:start].decode("utf-8", "surrogateescape")) if start <= len(raw) else None


def _line_text(text: str, number: int, column: int | None = None) -> tuple[str, str]:
    """The line as shown (cut if long: around the match, if it lies further in) and its anchor hash."""
    text = text.removesuffix("\n").removesuffix("\r")
    if number == 1 and text.startswith("\ufeff"):
        text = text[1:]  # read_file sets a BOM aside
        column = None if column is None else max(column - 1, 0)
    shown = to_display(text)
    if len(shown) > MAX_LINE_CHARS:
        if column is not None and column >= MAX_LINE_CHARS - _BEFORE_MATCH:
            start = min(column - _BEFORE_MATCH, len(shown) - MAX_LINE_CHARS)
            end = start + MAX_LINE_CHARS
            after = "…" if end < len(shown) else ""
            shown = f"…{shown[start:end]}{after} [match at column {column + 1} of {len(shown)}]"
        else:
            shown = f"{shown[:MAX_LINE_CHARS]}… [{len(shown) - MAX_LINE_CHARS} more characters]"
    return shown, line_hash(text)


def _drop_hardlinked(ctx: ToolContext, collector: _Collector, pinned: Path) -> tuple[int, int]:
    """Take out the matches of files with other names (hard links may lead outside the sandbox).

    rg reads what the directory holds; a hard link to a file outside is one
    of its entries, so its lines are dropped here unless the sandbox allows
    hard links. Returns the matching lines and files dropped.
    """
    lines = files = 0
    for path in list(collector.files):
        try:
            st = os.stat(pinned / path, follow_symlinks=False)
        except OSError:
            continue
        if hardlinked(ctx, st):
            file = collector.files.pop(path)
            collector.shown -= file.matches
            lines += file.matches
            files += 1
    return lines, files


def _format(collector: _Collector, prefix: str, rename: dict[str, str] | None = None) -> list[str]:
    out: list[str] = []
    separate = collector.context > 0
    for path in sorted(collector.files):
        file = collector.files[path]
        shown_path = join_display(prefix, (rename or {}).get(path, path))
        if file.binary:
            out.append(f"{shown_path}: binary file matches ({file.matches} line{'s' if file.matches != 1 else ''})")
            continue
        previous: int | None = None
        if separate and out:
            out.append("--")
        for is_match, number, text, column in sorted(file.lines, key=lambda t: t[1]):
            if number == previous:
                continue
            if separate and previous is not None and number > previous + 1:
                out.append("--")
            line, digest = _line_text(text, number, column)
            sep = ":" if is_match else "-"
            out.append(f"{shown_path}{sep}{number}{sep}{digest}|{line}")
            previous = number
    return out


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# -- the tool ---------------------------------------------------------------------------


async def _run_rg(
    argv: list[str], cwd: Path, on_output: Callable[[bytes | bytearray], bool], pass_fds: tuple[int, ...] = ()
) -> tuple[int | None, str]:
    """Run ripgrep, handing its output to ``on_output`` until that returns False.

    Returns:
        ripgrep's exit status (None when it was stopped early) and its error output.
    """
    stderr = bytearray()
    async with open_group_process(argv, cwd=cwd, pass_fds=pass_fds) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        stdout, err = process.stdout, process.stderr

        async def read_stderr() -> None:
            while chunk := await err.receive_some(65536):
                if len(stderr) < _STDERR_KEEP:
                    stderr.extend(chunk)

        stopped = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stderr)
            while chunk := await stdout.receive_some(_READ_SIZE):
                if not on_output(chunk):
                    stopped = True
                    nursery.cancel_scope.cancel()
                    break
        # Leaving the block stops ripgrep if it still runs.
        code = None if stopped else await process.wait()
    return code, stderr.decode("utf-8", "replace").strip()


class _Counter:
    """Totals from ``rg --count --with-filename --null`` output: ``path NUL count`` lines."""

    def __init__(self, path_filter: PathPattern | None) -> None:
        self.path_filter = path_filter
        self.lines = 0
        self.files = 0
        self._rest = b""

    def feed(self, chunk: bytes | bytearray) -> bool:
        data = self._rest + chunk
        entries = data.split(b"\n")
        self._rest = entries.pop()
        for entry in entries:
            name, _, count = entry.rpartition(b"\0")
            if self.path_filter is not None and not self.path_filter.matches(strip_dot(os.fsdecode(name))):
                continue
            self.lines += int(count)
            self.files += 1
        return True


@tool(name="grep", description=_DESCRIPTION, parameters=_PARAMETERS, permission="allow", timeout=10.0, kind="read")
async def grep(
    ctx: ToolContext,
    *,
    pattern: str,
    path: str = ".",
    include: str | None = None,
    context: int = 0,
    max_results: int = 100,
    case_insensitive: bool = False,
    fixed_strings: bool = False,
    multiline: bool = False,
) -> ToolResult:
    """Search the files under ``path`` for ``pattern``."""
    rg = find_ripgrep()
    # Resolving and opening look at the disk: in a worker thread, never on the loop.
    target = await trio.to_thread.run_sync(functools.partial(ctx.resolve_path, path, must_exist=True))
    run = functools.partial(
        _grep,
        ctx,
        rg=rg,
        target=target,
        pattern=pattern,
        include=include,
        context=context,
        max_results=max_results,
        case_insensitive=case_insensitive,
        fixed_strings=fixed_strings,
        multiline=multiline,
    )
    with contextlib.ExitStack() as held:
        # rg never reaches the target by name: a directory is held open by an
        # O_NOFOLLOW walk and searched as /proc/self/fd/N; a file is opened by
        # open_read (which refuses a swapped symlink and a hard link) and rg
        # reads that descriptor. So nothing swapped in after the check is read.
        if target.is_dir():
            pinned, fd = held.enter_context(pinned_directory(ctx, target))
            found = await run(cwd=pinned, operand=".", pass_fds=(fd,))
        else:
            file, _ = await trio.to_thread.run_sync(open_read, ctx, path)
            held.enter_context(file)
            found = await run(cwd=target.parent, operand=f"/proc/self/fd/{file.fileno()}", pass_fds=(file.fileno(),))
    return found


async def _grep(
    ctx: ToolContext,
    *,
    rg: str,
    target: Path,
    cwd: Path,
    operand: str,
    pass_fds: tuple[int, ...],
    pattern: str,
    include: str | None,
    context: int,
    max_results: int,
    case_insensitive: bool,
    fixed_strings: bool,
    multiline: bool,
) -> ToolResult:
    """Run the search (``operand`` under ``cwd``) and format its result for ``target``."""
    rename = {} if operand == "." else {operand: target.name}
    search: list[str] = []
    if case_insensitive:
        search.append("--ignore-case")
    if fixed_strings:
        search.append("--fixed-strings")
    if multiline:
        search.append("--multiline")
    path_filter = None
    if include is not None and operand == ".":
        included = PathPattern.compile(unescape(include))  # a name shown with \xHH escapes, given back
        search += included.ripgrep_args()
        path_filter = None if included.by_name_only else included
    search += [*RIPGREP_FILTERS, "--regexp", pattern, "--", operand]
    show = ["--json", "--context", str(context)] if context else ["--json"]

    collector = _Collector(max_results, context, path_filter)

    def collect(chunk: bytes | bytearray) -> bool:
        collector.feed(chunk)
        return not collector.needs_count

    code, errors = await _run_rg([rg, *show, *search], cwd, collect, pass_fds)
    if code == 2 and not collector.files:
        raise _rg_failure(pattern, include, errors)
    if code is None:
        counter = _Counter(path_filter)
        await _run_rg([rg, "--count", "--with-filename", "--null", *search], cwd, counter.feed, pass_fds)
        total, files = counter.lines, counter.files
    else:
        collector.finish()
        total, files = collector.totals()

    if operand == ".":
        dropped_lines, dropped_files = _drop_hardlinked(ctx, collector, cwd)
        total -= dropped_lines
        files -= dropped_files
    prefix = display_path(ctx, target if operand == "." else target.parent)
    where = display_path(ctx, target)
    where = "the working directory" if where == "." else where
    total = max(total, collector.shown)
    files = max(files, len(collector.files))
    if not collector.files:
        hints = []
        if not case_insensitive and not fixed_strings:
            hints.append("Try case_insensitive=true, a simpler pattern, or another path.")
        return ToolResult.success(
            f"No matches for {pattern!r} in {where} (files ignored by .gitignore and binary files are not searched).",
            hints=hints,
            data={"matches": 0, "files": 0, "shown": 0},
        )
    lines = _format(collector, prefix, rename)
    cut = total > collector.shown
    header = f"Found {_plural(total, 'matching line')} in {_plural(files, 'file')}"
    header += f"; showing the first {collector.shown}:" if cut else ":"
    out = [header, *lines]
    if cut:
        out.append(
            f"[{_plural(total - collector.shown, 'more matching line')} not shown (max_results={max_results}). "
            "Narrow the search with a more specific pattern, a path or include, or raise max_results.]",
        )
    if errors:
        out.append(f"[some files could not be searched: {_first_lines(errors, 3)}]")
    data: dict[str, Any] = {"matches": total, "files": files, "shown": collector.shown, "truncated": cut}
    return ToolResult.success("\n".join(out), data=data)


def _rg_failure(pattern: str, include: str | None, errors: str) -> ToolError:
    detail = errors or "ripgrep failed without a message"
    if "--multiline" in detail:
        # ripgrep's advice names its command-line flag, which the model cannot pass.
        return ToolError(
            f"the pattern {pattern!r} matches a line end ('\\n'), which needs multiline mode: call grep again "
            "with the same pattern and multiline: true. (Or drop the '\\n' to search single lines.)",
        )
    if "regex" in detail.lower() and "error" in detail.lower():
        return ToolError(
            f"invalid regular expression {pattern!r}:\n{detail}\n"
            "ripgrep uses Rust regex syntax: escape special characters such as ( ) [ ] { } . * + ? | with a "
            "backslash, or pass fixed_strings=true to search for the text literally.",
        )
    if "glob" in detail.lower() and include is not None:
        return ToolError(f"invalid include glob {include!r}: {detail}. Use a glob such as '*.py' or 'src/**/*.ts'.")
    return ToolError(f"grep failed: {detail}")


def _first_lines(text: str, n: int) -> str:
    lines = text.splitlines()
    more = f" (and {len(lines) - n} more)" if len(lines) > n else ""
    return "; ".join(lines[:n]) + more
