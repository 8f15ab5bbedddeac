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

import bisect
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
    walker.finish()
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
# On bytes (a backslash or a newline is never part of a longer UTF-8 sequence),
# so each match's offset is the tree's byte offset as it is.
_CONTINUATION = re.compile(rb"(?<!\\)((?:\\\\)*)\\\n")
# Where a backslash-newline is kept as it is.
_LITERAL_SPANS = frozenset({"raw_string", "heredoc_body", "heredoc_content", "comment", "ansi_c_string"})


def _join_continuations(source: bytes, tree: tree_sitter.Tree) -> bytes | None:
    """``source`` with every backslash-newline outside quotes removed, or None if it has none.

    Linear in the length of ``source``: the quoted spans (which never
    overlap: the walk does not enter one) are sorted once and each
    backslash-newline is looked up among them by bisection.
    """
    if b"\\\n" not in source:
        return None
    spans: list[tuple[int, int]] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in _LITERAL_SPANS:
            spans.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    spans.sort()
    starts = [a for a, _ in spans]
    out: list[bytes] = []
    last = 0
    for match in _CONTINUATION.finditer(source):
        start = match.start() + len(match.group(1))
        index = bisect.bisect_right(starts, start) - 1
        if index >= 0 and start < spans[index][1]:
            continue  # inside quotes: kept
        out.append(source[last : match.end() - 2])
        last = match.end()
    if not out:
        return None
    out.append(source[last:])
    return b"".join(out)


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


@attrs.frozen
class _Wrapper:
    """How a program that runs another one reads its command line: ``WRAPPER [OPTIONS] [OPERANDS] COMMAND...``.

    Attributes:
        values: its options that take a value, short (``-u``, also glued:
            ``-uroot``, or last in a cluster: ``-Eu root``) and long
            (``--user root`` or ``--user=root``).
        operands: words between its options and the command (timeout's
            duration, chroot's new root, flock's lock file).
        scripts: options whose value is a command line it runs with ``sh -c``.
        idle: options with which it runs no command (``taskset -p``).
        shell: options with which it runs a shell (``sudo -s``): the
            command's words as its script, or, with none, commands read from
            its input.
        bare_shell: with no command it starts a shell reading its input.
        runs_operands: False for a wrapper whose words after the options are
            files, not a command (``script -c CMD FILE``).
    """

    values: frozenset[str] = frozenset()
    operands: int = 0
    scripts: frozenset[str] = frozenset()
    idle: frozenset[str] = frozenset()
    shell: frozenset[str] = frozenset()
    bare_shell: bool = False
    runs_operands: bool = True


def _wrapper(
    values: str = "",
    *,
    operands: int = 0,
    scripts: str = "",
    idle: str = "",
    shells: str = "",
    bare_shell: bool = False,
    runs_operands: bool = True,
) -> _Wrapper:
    return _Wrapper(
        frozenset(values.split()) | frozenset(scripts.split()),
        operands,
        frozenset(scripts.split()),
        frozenset(idle.split()),
        frozenset(shells.split()),
        bare_shell,
        runs_operands,
    )


