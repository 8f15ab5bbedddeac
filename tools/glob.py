"""The ``glob`` tool: find files by name pattern, newest first.

Files are listed by ripgrep (``rg --files``), so the selection is grep's:
``.gitignore`` rules apply (in a git repository or not), hidden files are
included, ``.git`` is not. The pattern is matched here rather than handed
to ``rg --glob``, whose patterns override the ignore rules (``--glob
'*.log'`` would list the very logs ``.gitignore`` excludes).

Patterns follow ``.gitignore`` conventions: one without a ``/`` matches file
names at any depth (``*.py``); one with a ``/`` matches the path from the
searched directory (``src/**/*.ts``, ``/setup.py``); ``**`` spans
directories, ``*`` and ``?`` stay within one, ``[abc]`` and ``{a,b}`` work.

A pattern may also start from a directory elsewhere in the sandbox: an
absolute path (``/home/me/project/src/*.py``) or one with ``..`` before its
wildcards (``../lib/*.py`` with ``path='src'``). Its leading directories
are then resolved as any file tool's path, so one outside the sandbox is
refused with the sandbox's message instead of silently matching nothing,
and the rest is matched from there. A leading ``/`` stays the ``.gitignore``
anchor (``/setup.py``) unless the path's first name exists at the file
system's root and not in the searched directory.
"""

from __future__ import annotations

import heapq
import os
import re
from collections.abc import Iterable
from pathlib import Path

import attrs
import trio
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._names import show, unescape
from weald.tools._process import RIPGREP_FILTERS, find_ripgrep, open_group_process
from weald.tools._sandbox import display_path, pinned_directory, sandbox_roots

__all__ = ["MAX_FILES", "PathPattern", "glob"]

MAX_FILES = 100
"""The most files one call lists."""

# Paths are stat'ed for their mtime in batches of this many, in a worker thread.
_STAT_BATCH = 2048

# The type name ripgrep's file-name filter is registered under.
_RG_TYPE = "wealdglob"

_PARAMETERS = {
    "type": "object",
    "properties": {
        "pattern": {
            "type": "string",
            "minLength": 1,
            "description": (
                "Glob for the files to list. Without '/', matches file names at any depth ('*.py', "
                "'test_*.{py,pyi}'); with '/', the path from `path` ('src/**/*.ts', '/setup.py' for the top only). "
                "An absolute path inside the working directory works too."
            ),
        },
        "path": {
            "type": "string",
            "description": "Directory to search, relative to the working directory (default '.').",
        },
    },
    "required": ["pattern"],
    "additionalProperties": False,
}

_DESCRIPTION = (
    "Find files by name pattern, newest first (by modification time). Lists files only, at most "
    f"{MAX_FILES}, with a count of the rest; skips files ignored by .gitignore and the .git directory. "
    "Paths are relative to the working directory. Use grep to search inside files."
)


@attrs.frozen
class PathPattern:
    """A ``.gitignore``-style glob, compiled.

    Attributes:
        pattern: the glob as given.
        regex: matches a whole relative path (``/``-separated, no leading ``./``).
        anchored: the glob has a ``/``, so it matches whole paths, not just file names.
        name_glob: a glob for file names alone that every match satisfies
            (for ripgrep's fast name filter), or None when there is no such glob.
    """

    pattern: str
    regex: re.Pattern[str]
    anchored: bool
    name_glob: str | None

    @classmethod
    def compile(cls, pattern: str) -> PathPattern:
        """Compile ``pattern``.

        Raises:
            ToolError: the pattern is empty or malformed.
        """
        glob = pattern.strip()
        if glob.startswith("./"):
            glob = glob[2:]
        if glob.endswith("/"):
            glob += "**"
        anchored = "/" in glob
        glob = glob.lstrip("/")
        if not glob:
            raise ToolError(f"the pattern {pattern!r} matches nothing. Give a glob such as '*.py' or 'src/**/*.ts'.")
        try:
            body = _translate(glob)
            regex = re.compile(body if anchored else f"(?:.*/)?{body}", re.DOTALL)
        except (ValueError, re.error) as exc:
            raise ToolError(
                f"the glob {pattern!r} is malformed ({exc}). Check its brackets and braces, e.g. '*.{{py,pyi}}'.",
            ) from exc
        last = glob.rpartition("/")[2]
        clean = "**" not in last and last.count("{") == last.count("}") and last.count("[") == last.count("]")
        name_glob = last if clean and ("/" not in glob or "{" not in glob.rpartition("/")[0]) else None
        if name_glob is not None and show(name_glob) != name_glob:
            name_glob = None  # ripgrep takes only UTF-8 globs; a name that is not is matched here
        return cls(pattern=pattern, regex=regex, anchored=anchored, name_glob=name_glob)

    def matches(self, relative_path: str) -> bool:
        """True if ``relative_path`` (``/``-separated, from the searched directory) matches."""
        return self.regex.fullmatch(relative_path) is not None

    @property
    def by_name_only(self) -> bool:
        """True when ripgrep's name filter (`ripgrep_args`) selects exactly the matching files."""
        return not self.anchored and self.name_glob is not None

    def ripgrep_args(self) -> list[str]:
        """Ripgrep flags that select the files this pattern can match by name (never more, maybe fewer)."""
        if self.name_glob is None:
            return []
        return ["--type-add", f"{_RG_TYPE}:{self.name_glob}", "--type", _RG_TYPE]


