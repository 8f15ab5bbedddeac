"""Permission patterns for shell commands, matched on what bash will run rather than on the text.

A ``[tools.permissions.shell]`` table maps glob patterns to ``allow``, ``ask``
or ``deny``. The command line is read with `weald.tools._bash.analyze` and:

- a ``deny`` or ``ask`` pattern counts if it matches the whole command line
  or any of its simple commands, in any of their forms: as written, with the
  program named by its basename (``/bin/rm`` is ``rm``) and without leading
  assignments (``FOO=1 rm``), each command a wrapper runs (``sudo``, ``env``,
  ``xargs``, ``timeout``...), and with short flags compared as a set
  (``rm -rf *`` matches ``rm -r -f x``, ``rm -fr x`` and ``rm -rfv x``);
- the command line is allowed only if every simple command in it matches an
  ``allow`` pattern (a harmless wrapper's command may match for it:
  ``timeout 5 git status`` is allowed by ``git status*``), and nothing in it
  is a concern (`CommandLine.concerns`: ``eval``, ``$CMD``, a redirection out
  of the project...);
- as for every tool, every matching pattern counts and the strictest wins:
  deny, then ask, then allow. A simple command no pattern matches gets the
  tool's default (``ask`` for shell).
"""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
import shlex
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import attrs
from weald.tools._bash import CommandLine, SimpleCommand, analyze, flag_form
from weald.tools._contract import Permission, PermissionScope

__all__ = ["ShellVerdict", "decide_shell", "match_shell_patterns"]

_STRICTNESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


class _Form:
    """One form of a simple command, split once for every pattern: text, program, flags, other words."""

    __slots__ = ("flags", "name", "rest", "text")

    def __init__(self, words: tuple[str, ...]) -> None:
        self.text = " ".join(words)
        self.name = posixpath.basename(words[0]) if words else ""
        flags, rest = flag_form(self.name, words[1:])
        self.flags = flags
        self.rest = " ".join(rest)


@attrs.frozen
class _Pattern:
    """One compiled pattern: as a glob on text, and as program + flags + the other words."""

    source: str
    permission: Permission
    whole: re.Pattern[str]
    program: re.Pattern[str] | None
    flags: frozenset[str]
    rest: re.Pattern[str]

    @classmethod
    def compile(cls, source: str, permission: Permission) -> _Pattern:
        try:
            words = shlex.split(source)
        except ValueError:  # an unbalanced quote: split on blanks
            words = source.split()
        whole = re.compile(fnmatch.translate(source), re.DOTALL)
        if not words:
            return cls(source, permission, whole, None, frozenset(), re.compile(""))
        name = posixpath.basename(words[0]) or words[0]
        args: list[str] = []
        for word in words[1:]:
            # `--force*` is the flag `--force` and then anything.
            stem = word.rstrip("*")
            if stem != word and stem and flag_form(name, [stem])[0]:
                args.extend([stem, "*"])
            else:
                args.append(word)
        flags, rest = flag_form(name, args)
        return cls(
            source,
            permission,
            whole,
            re.compile(fnmatch.translate(name), re.DOTALL),
            flags,
            _rest_regex(rest),
        )

    def catches(self, form: _Form) -> bool:
        """Whether a deny/ask pattern matches one form of a simple command."""
        if self.whole.match(form.text):
            return True
        if self.program is None or not self.program.match(form.name):
            return False
        return self.flags <= form.flags and self.rest.match(form.rest) is not None

    def allows(self, command: SimpleCommand) -> bool:
        """Whether an allow pattern matches a simple command as written (or as a harmless wrapper runs it)."""
        return any(self.whole.match(text) for text in command.allow_texts)


def _glob(word: str) -> str:
    # fnmatch.translate gives `(?s:...)\\Z`; the part inside is the word's regex.
    translated = fnmatch.translate(word)
    return translated[len("(?s:") : -len(")\\Z")]


def _rest_regex(words: tuple[str, ...]) -> re.Pattern[str]:
    """A regex for the words after the program and flags; a lone ``*`` also matches no words at all."""
    parts: list[str] = []
    for index, word in enumerate(words):
        if word == "*":
            parts.append("(?: .*)?" if index else ".*")
        else:
            parts.append((" " if index else "") + _glob(word))
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


@attrs.frozen
class _Table:
    deny: tuple[_Pattern, ...]
    ask: tuple[_Pattern, ...]
    allow: tuple[_Pattern, ...]