# Programs that run a command given on their command line, and how they read it.
# A deny pattern sees the command each runs, as it sees `rm` in `nice rm`.
_WRAPPERS: dict[str, _Wrapper] = {
    "nice": _wrapper("-n --adjustment"),
    "ionice": _wrapper("-c -n -p -P -u --class --classdata --pid --pgid --uid", idle="-p -P -u --pid --pgid --uid"),
    "timeout": _wrapper("-s -k --signal --kill-after", operands=1),
    "stdbuf": _wrapper("-i -o -e --input --output --error"),
    "sudo": _wrapper(
        "-u -g -h -p -C -D -r -R -t -T -U --user --group --host --prompt --close-from --chdir --chroot --role "
        "--type --other-user --command-timeout",
        idle="-l -v -K -e -V --list --validate --remove-timestamp --edit --version",
        shells="-s -i --shell --login",
    ),
    "doas": _wrapper("-u -C", idle="-L", shells="-s"),
    "pkexec": _wrapper("--user"),
    "xargs": _wrapper(
        "-a -d -E -I -L -n -P -s --arg-file --delimiter --eof --max-args --max-procs --max-chars --max-lines "
        "--process-slot-var"
    ),
    "env": _wrapper("-u -C -S --unset --chdir --split-string"),
    "setsid": _wrapper(),
    "nohup": _wrapper(),
    "time": _wrapper("-f -o --format --output"),
    "command": _wrapper(idle="-v -V"),
    "builtin": _wrapper(),
    "exec": _wrapper("-a"),
    "chronic": _wrapper(),
    "unbuffer": _wrapper(),
    "coproc": _wrapper(),
    "flock": _wrapper("-w -E --timeout --conflict-exit-code", operands=1, scripts="-c --command"),
    "taskset": _wrapper(operands=1, idle="-p --pid"),
    "chrt": _wrapper("-T -P -D --sched-runtime --sched-period --sched-deadline", operands=1, idle="-p --pid -m --max"),
    "setpriv": _wrapper(
        "--ruid --euid --rgid --egid --reuid --regid --groups --inh-caps --ambient-caps --bounding-set "
        "--securebits --pdeathsig --selinux-label --apparmor-profile --landlock-access --landlock-rule "
        "--seccomp-filter"
    ),
    "prlimit": _wrapper("-p -o --pid --output"),
    "unshare": _wrapper(
        "-S -G -R -w -l --setuid --setgid --root --wd --propagation --setgroups --map-user --map-group "
        "--map-users --map-groups --monotonic --boottime --load-interp",
        bare_shell=True,
    ),
    "nsenter": _wrapper("-t -S -G -N --target --setuid --setgid --net-socket", bare_shell=True),
    "script": _wrapper(
        "-E -I -O -B -T -m -o --echo --log-in --log-out --log-io --log-timing --logging-format --output-limit",
        scripts="-c --command",
        bare_shell=True,
        runs_operands=False,
    ),
    "strace": _wrapper(
        "-a -b -e -E -I -o -O -p -P -s -S -u -U -X --output --attach --trace-path --string-limit --summary-sort-by "
        "--user --env --instruction-pointer --decode-fds"
    ),
    "ltrace": _wrapper("-a -A -D -e -F -l -n -o -p -s -u -x -w --output --align --indent --library"),
    "valgrind": _wrapper(),
    "chroot": _wrapper("--userspec --groups", operands=1, bare_shell=True),
    "systemd-run": _wrapper(
        "-u -p -E -M -H --unit --property --description --slice --setenv --uid --gid --nice --working-directory "
        "--machine --host --on-active --on-boot --on-startup --on-unit-active --on-unit-inactive --on-calendar "
        "--timer-property --path-property --socket-property --service-type --json --expand-environment",
        shells="-S --shell",
    ),
    "systemd-inhibit": _wrapper("--what --who --why --mode"),
    "fakeroot": _wrapper("-l -s -i -b --lib --faked", bare_shell=True),
    "faketime": _wrapper("-p --date-prog", operands=1),
    "numactl": _wrapper(
        "-i -m -N -C -p -P -w --interleave --membind --cpunodebind --physcpubind --preferred --preferred-many "
        "--weighted-interleave",
        idle="-s -H --show --hardware",
    ),
    "cgexec": _wrapper("-g"),
    "cpulimit": _wrapper("-l -p -e -P --limit --pid --exe --path"),
    "xvfb-run": _wrapper(
        "-n -s -f -e -p -w --server-num --server-args --auth-file --error-file --xauth-protocol --wait"
    ),
    "dbus-run-session": _wrapper("--config-file --dbus-daemon"),
    "catchsegv": _wrapper(),
    "tini": _wrapper("-p -e"),
    "dumb-init": _wrapper("-r --rewrite"),
    "torsocks": _wrapper("-u -p -a -P --user --pass --address --port"),
    "proxychains": _wrapper("-f"),
    "proxychains4": _wrapper("-f"),
    "firejail": _wrapper(bare_shell=True),
    "chpst": _wrapper("-u -U -b -e -n -l -L -m -d -o -p -f -c"),
    "eatmydata": _wrapper(),
    "nocache": _wrapper(),
    "linux32": _wrapper(bare_shell=True),
    "linux64": _wrapper(bare_shell=True),
    "setarch": _wrapper(operands=1, bare_shell=True),  # `setarch ARCH [options] [program]`: options after ARCH
    "runcon": _wrapper("-u -r -t -l --user --role --type --range"),  # `runcon CONTEXT CMD` without options
    "sg": _wrapper(operands=1, scripts="-c"),  # `sg [-] GROUP [-c] COMMAND`: COMMAND is run by /bin/sh -c
    "busybox": _wrapper(),  # `busybox rm -rf x`: the applet is the command
    "toybox": _wrapper(),
}

