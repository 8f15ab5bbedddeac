"""Skills: folders of instructions an agent loads when a task calls for them, and the ``use_skill`` tool.

A skill is a folder holding ``SKILL.md``, which opens with front matter::

    ---
    name: release
    description: Cut a release - bump the version, update the changelog, tag.
    ---
    (the instructions, in Markdown)

Skills are found in the project's ``.weald/skills/`` and in
``~/.weald/skills/``; the project's wins when both have a skill of the same
name. The model sees only names and descriptions (`describe_skills`, for the
system prompt); ``use_skill(name)`` gives it the whole ``SKILL.md`` and the
list of the folder's other files, which it reads as it needs them.

Skill folders are read under the same rules as the file tools
(`weald.tools._sandbox`): a project's skills directory must lie in the
project, and a skill folder, its ``SKILL.md`` and the files listed with it
must lie in the skills directory they were found in (the project, for the
project's skills). A symlink that leads out (``.weald/skills/evil ->
../outside``) is not followed: the skill is skipped with a note, for the
catalog and for ``use_skill`` alike. Files are opened with ``O_NOFOLLOW``
one directory at a time, so a link swapped in after the check is refused too.

Front matter is read by a small parser of ``key: value`` lines (plain,
quoted, and ``|``/``>`` block values), so no YAML library is needed. A
``SKILL.md`` that cannot be read, or lacks a ``name`` or ``description``, is
skipped with a note (logged, and shown when ``use_skill`` cannot find a name),
never raised.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from weald.runtime import replaced_link
from weald.tools._contract import ToolContext, ToolError, ToolResult, tool
from weald.tools._sandbox import open_directory, open_read

__all__ = [
    "SKILL_FILE",
    "Skill",
    "SkillFormatError",
    "SkillScan",
    "default_skill_dirs",
    "describe_skills",
    "parse_front_matter",
    "scan_skills",
    "skill_catalog",
    "use_skill",
]

log = logging.getLogger("weald.tools")

SKILL_FILE: Final = "SKILL.md"
MAX_SKILL_BYTES: Final = 1024 * 1024
MAX_LISTED_FILES: Final = 100
MAX_COUNTED_FILES: Final = 10_000

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:(?:[ \t]+(.*)|[ \t]*)")
_BLOCK = re.compile(r"[|>][+-]?")
_SKIPPED_DIRS: Final = frozenset({"__pycache__", "node_modules"})


class SkillFormatError(ValueError):
    """A ``SKILL.md`` file's front matter is missing or malformed."""


@attrs.frozen
class Skill:
    """One skill found on disk.

    Attributes:
        name: what ``use_skill`` is called with.
        description: what the skill is for; the model reads it to choose.
        path: the ``SKILL.md`` file.
        origin: the skills directory it was found in.
        fields: every front matter field, as text.
        root: the directory its files must stay in (the project for a
            project's skill, else the real skills directory); None: ``origin``.
    """

    name: str
    description: str
    path: Path
    origin: Path
    fields: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    root: Path | None = attrs.field(default=None, eq=False, repr=False)

    def boundary(self) -> ToolContext:
        """A context whose sandbox is the skill's root, for the file tools' no-follow helpers."""
        return ToolContext(working_dir=self.root if self.root is not None else self.origin)

    @property
    def directory(self) -> Path:
        """The skill's folder."""
        return self.path.parent


@attrs.frozen
class SkillScan:
    """The result of scanning skill directories.

    Attributes:
        skills: the skills found, sorted by name; earlier directories win name clashes.
        skipped: one note per ``SKILL.md`` skipped, saying which and why.
    """

    skills: tuple[Skill, ...] = ()
    skipped: tuple[str, ...] = ()

    def find(self, name: str) -> Skill | None:
        """The skill called ``name`` (exactly, else ignoring case), or None."""
        for skill in self.skills:
            if skill.name == name:
                return skill
        folded = name.strip().casefold()
        return next((s for s in self.skills if s.name.casefold() == folded), None)


# -- front matter -------------------------------------------------------------------------------


def _unquote(raw: str, line_no: int) -> str:
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, str):
            msg = f"line {line_no}: the double-quoted value {raw} is not closed or has a bad escape"
            raise SkillFormatError(msg)
        return value
    if len(raw) < 2 or not raw.endswith("'"):
        msg = f"line {line_no}: the single-quoted value {raw} is not closed"
        raise SkillFormatError(msg)
    return raw[1:-1].replace("''", "'")


