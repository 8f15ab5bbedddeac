r"""Read a bash command line the way bash will run it, for permission rules.

`analyze` parses a command line with tree-sitter's bash grammar and returns
its *simple commands* (``git status``, ``touch PWNED``) wherever they hide:
after ``;``, ``&&``, ``||``, ``|``, ``&`` or a newline, in subshells and
``{ }`` groups, in ``$(...)``, backquotes and ``<(...)``, in loops and
functions, in the script of ``bash -c '...'``, ``eval`` and ``watch``, and
behind wrappers (``sudo``, ``env``, ``xargs``, ``timeout``, ``find -exec``...).
Each comes with the forms permission patterns match (`SimpleCommand`).

What cannot be known before the command runs is a *concern* (`CommandLine.concerns`):
a program whose name is computed (``$CMD``), ``eval``, ``exec``, a shell
reading its commands from a pipe or a here-document, ``source`` of a
computed path, a script that is itself computed (``bash -c "$X"``), a
redirection writing outside the project, or text the grammar does not
parse. A command line with a concern is never allowed without asking.

Words are read as bash reads them: quotes and backslashes are removed
(``"r"m``, ``\\rm`` and ``$'\\x72m'`` are ``rm``), brace expansion is
applied (``-{r,f}`` is ``-r -f``), and a backslash-newline joins lines
before anything else. The parse is bounded (`MAX_COMMAND_BYTES`,
`MAX_SYNTAX_NODES`, `MAX_SIMPLE_COMMANDS`, `MAX_DEPTH`); past a bound the
command line is a concern.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

import attrs
import tree_sitter
import tree_sitter_bash

__all__ = [
    "MAX_COMMAND_BYTES",
    "MAX_DEPTH",
    "MAX_SIMPLE_COMMANDS",
    "MAX_SYNTAX_NODES",
    "SHELLS",
    "CommandLine",
    "SimpleCommand",
    "analyze",
    "flag_form",
]

MAX_COMMAND_BYTES = 64 * 1024
"""A longer command line is not parsed: it is a concern (ask)."""

MAX_SIMPLE_COMMANDS = 2000
"""More simple commands than this (nested scripts included) is a concern."""

MAX_SYNTAX_NODES = 20_000
"""A command line whose syntax tree has more nodes is not walked: it is a concern."""

MAX_DEPTH = 8
"""How deep scripts inside scripts (``bash -c``, ``eval``, backquotes) are followed."""

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "posh", "yash"})
"""Programs that run a shell script (from ``-c``, a file, or their stdin)."""

# A shell named like this is the system's, so `bash -c 'script'` is only its script.
_SYSTEM_BIN = ("/bin/", "/usr/bin/", "/usr/local/bin/")

# Redirection targets that are not files of the project but are always fine to write.
_HARMLESS_TARGETS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty")
_WRITE_OPERATORS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>", "&>|"})

# Word nodes whose text is the word, backslash escapes aside.
_LEAF_WORDS = frozenset({"word", "number"})
_MAX_BRACE_WORDS = 256


@attrs.frozen
class SimpleCommand:
    """One simple command of a command line, in the forms permission patterns match.

    Attributes:
        text: the command as written with quotes resolved (``git "status"`` is
            ``git status``), leading assignments included: what an ``allow``
            pattern must match.
        allow_texts: ``text``, then for a harmless wrapper (``timeout 5``,
            ``nice``, ``nohup``, ``time``, ``command``...) the text of the
            command it wraps; an ``allow`` pattern matching any of them allows it.
        forms: the word lists ``deny`` and ``ask`` patterns are tried on: as
            written, with the program named by its basename and the
            assignments dropped, and each command a wrapper runs.
        transparent: True for ``bash -c 'script'`` (a system shell, no
            assignments, known options): only the script's own commands need allowing.
    """

    text: str
    allow_texts: tuple[str, ...]
    forms: tuple[tuple[str, ...], ...]
    transparent: bool = False


@attrs.frozen
class CommandLine:
    """A command line read as bash will run it.

    Attributes:
        commands: every simple command, in source order (nested scripts after
            the command that runs them).
        concerns: why the command line must be asked about whatever the
            patterns say (empty when everything it runs is listed in ``commands``).
    """

    commands: tuple[SimpleCommand, ...]
    concerns: tuple[str, ...]


def analyze(
    command: str,
    *,
    cwd: PurePosixPath | None = None,
    roots: Sequence[PurePosixPath] = (),
) -> CommandLine:
    """Split ``command`` into its simple commands and the concerns it raises.

    Args:
        command: the command line, as the shell tool would run it.
        cwd: the directory it starts in (absolute); relative redirection
            targets resolve against it. None: the project's root.
        roots: the directories the command may write into with a redirection
            (the project and the allowed directories). Empty: only paths
            relative to ``cwd`` that stay inside it count as the project.

    Returns:
        The `CommandLine`. Never raises for any input.
    """
    walker = _Walker(cwd if cwd is not None else _PROJECT, tuple(roots) if roots else (_PROJECT,))
    walker.script(command, depth=0)
    return CommandLine(tuple(walker.commands), tuple(dict.fromkeys(walker.concerns)))


# A stand-in for the project when no directory is known: relative paths resolve under it.
_PROJECT = PurePosixPath("/\x00project")


# -- the parser ---------------------------------------------------------------------

_LANGUAGE = tree_sitter.Language(tree_sitter_bash.language())
_local = threading.local()


def _parser() -> tree_sitter.Parser:
    # A tree-sitter Parser holds parse state: one per thread.
    parser: tree_sitter.Parser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = tree_sitter.Parser(_LANGUAGE)
    return parser


# A backslash-newline not itself escaped: bash removes it before it splits words.
_CONTINUATION = re.compile(r"(?<!\\)((?:\\\\)*)\\\n")
# Where a backslash-newline is kept as it is.
_LITERAL_SPANS = frozenset({"raw_string", "heredoc_body", "heredoc_content", "comment", "ansi_c_string"})


def _join_continuations(source: bytes, tree: tree_sitter.Tree) -> bytes | None:
    """``source`` with every backslash-newline outside quotes removed, or None if it has none."""
    if b"\\\n" not in source:
        return None
    kept: list[tuple[int, int]] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in _LITERAL_SPANS:
            kept.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    text = source.decode("utf-8", "surrogateescape")
    out: list[str] = []
    last = 0
    for match in _CONTINUATION.finditer(text):
        start = len(text[: match.start()].encode("utf-8", "surrogateescape")) + len(match.group(1))
        if any(a <= start < b for a, b in kept):
            continue
        out.append(text[last : match.end() - 2])
        last = match.end()
    if not out:
        return None
    out.append(text[last:])
    return "".join(out).encode("utf-8", "surrogateescape")


# -- words --------------------------------------------------------------------------


class _Word:
    """A word as bash sees it after quote removal.

    ``text`` is the resolved text for a static word, the source for one with
    expansions (``dynamic``). ``quoted`` marks, per character of ``text``,
    the ones quoting or a backslash made literal (no glob, brace or tilde meaning).
    """

    __slots__ = ("dynamic", "quoted", "text")

    def __init__(self, text: str, quoted: str, *, dynamic: bool = False) -> None:
        self.text = text
        self.quoted = quoted
        self.dynamic = dynamic

    def __repr__(self) -> str:
        return f"_Word({self.text!r}{', dynamic' if self.dynamic else ''})"

    def unquoted_has(self, chars: str) -> bool:
        return any(c in chars and q == "0" for c, q in zip(self.text, self.quoted, strict=True))


def _node_text(node: tree_sitter.Node) -> str:
    return (node.text or b"").decode("utf-8", "surrogateescape")


_ANSI_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_ANSI_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.DOTALL)


def _ansi_c(body: str) -> str:
    """The value of ``$'body'``."""

    def one(match: re.Match[str]) -> str:
        esc = match.group(1)
        head = esc[0]
        if head in "xuU" and len(esc) > 1:
            return chr(min(int(esc[1:], 16), 0x10FFFF))
        if head.isdigit():
            return chr(int(esc, 8) & 0xFF)
        if head == "c" and len(esc) == 2:
            return chr(ord(esc[1].upper()) ^ 0x40)
        return _ANSI_SIMPLE.get(esc, "\\" + esc)

    return _ANSI_ESCAPE.sub(one, body)


def _unescape_unquoted(raw: str) -> tuple[str, str]:
    text: list[str] = []
    quoted: list[str] = []
    i = 0
    while i < len(raw):
        if raw[i] == "\\" and i + 1 < len(raw):
            text.append(raw[i + 1])
            quoted.append("1")
            i += 2
        else:
            text.append(raw[i])
            quoted.append("0")
            i += 1
    return "".join(text), "".join(quoted)


_DQ_ESCAPABLE = frozenset('$`"\\\n')


def _unescape_double_quoted(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        if raw[i] == "\\" and i + 1 < len(raw) and raw[i + 1] in _DQ_ESCAPABLE:
            out.append(raw[i + 1])
            i += 2
        else:
            out.append(raw[i])
            i += 1
    return "".join(out)


def _resolve(node: tree_sitter.Node) -> tuple[str, str] | None:
    """The text and quote mask of a static word node, or None if it has expansions."""
    kind = node.type
    if kind in _LEAF_WORDS:
        return _unescape_unquoted(_node_text(node))
    if kind == "raw_string":
        body = _node_text(node)[1:-1]
        return body, "1" * len(body)
    if kind == "ansi_c_string":
        body = _ansi_c(_node_text(node)[2:-1])
        return body, "1" * len(body)
    if kind in ("string", "translated_string"):
        parts: list[str] = []
        for child in node.children:
            if child.type == "string_content":
                parts.append(_unescape_double_quoted(_node_text(child)))
            elif child.type not in ('"', '$"', "$"):
                return None
        body = "".join(parts)
        return body, "1" * len(body)
    if kind == "concatenation":
        texts: list[str] = []
        masks: list[str] = []
        for child in node.children:
            part = _resolve(child)
            if part is None:
                return None
            texts.append(part[0])
            masks.append(part[1])
        return "".join(texts), "".join(masks)
    if kind == "brace_expression":
        raw = _node_text(node)
        return raw, "0" * len(raw)
    return None


def _words(node: tree_sitter.Node) -> list[_Word]:
    """The words one argument node becomes (several after brace expansion)."""
    resolved = _resolve(node)
    if resolved is None:
        source = _node_text(node)
        return [_Word(source, "1" * len(source), dynamic=True)]
    text, quoted = resolved
    if "{" not in text:
        return [_Word(text, quoted)]
    expanded = _brace_expand(text, quoted)
    if expanded is None:
        return [_Word(text, quoted, dynamic=True)]
    return [_Word(t, q) for t, q in expanded]


def _matching_brace(text: str, quoted: str, start: int) -> tuple[int, list[int]] | None:
    """The index of the ``}`` closing the ``{`` at ``start``, and its top-level commas."""
    depth = 0
    commas: list[int] = []
    for i in range(start, len(text)):
        if quoted[i] == "1":
            continue
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i, commas
        elif c == "," and depth == 1:
            commas.append(i)
    return None


_RANGE = re.compile(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?")


def _brace_range(inner: str) -> list[str] | None:
    match = _RANGE.fullmatch(inner)
    if match is None:
        return None
    a, b, step_text = match.groups()
    step = abs(int(step_text)) if step_text else 1
    step = step or 1
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        lo, hi = int(a), int(b)
        if abs(hi - lo) // step > _MAX_BRACE_WORDS:
            return None
        seq = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [str(n) for n in seq]
    if len(a) == 1 and len(b) == 1 and not a.isdigit() and not b.isdigit():
        lo, hi = ord(a), ord(b)
        seq = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [chr(n) for n in seq]
    return None


def _brace_expand(text: str, quoted: str) -> list[tuple[str, str]] | None:
    """Bash's brace expansion of one word; None if it would make too many words."""
    results: list[tuple[str, str]] = []
    pending = [(text, quoted)]
    while pending:
        word, mask = pending.pop()
        expanded = _expand_first_brace(word, mask)
        if expanded is None:
            results.append((word, mask))
        else:
            pending.extend(reversed(expanded))
        if len(results) + len(pending) > _MAX_BRACE_WORDS:
            return None
    return results


def _expand_first_brace(word: str, mask: str) -> list[tuple[str, str]] | None:
    start = 0
    while True:
        start = _next_unquoted(word, mask, "{", start)
        if start < 0:
            return None
        found = _matching_brace(word, mask, start)
        if found is None:
            return None
        end, commas = found
        head, tail = (word[:start], mask[:start]), (word[end + 1 :], mask[end + 1 :])
        if commas:
            bounds = [start, *commas, end]
            return [
                (head[0] + word[a + 1 : b] + tail[0], head[1] + mask[a + 1 : b] + tail[1])
                for a, b in itertools.pairwise(bounds)
            ]
        inner = word[start + 1 : end]
        if "1" not in mask[start + 1 : end]:
            seq = _brace_range(inner)
            if seq is not None:
                return [(head[0] + s + tail[0], head[1] + "0" * len(s) + tail[1]) for s in seq]
        start += 1


def _next_unquoted(word: str, mask: str, char: str, start: int) -> int:
    i = word.find(char, start)
    while i >= 0 and mask[i] == "1":
        i = word.find(char, i + 1)
    return i


# -- flags --------------------------------------------------------------------------

_SHORT_LETTERS = re.compile(r"-[A-Za-z]+")
_SHORT_NUMBER = re.compile(r"-\d+")

# Spellings that mean the same flag, per program (long options and case variants).
_FLAG_ALIASES: dict[str, dict[str, str]] = {
    "rm": {"--recursive": "r", "R": "r", "--force": "f", "--dir": "d"},
    "git": {"--force": "f"},
}


def flag_form(program: str, args: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The short flags among ``args`` (clusters split, aliases applied) and the other words in order.

    ``rm -r x -f`` and ``rm -fr x`` both give ``({"r", "f"}, ("x",))``.
    Words after ``--`` are operands. Words with glob characters are kept
    as words (a pattern's ``-*`` matches any flags).
    """
    aliases = _FLAG_ALIASES.get(program, {})
    flags: set[str] = set()
    rest: list[str] = []
    operands = False
    for arg in args:
        if operands:
            rest.append(arg)
        elif arg == "--":
            operands = True
            rest.append(arg)
        elif arg in aliases:
            flags.add(aliases[arg])
        elif _SHORT_LETTERS.fullmatch(arg):
            flags.update(aliases.get(c, c) for c in arg[1:])
        elif _SHORT_NUMBER.fullmatch(arg):
            flags.add(arg[1:])
        else:
            rest.append(arg)
    return frozenset(flags), tuple(rest)


# -- wrappers -----------------------------------------------------------------------

# Options taking a value, per wrapper, in their short and long spellings.
_WRAPPER_VALUE_OPTIONS: dict[str, frozenset[str]] = {
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "--class", "--classdata"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "stdbuf": frozenset({"-i", "-o", "-e", "--input", "--output", "--error"}),
    "sudo": frozenset(
        {"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-T", "-U", "--user", "--group", "--host", "--prompt"}
    ),
    "doas": frozenset({"-u", "-C"}),
    "xargs": frozenset(
        {"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file", "--delimiter", "--max-args", "--max-procs"}
    ),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
    "setsid": frozenset(),
    "nohup": frozenset(),
    "time": frozenset({"-f", "-o", "--format", "--output"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "chronic": frozenset(),
    "unbuffer": frozenset(),
    "coproc": frozenset(),
    "flock": frozenset({"-w", "-E", "--timeout", "--conflict-exit-code"}),
    "taskset": frozenset(),
    "chrt": frozenset(),
}

# Wrappers that run the wrapped command as it is, in the same environment and
# with the same arguments: allowing the wrapped command allows the wrapper around it.
_HARMLESS_WRAPPERS = frozenset({"nice", "ionice", "timeout", "stdbuf", "nohup", "time", "command", "builtin"})


def _split_options(name: str, args: list[_Word]) -> tuple[list[_Word], list[_Word]] | None:
    """A wrapper's own options, and the command after them (None if one is computed)."""
    takes_value = _WRAPPER_VALUE_OPTIONS.get(name, frozenset())
    i = 0
    while i < len(args):
        word = args[i]
        if word.dynamic:
            return None
        text = word.text
        if text == "--":
            return args[: i + 1], args[i + 1 :]
        if not text.startswith("-") or text == "-":
            break
        if name == "nice" and _SHORT_NUMBER.fullmatch(text):
            i += 1
            continue
        if name in ("taskset", "chrt") and not text.startswith("-"):
            break
        option = text.split("=", 1)[0]
        i += 2 if option in takes_value and "=" not in text else 1
    return args[:i], args[i:]


def _peel(name: str, args: list[_Word]) -> tuple[list[_Word] | None, str | None]:
    """The command a wrapper runs (None if none or unknown), and a concern if it hides one."""
    split = _split_options(name, args)
    if split is None:
        return None, f"{name} with computed options"
    options, rest = split
    texts = {w.text.split("=", 1)[0] for w in options}
    if name == "command" and texts & {"-v", "-V"}:
        return None, None
    if name == "env" and texts & {"-S", "--split-string"}:
        return None, "env -S runs a command line weald cannot check"
    if name in ("env", "sudo", "doas"):
        while rest and not rest[0].dynamic and _ASSIGNMENT.match(rest[0].text):
            rest = rest[1:]
    if name == "timeout":
        rest = rest[1:]  # the duration
    if name in ("taskset", "chrt"):
        rest = rest[1:]  # the mask or priority
    if name == "flock":
        if texts & {"-c", "--command"}:
            return None, "flock -c runs a command line weald cannot check"
        rest = rest[1:]  # the lock file
    if name == "sudo" and (texts & {"-i", "-s", "--login", "--shell"}) and not rest:
        return None, "sudo starts a shell"
    return (rest or None), None


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def _find_exec(args: list[_Word]) -> list[list[_Word]]:
    """The commands ``find ... -exec CMD ... ;`` runs."""
    found: list[list[_Word]] = []
    i = 0
    while i < len(args):
        if args[i].text in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and args[j].text not in (";", "+"):
                j += 1
            if j > i + 1:
                found.append(args[i + 1 : j])
            i = j
        i += 1
    return found


# Shell options that take a value; `-c` is handled apart.
_SHELL_VALUE_OPTIONS = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_SHELL_KNOWN_FLAGS = frozenset("abefhkmnptuvxBCEHPT")


class _ShellCall:
    """How a shell is invoked: its ``-c`` script, or where it reads commands from."""

    __slots__ = ("clean", "script", "stdin", "uses_file")

    def __init__(self, args: list[_Word]) -> None:
        self.script: _Word | None = None
        self.stdin = False  # reads its commands from stdin
        self.uses_file = False  # runs a script file
        self.clean = True  # only options known to change nothing but the shell's own behaviour
        has_c = False
        i = 0
        while i < len(args):
            word = args[i]
            text = word.text
            if word.dynamic:
                self.clean = False
                if has_c:
                    self.script = word
                break
            if text in _SHELL_VALUE_OPTIONS:
                self.clean = self.clean and text in ("-o", "+o", "-O", "+O")
                i += 2
                continue
            if text in ("--norc", "--noprofile", "--posix", "--login", "--noediting", "-l"):
                i += 1
                continue
            if text == "--":
                i += 1
                break
            if text in ("--version", "--help"):
                self.stdin = False
                self.uses_file = True  # runs nothing
                return
            if text.startswith("--"):
                self.clean = False
                i += 1
                continue
            if len(text) > 1 and text[0] in "-+":
                letters = text[1:]
                if "c" in letters:
                    has_c = True
                if "s" in letters:
                    self.stdin = True
                if "i" in letters:
                    self.stdin = True
                    self.clean = False
                if not set(letters) <= _SHELL_KNOWN_FLAGS | {"c", "s", "l"}:
                    self.clean = False
                i += 1
                continue
            break
        rest = args[i:]
        if has_c:
            if self.script is None:
                if rest:
                    self.script = rest[0]
                else:
                    self.clean = False
        elif not self.stdin:
            if rest:
                self.uses_file = True
            else:
                self.stdin = True


# -- the walk -----------------------------------------------------------------------

# Containers whose children are statements: a bare assignment among them is a simple command.
_STATEMENT_PARENTS = frozenset(
    {
        "program",
        "list",
        "pipeline",
        "subshell",
        "compound_statement",
        "do_group",
        "if_statement",
        "elif_clause",
        "else_clause",
        "while_statement",
        "case_item",
        "negated_command",
        "redirected_statement",
        "variable_assignments",
    }
)


class _Walker:
    """Collects the simple commands and concerns of a command line and the scripts inside it."""

    def __init__(self, cwd: PurePosixPath, roots: tuple[PurePosixPath, ...]) -> None:
        self.commands: list[SimpleCommand] = []
        self.concerns: list[str] = []
        self.cwd: PurePosixPath | None = cwd
        self.roots = roots

    # -- scripts

    def script(self, source_text: str, *, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.concerns.append(f"scripts nested more than {MAX_DEPTH} deep")
            return
        source = source_text.encode("utf-8", "surrogateescape")
        if len(source) > MAX_COMMAND_BYTES:
            self.concerns.append(f"the command line is longer than {MAX_COMMAND_BYTES // 1024} KiB")
            return
        parser = _parser()
        tree = parser.parse(source)
        joined = _join_continuations(source, tree)
        if joined is not None:
            tree = parser.parse(joined)
        root = tree.root_node
        if root.descendant_count > MAX_SYNTAX_NODES:
            self.concerns.append(f"the command line is too long to check ({root.descendant_count:,} syntax nodes)")
            return
        if root.has_error:
            self.concerns.append(f"bash's grammar does not parse {_excerpt(_error_text(root))}")
        self.walk(root, depth)

    def nested(self, word: _Word | None, what: str, depth: int) -> None:
        """Follow a script given as a word (``bash -c WORD``, ``eval``); computed is a concern."""
        if word is None:
            return
        if word.dynamic:
            self.concerns.append(f"{what} runs a script that is computed when it runs ({_excerpt(word.text)})")
            return
        self.script(word.text, depth=depth + 1)

    # -- nodes

    def walk(self, node: tree_sitter.Node, depth: int) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            if len(self.commands) > MAX_SIMPLE_COMMANDS:
                self.concerns.append(f"more than {MAX_SIMPLE_COMMANDS} simple commands")
                return
            kind = current.type
            if kind in ("command", "declaration_command", "unset_command"):
                self.command(current, depth)
            elif kind == "variable_assignment" and current.parent is not None:
                if current.parent.type in _STATEMENT_PARENTS:
                    self.bare_assignment(current)
            elif kind == "file_redirect":
                self.redirect(current)
            elif kind == "heredoc_redirect":
                self.heredoc(current)
            elif kind == "command_substitution" and self.backquotes(current, depth):
                continue
            # Children in source order: reversed onto the stack.
            stack.extend(reversed(current.children))

    def backquotes(self, node: tree_sitter.Node, depth: int) -> bool:
        """Parse backquotes with backslashes again, as bash does; True if done (skip the children)."""
        source = _node_text(node)
        inner = source[1:-1]
        if not source.startswith("`") or "\\" not in inner:
            return False
        # Inside backquotes bash removes one level of backslashes and parses
        # again: `echo \`id\`` runs id. The grammar's own children miss that.
        self.script(re.sub(r"\\([\\`$])", r"\1", inner), depth=depth + 1)
        return True

    def bare_assignment(self, node: tree_sitter.Node) -> None:
        """``PATH=/tmp/x`` alone: a command of its own, which an allow pattern must name."""
        text = _node_text(node)
        self.commands.append(SimpleCommand(text=text, allow_texts=(text,), forms=((text,),)))

    def command(self, node: tree_sitter.Node, depth: int) -> None:
        assignments: list[str] = []
        words: list[_Word] = []
        for index, child in enumerate(node.children):
            field = node.field_name_for_child(index)
            kind = child.type
            if kind == "variable_assignment" and node.type == "command":
                assignments.append(_assignment_text(child))
            elif kind in ("file_redirect", "herestring_redirect", "heredoc_redirect", "comment"):
                continue
            elif field == "name" or kind == "command_name":
                words.extend(_words(child.children[0] if child.children else child))
            elif kind in ("export", "declare", "typeset", "local", "readonly", "unset", "unsetenv"):
                words.append(_Word(kind, "0" * len(kind)))
            elif kind in ("variable_assignment", "variable_name"):
                text = _node_text(child)
                words.append(_Word(text, "1" * len(text), dynamic=kind == "variable_assignment" and "$" in text))
            elif child.is_named:
                words.extend(_words(child))
        if not words:
            return
        self.simple(assignments, words, depth, stdin_script=_stdin_script(node))

    def simple(self, assignments: list[str], words: list[_Word], depth: int, *, stdin_script: _Word | None) -> None:
        program = words[0]
        text = " ".join([*assignments, *(w.text for w in words)])
        if program.dynamic:
            self.concerns.append(f"the program's name is computed when it runs ({_excerpt(program.text)})")
        elif program.unquoted_has("*?["):
            self.concerns.append(f"the program's name is a glob pattern ({_excerpt(program.text)})")
        name = posixpath.basename(program.text)
        args = words[1:]
        forms: list[tuple[str, ...]] = [tuple(w.text for w in words)]
        if assignments:
            forms.insert(0, (*assignments, *forms[0]))
        forms.append((name, *(w.text for w in args)))
        allow_texts = [text]
        transparent = False
        inner: list[_Word] | None = words
        harmless = not assignments
        seen = 0
        # The program, then whatever each wrapper runs: `sudo env nice rm` is four.
        while inner is not None and seen < MAX_DEPTH:
            seen += 1
            head = inner[0]
            if seen > 1 and head.dynamic:
                self.concerns.append(f"the program's name is computed when it runs ({_excerpt(head.text)})")
            if seen > 1 and not head.dynamic and head.unquoted_has("*?["):
                self.concerns.append(f"the program's name is a glob pattern ({_excerpt(head.text)})")
            if head.dynamic:
                break
            current = posixpath.basename(head.text)
            current_args = inner[1:]
            if seen > 1:
                forms.append((current, *(w.text for w in current_args)))
            if current == "git":
                bare = _git_without_globals(current_args)
                if bare is not None:
                    forms.append(("git", *(w.text for w in bare)))
            self.track_directory(current, current_args)
            inner, harmless, transparent = self.look_inside(
                current,
                inner,
                current_args,
                depth,
                harmless=harmless,
                allow_texts=allow_texts,
                stdin_script=stdin_script,
            )
        self.commands.append(
            SimpleCommand(
                text=text,
                allow_texts=tuple(dict.fromkeys(allow_texts)),
                forms=tuple(dict.fromkeys(forms)),
                transparent=transparent,
            )
        )

    def look_inside(
        self,
        name: str,
        words: list[_Word],
        args: list[_Word],
        depth: int,
        *,
        harmless: bool,
        allow_texts: list[str],
        stdin_script: _Word | None,
    ) -> tuple[list[_Word] | None, bool, bool]:
        """What one program runs besides itself; returns (wrapped command, still harmless, transparent)."""
        if name in SHELLS:
            call = _ShellCall(args)
            if call.script is not None:
                self.nested(call.script, f"{name} -c", depth)
            elif call.stdin:
                if stdin_script is not None:
                    self.nested(stdin_script, f"{name}'s input", depth)
                self.concerns.append(f"{name} reads the commands it runs from its input")
            system = "/" not in words[0].text or words[0].text.startswith(_SYSTEM_BIN)
            clean = call.script is not None and not call.script.dynamic and call.clean
            return None, False, harmless and system and clean
        if name in ("eval", "trap"):
            script_words = args if name == "eval" else args[:1]
            if script_words:
                dynamic = any(w.dynamic for w in script_words)
                joined = " ".join(w.text for w in script_words)
                self.nested(_Word(joined, "1" * len(joined), dynamic=dynamic), name, depth)
            if name == "eval":
                self.concerns.append("eval runs a command line built when it runs")
            return None, False, False
        if name in ("watch", "su", "runuser"):
            self.other_shells(name, args, depth)
            return None, False, False
        if name in ("source", "."):
            if args and args[0].dynamic:
                self.concerns.append(f"{name} reads a script whose path is computed ({_excerpt(args[0].text)})")
            return None, False, False
        if name == "find":
            for run in _find_exec(args):
                self.simple([], run, depth, stdin_script=None)
            return None, False, False
        if name in _WRAPPER_VALUE_OPTIONS:
            wrapped, concern = _peel(name, args)
            if concern is not None:
                self.concerns.append(concern)
            if name == "exec" and wrapped is not None:
                self.concerns.append("exec replaces the shell with another program")
            if wrapped is None:
                return None, False, False
            harmless = harmless and name in _HARMLESS_WRAPPERS
            if name == "time" and any(w.text != "-p" for w in args[: len(args) - len(wrapped)]):
                harmless = False  # /usr/bin/time -o FILE writes a file
            if harmless:
                allow_texts.append(" ".join(w.text for w in wrapped))
            return wrapped, harmless, False
        return None, False, False

    def other_shells(self, name: str, args: list[_Word], depth: int) -> None:
        """``watch CMD``, ``su -c CMD``: a command line run by ``sh -c``."""
        if name == "watch":
            split = _split_watch(args)
            if split is None:
                self.concerns.append("watch with computed options")
                return
            if split:
                dynamic = any(w.dynamic for w in split)
                joined = " ".join(w.text for w in split)
                self.nested(_Word(joined, "1" * len(joined), dynamic=dynamic), "watch", depth)
            return
        for i, word in enumerate(args):
            if word.text in ("-c", "--command") and i + 1 < len(args):
                self.nested(args[i + 1], f"{name} -c", depth)
                return
        self.concerns.append(f"{name} starts a shell as another user")

    def track_directory(self, name: str, args: list[_Word]) -> None:
        """Follow ``cd`` so that later relative redirections resolve where bash resolves them."""
        if name not in ("cd", "pushd", "popd"):
            return
        operands = [w for w in args if not w.text.startswith("-") or w.text == "-"]
        if name == "popd" or not operands or operands[0].dynamic or operands[0].text == "-":
            self.cwd = None
            return
        target = _expand_tilde(operands[0])
        if target is None or self.cwd is None:
            self.cwd = None
            return
        self.cwd = _normalize(self.cwd / target)

    # -- redirections

    def redirect(self, node: tree_sitter.Node) -> None:
        operator = ""
        destination: tree_sitter.Node | None = None
        for index, child in enumerate(node.children):
            if node.field_name_for_child(index) == "destination":
                destination = child
            elif not child.is_named:
                operator = child.type
        if operator not in _WRITE_OPERATORS or destination is None:
            return
        if destination.type == "process_substitution":
            return
        words = _words(destination)
        if len(words) != 1 or words[0].dynamic:
            self.concerns.append(f"it writes to a file named when it runs ({operator} {_node_text(destination)})")
            return
        word = words[0]
        if operator in (">&", "<&") and (word.text.isdigit() or word.text == "-"):
            return  # a descriptor, not a file
        problem = self.outside_project(word)
        if problem is not None:
            self.concerns.append(f"{problem} ({operator} {word.text})")

    def outside_project(self, word: _Word) -> str | None:
        """Why writing to the file ``word`` names is not known to stay in the project, or None."""
        target = _expand_tilde(word)
        if target is None:
            return "it writes into another user's home directory"
        if target in _HARMLESS_TARGETS or target.startswith("/dev/fd/"):
            return None
        if word.unquoted_has("*?["):
            return "it writes to a file named by a glob pattern"
        if posixpath.isabs(target):
            path = _normalize(PurePosixPath(target))
        elif self.cwd is None:
            return "it writes to a relative path after a cd weald cannot follow"
        else:
            path = _normalize(self.cwd / target)
        if any(path == root or path.is_relative_to(root) for root in self.roots):
            return None
        return "it writes outside the project"

    def heredoc(self, node: tree_sitter.Node) -> None:
        start = next((c for c in node.children if c.type == "heredoc_start"), None)
        if start is None or any(q in _node_text(start) for q in "'\"\\"):
            return  # a quoted delimiter: the body is taken as it is
        for child in node.children:
            if child.type != "heredoc_body":
                continue
            parts = [c for c in child.children if c.type == "heredoc_content"] if child.children else [child]
            for part in parts:
                if "`" in _node_text(part):
                    # The grammar does not parse backquotes in a here-document; bash runs them.
                    self.concerns.append("a here-document runs backquoted commands")
                    return
        # A shell reading the here-document as its commands is a concern `look_inside` raises.


def _stdin_script(node: tree_sitter.Node) -> _Word | None:
    """What a command reads on its input from a ``<<<`` word or a here-document, if it has one."""
    parent = node.parent
    candidates = list(node.children)
    if parent is not None and parent.type == "redirected_statement":
        candidates.extend(parent.children)
    for child in candidates:
        if child.type == "herestring_redirect":
            for part in child.children:
                if part.is_named:
                    words = _words(part)
                    return words[0] if len(words) == 1 else None
        if child.type == "heredoc_redirect":
            start = next((c for c in child.children if c.type == "heredoc_start"), None)
            body = next((c for c in child.children if c.type == "heredoc_body"), None)
            if start is None or body is None:
                return None
            text = _node_text(body)
            quoted = any(q in _node_text(start) for q in "'\"\\")
            expands = not quoted and any(c.type != "heredoc_content" for c in body.children)
            return _Word(text, "1" * len(text), dynamic=expands)
    return None


def _assignment_text(node: tree_sitter.Node) -> str:
    name = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    left = _node_text(name) if name is not None else ""
    if value is None:
        return f"{left}="
    words = _words(value)
    return f"{left}={' '.join(w.text for w in words)}"


def _git_without_globals(args: list[_Word]) -> list[_Word] | None:
    """``git``'s arguments from its subcommand on, if global options came first."""
    i = 0
    while i < len(args) and args[i].text.startswith("-"):
        i += 2 if args[i].text in ("-C", "-c", "--git-dir", "--work-tree", "--namespace") else 1
    return args[i:] if i else None


def _split_watch(args: list[_Word]) -> list[_Word] | None:
    takes_value = {"-n", "--interval", "-d", "--differences", "-q", "--equexit"}
    i = 0
    while i < len(args):
        text = args[i].text
        if args[i].dynamic:
            return None
        if not text.startswith("-"):
            break
        i += 2 if text in takes_value and text not in ("-d", "--differences") else 1
    return args[i:]


def _expand_tilde(word: _Word) -> str | None:
    """The path a word names, ``~`` expanded; None for ``~user``."""
    text = word.text
    if text.startswith("~") and word.quoted[:1] == "0":
        head, _, tail = text.partition("/")
        if head != "~":
            return None
        home = os.path.expanduser("~")
        return posixpath.join(home, tail) if tail else home
    return text


def _normalize(path: PurePosixPath) -> PurePosixPath:
    return PurePosixPath(posixpath.normpath(str(path)))


def _excerpt(text: str, limit: int = 60) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _error_text(root: tree_sitter.Node) -> str:
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            text = _node_text(node)
            return text if text else f"(missing {node.type})"
        stack.extend(reversed(node.children))
    return _node_text(root)