# Wrappers that run the wrapped command as it is, in the same environment and
# with the same arguments: allowing the wrapped command allows the wrapper around it.
_HARMLESS_WRAPPERS = frozenset({"nice", "ionice", "timeout", "stdbuf", "nohup", "time", "command", "builtin"})


def _split_options(name: str, args: list[_Word]) -> tuple[list[_Word], list[_Word]] | None:
    """A wrapper's own options, and the words after them (None if an option is computed).

    Short options may be clustered (``-qc``); one that takes a value takes
    the rest of its cluster, or else the next word. Options end at ``--``
    or at the first word that is not one, as each of these programs reads them.
    """
    takes_value = _WRAPPERS[name].values
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
        if text.startswith("--"):
            i += 2 if text in takes_value else 1  # `--user root`; `--user=root` is one word
            continue
        step = 1
        for index, letter in enumerate(text[1:], 1):
            if "-" + letter in takes_value:
                step = 1 if index < len(text) - 1 else 2  # the value: the cluster's rest, or the next word
                break
        i += step
    return args[:i], args[i:]


def _option_value(options: list[_Word], wanted: frozenset[str]) -> _Word | bool | None:
    """The value of the first of ``wanted`` among a wrapper's options; True if present without one; else None."""
    for i, word in enumerate(options):
        text = word.text
        if text.startswith("--"):
            option, glued, value = text.partition("=")
            if option in wanted:
                if glued:
                    return _Word(value, "1" * len(value))
                return options[i + 1] if i + 1 < len(options) else True
            continue
        if not text.startswith("-") or text == "--":
            continue
        for index, letter in enumerate(text[1:], 1):
            if "-" + letter in wanted:
                rest = text[index + 1 :]
                if rest:
                    return _Word(rest, "1" * len(rest))
                return options[i + 1] if i + 1 < len(options) else True
    return None


def _has_option(options: list[_Word], wanted: frozenset[str]) -> bool:
    if not wanted:
        return False
    for word in options:
        text = word.text
        if text.startswith("--"):
            if text.partition("=")[0] in wanted:
                return True
        elif text.startswith("-") and any("-" + letter in wanted for letter in text[1:]):
            return True
    return False


@attrs.frozen
class _Peeled:
    """What a wrapper runs: a command (its words), or a script for ``sh -c``; and a concern if it hides one."""

    command: list[_Word] | None = None
    script: _Word | None = None
    concern: str | None = None


def _peel(name: str, args: list[_Word]) -> _Peeled:
    """The command a wrapper runs (None if none or unknown), and a concern if it hides one."""
    spec = _WRAPPERS[name]
    if name == "setarch" and args:
        args = args[1:]  # its ARCH comes first, then its options
        spec = attrs.evolve(spec, operands=0)
    if name == "runcon" and args and not args[0].text.startswith("-"):
        spec = attrs.evolve(spec, operands=1)  # `runcon CONTEXT COMMAND`
    if name == "sg" and args and args[0].text == "-":
        args = args[1:]
    split = _split_options(name, args)
    if split is None:
        return _Peeled(concern=f"{name} with computed options")
    options, rest = split
    texts = {w.text.split("=", 1)[0] for w in options}
    if name == "env" and texts & {"-S", "--split-string"}:
        return _Peeled(concern="env -S runs a command line weald cannot check")
    if name == "systemd-run":
        for word in options:
            if "Exec" in word.text:
                return _Peeled(concern="systemd-run runs the commands its unit properties name")
    script = _option_value(options, spec.scripts)
    if _has_option(options, spec.idle) and script is None:
        return _Peeled()
    if name in ("env", "sudo", "doas"):
        while rest and not rest[0].dynamic and _ASSIGNMENT.match(rest[0].text):
            rest = rest[1:]
    rest = rest[spec.operands :]
    if script is None and spec.scripts and rest and rest[0].text in spec.scripts:
        script = rest[1] if len(rest) > 1 else True  # `flock FILE -c CMD`, `sg GROUP -c CMD`
        rest = []
    if name == "sg" and script is None and rest:
        script = _joined(rest)  # `sg GROUP COMMAND...`: /bin/sh -c runs it too
        rest = []
    if isinstance(script, _Word):
        return _Peeled(script=script)
    if script is True:
        return _Peeled(concern=f"{name} runs a command line weald cannot find")
    if _has_option(options, spec.shell):
        if rest:
            return _Peeled(script=_joined(rest))  # `sudo -s CMD...`: the shell runs them as its script
        return _Peeled(concern=f"{name} starts a shell")
    if not spec.runs_operands:
        rest = []
    if not rest and spec.bare_shell:
        return _Peeled(concern=f"{name} starts a shell reading the commands it runs from its input")
    return _Peeled(command=rest or None)