def _translate(glob: str) -> str:
    """The regex for a glob (no anchoring); raises ValueError on unbalanced braces or brackets."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i) and (i == 0 or glob[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i) and (i == 0 or glob[i - 1] == "/") and i + 2 == n:
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = glob.find("]", i + 2 if glob.startswith(("[!", "[^", "[]"), i) else i + 1)
            if end < 0:
                msg = "'[' without a closing ']'"
                raise ValueError(msg)
            inner = glob[i + 1 : end]
            if inner[:1] in ("!", "^"):
                inner = "^" + inner[1:]
            out.append("[" + inner.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "{":
            end = _closing_brace(glob, i)
            alternatives = _split_top(glob[i + 1 : end])
            out.append("(?:" + "|".join(_translate(a) if a else "" for a in alternatives) + ")")
            i = end + 1
        elif c == "}":
            msg = "'}' without an opening '{'"
            raise ValueError(msg)
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _closing_brace(glob: str, start: int) -> int:
    depth = 0
    for j in range(start, len(glob)):
        if glob[j] == "{":
            depth += 1
        elif glob[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    msg = "'{' without a closing '}'"
    raise ValueError(msg)


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += (ch == "{") - (ch == "}")
        current.append(ch)
    parts.append("".join(current))
    return parts


def strip_dot(path: str) -> str:
    """A path as ripgrep prints it for the operand ``.``, without the leading ``./``."""
    return path[2:] if path.startswith("./") else path


def join_display(prefix: str, relative: str) -> str:
    """``relative`` (from a searched directory shown as ``prefix``) as the model sees it."""
    return relative if prefix == "." else f"{prefix}/{relative}"


async def _rg_error(stderr: trio.abc.ReceiveStream) -> bytes:
    data = bytearray()
    while chunk := await stderr.receive_some(65536):
        if len(data) < 65536:
            data += chunk
    return bytes(data)


def _stat_batch(root: Path, names: Iterable[str]) -> list[tuple[float, str]]:
    out = []
    for name in names:
        try:
            mtime = os.stat(root / name).st_mtime
        except OSError:
            continue  # deleted since it was listed
        out.append((-mtime, name))
    return out


async def list_files(
    root: Path, pattern: PathPattern, *, limit: int, pass_fds: tuple[int, ...] = ()
) -> tuple[list[str], int, str]:
    """The ``limit`` newest files under ``root`` that match ``pattern``, and how many match in all.

    Returns:
        Their paths relative to ``root`` (newest first, ties by name), the
        total count, and ripgrep's error output (empty when it had none).

    Raises:
        ToolError: ripgrep is missing or refused the arguments.
    """
    argv = [find_ripgrep(), "--files", *pattern.ripgrep_args(), *RIPGREP_FILTERS, "--", "."]
    best: list[tuple[float, str]] = []
    total = 0
    batch: list[str] = []

    async def flush() -> None:
        nonlocal best
        stats = await trio.to_thread.run_sync(_stat_batch, root, list(batch))
        batch.clear()
        best = heapq.nsmallest(limit, [*best, *stats])

    stderr = b""
    async with open_group_process(argv, cwd=root, pass_fds=pass_fds) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        async with trio.open_nursery() as nursery:
            err_stream = process.stderr

            async def read_stderr() -> None:
                nonlocal stderr
                stderr = await _rg_error(err_stream)

            nursery.start_soon(read_stderr)
            rest = b""
            while chunk := await process.stdout.receive_some(65536):
                data = rest + chunk
                lines = data.split(b"\n")
                rest = lines.pop()
                for line in lines:
                    name = strip_dot(os.fsdecode(line))
                    if not pattern.matches(name):
                        continue
                    total += 1
                    batch.append(name)
                if len(batch) >= _STAT_BATCH:
                    await flush()
            if batch:
                await flush()
        code = await process.wait()
    message = stderr.decode("utf-8", "replace").strip()
    if code == 2 and total == 0 and message:
        raise ToolError(f"listing files failed: {message}")
    return [name for _, name in best], total, message


@tool(name="glob", description=_DESCRIPTION, parameters=_PARAMETERS, permission="allow", timeout=10.0, kind="read")
async def glob(ctx: ToolContext, *, pattern: str, path: str = ".") -> ToolResult:
    """List files matching ``pattern`` under ``path``, newest first."""
    # A name shown with \xHH escapes (not UTF-8) may come back in a pattern.
    root, relative = rebase(ctx, ctx.resolve_path(path, must_exist=True), unescape(pattern))
    compiled = PathPattern.compile(relative)
    if not root.is_dir():
        raise ToolError(
            f"{display_path(ctx, root)} is a file, not a directory; glob lists the files in a directory. "
            "Give its directory as path, or use read_file to read it.",
        )
    # Listed from the directory held open, not by its name: one swapped for a
    # symlink after the check is refused, never followed.
    with pinned_directory(ctx, root) as (pinned, fd):
        names, total, errors = await list_files(pinned, compiled, limit=MAX_FILES, pass_fds=(fd,))
    prefix = display_path(ctx, root)
    where = "the working directory" if prefix == "." else prefix
    if not names:
        return ToolResult.success(
            f"No files match {pattern!r} in {where} (files ignored by .gitignore are not listed).",
            data={"files": [], "total": 0},
        )
    shown = [join_display(prefix, name) for name in names]
    header = f"{total:,} file{'s match' if total != 1 else ' matches'} {pattern!r} in {where}, newest first"
    lines = [header + (f"; showing the newest {len(shown)}:" if total > len(shown) else ":"), *shown]
    if total > len(shown):
        lines.append(
            f"[{total - len(shown)} more not shown. Narrow the pattern or the path to see them.]",
        )
    if errors:
        lines.append(f"[some files could not be listed: {_first_lines(errors, 3)}]")
    return ToolResult.success("\n".join(lines), data={"files": shown, "total": total})


_WILDCARDS = frozenset("*?[{\\")


def rebase(ctx: ToolContext, root: Path, pattern: str) -> tuple[Path, str]:
    """The directory to search and the pattern to match there, for a pattern that names its own start.

    An absolute pattern, or one with ``..`` among its leading directories,
    starts from those directories (checked as a file tool's path is) and
    matches the rest, anchored, from there. Any other pattern is returned
    as it is, with ``root``.

    Raises:
        ToolError: the leading directories lead outside the sandbox or do not
            exist, or a ``..`` follows a wildcard.
    """
    text = pattern.strip()
    parts = text.split("/")
    if not (_is_absolute(ctx, root, parts) or ".." in parts):
        return root, pattern
    literal = 0
    while literal < len(parts) - 1 and not _WILDCARDS.intersection(parts[literal]):
        literal += 1
    if ".." in parts[literal:]:
        raise ToolError(
            f"the pattern {pattern!r} has '..' after a wildcard, which no listed path contains. "
            "Put the directories first (e.g. '../lib/*.py'), or give the directory as path.",
        )
    if parts[0] == "":  # absolute: the leading directories are a path of their own
        leading = "/".join(parts[:literal]) or "/"
    else:
        shown = display_path(ctx, root)
        leading = "/".join(parts[:literal]) if shown == "." else "/".join([shown, *parts[:literal]])
    return ctx.resolve_path(leading, must_exist=True), "/" + "/".join(parts[literal:])


def _is_absolute(ctx: ToolContext, root: Path, parts: list[str]) -> bool:
    """True if a pattern split on ``/`` is an absolute path rather than one anchored at ``root``.

    The two read alike ('/setup.py'). It is a path when it starts inside the
    sandbox, or when its first name exists at the file system's root and not
    in the searched directory.
    """
    if len(parts) < 2 or parts[0] != "" or not parts[1] or _WILDCARDS.intersection(parts[1]):
        return False
    leading = Path("/", *(part for part in parts[:-1] if part))
    if any(leading == r or leading.is_relative_to(r) for r in sandbox_roots(ctx)):
        return True
    return os.path.lexists("/" + parts[1]) and not os.path.lexists(root / parts[1])


def _first_lines(text: str, n: int) -> str:
    lines = text.splitlines()
    more = f" (and {len(lines) - n} more)" if len(lines) > n else ""
    return "; ".join(lines[:n]) + more