def parse_front_matter(text: str) -> tuple[dict[str, str], str]:
    """Split a ``SKILL.md`` into its front matter fields and its body.

    Understands the YAML a front matter block needs: ``key: value`` lines
    with plain, ``"double"`` or ``'single'`` quoted values, plain values
    continued on indented lines, ``|`` and ``>`` block values, and ``#``
    comments. A key holding a nested block (a mapping or a list) gets the
    block's text.

    Returns:
        The fields (values as text) and the body after the front matter.

    Raises:
        SkillFormatError: no front matter, or a line that is not ``key: value``.
    """
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        msg = "no front matter: the file must start with a '---' line, then 'name:' and 'description:' lines"
        raise SkillFormatError(msg)
    end = next((i for i in range(1, len(lines)) if lines[i].strip() in ("---", "...")), None)
    if end is None:
        msg = "the front matter is not closed by a '---' line"
        raise SkillFormatError(msg)
    fields: dict[str, str] = {}
    i = 1
    while i < end:
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0] in " \t":
            msg = f"line {i}: indented line {line.strip()!r} follows no key"
            raise SkillFormatError(msg)
        match = _KEY_LINE.fullmatch(line.rstrip())
        if match is None:
            msg = f"line {i}: expected 'key: value', got {line.strip()!r}"
            raise SkillFormatError(msg)
        key, raw = match.group(1), (match.group(2) or "").strip()
        # Indented (or blank) lines that follow belong to this key.
        block: list[str] = []
        while i < end and (not lines[i].strip() or lines[i][0] in " \t"):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        if _BLOCK.fullmatch(raw):
            stripped = [b.strip() for b in block]
            fields[key] = "\n".join(stripped) if raw.startswith("|") else " ".join(s for s in stripped if s)
        elif raw[:1] in ("'", '"'):
            if block:
                raw = " ".join([raw, *(b.strip() for b in block)])
            fields[key] = _unquote(raw, i - len(block))
        else:
            if raw.startswith("#"):
                raw = ""
            raw = re.sub(r"[ \t]+#.*$", "", raw)
            parts = [raw] if raw else []
            parts.extend(b.strip() for b in block if b.strip())
            fields[key] = (" " if raw else "\n").join(parts)
    body = "\n".join(lines[end + 1 :])
    return fields, body


# -- discovery -------------------------------------------------------------------------------------


def default_skill_dirs(
    working_dir: str | os.PathLike[str], home: str | os.PathLike[str] | None = None
) -> tuple[Path, ...]:
    """Where skills are looked for, highest precedence first: the project's, then the user's.

    Args:
        working_dir: the project directory (``<it>/.weald/skills``).
        home: the user's home (``<it>/.weald/skills``); `Path.home` if None.
    """
    user_home = Path(home) if home is not None else Path.home()
    return (Path(working_dir) / ".weald" / "skills", user_home / ".weald" / "skills")


def _read_skill_file(skill_file: Path, root: Path) -> str:
    """The text of a ``SKILL.md``, opened without following links out of ``root``."""
    try:
        handle, _ = open_read(ToolContext(working_dir=root), str(skill_file))
        with handle:
            data = handle.read(MAX_SKILL_BYTES + 1)
    except ToolError as exc:
        raise SkillFormatError(str(exc)) from exc
    except OSError as exc:
        msg = f"it cannot be read ({exc.strerror or exc})"
        raise SkillFormatError(msg) from exc
    if len(data) > MAX_SKILL_BYTES:
        msg = f"it is more than {MAX_SKILL_BYTES} bytes"
        raise SkillFormatError(msg)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"it is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise SkillFormatError(msg) from exc