def _joined(words: list[_Word]) -> _Word:
    text = " ".join(w.text for w in words)
    return _Word(text, "1" * len(text), dynamic=any(w.dynamic for w in words))


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


def _split_backquotes(text: str) -> list[str]:
    """``text`` split at each backquote no backslash escapes: bash's reading of backquotes."""
    parts: list[str] = []
    start = i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "`":
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


# Constructs whose text bash expands a second time (`_Walker.reread`); `((` is a compound_statement.
_REREAD_ROOTS = frozenset({"arithmetic_expansion", "subscript", "expansion", "c_style_for_statement"})
# `[[ a -eq b ]]` compares a and b as arithmetic; `[[ -v a[i] ]]` expands the subscript.
_ARITHMETIC_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-v"})
_SINK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*_]")
_SINK_NAME_IN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables bash sets from the command line's own words (the last argument,
# a regex match, what read read, the positional parameters...): arithmetic
# naming one reads text the command line chose.
_SHELL_SET_VARIABLES = frozenset(
    {
        "*",
        "@",
        "_",
        "BASH_ARGV",
        "BASH_COMMAND",
        "BASH_REMATCH",
        "COPROC",
        "DIRSTACK",
        "FUNCNAME",
        "MAPFILE",
        "OLDPWD",
        "OPTARG",
        "PWD",
        "READLINE_LINE",
        "REPLY",
    }
)


def _arithmetic_test(node: tree_sitter.Node) -> bool:
    return any(c.type == "test_operator" and _node_text(c) in _ARITHMETIC_TESTS for c in node.children)


def _rereads(node: tree_sitter.Node) -> bool:
    """Whether bash expands this construct's text a second time (`_Walker.reread`)."""
    kind = node.type
    if kind in _REREAD_ROOTS:
        return True
    if kind == "compound_statement":
        return bool(node.children) and node.children[0].type == "(("
    return kind in ("binary_expression", "unary_expression") and _arithmetic_test(node)


