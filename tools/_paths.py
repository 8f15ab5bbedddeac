"""Where a path a model gives leads: inside the working directory and the allowed directories, or not.

File tools touch only files under the working directory and the allowed
directories (the *roots*). `resolve_in_sandbox` refuses a path that leads
elsewhere: by ``..``, as an absolute path, or through a symlink (the file
itself or any directory on the way). A symlink inside the sandbox that
points inside is fine; the resolved path is the real one.

This is the half of the file sandbox the tool contract needs
(``ToolContext.resolve_path``); opening files safely is
`weald.tools._sandbox`, which builds on it. It takes any object with
``working_dir`` and ``allowed_dirs`` (a `ToolContext`), so it imports
nothing of the contract.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from pathlib import Path
from typing import Protocol

from weald.tools._errors import ToolError
from weald.tools._names import show, unescape

__all__ = [
    "Scope",
    "describe_roots",
    "display_path",
    "missing_error",
    "resolve_in_sandbox",
    "root_of",
    "sandbox_roots",
]


class Scope(Protocol):
    """Where file tools may work: what `resolve_in_sandbox` reads of a `ToolContext`."""

    @property
    def working_dir(self) -> Path:
        """The project directory; relative paths resolve here."""
        ...

    @property
    def allowed_dirs(self) -> tuple[Path, ...]:
        """Further directories file tools may touch (relative: to ``working_dir``)."""
        ...


def sandbox_roots(scope: Scope) -> list[Path]:
    """The real paths of the working directory and the allowed directories, in that order."""
    roots = [Path(os.path.realpath(scope.working_dir))]
    for d in scope.allowed_dirs:
        real = Path(os.path.realpath(d if d.is_absolute() else scope.working_dir / d))
        if real not in roots:
            roots.append(real)
    return roots


def display_path(scope: Scope, path: Path) -> str:
    """``path`` as the model should see it: relative to the working directory when inside it."""
    root = Path(os.path.realpath(scope.working_dir))
    try:
        rel = path.relative_to(root)
    except ValueError:
        return str(path)
    return str(rel) if rel.parts else "."


def root_of(path: Path, roots: list[Path]) -> Path | None:
    """The innermost root containing ``path``, or None."""
    best: Path | None = None
    for root in roots:
        if (path == root or path.is_relative_to(root)) and (best is None or len(root.parts) > len(best.parts)):
            best = root
    return best


def describe_roots(roots: list[Path]) -> str:
    """The roots, for messages: the working directory, then the allowed directories."""
    extra = [str(r) for r in roots[1:]]
    where = f"the working directory {roots[0]}"
    if extra:
        where += " and the allowed directories " + ", ".join(extra)
    return where


def resolve_in_sandbox(scope: Scope, path: str, *, must_exist: bool = False) -> Path:
    """Resolve ``path`` to a real path inside the sandbox.

    Relative paths resolve against ``scope.working_dir``; a leading ``~`` is the
    home directory (usually outside). Symlinks are resolved; the result has none.

    Args:
        scope: the call's context (working dir, allowed dirs).
        path: the path as the model gave it.
        must_exist: refuse a path that does not exist.

    Returns:
        The real, absolute path.

    Raises:
        ToolError: the path is empty, leads outside the sandbox (``..``, an
            absolute path elsewhere, a symlink out), or must exist and does not.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("the path is empty. Give a file path relative to the working directory, e.g. 'src/main.py'.")
    if "\x00" in path:
        raise ToolError(f"the path {path!r} contains a NUL character. Give a plain file path.")
    roots = sandbox_roots(scope)
    path = _as_named(roots[0], path)
    given = os.path.expanduser(path) if path.startswith("~") else path
    candidate = os.path.join(roots[0], given)
    real = Path(os.path.realpath(candidate))
    if root_of(real, roots) is None:
        lexical = Path(os.path.normpath(candidate))
        given_roots = [
            Path(os.path.normpath(os.path.join(roots[0], d))) for d in (scope.working_dir, *scope.allowed_dirs)
        ]
        where = describe_roots(roots)
        if root_of(lexical, roots) is None and root_of(lexical, given_roots) is None:
            how = f": its '..' components lead to {lexical}" if ".." in Path(given).parts else f" ({lexical})"
            raise ToolError(
                f"{path} is outside the sandbox{how}. File tools may only touch files under "
                f"{where}. Use a path inside it, relative to the working directory.",
            )
        raise ToolError(
            f"{path} leads outside the sandbox through a symlink: it resolves to {real}. File tools may only "
            f"touch files under {where}, and do not follow symlinks out of it. Work on the files inside instead.",
        )
    if must_exist and not os.path.lexists(real):
        raise missing_error(scope, path, real)
    return real


def _as_named(base: Path, path: str) -> str:
    r"""``path``, or the name its ``\xHH`` escapes stand for when that is what exists.

    Tools show a name that is not UTF-8 with its undecodable bytes as
    ``\xHH`` (`weald.tools._names.show`), and the model sends it back so. The
    path as given wins if it exists (a name may really contain ``\xff``); else
    the unescaped one is used if it, or its directory, exists.
    """
    named = unescape(path)
    if named is path:
        return path
    literal, escaped = os.path.join(base, os.path.expanduser(path)), os.path.join(base, os.path.expanduser(named))
    if os.path.lexists(literal):
        return path
    if os.path.lexists(escaped):
        return named
    if os.path.lexists(os.path.dirname(escaped)) and not os.path.lexists(os.path.dirname(literal)):
        return named
    return path


def missing_error(scope: Scope, path: str, real: Path) -> ToolError:
    """The error for a file that does not exist, suggesting close names in its directory."""
    hint = ""
    with contextlib.suppress(OSError):
        names = os.listdir(real.parent)
        close = difflib.get_close_matches(real.name, names, n=3, cutoff=0.6)
        if close:
            parent = display_path(scope, real.parent)
            shown = [name if parent == "." else f"{parent}/{name}" for name in close]
            hint = " Did you mean " + " or ".join(f"'{show(s)}'" for s in shown) + "?"
    return ToolError(f"{path} does not exist.{hint} Use glob to find the file (e.g. pattern '**/{real.name}').")