def _load_skill(skill_file: Path, origin: Path, root: Path) -> Skill:
    text = _read_skill_file(skill_file, root)
    fields, _ = parse_front_matter(text)
    name = fields.get("name", "").strip()
    description = " ".join(fields.get("description", "").split())
    if not name:
        msg = "the front matter has no 'name'"
        raise SkillFormatError(msg)
    if not _NAME.fullmatch(name):
        msg = f"the name {name!r} is not 1-64 letters, digits, '.', '_' or '-'"
        raise SkillFormatError(msg)
    if not description:
        msg = "the front matter has no 'description' (the model needs it to choose the skill)"
        raise SkillFormatError(msg)
    return Skill(name=name, description=description, path=skill_file, origin=origin, fields=fields, root=root)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _skills_root(directory: Path, project: Path | None) -> tuple[Path, Path] | str:
    """The root a skills directory's files must stay in and its real path, or why it is not used.

    A directory inside the project (lexically) has the project as its root,
    and must resolve inside it; any other (the user's) is its own root.
    """
    real = Path(os.path.realpath(directory))
    if project is not None:
        real_project = Path(os.path.realpath(project))
        lexical = Path(os.path.normpath(project / directory))
        if _inside(lexical, Path(os.path.normpath(project))) or _inside(lexical, real_project):
            if not _inside(real, real_project):
                return (
                    f"{directory}: skipped, it leads outside the project through a symlink (to {real}); "
                    "skills are not followed out of the project"
                )
            return real_project, real
    return real, real


def scan_skills(dirs: Iterable[str | os.PathLike[str]], *, project: str | os.PathLike[str] | None = None) -> SkillScan:
    """Find the skills in ``dirs`` (each a directory of skill folders); never raises for bad files.

    Args:
        dirs: skill directories, highest precedence first; a missing one is
            skipped silently. A skill whose name an earlier directory already
            has is shadowed (not a problem: that is how a project overrides
            a user's skill).
        project: the project directory. A skills directory inside it must
            resolve inside it; a skill in any directory must resolve inside
            its root (the project, or else the skills directory itself).
            Whatever leads out through a symlink is skipped with a note.
    """
    found: dict[str, Skill] = {}
    skipped: list[str] = []
    seen_dirs: set[Path] = set()
    project_path = Path(project) if project is not None else None
    for entry in dirs:
        directory = Path(entry).expanduser()
        try:
            if not directory.is_dir():
                continue
            replaced = replaced_link(directory)
            if replaced is not None:  # a running command swapped the project's .weald link for its own
                skipped.append(f"{directory}: skipped, {replaced}")
                continue
            where = _skills_root(directory, project_path)
            if isinstance(where, str):
                skipped.append(where)
                continue
            root, resolved = where
            if resolved in seen_dirs:
                continue
            seen_dirs.add(resolved)
            folders = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError as exc:
            skipped.append(f"{directory}: cannot be listed ({exc.strerror or exc})")
            continue
        in_this_dir: dict[str, Path] = {}
        for folder in folders:
            real_folder = Path(os.path.realpath(folder))
            if not _inside(real_folder, root):
                skipped.append(
                    f"{folder}: skipped, it is a symlink to {real_folder}, outside {root}; "
                    "skills are not followed out of their directory"
                )
                continue
            skill_file = folder / SKILL_FILE
            if not os.path.lexists(skill_file):
                continue
            try:
                skill = _load_skill(skill_file, directory, root)
            except SkillFormatError as exc:
                skipped.append(f"{skill_file}: skipped, {exc}")
                continue
            if skill.name in in_this_dir:
                skipped.append(f"{skill_file}: skipped, the name {skill.name!r} is taken by {in_this_dir[skill.name]}")
                continue
            in_this_dir[skill.name] = skill_file
            found.setdefault(skill.name, skill)
    for note in skipped:
        log.warning("skills: %s", note)
    return SkillScan(skills=tuple(found[name] for name in sorted(found)), skipped=tuple(skipped))


def skill_catalog(
    working_dir: str | os.PathLike[str],
    home: str | os.PathLike[str] | None = None,
    *,
    dirs: Sequence[str | os.PathLike[str]] | None = None,
) -> list[Skill]:
    """The skills available in a project, sorted by name (project skills win name clashes).

    Args:
        working_dir: the project directory.
        home: the user's home; `Path.home` if None.
        dirs: skill directories to use instead of `default_skill_dirs`, highest precedence first.
    """
    chosen = dirs if dirs is not None else default_skill_dirs(working_dir, home)
    return list(scan_skills(chosen, project=working_dir).skills)