class _Walker:
    """Collects the simple commands and concerns of a command line and the scripts inside it."""

    def __init__(self, cwd: PurePosixPath, roots: tuple[PurePosixPath, ...]) -> None:
        self.commands: list[SimpleCommand] = []
        self.concerns: list[str] = []
        self.cwd: PurePosixPath | None = cwd
        self.roots = roots
        # Text bash reads a second time (see `reread`): the syntax nodes already
        # scanned, the variables whose values arithmetic (or ``${!x}``,
        # ``${x@P}``) reads as code, and the values this command line gives
        # variables that such a read could run (`taint`).
        self.scanned: set[int] = set()
        self.sinks: set[str] = set()
        self.tainted: list[str] = []
        self.tainted_texts: list[str] = []

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
            elif kind in ("for_statement", "select_statement"):
                self.loop_values(current)
            if _rereads(current):
                self.reread(current, depth)
            if kind == "variable_assignment":
                self.assigned(current)
            elif kind == "expansion":
                self.expansion_effects(current)
            # Children in source order: reversed onto the stack.
            stack.extend(reversed(current.children))

    # -- text bash reads again

    def reread(self, root: tree_sitter.Node, depth: int) -> None:
        """Scan a construct whose text bash expands a second time, the way the grammar cannot.

        In arithmetic (``$((...))``, ``$[...]``, ``((...))``, ``for ((...))``,
        an array subscript, ``${s:offset:length}``, ``[[ a -eq b ]]``,
        ``[[ -v name ]]``) and in a parameter expansion, bash expands the
        text as if it were double-quoted, so ``'$(cmd)'`` there runs cmd,
        though the grammar reads a single-quoted string; and arithmetic reads
        every variable it names as arithmetic again, where ``a[$(cmd)]`` in
        its value runs cmd. So text the grammar left whole (a word, a
        quoted string) that holds ``$`` or a backquote is a concern, and the
        substitutions in it are walked (`hidden`) so that deny patterns see
        them; and each variable named in arithmetic is a *sink* (`finish`).

        Each syntax node is scanned once: a nested construct is scanned with
        its parent and not again.
        """
        if root.id in self.scanned:
            return
        self.scanned.add(root.id)
        stack: list[tuple[tree_sitter.Node, bool]] = [(root, False)]
        while stack:
            node, arithmetic = stack.pop()
            kind = node.type
            if kind == "process_substitution" and arithmetic:
                # Bash does no process substitution in arithmetic: `<(...)` there is text it expands.
                self.reread_leaf(node, kind, depth, arithmetic=arithmetic)
                continue
            if kind in ("command_substitution", "process_substitution", "do_group"):
                continue  # real scripts, walked as such
            if node is not root and _rereads(node):
                self.scanned.add(node.id)
            children = node.children
            if kind == "simple_expansion":
                if arithmetic:
                    self.sinks.update(_node_text(c) for c in children if c.is_named)
                continue
            if kind in ("arithmetic_expansion", "compound_statement", "c_style_for_statement"):
                stack.extend((child, True) for child in children)
            elif kind == "subscript":
                # The array's name keeps its context (`${a[i]}` reads a[i] as text), the index is arithmetic.
                stack.extend((child, arithmetic or index > 0) for index, child in enumerate(children))
            elif kind == "expansion":
                # After a lone `:` come the offset and length of `${s:offset:length}`: arithmetic.
                offset = False
                for child in children:
                    offset = offset or child.type == ":"
                    stack.append((child, arithmetic or offset))
            elif kind in ("binary_expression", "unary_expression") and _arithmetic_test(node):
                stack.extend((child, True) for child in children if child.type != "test_operator")
            elif not children or kind in ("raw_string", "ansi_c_string"):
                if node.is_named:
                    self.reread_leaf(node, kind, depth, arithmetic=arithmetic)
            else:
                stack.extend((child, arithmetic) for child in children)

    def reread_leaf(self, node: tree_sitter.Node, kind: str, depth: int, *, arithmetic: bool) -> None:
        raw = _node_text(node)
        value = _ansi_c(raw[2:-1]) if kind == "ansi_c_string" else raw
        if "$" in raw or "`" in raw or "$" in value or "`" in value:
            self.concerns.append(f"bash expands this text again where weald cannot follow it ({_excerpt(raw)})")
            self.hidden(value, depth)
        elif arithmetic and kind in ("variable_name", "special_variable_name", "word") and _SINK_NAME.fullmatch(raw):
            self.sinks.add(raw)

    def hidden(self, text: str, depth: int) -> None:
        """Walk the substitutions bash runs in ``text`` when it expands it as double-quoted, for deny patterns.

        What is found is only added to the commands (the caller raised the
        concern): ``echo $(( '$(rm -rf x)' ))`` is then denied by
        ``"rm *" = "deny"``, not only asked about.
        """
        if depth >= MAX_DEPTH or ("$" not in text and "`" not in text):
            return
        source = ('"' + text + '"').encode("utf-8", "surrogateescape")
        if len(source) > MAX_COMMAND_BYTES:
            return
        stack = [_parser().parse(source).root_node]
        while stack:
            node = stack.pop()
            if node.type in ("command_substitution", "process_substitution"):
                self.walk(node, depth + 1)
            else:
                stack.extend(node.children)

    def taint(self, name: str, words: list[_Word]) -> None:
        """Note a value this command line gives ``name`` that arithmetic reading it could run as a command."""
        for word in words:
            if word.dynamic or word.unquoted_has("*?[") or "$" in word.text or "`" in word.text:
                self.tainted.append(f"{name}={_excerpt(word.text, 40)}")
                if not word.dynamic:
                    self.tainted_texts.append(word.text)

    def assigned(self, node: tree_sitter.Node) -> None:
        """``x=VALUE``, ``a[i]=VALUE``, ``a=(...)``, alone, before a command or in a declaration."""
        name = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        label = _node_text(name) if name is not None else "?"
        if value is None:
            return
        parts = [c for c in value.children if c.is_named] if value.type == "array" else [value]
        self.taint(label, [w for part in parts for w in _words(part)])

    def loop_values(self, node: tree_sitter.Node) -> None:
        """``for x in WORDS`` and ``select x in WORDS``: x takes each word (a file name, for a glob)."""
        name = node.child_by_field_name("variable")
        label = _node_text(name) if name is not None else "?"
        words: list[_Word] = []
        for index, child in enumerate(node.children):
            if node.field_name_for_child(index) == "value":
                words.extend(_words(child))
        if not any(node.field_name_for_child(i) == "value" for i in range(node.child_count)):
            self.tainted.append(f"{label} (the positional parameters)")  # `for x; do`: "$@"
        self.taint(label, words)

    def expansion_effects(self, node: tree_sitter.Node) -> None:
        """``${x:=WORD}`` assigns, ``${!x}`` reads x's value as a name, ``${x@P}`` expands it as a prompt."""
        children = node.children
        tokens = [c.type for c in children if not c.is_named]
        name = next((c for c in children if c.type in ("variable_name", "subscript")), None)
        label = _node_text(name) if name is not None else "?"
        if name is not None and name.type == "subscript" and name.children:
            label = _node_text(name.children[0])
        if "!" in tokens[:2] or ("@" in tokens and _node_text(children[-2]) == "P"):
            self.sinks.add(label)
        for op in (":=", "="):
            if op in tokens:
                after = children[[c.type for c in children].index(op) + 1 :]
                self.taint(label, [w for c in after if c.is_named for w in _words(c)])

    def name_operands(self, name: str, args: list[_Word], depth: int) -> None:
        """Builtins that read arguments as variable names (with a subscript bash expands) or as arithmetic."""
        operands: list[_Word] = []
        if name == "let":
            operands = args
        elif name in ("declare", "typeset", "local", "export", "readonly"):
            # With -i each value is arithmetic, with -n a variable's name (a subscript in a name being
            # assigned is a `subscript` node, scanned apart).
            if any(w.text.startswith("-") and ("i" in w.text or "n" in w.text) for w in args):
                operands = [w for w in args if not w.text.startswith(("-", "+"))]
        elif name in ("read", "mapfile", "readarray", "getopts"):
            operands = [w for w in args if not w.text.startswith("-")]
            self.tainted.append(f"what {name} reads")
        elif name in ("printf", "wait", "test", "["):
            flag = "-p" if name == "wait" else "-v"
            operands = [args[i + 1] for i, w in enumerate(args[:-1]) if w.text == flag]
            if name == "printf" and operands:
                self.tainted.append("what printf -v writes")
        for word in operands:
            if "$" in word.text or "`" in word.text:
                self.concerns.append(
                    f"{name} expands this text again where weald cannot follow it ({_excerpt(word.text)})"
                )
                self.hidden(word.text, depth)
            elif name == "let":
                self.sinks.update(_SINK_NAME_IN.findall(word.text))

    def finish(self) -> None:
        """Raise the concern of arithmetic reading a variable this command line gave a value weald cannot check."""
        if not self.sinks:
            return
        special = sorted(self.sinks & _SHELL_SET_VARIABLES | {n for n in self.sinks if n.isdigit()})
        if not special and not self.tainted:
            return
        read = ", ".join(sorted(self.sinks)[:5])
        why = f"{', '.join(special)} set by bash" if special else "; ".join(self.tainted[:3])
        self.concerns.append(f"bash reads the value of {read} as code again (arithmetic), and it comes from {why}")
        for text in self.tainted_texts[:64]:
            self.hidden(text, 0)

    def backquotes(self, node: tree_sitter.Node, depth: int) -> bool:
        """Parse backquotes with backslashes again, as bash does; True if done (skip the children)."""
        source = _node_text(node)
        inner = source[1:-1]
        if not source.startswith("`"):
            return False
        parts = _split_backquotes(source)
        if len(parts) > 3:
            # Bash ends backquotes at the next backquote no backslash escapes, quotes or
            # not (`echo '`x`'` runs x); the grammar honours the quotes. Read it as bash does.
            self.concerns.append(f"backquotes inside backquotes without backslashes ({_excerpt(source)})")
            for script in parts[1::2]:
                self.script(re.sub(r"\\([\\`$])", r"\1", script), depth=depth + 1)
            return True
        if "\\" not in inner:
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
            self.name_operands(current, current_args, depth)
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
        if name in _WRAPPERS:
            peeled = _peel(name, args)
            if peeled.concern is not None:
                self.concerns.append(peeled.concern)
            if peeled.script is not None:
                self.nested(peeled.script, f"{name}'s command line", depth)
            wrapped = peeled.command
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
        root = next((r for r in self.roots if path == r or path.is_relative_to(r)), None)
        if root is None:
            return "it writes outside the project"
        parts = {part.lower() for part in path.relative_to(root).parts}
        if ".git" in parts:
            return "it writes into .git (git runs what .git/config and .git/hooks name, outside any sandbox)"
        if parts & {"weald.toml", ".weald"}:
            return "it writes weald's own configuration (weald.toml, .weald/)"
        return None

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