@functools.lru_cache(maxsize=64)
def _compile(items: tuple[tuple[str, Permission], ...]) -> _Table:
    patterns = [_Pattern.compile(source, permission) for source, permission in items]
    return _Table(
        deny=tuple(p for p in patterns if p.permission == "deny"),
        ask=tuple(p for p in patterns if p.permission == "ask"),
        allow=tuple(p for p in patterns if p.permission == "allow"),
    )


@attrs.frozen
class ShellVerdict:
    """A decision on one command line, and why.

    Attributes:
        permission: ``allow``, ``ask`` or ``deny``.
        reason: one line naming the pattern, concern or default that decided.
        line: the command line as read (its simple commands and concerns).
    """

    permission: Permission
    reason: str
    line: CommandLine


def _key(pattern: _Pattern) -> str:
    return f'tools.permissions.shell "{pattern.source}" = {pattern.permission}'


def _caught(
    patterns: tuple[_Pattern, ...], command: str, forms: list[tuple[SimpleCommand, list[_Form]]]
) -> tuple[_Pattern, str] | None:
    for pattern in patterns:
        if pattern.whole.match(command):
            return pattern, command
        for simple, split in forms:
            if any(pattern.catches(form) for form in split):
                return pattern, simple.text
    return None


def _excerpt(text: str, limit: int = 80) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def decide_shell(
    command: str,
    patterns: Mapping[str, Permission],
    default: Permission = "ask",
    *,
    cwd: PurePosixPath | None = None,
    roots: tuple[PurePosixPath, ...] = (),
) -> ShellVerdict:
    """Decide allow, ask or deny for one command line under a pattern table.

    Args:
        command: the command line.
        patterns: glob pattern -> permission (``[tools.permissions.shell]``).
        default: the permission of a simple command no pattern matches.
        cwd: where the command starts (for relative redirection targets).
        roots: the project and allowed directories redirections may write into.

    Returns:
        The `ShellVerdict`.
    """
    table = _compile(tuple(patterns.items()))
    line = analyze(command, cwd=cwd, roots=roots)
    forms = [(c, [_Form(f) for f in c.forms]) for c in line.commands] if table.deny or table.ask else []
    denied = _caught(table.deny, command, forms)
    if denied is not None:
        pattern, text = denied
        return ShellVerdict("deny", f'{_key(pattern)}, matching "{_excerpt(text)}"', line)
    asked = _caught(table.ask, command, forms)
    if asked is not None:
        pattern, text = asked
        return ShellVerdict("ask", f'{_key(pattern)}, matching "{_excerpt(text)}"', line)
    missing = [c for c in line.commands if not c.transparent and not any(p.allows(c) for p in table.allow)]
    if missing and default == "deny":
        return ShellVerdict("deny", f'default for shell: no pattern allows "{_excerpt(missing[0].text)}"', line)
    if line.concerns:
        return ShellVerdict("ask", f"weald cannot check everything this runs: {'; '.join(line.concerns)}", line)
    if missing:
        if len(missing) == len(line.commands):
            return ShellVerdict(default, "default for shell (no pattern matched)", line)
        return ShellVerdict(default, f'default for shell: no pattern allows "{_excerpt(missing[0].text)}"', line)
    if not line.commands:
        return ShellVerdict(default, "default for shell (no command)", line)
    used = [p for p in table.allow if any(p.allows(c) for c in line.commands)]
    listed = ", ".join(f'"{p.source}"' for p in used)
    return ShellVerdict("allow", f"tools.permissions.shell {listed} = allow, for every command in it", line)


def match_shell_patterns(
    arguments: Mapping[str, Any],
    patterns: Mapping[str, Permission],
    default: Permission,
    scope: PermissionScope,
) -> tuple[Permission, str]:
    """The shell tool's pattern matcher (see `weald.tools.Tool.match_patterns`)."""
    command = arguments.get("command")
    if not isinstance(command, str):
        return default, "default for shell (no pattern matched)"
    roots: tuple[PurePosixPath, ...] = ()
    cwd: PurePosixPath | None = None
    if scope.working_dir is not None:
        base = PurePosixPath(scope.working_dir)
        roots = (base, *(PurePosixPath(d) for d in scope.allowed_dirs))
        asked = arguments.get("cwd")
        cwd = PurePosixPath(posixpath.normpath(base / asked)) if isinstance(asked, str) and asked else base
    verdict = decide_shell(command, patterns, default, cwd=cwd, roots=roots)
    return verdict.permission, verdict.reason