def describe_skills(
    working_dir: str | os.PathLike[str],
    home: str | os.PathLike[str] | None = None,
    *,
    dirs: Sequence[str | os.PathLike[str]] | None = None,
) -> str:
    """The skill catalog as text for the system prompt: one ``- name: description`` line each.

    Returns:
        The text, or an empty string when there are no skills (so the
        prompt can leave the section out).
    """
    skills = skill_catalog(working_dir, home, dirs=dirs)
    if not skills:
        return ""
    lines = [
        "Skills available (call use_skill with a name to load its full instructions before doing a task it covers):",
    ]
    lines.extend(f"- {s.name}: {s.description}" for s in skills)
    return "\n".join(lines)


# -- the tool ----------------------------------------------------------------------------------------


def _dirs_for(ctx: ToolContext) -> tuple[Path, ...]:
    runtime: Any = getattr(ctx.session, "runtime", None)
    configured = getattr(runtime, "skill_dirs", None)
    if configured is not None:
        return tuple(Path(d) for d in configured)
    return default_skill_dirs(ctx.working_dir)


def _other_files(skill: Skill) -> tuple[list[str], int]:
    """The skill folder's other files (at most `MAX_LISTED_FILES` named), walked without following links.

    A symlink is listed only if it resolves inside the skill's root.
    """
    boundary = skill.boundary()
    directory = skill.directory
    files: list[str] = []
    total = 0
    fd = open_directory(boundary, str(directory))
    try:
        for top, subdirs, names, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
            # fwalk lists a symlink to a directory among the directories without entering it.
            links = [d for d in subdirs if stat.S_ISLNK(os.stat(d, dir_fd=dir_fd, follow_symlinks=False).st_mode)]
            subdirs[:] = [d for d in subdirs if d not in links]
            for name in sorted([*names, *links]):
                relative = os.path.normpath(os.path.join(top, name))
                if name.startswith(".") or relative == SKILL_FILE:
                    continue
                if name in links or stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    real = Path(os.path.realpath(directory / relative))
                    if not _inside(real, boundary.working_dir):
                        continue  # a link out of the skill's root is not shown
                total += 1
                if len(files) < MAX_LISTED_FILES:
                    files.append(Path(relative).as_posix())
                if total >= MAX_COUNTED_FILES:
                    return files, total
    finally:
        os.close(fd)
    return files, total


@tool(
    name="use_skill",
    description=(
        "Load a skill: the full instructions (SKILL.md) of one of the skills listed in your instructions, "
        "with the paths of its other files (scripts, references) to read when it refers to them. Load a "
        "skill before doing a task it covers."
    ),
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 1, "description": "The skill's name."}},
        "required": ["name"],
        "additionalProperties": False,
    },
    permission="allow",
    kind="runtime",
)
def use_skill(ctx: ToolContext, name: str) -> ToolResult:
    """Return a skill's ``SKILL.md`` and the list of its other files."""
    dirs = _dirs_for(ctx)
    scan = scan_skills(dirs, project=ctx.working_dir)
    skill = scan.find(name)
    if skill is None:
        notes = [f"Skipped: {s}" for s in scan.skipped[:5]]
        if not scan.skills:
            message = (
                f"no skill named {name!r}: no skills are installed. A skill is a folder with a SKILL.md in "
                f"{' or '.join(str(d) for d in dirs)}."
            )
        else:
            message = (
                f"no skill named {name!r}. Available skills: {', '.join(s.name for s in scan.skills)}. "
                "Call use_skill with one of these names."
            )
        raise ToolError("\n".join([message, *notes]))
    try:
        text = _read_skill_file(skill.path, skill.root if skill.root is not None else skill.origin)
        files, total = _other_files(skill)
    except (SkillFormatError, OSError) as exc:
        raise ToolError(
            f"skill {skill.name!r}: {skill.path} cannot be read now ({exc}); try again or pick another"
        ) from exc
    parts = [f"Skill {skill.name!r} from {skill.path}:", "", text.rstrip()]
    if files:
        counted = f"{total}" if total < MAX_COUNTED_FILES else f"more than {MAX_COUNTED_FILES - 1}"
        more = f" (first {len(files)} of {counted})" if total > len(files) else ""
        parts += ["", f"Other files in {skill.directory}{more}, relative to it (read them when the skill says to):"]
        parts += [f"- {f}" for f in files]
    data = {"name": skill.name, "path": str(skill.path), "directory": str(skill.directory), "files": files}
    return ToolResult.success("\n".join(parts), data=data)
